"""The one temporary-file scheme of the tree: a file is replaced whole (temporary name, then rename),
so a crash never leaves one half-written, and a durable write survives a crash of the host too.

Every writer that replaces a file whole uses it: the submission layer's records and scripts
(jobs.runs.atomic), the hardware sampler's node files (slurm/hwsample.py) and the checkpoints'
JSON files (recsys.checkpoints.atomic). Standard library only: `slurm/` is the leaf both the engines and
the submission layer may import (setup.cfg).

The temporary is `.<name>.tmp.<host>-<pid>.<random>` beside the target, created exclusively
(O_CREAT|O_EXCL|O_NOFOLLOW: tempfile.mkstemp), so nobody who can write into the directory can
plant a link that makes the writer overwrite another file. A `durable` write fsyncs the file
before the rename and the directory after it: without the second, a power loss can undo the
rename although the file's data reached the disk. A killed writer's temporary is removed by the
next write of the same file: at once when its writer ran on this host and is gone, else once it
is older than STALE_S (no writer holds its temporary that long).
"""

import contextlib
import errno
import os
import socket
import tempfile
import time

TMP = ".tmp."
STALE_S = 600.0
# errors of a file system that cannot fsync a directory (some FUSE and network mounts): the
# rename stands, only its durability is what the file system gives
_NO_DIR_SYNC = (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EACCES)


def _host():
    return socket.gethostname().split(".")[0] or "host"


def umask():
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


def temp_prefix(name):
    """The start of every temporary name of the file `name` (a base name)."""
    return f".{name}{TMP}"


def fsync_dir(directory):
    """Make a rename (or a new entry) in `directory` durable. Returns False on a file system that
    cannot sync a directory; other errors (EIO) are raised."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _NO_DIR_SYNC:
            return False
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno in _NO_DIR_SYNC:
            return False
        raise
    finally:
        os.close(fd)
    return True


def _writer_gone(rest, host, now, mtime):
    """Whether the writer of a temporary named `<prefix><rest>` can no longer rename it."""
    if now - mtime > STALE_S:
        return True
    owner, _, _ = rest.rpartition(".")
    where, _, pid = owner.rpartition("-")
    if where != host or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False    # alive, another user's
    return False


def remove_stale(path):
    """Remove the temporaries of `path` that killed writers left (see the module doc); returns
    their names. Best effort: a directory that cannot be listed is left as it is."""
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    prefix, host, now, removed = temp_prefix(name), _host(), time.time(), []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            mtime = entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if _writer_gone(entry.name[len(prefix):], host, now, mtime):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(entry.name)
    return removed


def stage(path, data, mode=None, durable=False):
    """`data` (bytes or str) written to an exclusive temporary beside `path`; returns its name.
    `mode`: the permission bits, under the umask (default 0666: what open() gives); `durable`:
    fsynced.
    The temporary is removed again when the write fails (the OSError is raised)."""
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    fd, tmp = tempfile.mkstemp(prefix=f"{temp_prefix(name)}{_host()}-{os.getpid()}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fchmod(handle.fileno(), (0o666 if mode is None else mode) & ~umask())
            if durable:
                os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def publish(tmp, path, durable=False):
    """Rename a staged temporary onto `path` (removed again when the rename fails); `durable`:
    the directory is fsynced after the rename."""
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(os.fspath(path))))


def write(path, data, mode=None, durable=False):
    """Replace `path` whole with `data` (bytes or str): stage, then publish; the temporaries of
    killed writers of the same file are removed first. Raises OSError; nothing is left of a
    failed write."""
    remove_stale(path)
    publish(stage(path, data, mode, durable), path, durable)
