"""Run directories: one per submission, holding the scripts, the request, the job ids, logs.

Layout: <runs_dir>/<name>-<YYYYmmdd-HHMMSS>/ with request.json (the requests and the profile as loaded), <key>.sbatch,
jobs.json (rewritten atomically after every sbatch, so a crash mid-chain still says what was
submitted) and logs/ (batch output, per-rank output, <key>-<jobid>.info records, and each job's
engine log <key>-<tag>.engine.jsonl).

Nobody else's files are trusted (a shared runs dir: a group project directory, a 1777 scratch):
a run or study directory, and every lock the toolkit takes in one, must be owned by this user and
writable by nobody else (check_private), lock files are opened without following links
(open_lock), and a file system without flock (Lustre mounted noflock, NFS without lockd) is said
in one line naming the directory (lock_exclusive). The profile's runs_group gives its group read
access, never write: a directory the group may write is refused like any other.
"""

import contextlib
import errno
import fcntl
import os
import stat
import time
from typing import Iterator, Optional

from jobs.errors import RequestError, StorageError
from slurm.common.atomicfile import fsync_dir

SUBMIT_LOCK = "submit.lock"     # held (flock) by the process submitting the run (jobs.submit, jobs.recovery)
ENGINE_LOG_SUFFIX = ".engine.jsonl"     # logs/<key>-<tag>.engine.jsonl: the engine's JSON-lines log of a job


def default_runs_dir(profile=None):
    env = os.environ.get("RECSYS_RUNS_DIR")
    if env:
        return env
    defaults = (profile.defaults if profile is not None else None) or {}
    return os.path.expanduser(defaults.get("runs_dir") or "recsys-runs")


# Free space a submission needs on the runs dir's file system before it submits anything: its
# records, scripts and the jobs' logs (RECSYS_MIN_FREE_MB overrides; 0 turns the check off).
MIN_FREE_MB = 16


def check_free_space(runs_dir):
    """Refuse (StorageError, one line with the free space) a submission whose records could not
    be written: a job whose id cannot be recorded is a job nobody follows."""
    from .atomic import free_bytes, human_bytes

    try:
        need = float(os.environ.get("RECSYS_MIN_FREE_MB", MIN_FREE_MB)) * 1024 * 1024
    except ValueError:
        raise RequestError(f"RECSYS_MIN_FREE_MB: {os.environ['RECSYS_MIN_FREE_MB']!r} is not a number") from None
    free = free_bytes(runs_dir)
    if need > 0 and free is not None and free < need:
        raise StorageError(f"--runs-dir: {runs_dir}: only {human_bytes(free)} free on its file system, "
                           f"{human_bytes(need)} needed for the records and logs of a run "
                           "(RECSYS_MIN_FREE_MB); nothing submitted")


def make_private_dir(path, group=None, parents=False):
    """Create a run or study directory readable by its owner only (mode 0700), or, with `group`
    (the profile's defaults.runs_group), by that group too (2750, group-owned, setgid so what is
    created inside keeps the group): the scripts and records hold the profile's env values.
    Raises FileExistsError when it exists (names are claimed with one mkdir)."""
    if parents:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    os.mkdir(path, 0o700)
    if group:
        import grp

        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            os.rmdir(path)
            raise RequestError(f"defaults.runs_group: no Unix group {group!r} on this host") from None
        try:
            os.chown(path, -1, gid)
        except OSError as exc:      # not a member of that group
            os.rmdir(path)
            raise RequestError(f"defaults.runs_group: cannot give {path!r} to group {group!r}: {exc.strerror} "
                               "(you must be a member of it)") from None
        os.chmod(path, 0o2750)
        group_umask()
    else:
        os.chmod(path, 0o700)


def group_umask() -> int:
    """Clear the group's read and search bits from the process umask (and set its write bit),
    whatever the user's umask (077 included): everything this process writes from now on in a
    runs_group directory (records, scripts, logs/, the frozen profile) is readable by the group,
    never writable by it, and the jobs it submits write their logs so too (sbatch passes its umask
    on to the job: SLURM_UMASK). Others' bits stay the user's: the 2750 directory keeps others
    out. Called once a group's directory is made or taken; the process keeps writing into it.
    Returns the new umask."""
    old = os.umask(0o077)
    new = (old & ~0o070) | 0o020
    os.umask(new)
    return new


def keep_group(path: str) -> None:
    """In a runs_group directory of this user's (setgid, group-readable: make_private_dir), work
    under group_umask from now on: a later command (status, report) that writes records into it
    keeps them readable by the group whatever the user's umask."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if st.st_uid == os.geteuid() and st.st_mode & stat.S_ISGID and st.st_mode & stat.S_IRGRP:
        group_umask()


def check_runs_dir(runs_dir):
    """Refuse (one line naming --runs-dir) a runs dir that is, or lies under, something other
    than a directory, before anything is rendered or created."""
    path = os.path.abspath(runs_dir)
    if "%" in path:     # sbatch expands %j, %x, ... in --output: the job would die with no log
        raise RequestError(f"--runs-dir: {runs_dir!r} contains '%', which Slurm expands in the job log "
                           "paths; choose a directory without it")
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        what = ("exists and is not a directory" if probe == path
                else f"lies under {probe!r}, which is not a directory")
        raise RequestError(f"--runs-dir: {runs_dir!r} {what}")
    return path


def new_run_dir(runs_dir, name, create=True, group=None):
    """A fresh directory `<runs_dir>/<name>-<timestamp>[-n]` (created with logs/ when `create`,
    private to its owner or `group`: make_private_dir)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = os.path.join(check_runs_dir(runs_dir), f"{name}-{stamp}")
    path, n = base, 1
    while True:
        if not create:
            if not os.path.exists(path):
                return path
        else:
            try:        # claim the name with one mkdir: concurrent submissions never share a run dir
                make_private_dir(path, group, parents=True)
            except FileExistsError:
                pass
            except OSError as exc:
                raise RequestError(f"--runs-dir: cannot create {path!r}: {exc.strerror}") from None
            else:
                os.mkdir(os.path.join(path, "logs"))
                try:    # the new entry outlives a crash of the host, as the durable records in it do
                    fsync_dir(os.path.dirname(path))
                except OSError as exc:
                    raise RequestError(f"--runs-dir: cannot sync {os.path.dirname(path)!r}: {exc.strerror}") from None
                return path
        n += 1
        path = f"{base}-{n}"


def find_run(run=None, runs_dir=None):
    """Resolve a run argument: a path, a name under the runs dir, or (None) the newest run."""
    runs_dir = runs_dir or default_runs_dir()
    if run:
        for candidate in (run, os.path.join(runs_dir, run)):
            if os.path.isfile(os.path.join(candidate, "jobs.json")):
                keep_group(candidate)
                return os.path.abspath(candidate)
        raise RequestError(f"run: {run!r} is not a run directory (no jobs.json; runs dir {runs_dir})")
    if os.path.isdir(runs_dir):
        runs = [os.path.join(runs_dir, d) for d in os.listdir(runs_dir)
                if os.path.isfile(os.path.join(runs_dir, d, "jobs.json"))]
        if runs:
            newest = max(runs, key=os.path.getmtime)
            keep_group(newest)
            return os.path.abspath(newest)
    raise RequestError(f"run: no runs under {runs_dir}; give a run directory")


def lock_held(path):
    """Whether a process holds an flock on `path` now (a `study run` its study's run.lock, a
    submitter its run's submit.lock): True, False (no such file, or nobody holds it) or None (it
    cannot be read). The probe opens the file read-only and asks for a shared lock without
    waiting, so a user who may only read the directory can ask too; the kernel drops a lock when
    its process dies, kill -9 included. A holder that asks for its lock at that very moment must
    retry briefly (LOCK_RETRY_S)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return True if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
    finally:
        os.close(fd)        # also lets go of the shared lock, if it was granted
    return False


LOCK_RETRY_S = 1.0      # how long an exclusive locker retries while a lock_held probe holds it


def lock_exclusive(fd, retry_s=LOCK_RETRY_S):
    """flock(LOCK_EX) without blocking on a real holder: retried for `retry_s` seconds, since a
    lock_held probe holds a shared lock for microseconds. Raises BlockingIOError when another
    process holds it, StorageError (one line naming the directory: no_flock_error) on a file
    system without flock."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)    # a probe lets go within microseconds; a real holder keeps it
        except OSError as exc:
            if exc.errno in NO_FLOCK:
                raise no_flock_error(_fd_dir(fd), exc) from None
            raise


def _owner_name(uid):
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check_private(path: str, st: Optional[os.stat_result] = None, what: str = "study or run directory") -> None:
    """Refuse (StorageError, one line naming the path, its owner and mode) a study or run
    directory, or a file the toolkit opens in one, that is a symbolic link, that another user owns
    or that group or others may write: a name in a shared runs dir can be taken first by anyone
    who may write there (study names come from the spec), and their files must never be run,
    truncated or trusted. `st`: the path's lstat (or its descriptor's fstat), if already known."""
    if st is None:
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise StorageError(f"{what} {path}: cannot be read ({exc.strerror})") from None
    euid = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        why = "is a symbolic link"
    elif st.st_uid != euid:
        why = f"belongs to another user, not to you ({_owner_name(euid)})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = "may be written by " + ("its group and others" if st.st_mode & stat.S_IWGRP and
                                     st.st_mode & stat.S_IWOTH else "others" if st.st_mode & stat.S_IWOTH
                                     else "its group")
    else:
        return
    raise StorageError(f"{what} {path} {why} (owner {_owner_name(st.st_uid)}, mode "
                       f"{stat.filemode(st.st_mode)} {stat.S_IMODE(st.st_mode):04o}); refused: only what you own "
                       "and nobody else may write is used (choose another --runs-dir or study name, or remove "
                       "it)")


# flock's errors on a file system that has no flock: Lustre mounted noflock (ENOSYS), NFS without
# lockd (ENOLCK), others (EOPNOTSUPP)
NO_FLOCK = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP)


def no_flock_error(directory: str, exc: OSError) -> StorageError:
    """The one line of a lock that the file system of `directory` cannot take."""
    return StorageError(f"{directory}: its file system does not lock files (flock: {exc.strerror or exc}), "
                        "which the runs directory needs so that nothing is submitted twice; mount it with "
                        "flock (Lustre: -o flock; NFS: with lockd running) or choose a --runs-dir "
                        "(RECSYS_RUNS_DIR, defaults.runs_dir) on a file system that has it")


def _fd_dir(fd):
    try:
        return os.path.dirname(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return "the runs directory"


def open_lock(path: str, private_dir: bool = True) -> int:
    """Open (creating it, mode 0644 under the umask) the lock file `path`, never through a link
    (O_NOFOLLOW), and refuse in one line (check_private) a lock file, or with `private_dir` its
    directory, that another user owns or may write. Returns the descriptor (not locked yet:
    lock_exclusive). `private_dir=False`: a lock in the runs dir itself, which may be shared."""
    directory = os.path.dirname(path) or "."
    if private_dir:
        check_private(directory)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            check_private(path, what="lock file")       # a planted link: said as such
        raise StorageError(f"cannot open the lock {path}: {exc.strerror}") from None
    try:
        check_private(path, os.fstat(fd), what="lock file")
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def holding(path: str, retry_s: float = LOCK_RETRY_S, private_dir: bool = True) -> Iterator[int]:
    """The lock file `path` opened (open_lock) and held exclusively (lock_exclusive) for the
    block; yields its descriptor. BlockingIOError when another process holds it."""
    fd = open_lock(path, private_dir)
    try:
        lock_exclusive(fd, retry_s)
        yield fd
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
