"""Finalize stage: assemble the shards into the DLRM split-binary dataset, its feature specs and size report.

The transform already decided each row's mapping (train / test / validation,
the last day cut at half of its raw lines). Per mapping, pieces are written in
output order: input-order pieces by (day, line), shuffle buckets in bucket
order. A bucket written by one shard is copied as is; a bucket written by
several shards (array mode) is merged by (key, file, line) from the pieces'
``order.bin``, which gives the bytes of a one-shard run. Files are copied with
``os.copy_file_range`` (no user-space copy), several at a time. The dataset is
assembled in a temporary sibling of the output, verified (the feature specs
validate with ``recsys.features.spec`` and each mapping has the number of rows
the shards counted, so every file has exactly rows x record size bytes) and
only then renamed to the output; the staging directory is removed afterwards
unless ``keep_stages``. The dictionaries move to ``<output>/dictionary/``.

Feature specs (``Rules.spec_layout``): ``reference`` writes
``feature_spec.yaml`` with exactly the mappings ``train`` and ``test`` (NVIDIA's
DLRM loaders assert this) and ``feature_spec_validation.yaml`` with
``validation`` (named in the first one's ``metadata.mapping_specs``, which
``recsys.features.spec`` follows); ``combined`` writes one spec with all three.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np

from preproc.criteo.dictionary import load_dictionary_meta
from preproc.criteo.layout import (CAT_FEATURES, EMBEDDING_DIM, INT_FEATURES, MAPPINGS, NUMERICAL_RULES,
                                   REPORT_THRESHOLDS, VALIDATION_SPEC, Rules, Staging, categorical_dtype,
                                   embedding_gib, format_bytes)
from preproc.criteo.transform import ORDER_FILE, load_shards, piece_order, record_sizes
from preproc.dataio.output import atomic_dir, verify_against_spec
from preproc.errors import PreprocError

log = logging.getLogger("preproc.criteo")
SPEC_FILE = "feature_spec.yaml"


def plan_mappings(pieces: list[dict]) -> dict[str, list[list[dict]]]:
    """{mapping: [segment]} in output order; a segment is the pieces of one bucket (merged) or one piece."""
    plan = {m: [] for m in MAPPINGS}
    by_bucket = {}
    for piece in sorted(pieces, key=piece_order):
        if piece["bucket"] < 0:
            plan[piece["mapping"]].append([piece])
        else:
            by_bucket.setdefault((piece["mapping"], piece["bucket"]), []).append(piece)
    for (mapping, _), segment in sorted(by_bucket.items()):
        plan[mapping].append(segment)
    return plan


def _copy_range(src_path: Path, out, offset: int, count: int) -> None:
    with open(src_path, "rb") as src:
        left = count
        while left > 0:
            try:
                n = os.copy_file_range(src.fileno(), out.fileno(), left, offset + count - left)
            except (OSError, AttributeError):
                src.seek(offset + count - left)
                out.write(src.read(left))
                out.flush()
                n = left
            if n == 0:
                raise OSError(f"{src_path}: shorter than expected")
            left -= n


def merge_order(segment: list[dict]) -> np.ndarray:
    """Row order of a bucket written by several shards: by (key, file, line), as one shard sorts it."""
    order = np.concatenate([np.fromfile(Path(p["dir"]) / ORDER_FILE, dtype=np.int64).reshape(-1, 3)
                            for p in segment])
    return np.lexsort((order[:, 2], order[:, 1], order[:, 0]))


def _write_mapping(directory: Path, segments: list[list[dict]], sizes: dict[str, int], dtypes: dict[str, str],
                   pool: concurrent.futures.Executor) -> dict[str, int]:
    """Write every file of one mapping; returns bytes per file."""
    handles = {file: open(directory / file, "wb") for file in sizes}
    try:
        for segment in segments:
            if len(segment) == 1:
                piece = segment[0]
                jobs = [pool.submit(_copy_range, Path(piece["dir"]) / file, handles[file], 0, piece["rows"] * size)
                        for file, size in sizes.items()]
            else:
                order = merge_order(segment)

                def merged(file, order=order, segment=segment):
                    data = np.concatenate([np.fromfile(Path(p["dir"]) / file, dtype=dtypes[file])
                                           .reshape(p["rows"], -1) for p in segment])
                    handles[file].write(np.ascontiguousarray(data[order]).tobytes())
                    handles[file].flush()

                jobs = [pool.submit(merged, file) for file in sizes]
            for job in jobs:
                job.result()
    finally:
        for handle in handles.values():
            handle.close()
    return {file: (directory / file).stat().st_size for file in sizes}


def feature_spec_dict(cardinalities: list[int], rows: dict[str, int], meta: dict,
                      mappings=MAPPINGS) -> dict:
    """The DLRM feature spec (hpc-facts section 4) of ``mappings`` of the assembled dataset."""
    rules = Rules.from_dict(meta["rules"])
    features = {"label": {"dtype": "bool"}}
    features.update({name: {"dtype": "float16"} for name in INT_FEATURES})
    features.update({name: {"dtype": categorical_dtype(card), "cardinality": int(card)}
                     for name, card in zip(CAT_FEATURES, cardinalities)})
    source = {}
    for mapping in mappings:
        chunks = [{"type": "split_binary", "features": ["label"], "files": [f"{mapping}/label.bin"]},
                  {"type": "split_binary", "features": list(INT_FEATURES), "files": [f"{mapping}/numerical.bin"]}]
        chunks += [{"type": "split_binary", "features": [name], "files": [f"{mapping}/{name}.bin"]}
                   for name in CAT_FEATURES]
        source[mapping] = chunks
    channels = {"label": ["label"], "numerical": list(INT_FEATURES), "categorical": list(CAT_FEATURES)}
    dictionary_days = ("all days (test day included, as the reference)" if rules.dictionary_days == "all"
                       else "training days only")
    metadata = {"dataset": "criteo", "numerical_transform": NUMERICAL_RULES[rules.numerical],
                "rules": dict(meta["rules"]), "thresholds": meta["thresholds"],
                "rows": {m: rows[m] for m in mappings},
                "days": len(meta["files"]), "split": "days 0..D-2 train; last day cut at floor(lines/2) of its "
                                                     "raw lines: first part test, rest validation",
                "train_order": ("shuffled by a seeded hash of (file, line)" if rules.train_order == "shuffle"
                                else "input order (day, line)"),
                "dictionary_order": f"counts over {dictionary_days}; descending frequency, ties by ascending "
                                    "value, ids from 1; 0 = rare/missing"}
    return {"feature_spec": features, "source_spec": source, "channel_spec": channels, "metadata": metadata}


def feature_specs(cardinalities: list[int], rows: dict[str, int], meta: dict) -> dict[str, dict]:
    """{file name: spec dict} of the dataset's feature specs, by ``Rules.spec_layout``."""
    if Rules.from_dict(meta["rules"]).spec_layout == "combined":
        return {SPEC_FILE: feature_spec_dict(cardinalities, rows, meta)}
    main = feature_spec_dict(cardinalities, rows, meta, ("train", "test"))
    main["metadata"]["mapping_specs"] = {"validation": VALIDATION_SPEC}
    return {SPEC_FILE: main, VALIDATION_SPEC: feature_spec_dict(cardinalities, rows, meta, ("validation",))}


def write_feature_spec(spec: dict, directory: Path, name: str = SPEC_FILE) -> None:
    from recsys.features.spec import FeatureSpec

    FeatureSpec(spec["feature_spec"], spec["source_spec"], spec["channel_spec"], spec["metadata"],
                base_directory=str(directory)).to_yaml(str(directory / name))


def verify_specs(directory: Path, expected_rows: dict[str, int]) -> None:
    """Every spec file validates (files present, whole rows) and its rows are what the shards counted."""
    verify_against_spec(directory, expected_rows, spec_files=(SPEC_FILE, VALIDATION_SPEC))


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
    pieces = [p for m in manifests for p in m["pieces"]]
    covered = sorted(idx for m in manifests for idx in m["file_idx"])
    expected = sorted(f["file_idx"] for f in meta["files"])
    if covered != expected:
        raise PreprocError(f"{staging.shards}: shards cover files {covered}, the dictionary lists {expected}")
    plan = plan_mappings(pieces)
    sizes = record_sizes(meta["cardinalities"])
    dtypes = {"label.bin": "bool", "numerical.bin": "float16"}
    dtypes.update({f"{name}.bin": categorical_dtype(card) for name, card in zip(CAT_FEATURES, meta["cardinalities"])})
    rows = {m: sum(p["rows"] for segment in plan[m] for p in segment) for m in MAPPINGS}
    bad_total = sum(v["bad_rows"] for m in manifests for v in m["bad_rows"].values())
    meta = dict(meta, bad_rows_total=bad_total)
    specs = feature_specs(meta["cardinalities"], rows, meta)
    file_bytes = {}

    with atomic_dir(staging.output, overwrite=overwrite, verify=lambda d: verify_specs(d, rows)) as tmp:
        log.info("finalize: writing %d files (%s rows)", len(MAPPINGS) * len(sizes), rows)
        with concurrent.futures.ThreadPoolExecutor(copy_threads) as pool:
            for mapping in MAPPINGS:
                (tmp / mapping).mkdir()
                file_bytes[mapping] = _write_mapping(tmp / mapping, plan[mapping], sizes, dtypes, pool)
        for name, spec in specs.items():
            write_feature_spec(spec, tmp, name)
        report = size_report(meta, rows, file_bytes)
        (tmp / "size_report.json").write_text(json.dumps(report, indent=1))
        (tmp / "size_report.txt").write_text(format_report(report) + "\n")
        shutil.copytree(staging.dictionary, tmp / "dictionary")
    if not keep_stages:
        shutil.rmtree(staging.root, ignore_errors=True)
    log.info("finalize: wrote %s\n%s", staging.output, format_report(report))
    return report
