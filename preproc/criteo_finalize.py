"""Finalize stage: assemble the shards into the DLRM split-binary dataset, its feature spec and size report.

Pieces are concatenated in input order (day, then line). Training days go to
``train/``; the last day's rows are cut at ``floor(n/2)``: the first part to
``test/``, the rest to ``validation/``. Files are copied with
``os.copy_file_range`` (no user-space copy), several at a time. The dataset is
assembled in a temporary sibling of the output, verified (the feature spec
validates with ``recsys.feature_spec`` and each mapping has the number of rows
the shards counted, so every file has exactly rows x record size bytes) and only
then renamed to the output; the staging directory is removed afterwards unless
``keep_stages``. The dictionaries move to ``<output>/dictionary/``.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import shutil
from pathlib import Path

from preproc.criteo_dictionary import load_dictionary_meta
from preproc.criteo_layout import (CAT_FEATURES, EMBEDDING_DIM, INT_FEATURES, MAPPINGS, REPORT_THRESHOLDS,
                                   TRANSFORM_DOC, Staging, categorical_dtype, embedding_gib, format_bytes, test_rows)
from preproc.criteo_transform import load_shards, record_sizes
from preproc.errors import PreprocError
from preproc.output import atomic_dir, verify_against_spec

log = logging.getLogger("preproc.criteo")


def plan_mappings(pieces: list[dict], last_file_idx: int) -> dict[str, list[tuple[dict, int, int]]]:
    """{mapping: [(piece, first row, end row)]} in output order (pieces already in input order)."""
    plan = {m: [] for m in MAPPINGS}
    last = [p for p in pieces if p["file_idx"] == last_file_idx]
    cut = test_rows(sum(p["rows"] for p in last))
    for piece in pieces:
        if piece["file_idx"] != last_file_idx:
            plan["train"].append((piece, 0, piece["rows"]))
    start = 0
    for piece in last:
        end = start + piece["rows"]
        if start < cut:
            plan["test"].append((piece, 0, min(end, cut) - start))
        if end > cut:
            plan["validation"].append((piece, max(cut - start, 0), piece["rows"]))
        start = end
    return plan


def _concatenate(target: Path, parts: list[tuple[Path, int, int]]) -> int:
    """Write ``parts`` [(file, byte offset, byte count)] one after the other into ``target``."""
    written = 0
    with open(target, "wb") as out:
        for path, offset, count in parts:
            with open(path, "rb") as src:
                left = count
                while left > 0:
                    try:
                        n = os.copy_file_range(src.fileno(), out.fileno(), left, offset + count - left)
                    except (OSError, AttributeError):
                        src.seek(offset + count - left)
                        out.write(src.read(left))
                        n = left
                    if n == 0:
                        raise OSError(f"{path}: shorter than expected")
                    left -= n
            written += count
    return written


def feature_spec_dict(cardinalities: list[int], rows: dict[str, int], meta: dict) -> dict:
    """The DLRM feature spec (hpc-facts section 4) of the assembled dataset."""
    features = {"label": {"dtype": "bool"}}
    features.update({name: {"dtype": "float16"} for name in INT_FEATURES})
    features.update({name: {"dtype": categorical_dtype(card), "cardinality": int(card)}
                     for name, card in zip(CAT_FEATURES, cardinalities)})
    source = {}
    for mapping in MAPPINGS:
        chunks = [{"type": "split_binary", "features": ["label"], "files": [f"{mapping}/label.bin"]},
                  {"type": "split_binary", "features": list(INT_FEATURES), "files": [f"{mapping}/numerical.bin"]}]
        chunks += [{"type": "split_binary", "features": [name], "files": [f"{mapping}/{name}.bin"]}
                   for name in CAT_FEATURES]
        source[mapping] = chunks
    channels = {"label": ["label"], "numerical": list(INT_FEATURES), "categorical": list(CAT_FEATURES)}
    metadata = {"dataset": "criteo", "numerical_transform": TRANSFORM_DOC,
                "thresholds": meta["thresholds"], "rows": rows,
                "days": len(meta["files"]), "split": "days 0..D-2 train; last day: first floor(n/2) rows test, "
                                                     "rest validation",
                "dictionary_order": "descending frequency, ties by ascending value, ids from 1; 0 = rare/missing"}
    return {"feature_spec": features, "source_spec": source, "channel_spec": channels, "metadata": metadata}


def write_feature_spec(spec: dict, directory: Path) -> None:
    from recsys.feature_spec import FeatureSpec

    FeatureSpec(spec["feature_spec"], spec["source_spec"], spec["channel_spec"], spec["metadata"],
                base_directory=str(directory)).to_yaml(str(directory / "feature_spec.yaml"))


def size_report(meta: dict, rows: dict[str, int], file_bytes: dict[str, dict[str, int]]) -> dict:
    """Rows, bytes per file and embedding sizes (dim 128, fp32) at the chosen and the reference thresholds."""
    tables = {"chosen": embedding_gib(meta["cardinalities"])}
    for t in REPORT_THRESHOLDS:
        tables[f"T={t}"] = embedding_gib(meta["cardinality_at"][str(t)])
    return {"rows": rows, "bytes": file_bytes, "cardinalities": meta["cardinalities"],
            "thresholds": meta["thresholds"], "embedding_dim": EMBEDDING_DIM, "embedding_gib_fp32": tables,
            "embedding_rows": {"chosen": sum(meta["cardinalities"]),
                               **{f"T={t}": sum(meta["cardinality_at"][str(t)]) for t in REPORT_THRESHOLDS}},
            "bad_rows": meta.get("bad_rows_total", 0)}


def format_report(report: dict) -> str:
    lines = ["mapping      rows        bytes"]
    for mapping in MAPPINGS:
        total = format_bytes(sum(report["bytes"][mapping].values()))
        lines.append(f"{mapping:<11}{report['rows'][mapping]:>12,} {total:>12}")
    lines.append("file             " + "  ".join(f"{m:>12}" for m in MAPPINGS))
    for file in report["bytes"]["train"]:
        lines.append(f"{file:<17}" + "  ".join(f"{format_bytes(report['bytes'][m][file]):>12}" for m in MAPPINGS))
    lines.append(f"embedding tables (dim {report['embedding_dim']}, fp32):")
    for key, gib in report["embedding_gib_fp32"].items():
        lines.append(f"  {key:<7} {report['embedding_rows'][key]:>14,} rows {gib:>12.4f} GiB")
    lines.append(f"bad rows skipped: {report['bad_rows']}")
    return "\n".join(lines)


def finalize(staging: Staging, overwrite: bool, keep_stages: bool = False, copy_threads: int = 8) -> dict:
    """Assemble, verify and publish the dataset at ``staging.output``; returns the size report."""
    meta = load_dictionary_meta(staging)
    manifests = load_shards(staging, meta)
    pieces = sorted((p for m in manifests for p in m["pieces"]),
                    key=lambda p: (p["file_idx"], p["block"], p["first_pos"]))
    covered = sorted(idx for m in manifests for idx in m["file_idx"])
    expected = sorted(f["file_idx"] for f in meta["files"])
    if covered != expected:
        raise PreprocError(f"{staging.shards}: shards cover files {covered}, the dictionary lists {expected}")
    last_file_idx = max(f["file_idx"] for f in meta["files"] if f["day"] == meta["last_day"])
    plan = plan_mappings(pieces, last_file_idx)
    sizes = record_sizes(meta["cardinalities"])
    rows = {m: sum(end - start for _, start, end in plan[m]) for m in MAPPINGS}
    bad_total = sum(v["bad_rows"] for m in manifests for v in m["bad_rows"].values())
    meta = dict(meta, bad_rows_total=bad_total)
    spec = feature_spec_dict(meta["cardinalities"], rows, meta)
    file_bytes = {m: {} for m in MAPPINGS}

    def verify(directory: Path) -> None:
        verify_against_spec(directory, rows)

    with atomic_dir(staging.output, overwrite=overwrite, verify=verify) as tmp:
        jobs = []
        for mapping in MAPPINGS:
            (tmp / mapping).mkdir()
            for file, size in sizes.items():
                parts = [(Path(piece["dir"]) / file, start * size, (end - start) * size)
                         for piece, start, end in plan[mapping] if end > start]
                jobs.append((mapping, file, tmp / mapping / file, parts))
        log.info("finalize: writing %d files (%s rows)", len(jobs), rows)
        with concurrent.futures.ThreadPoolExecutor(copy_threads) as pool:
            futures = {pool.submit(_concatenate, target, parts): (mapping, file)
                       for mapping, file, target, parts in jobs}
            for future in concurrent.futures.as_completed(futures):
                mapping, file = futures[future]
                file_bytes[mapping][file] = future.result()
        file_bytes = {m: {f: file_bytes[m][f] for f in sizes} for m in MAPPINGS}
        write_feature_spec(spec, tmp)
        report = size_report(meta, rows, file_bytes)
        (tmp / "size_report.json").write_text(json.dumps(report, indent=1))
        (tmp / "size_report.txt").write_text(format_report(report) + "\n")
        shutil.copytree(staging.dictionary, tmp / "dictionary")
    if not keep_stages:
        shutil.rmtree(staging.root, ignore_errors=True)
    log.info("finalize: wrote %s\n%s", staging.output, format_report(report))
    return report
