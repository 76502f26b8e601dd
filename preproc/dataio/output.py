"""Input checks and all-or-nothing outputs for the preprocessing stages.

* ``input_files`` / ``check_output_free`` run before Spark starts and raise a
  one-line ``PreprocError`` for a missing or empty input or an output that exists
  without ``--overwrite``.
* ``atomic_dir(final)`` hands out a temporary directory next to ``final`` (same
  parent, so the same file system and ``rename`` is atomic), runs a verification
  callback on it, and only then renames it to ``final``. On any error the
  temporary directory is removed (a full disk becomes one ``OutputError`` line naming
  ``final``, exit 1); a killed process leaves only a hidden
  ``.<name>.tmp-*`` sibling, which the next writer of the same output removes
  (one writer per output path at a time, which the stage layout guarantees).
  Replacing an existing ``final`` (``overwrite=True``) swaps the two directories in one
  atomic step (``renameat2(RENAME_EXCHANGE)``) and then deletes the old one; where that is not
  available it renames the old one aside first, and a writer killed between the two renames
  has its previous output put back by the next writer.
* ``verify_against_spec(dir, expected_rows)`` is the verification the stages
  use: the directory's ``feature_spec.yaml`` must validate with
  ``recsys.features.spec`` (every file present, byte size a whole number of rows,
  all chunks of a mapping the same number of rows) and the rows per mapping must
  equal what the Spark job counted. A marker file is never trusted.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable, Iterator

from preproc.errors import OutputError, PreprocError

log = logging.getLogger("preproc.output")


def add_output_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--output", required=required, help="output directory (written atomically)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")


def input_files(path: str | os.PathLike, what: str = "--input") -> list[Path]:
    """Sorted non-hidden regular files of ``path`` (a file or a directory); one-line error when none."""
    path = Path(path)
    if not path.exists():
        raise PreprocError(f"{what}: {path}: no such file or directory")
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_")))
        if not files:
            raise PreprocError(f"{what}: {path}: directory holds no input files")
    empty = [f for f in files if f.stat().st_size == 0]
    if empty:
        raise PreprocError(f"{what}: {empty[0]}: input file is empty")
    return files


def check_output_free(path: str | os.PathLike, overwrite: bool, what: str = "--output") -> None:
    """One-line error if ``path`` exists and ``overwrite`` is not set, or its parent is not a directory."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise PreprocError(f"{what}: {path}: output exists (pass --overwrite to replace it)")
    if path.exists() and not path.is_dir():
        raise PreprocError(f"{what}: {path}: exists and is not a directory")
    parent = path.absolute().parent
    if parent.exists() and not parent.is_dir():
        raise PreprocError(f"{what}: {parent}: parent is not a directory")


def read_json(path: str | os.PathLike, what: str, remedy: str) -> dict:
    """A stage's JSON record; a missing or damaged one is a one-line ``PreprocError`` naming it and the remedy."""
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise PreprocError(f"{path}: {what} missing ({remedy})") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PreprocError(f"{path}: {what} damaged: {str(exc).splitlines()[0]} ({remedy})") from None
    if not isinstance(data, dict):
        raise PreprocError(f"{path}: {what} damaged: not a JSON object ({remedy})")
    return data


def temp_sibling(final: Path, tag: str = "tmp") -> Path:
    return final.parent / f".{final.name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def remove_stale_temps(final: Path) -> None:
    """Clear what a killed writer of ``final`` left behind: temporary directories are removed; a
    previous output set aside by an interrupted ``publish`` (``final`` itself missing) is put back."""
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        log.warning("removing stale temporary output %s", stale)
        shutil.rmtree(stale, ignore_errors=True)
    for old in sorted(final.parent.glob(f".{final.name}.old-*"), key=lambda p: p.stat().st_mtime, reverse=True):
        if not final.exists():
            log.warning("restoring the previous output %s from %s (its replacement was interrupted)", final, old)
            os.rename(old, final)
        else:
            shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where
    the C library or the file system cannot."""
    import ctypes
    import errno

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def publish(tmp: Path, final: Path, overwrite: bool) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` is replaced only with ``overwrite``, in one
    atomic swap where the system can (the old output then sits at ``tmp``, which the caller removes),
    so that no moment exists without a complete ``final``."""
    if final.exists():
        if not overwrite:
            raise PreprocError(f"{final}: output appeared while writing (pass --overwrite to replace it)")
        if _exchange(tmp, final):
            return
        old = temp_sibling(final, "old")
        os.rename(final, old)       # a kill here leaves only .old: remove_stale_temps puts it back
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        return
    os.rename(tmp, final)


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike, overwrite: bool = False,
               verify: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """Yield a temporary directory; on success verify it and rename it to ``final``."""
    final = Path(final).absolute()
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(final)
    tmp = temp_sibling(final)
    tmp.mkdir()
    try:
        yield tmp
        if verify is not None:
            verify(tmp)
        publish(tmp, final, overwrite)
    except Exception as exc:
        if not disk_full(exc):
            raise
        written = _bytes_under(tmp)
        total = shutil.disk_usage(final.parent).total
        kept = ", the previous output untouched" if final.exists() else ""
        raise OutputError(f"{final}: no space left on device after writing {_format(written)} of it "
                          f"(file system of {_format(total)}); nothing published{kept}, the temporary "
                          "removed") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


NO_SPACE = ("no space left on device", "disk quota exceeded")


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` or an exception it came from is ENOSPC/EDQUOT, in this process or reported by
    Spark (a Java ``IOException`` or a Python worker's ``OSError``, as text in the Py4J error)."""
    import errno

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        try:
            text = str(exc).lower()
        except Exception:  # a Py4J error whose JVM is gone
            text = ""
        if any(marker in text for marker in NO_SPACE):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _bytes_under(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _format(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n}"  # pragma: no cover


def verify_against_spec(directory: str | os.PathLike, expected_rows: dict[str, int],
                        spec_files: tuple[str, ...] = ("feature_spec.yaml",)) -> dict[str, int]:
    """Validate each spec file of ``directory`` that exists (files present, whole rows); the rows
    per mapping over all of them must match ``expected_rows``."""
    from recsys.features.spec import FeatureSpec, FeatureSpecError

    rows: dict[str, int] = {}
    for name in spec_files:
        path = os.path.join(directory, name)
        if name == spec_files[0] or os.path.exists(path):
            try:
                rows.update(FeatureSpec.from_yaml(path).validate())
            except FeatureSpecError as exc:
                raise PreprocError(f"verification failed: {exc}") from None
    for mapping, want in expected_rows.items():
        if rows.get(mapping) != want:
            raise PreprocError(f"verification failed: {directory}: mapping {mapping} has {rows.get(mapping)} rows "
                               f"on disk, the job produced {want}")
    return rows
