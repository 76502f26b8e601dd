"""All-or-nothing files: every record and script the submission layer writes goes through here
(temporary name, then rename: slurm/common/atomicfile.py, the tree's one scheme), so a crash never leaves
one half-written, and a killed writer's temporary is removed by the next write of the file.

The temporary is created exclusively (O_CREAT|O_EXCL|O_NOFOLLOW, a random name in the target's
directory), so nobody who can write into a shared run directory can plant a symlink that makes
the owner overwrite another file. A `durable` write is flushed to disk (fsync) before the rename
and its directory after it: what is written right before `sbatch` (a job's intent, a study's
point) must outlive a crash of the login node, rename included, not only of the process; caches
and reports, which a later look writes again, skip it (an fsync costs 1-9 ms here). A write that
fails (a full disk, a quota, a read-only directory) removes its temporary and raises
jobs.errors.StorageError: one line naming the file and, for a full disk, the space left. A
record is read back by read_json, which refuses (one line) a file larger than MAX_RECORD_BYTES
or nested deeper than MAX_DEPTH: a damaged or planted record costs no memory and no traceback.
"""

import contextlib
import errno
import json
import os
import stat

from jobs.errors import RequestError, StorageError
from slurm.common import atomicfile

FULL = (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path):
    """Bytes an unprivileged writer may still use on the file system holding `path` (the
    nearest existing directory above it); None when it cannot be asked."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def human_bytes(n):
    """`16 KiB`, `3.2 GiB`: a size for a message."""
    if n is None:
        return "unknown"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" or value >= 100 else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def storage_error(path, exc, what="cannot write"):
    """The one-line StorageError of an OSError met while writing `path`."""
    if exc.errno in FULL:
        return StorageError(f"{what} {path}: {exc.strerror} ({human_bytes(free_bytes(path))} free on its "
                            "file system); nothing of it was left")
    return StorageError(f"{what} {path}: {exc.strerror or exc}")


def _stage(path, data, mode=None, durable=False):
    """`data` written to an exclusive temporary beside `path` (removed again when that fails);
    returns the temporary's name."""
    path = os.fspath(path)
    try:
        return atomicfile.stage(path, data, mode=mode, durable=durable)
    except OSError as exc:
        raise storage_error(path, exc) from None


def write_bytes(path, data, mode=None, durable=False):
    """Write `data` (bytes) to `path` atomically. `mode`: the file's permission bits (default:
    what open() would give under the umask); `durable`: fsync the file before the rename and
    its directory after it. A killed writer's temporary of the same file is removed first."""
    atomicfile.remove_stale(path)
    tmp = _stage(path, data, mode, durable)
    try:
        atomicfile.publish(tmp, path, durable=durable)
    except OSError as exc:
        raise storage_error(os.fspath(path), exc) from None


def write_text(path, text, mode=None, durable=False):
    """Write a text file atomically (temporary name, then rename)."""
    write_bytes(path, text.encode("utf-8"), mode=mode, durable=durable)


def write_json(path, data, mode=None, durable=False):
    """Write JSON atomically (temporary name, then rename)."""
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n", mode=mode, durable=durable)


# a record larger than this, or nested deeper, is refused in one line (RECSYS_MAX_RECORD_MB overrides the size)
MAX_RECORD_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 64


def _max_bytes():
    value = os.environ.get("RECSYS_MAX_RECORD_MB", "")
    try:
        return int(float(value) * 1024 * 1024) if value else MAX_RECORD_BYTES
    except ValueError:
        raise RequestError(f"RECSYS_MAX_RECORD_MB: {value!r} is not a number") from None


def _depth_ok(data, limit):
    """Whether `data` (parsed JSON) nests at most `limit` containers deep (no recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return True


def read_json(path):
    """The JSON value of a record file. Raises OSError when it cannot be opened, ValueError (one
    line naming the file) for bad JSON, a file that is not a regular file, larger than
    MAX_RECORD_BYTES (read no further) or nested deeper than MAX_DEPTH."""
    limit = _max_bytes()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)     # a FIFO planted there must not hang us
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path}: not a regular file")
        if info.st_size > limit:
            raise ValueError(f"{path}: {human_bytes(info.st_size)}, larger than a record may be "
                             f"({human_bytes(limit)}, RECSYS_MAX_RECORD_MB); not read")
        raw = handle.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(f"{path}: larger than a record may be ({human_bytes(limit)}, RECSYS_MAX_RECORD_MB); "
                         "not read")
    deep = ValueError(f"{path}: nested deeper than a record may be ({MAX_DEPTH} levels); not read")
    try:
        data = json.loads(raw)
    except RecursionError:          # deeper than Python's own limit
        raise deep from None
    except ValueError as exc:       # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not _depth_ok(data, MAX_DEPTH):
        raise deep
    return data


def write_group(files):
    """Write several files as one: {path: bytes or str}. Every file is first written to its
    temporary; only when all were written are they renamed into place (none is replaced when
    any write fails, and the temporaries are removed): a report never pairs a new table with
    an old plot."""
    staged = []
    try:
        for path, data in files.items():
            atomicfile.remove_stale(path)
            staged.append((_stage(path, data), path))
        for tmp, path in staged:
            os.replace(tmp, path)
        staged = []
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
