"""Input checks and all-or-nothing outputs for the preprocessing stages.

* ``input_files`` / ``check_output_free`` run before Spark starts and raise a
  one-line ``PreprocError`` for a missing or empty input or an output that exists
  without ``--overwrite``.
* ``atomic_dir(final)`` hands out a temporary directory next to ``final`` (same
  parent, so the same file system and ``rename`` is atomic), runs a verification
  callback on it, and only then renames it to ``final``. On any error the
  temporary directory is removed; a killed process leaves only a hidden
  ``.<name>.tmp-*`` sibling, which the next writer of the same output removes
  (one writer per output path at a time, which the stage layout guarantees).
  Replacing an existing ``final`` (``overwrite=True``) renames it aside first and
  deletes it after the new one is in place.
* ``verify_against_spec(dir, expected_rows)`` is the verification the stages
  use: the directory's ``feature_spec.yaml`` must validate with
  ``recsys.feature_spec`` (every file present, byte size a whole number of rows,
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

from preproc.errors import PreprocError

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


def temp_sibling(final: Path, tag: str = "tmp") -> Path:
    return final.parent / f".{final.name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def remove_stale_temps(final: Path) -> None:
    """Remove what a killed writer of ``final`` left behind."""
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        log.warning("removing stale temporary output %s", stale)
        shutil.rmtree(stale, ignore_errors=True)


def publish(tmp: Path, final: Path, overwrite: bool) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` is replaced only with ``overwrite``."""
    old = None
    if final.exists():
        if not overwrite:
            raise PreprocError(f"{final}: output appeared while writing (pass --overwrite to replace it)")
        old = temp_sibling(final, "old")
        os.rename(final, old)
    os.rename(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


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
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def verify_against_spec(directory: str | os.PathLike, expected_rows: dict[str, int],
                        spec_files: tuple[str, ...] = ("feature_spec.yaml",)) -> dict[str, int]:
    """Validate each spec file of ``directory`` that exists (files present, whole rows); the rows
    per mapping over all of them must match ``expected_rows``."""
    from recsys.feature_spec import FeatureSpec, FeatureSpecError

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
