"""All-or-nothing files: every record and script the submission layer writes goes through here
(temporary name, then rename), so a crash never leaves one half-written.

The temporary file is created exclusively (O_CREAT|O_EXCL|O_NOFOLLOW, a random name in the
target's directory: tempfile.mkstemp), so nobody who can write into a shared run directory can
plant a symlink that makes the owner overwrite another file. A `durable` write is flushed to
disk (fsync) before the rename: what is written right before `sbatch` (a job's intent, a study's
point) must outlive a crash of the login node, not only of the process; caches and reports,
which a later look writes again, skip it (an fsync costs 1-9 ms here). A write that fails (a full
disk, a quota, a read-only directory) removes its temporary and raises jobs.errors.StorageError:
one line naming the file and, for a full disk, the space left.
"""

import contextlib
import errno
import json
import os
import tempfile

from jobs.errors import StorageError

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


def _umask():
    """The process umask, read without changing it (Linux /proc), else through os.umask."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _stage(path, data, mode=None, durable=False):
    """`data` written to an exclusive temporary beside `path` (removed again when that fails);
    returns the temporary's name."""
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.tmp.", dir=directory)
    except OSError as exc:
        raise storage_error(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fchmod(handle.fileno(), (0o666 if mode is None else mode) & ~_umask())
            if durable:
                os.fsync(handle.fileno())
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise storage_error(path, exc) from None
        raise
    return tmp


def write_bytes(path, data, mode=None, durable=False):
    """Write `data` (bytes) to `path` atomically. `mode`: the file's permission bits (default:
    what open() would give under the umask); `durable`: fsync before the rename."""
    tmp = _stage(path, data, mode, durable)
    try:
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise storage_error(os.fspath(path), exc) from None


def write_text(path, text, mode=None, durable=False):
    """Write a text file atomically (temporary name, then rename)."""
    write_bytes(path, text.encode("utf-8"), mode=mode, durable=durable)


def write_json(path, data, mode=None, durable=False):
    """Write JSON atomically (temporary name, then rename)."""
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n", mode=mode, durable=durable)


def read_json(path):
    with open(path) as handle:
        return json.load(handle)


def write_group(files):
    """Write several files as one: {path: bytes or str}. Every file is first written to its
    temporary; only when all were written are they renamed into place (none is replaced when
    any write fails, and the temporaries are removed): a report never pairs a new table with
    an old plot."""
    staged = []
    try:
        for path, data in files.items():
            staged.append((_stage(path, data), path))
        for tmp, path in staged:
            os.replace(tmp, path)
        staged = []
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
