"""A study's frozen code: the engines and in-job helpers its jobs run (recsys/, slurm/), copied
once into study-<name>/code/<hash>/ and named by the hash of their content, so that a study that
runs for hours, and every later `extend` or re-run of it, runs the code it started with, whatever
is edited or checked out meanwhile. The profile is frozen beside it: the resolved, validated
profile (`extends` and node references applied) as one self-contained YAML,
code/profile-<hash>.yaml, named by Profile.content_sha256 (the hash every job exports and the
engine's provenance records), so an edit of the user's profile file between runs changes no later
point either. A refresh (`study run --refresh-code`) copies the checkout and the profile as they
are now and records the change in study.json; the report says whether every point ran one copy.
"""

import hashlib
import os
import shutil
import stat
import subprocess
import time
from typing import Any, Dict, Optional

from jobs.errors import StorageError
from jobs.planning.argv import slurm_dir
from jobs.runs import rundir
from jobs.runs.atomic import write_text

CODE = "code"
PACKAGES = ("recsys", "slurm")
SKIP_DIRS = ("__pycache__",)
SKIP_SUFFIXES = (".pyc", ".pyo")


def checkout():
    """The checkout whose code jobs run when nothing is frozen (the parent of slurm/)."""
    return os.path.dirname(slurm_dir())


def _files(root):
    """Relative paths of the code under `root`, sorted."""
    out = []
    for package in PACKAGES:
        for here, dirs, names in os.walk(os.path.join(root, package)):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            out += [os.path.relpath(os.path.join(here, n), root) for n in names if not n.endswith(SKIP_SUFFIXES)]
    return sorted(out)


def file_hashes(root: str, private: bool = False) -> Dict[str, str]:
    """{relative path: sha256 of its bytes} of the code under `root`. `private`: a study's copy,
    whose every file and directory must be this user's, no link, and writable by nobody else
    (rundir.check_private; the file is read without following a link)."""
    out = {}
    for rel in _files(root):
        path = os.path.join(root, rel)
        if private:
            for part in _parents(root, rel):
                rundir.check_private(part, what="the study's frozen code")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_NOFOLLOW if private else 0))
        except OSError as exc:
            if private:
                rundir.check_private(path, what="the study's frozen code")
            raise StorageError(f"study: cannot read the code file {path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as handle:
            if private:
                rundir.check_private(path, os.fstat(handle.fileno()), what="the study's frozen code")
            out[rel] = hashlib.sha256(handle.read()).hexdigest()
    return out


def _parents(root, rel):
    """The directories of a copy from `root` down to the one holding `rel`."""
    parts = [root]
    for name in os.path.dirname(rel).split(os.sep):
        if name:
            parts.append(os.path.join(parts[-1], name))
    return parts


def _combined(hashes):
    digest = hashlib.sha256()
    for rel in sorted(hashes):
        digest.update(rel.encode() + b"\0")
        digest.update(bytes.fromhex(hashes[rel]))
    return digest.hexdigest()


def content_hash(root):
    """sha256 over every file's relative path and bytes, in order."""
    return _combined(file_hashes(root))


def verify(code: Dict[str, Any], study_dir: Optional[str] = None) -> None:
    """Check a study's frozen copy (`code`: freeze's record) against its recorded hash before it
    is used: a copy that differs (a file changed, added or gone) or that another user owns or may
    write is refused in one line naming the file (StorageError); a job must never run other code
    than the study records. A relative "dir" is taken under `study_dir`."""
    root = os.path.join(study_dir or "", code["dir"])
    rundir.check_private(root, what="the study's frozen code")
    hashes = file_hashes(root, private=True)
    if _combined(hashes) == code["sha256"]:
        return
    recorded = code.get("files") or {}
    changed = sorted(set(hashes) ^ set(recorded)) + sorted(r for r in hashes if r in recorded
                                                           and hashes[r] != recorded[r])
    which = os.path.join(root, changed[0]) if changed and recorded else root
    raise StorageError(f"study: its frozen code {which} differs from the copy the study recorded (sha256 "
                       f"{code['sha256'][:16]}); refused: nothing submitted (`study run --refresh-code` "
                       "copies the checkout as it is now)")


def freeze(study_dir, root=None, group=None):
    """The copy of `root` (default: this checkout) in the study: {"sha256", "dir", "source",
    "frozen_at", "files" (each file's sha256, so that verify names a changed one)}. Made once per
    content (a copy under a temporary name, then one rename), so an interrupted copy is never
    used, and an existing one is reused once verified. `group`: the profile's runs_group."""
    root = root or checkout()
    hashes = file_hashes(root)
    sha = _combined(hashes)
    target = os.path.join(study_dir, CODE, sha[:16])
    if os.path.lexists(target):
        rundir.check_private(target, what="the study's frozen code")
        if _combined(file_hashes(target, private=True)) != sha:     # a damaged copy: made again
            shutil.rmtree(target)
    if not os.path.lexists(target):
        _code_dir(study_dir, group)
        partial = f"{target}.partial-{os.getpid()}"
        try:
            shutil.rmtree(partial, ignore_errors=True)
            for rel in _files(root):
                os.makedirs(os.path.dirname(os.path.join(partial, rel)), exist_ok=True)
                shutil.copy2(os.path.join(root, rel), os.path.join(partial, rel))
            for here, _, names in os.walk(partial):     # nobody else may write the copy (verify)
                for path in [here] + [os.path.join(here, n) for n in names]:
                    os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
            os.rename(partial, target)
        except OSError as exc:
            shutil.rmtree(partial, ignore_errors=True)
            if not os.path.isdir(target):
                raise StorageError(f"study: cannot copy the code into {target!r}: {exc.strerror}") from None
        if content_hash(target) != sha:     # the checkout changed while it was copied
            shutil.rmtree(target, ignore_errors=True)
            raise StorageError(f"study: {root} changed while it was copied into the study; run again")
    commit, dirty = _git(root)
    code = {"sha256": sha, "dir": target, "source": root, "frozen_at": round(time.time(), 3),
            "git_commit": commit, "git_dirty": dirty, "files": hashes}
    verify(code)        # an existing copy is reused only as it was made
    return code


def _code_dir(study_dir, group=None):
    """study_dir/code, created private (0700, 0750 with the profile's runs_group: under its
    umask) and refused when it is not this user's alone."""
    path = os.path.join(study_dir, CODE)
    try:
        os.makedirs(study_dir, exist_ok=True)
        os.mkdir(path, 0o750 if group else 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StorageError(f"study: cannot create {path!r}: {exc.strerror}") from None
    rundir.check_private(path, what="the study's code directory")
    return path


def profile_file(study_dir, sha):
    """Where a study keeps its copy of the profile of content hash `sha`."""
    return os.path.join(study_dir, CODE, f"profile-{sha[:16]}.yaml")


def freeze_profile(study_dir, profile):
    """The study's copy of a loaded Profile: {"sha256", "name", "file", "source", "frozen_at"}
    ("file" relative to the study dir, which may move). Written once per content (atomically:
    a temporary name, then a rename); an existing copy is reused."""
    import yaml

    sha = profile.content_sha256()
    target = profile_file(study_dir, sha)
    group = (profile.defaults or {}).get("runs_group")
    _code_dir(study_dir, group)
    if not os.path.lexists(target):
        data = profile.as_dict()
        data.pop("path", None)
        text = (f"# The profile {profile.name!r} as study {os.path.basename(study_dir)} froze it (from "
                f"{profile.path or 'a loaded profile'}); its points run with this copy.\n"
                + yaml.safe_dump(data, sort_keys=False))
        try:
            # its env: values may be secrets: as private as the run directory (the group's only
            # with runs_group)
            write_text(target, text, mode=0o640 if group else 0o600)
        except (OSError, StorageError) as exc:
            raise StorageError(f"study: cannot write the profile's copy {target!r}: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
    else:       # a copy from before it was kept private
        rundir.check_private(target, what="the study's frozen profile")
        os.chmod(target, stat.S_IMODE(os.stat(target).st_mode) & (0o640 if group else 0o600))
    return {"sha256": sha, "name": profile.name, "file": os.path.relpath(target, study_dir),
            "source": profile.path, "frozen_at": round(time.time(), 3)}


def load_frozen_profile(study_dir, copy):
    """The Profile a study froze (`copy`: freeze_profile's record), loaded and checked again;
    a copy that is gone or no longer hashes as recorded is refused in one line (a point must
    never run with a profile other than the one the study records)."""
    from jobs.profiles import ProfileError, load_profile

    path = os.path.join(study_dir, copy["file"])
    rundir.check_private(path, what="the study's frozen profile")
    try:
        profile = load_profile(path)
    except ProfileError as exc:
        raise StorageError(f"study: its frozen profile cannot be read ({exc}); `study run --refresh-code` "
                           "freezes the profile as it is now") from None
    if profile.content_sha256() != copy["sha256"]:
        raise StorageError(f"study: its frozen profile {path} was changed after it was frozen (sha256 "
                           f"{copy['sha256'][:16]} recorded); `study run --refresh-code` freezes the profile "
                           "as it is now")
    return profile


def _git(root):
    """(HEAD, dirty) of the checkout the copy was made from, else (None, None): the copy is no git
    work tree, so the engines' own provenance of a frozen point has no commit; the study keeps it."""
    def git(*args):
        try:
            proc = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=30,
                                  env=dict({k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
                                           GIT_OPTIONAL_LOCKS="0", LC_ALL="C"))
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    top = (git("rev-parse", "--show-toplevel") or "").strip()
    try:
        if not top or not os.path.samefile(top, root):
            return None, None
    except OSError:
        return None, None
    head = (git("rev-parse", "HEAD") or "").strip() or None
    status = git("status", "--porcelain", "--untracked-files=no")
    return head, (bool(status.strip()) if status is not None and head else None)
