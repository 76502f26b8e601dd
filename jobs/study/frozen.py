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
import subprocess
import time

from jobs.errors import StorageError
from jobs.planning.argv import slurm_dir
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


def content_hash(root):
    """sha256 over every file's relative path and bytes, in order."""
    digest = hashlib.sha256()
    for rel in _files(root):
        digest.update(rel.encode() + b"\0")
        with open(os.path.join(root, rel), "rb") as handle:
            digest.update(hashlib.sha256(handle.read()).digest())
    return digest.hexdigest()


def freeze(study_dir, root=None):
    """The copy of `root` (default: this checkout) in the study: {"sha256", "dir", "source",
    "frozen_at"}. Made once per content (a copy under a temporary name, then one rename), so an
    interrupted copy is never used and an existing one is reused."""
    root = root or checkout()
    sha = content_hash(root)
    target = os.path.join(study_dir, CODE, sha[:16])
    if not os.path.isdir(target):
        partial = f"{target}.partial-{os.getpid()}"
        try:
            shutil.rmtree(partial, ignore_errors=True)
            for rel in _files(root):
                os.makedirs(os.path.dirname(os.path.join(partial, rel)), exist_ok=True)
                shutil.copy2(os.path.join(root, rel), os.path.join(partial, rel))
            os.rename(partial, target)
        except OSError as exc:
            shutil.rmtree(partial, ignore_errors=True)
            if not os.path.isdir(target):
                raise StorageError(f"study: cannot copy the code into {target!r}: {exc.strerror}") from None
        if content_hash(target) != sha:     # the checkout changed while it was copied
            shutil.rmtree(target, ignore_errors=True)
            raise StorageError(f"study: {root} changed while it was copied into the study; run again")
    commit, dirty = _git(root)
    return {"sha256": sha, "dir": target, "source": root, "frozen_at": round(time.time(), 3),
            "git_commit": commit, "git_dirty": dirty}


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
    if not os.path.isfile(target):
        data = profile.as_dict()
        data.pop("path", None)
        text = (f"# The profile {profile.name!r} as study {os.path.basename(study_dir)} froze it (from "
                f"{profile.path or 'a loaded profile'}); its points run with this copy.\n"
                + yaml.safe_dump(data, sort_keys=False))
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            write_text(target, text)
        except (OSError, StorageError) as exc:
            raise StorageError(f"study: cannot write the profile's copy {target!r}: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
    return {"sha256": sha, "name": profile.name, "file": os.path.relpath(target, study_dir),
            "source": profile.path, "frozen_at": round(time.time(), 3)}


def load_frozen_profile(study_dir, copy):
    """The Profile a study froze (`copy`: freeze_profile's record), loaded and checked again;
    a copy that is gone or no longer hashes as recorded is refused in one line (a point must
    never run with a profile other than the one the study records)."""
    from jobs.profiles import ProfileError, load_profile

    path = os.path.join(study_dir, copy["file"])
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
