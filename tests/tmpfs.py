"""Small file systems for the full-disk tests: a real tmpfs (mounting needs root, which the suite
runs as under tests/run.sh and CI; elsewhere the test is skipped), filled on purpose."""

import contextlib
import os
import subprocess

import pytest


@contextlib.contextmanager
def small_tmpfs(path, size):
    """A tmpfs of `size` (mount's syntax: 64k, 1m) mounted at `path` (created), unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(mnt, leave=0):
    """Fill the file system of `mnt` (a file `filler`) until `leave` bytes are free."""
    st = os.statvfs(mnt)
    with open(os.path.join(mnt, "filler"), "wb") as handle:
        handle.write(b"\0" * (st.f_bavail * st.f_frsize - leave))
    st = os.statvfs(mnt)
    assert st.f_bavail * st.f_frsize == leave


def fill_command(mnt):
    """A shell command that fills the file system of `mnt` (for RECSYS_FAULT_CMD)."""
    return f"cat /dev/zero > {mnt}/filler 2>/dev/null; true"
