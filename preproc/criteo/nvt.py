"""Criteo day files -> DLRM parquet with an NVTabular workflow (``criteo run --engine nvtabular``).

Same semantics as the Spark pipeline (preproc.criteo.layout: split, dictionary
days, frequency thresholds, numerical rules, training-row order), so that both
engines give the same rows, split, categorical ids and (within float16 rounding)
numericals. What runs where:

1. Scan (dask, raw bytes only): the day files are cut into blocks of about
   ``BLOCK_BYTES`` at line starts and the lines of every block are counted, so every
   row knows its line number in its file (the last day's cut at half of its raw
   lines and the shuffle key need it).
2. Parse (dask ``from_map``, one pandas partition per block): 40 tab-separated
   fields; a row with another field count, a label other than 0/1 or an
   unparsable integer is bad (counted per file, then dropped, ``--bad-rows``), as
   preproc.criteo.read. Each row gets its mapping (train/test/validation) and,
   under ``--train-order shuffle``, ``layout.shuffle_key``.
3. The ``nvtabular.Workflow`` (the features only, saved to ``<output>/workflow``
   so the same transform applies to new data):
   ``cat_i >> Categorify(freq_threshold=T_i) >> ReferenceIds`` and
   ``num_i >> LambdaOp(numerical rule)``. Fitted on the dictionary days (all days,
   or the training days with ``--dictionary-days train``). After fitting, each
   column's vocabulary file is put in the reference order (descending count,
   ties by ascending value: Categorify breaks ties in no fixed order), and
   ``ReferenceIds`` maps Categorify's encoding (0 pad, 1 null, 2 out of
   vocabulary, 3.. values) to the reference's (0 = missing/rare/unseen, 1..).
4. Output: per mapping, rows in the Spark pipeline's order (test/validation and
   ``--train-order input``: day, line; ``shuffle``: shuffle bucket, key, file,
   line) written as ``<mapping>/part_NNNNN.parquet`` of at most ``--part-rows``
   rows, with ``feature_spec.yaml`` (+ ``feature_spec_validation.yaml`` under
   ``--spec-layout reference``) listing them as parquet chunks. Label int8,
   numericals float32 (parquet has no float16), categorical ids in the dtype the
   Spark output uses for the cardinality.

The dataset is written in a temporary sibling of the output, verified
(``preproc.dataio.output.verify_against_spec``: files present, rows per mapping = rows
the job counted) and renamed; a failure leaves nothing at the output path.
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import shutil
import time
import warnings
from pathlib import Path

import numpy as np

from preproc.criteo.layout import (CAT_FEATURES, INT_FEATURES, MAPPINGS, MAX_FILE_LINES, NUM_CAT, NUM_FIELDS,
                                   NUM_INT, NUMERICAL_SHIFT, Rules, categorical_dtype, shuffle_buckets, shuffle_key,
                                   test_rows)
from preproc.dataio import bad_rows
from preproc.dataio.output import atomic_dir, verify_against_spec
from preproc.errors import PreprocError
from preproc.runtime.workflow_ops import ops_of

log = logging.getLogger("preproc.nvt")
BLOCK_BYTES = 64 << 20
PART_ROWS = 1 << 20
WORKFLOW_DIR = "workflow"
MAPPING_CODES = {m: i for i, m in enumerate(MAPPINGS)}
KEEP = ["file_idx", "line", "mapping", "key", "bucket"]   # bookkeeping columns carried past the workflow
NULL_ID, OOV_ID, FIRST_ID = 1, 2, 3                     # Categorify's encoding (23.08)


# --- 1. blocks and line numbers ------------------------------------------------------------------
def blocks(files: list[tuple[int, int, Path]], block_bytes: int = BLOCK_BYTES) -> list[tuple]:
    """[(file_idx, day, path, start, end)]: byte ranges that begin at a line start, in file order."""
    out = []
    for file_idx, day, path in files:
        size = path.stat().st_size
        starts = [0]
        with open(path, "rb") as f:
            for cut in range(block_bytes, size, block_bytes):
                f.seek(cut - 1)
                rest = f.read(1 << 20)
                nl = rest.find(b"\n")
                while nl < 0 and len(rest) < size - cut + 1:
                    more = f.read(1 << 20)
                    if not more:
                        break
                    rest += more
                    nl = rest.find(b"\n")
                if nl < 0:
                    break
                start = cut - 1 + nl + 1
                if start > starts[-1] and start < size:
                    starts.append(start)
        ends = starts[1:] + [size]
        out += [(file_idx, day, str(path), s, e) for s, e in zip(starts, ends)]
    return out


def _read_lines(path: str, start: int, end: int) -> list[str]:
    """The lines of a block as Spark's text reader sees them (a trailing newline ends, not starts, a line)."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def count_lines(block: tuple) -> int:
    _, _, path, start, end = block
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


# --- 2. parsing ---------------------------------------------------------------------------------
def _meta():
    import pandas as pd

    columns = {"file_idx": "int32", "day": "int32", "line": "int64", "bad": "bool", "label": "int8"}
    columns.update({f: "float64" for f in INT_FEATURES})
    columns.update({f: "object" for f in CAT_FEATURES})
    columns.update({"mapping": "int8", "key": "int64", "bucket": "int64"})
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in columns.items()})


def parse_block(block: tuple, first_line: int, last_day: int, cut: int, shuffle: bool, seed: int,
                buckets: int):
    """One block -> pandas frame (all rows, ``bad`` flagged; features of bad rows are null)."""
    import pandas as pd

    file_idx, day, path, start, end = block
    lines = pd.Series(_read_lines(path, start, end), dtype=object).str.replace(r"\r$", "", regex=True)
    n = len(lines)
    fields = lines.str.count("\t") + 1
    shape_ok = (fields == NUM_FIELDS).to_numpy()
    good_lines = lines[shape_ok]
    names = ["label"] + INT_FEATURES + CAT_FEATURES
    if len(good_lines):
        import csv
        table = pd.read_csv(io.StringIO("\n".join(good_lines)), sep="\t", header=None, names=names, dtype=str,
                            keep_default_na=False, na_filter=False, quoting=csv.QUOTE_NONE)
        table.index = np.flatnonzero(shape_ok)
    else:
        table = pd.DataFrame({c: pd.Series([], dtype=object) for c in names})
    frame = table.reindex(range(n))
    bad = ~shape_ok | ~frame["label"].isin(["0", "1"]).to_numpy()
    for name in INT_FEATURES:
        text = frame[name].fillna("")
        ok = (text == "") | text.str.fullmatch(r"-?[0-9]+")
        long = ok & (text.str.len() > 18)
        if long.any():  # outside int64 -> bad, as Spark's cast to bigint
            ok[long] = text[long].map(lambda s: -(2 ** 63) <= int(s) < 2 ** 63)
        bad |= ~ok.to_numpy(dtype=bool)
        frame[name] = pd.to_numeric(text.where(ok & (text != "")), errors="coerce").astype("float64")
    good = ~bad
    out = pd.DataFrame({"file_idx": np.full(n, file_idx, dtype="int32"), "day": np.full(n, day, dtype="int32"),
                        "line": np.arange(first_line, first_line + n, dtype="int64"), "bad": bad,
                        "label": np.where(good, frame["label"].map({"0": 0, "1": 1}).fillna(0), 0).astype("int8")})
    for name in INT_FEATURES:
        out[name] = frame[name].where(good)
    for name in CAT_FEATURES:
        out[name] = frame[name].where(good & (frame[name] != ""), None).astype(object)
    line = out["line"].to_numpy()
    if day < last_day:
        mapping = np.full(n, MAPPING_CODES["train"], dtype="int8")
    else:
        mapping = np.where(line < cut, MAPPING_CODES["test"], MAPPING_CODES["validation"]).astype("int8")
    out["mapping"] = mapping
    if shuffle and day < last_day:
        key = shuffle_key(np.int64(seed), np.int64(file_idx), line.astype(np.int64))
        out["key"] = key.astype("int64")
        out["bucket"] = (key % buckets).astype("int64")
    else:
        out["key"] = np.zeros(n, dtype="int64")
        out["bucket"] = np.full(n, -1, dtype="int64")
    return out


def good_rows(frame):
    """The rows that are not bad, indexed 0..n-1 (Categorify locates nulls by index position)."""
    return frame[~frame["bad"]].drop(columns=["bad", "day"]).reset_index(drop=True)


# --- 3. the workflow ------------------------------------------------------------------------------
def numerical_rule(rule: str):
    """The numerical transform of ``layout.NUMERICAL_RULES`` on a pandas or cudf column."""

    def reference(col):
        shifted = col.astype("float64") + NUMERICAL_SHIFT
        return np.log(shifted.where(shifted > 0, 1.0)).astype("float32")  # missing (NaN) / x <= -3 -> ln 1 = 0

    def clamp(col):
        return np.log(col.astype("float64").fillna(0.0).clip(lower=0.0) + NUMERICAL_SHIFT).astype("float32")

    return {"reference": reference, "clamp": clamp}[rule]


def reference_ids(col):
    """Categorify's ids (1 null, 2 out of vocabulary, 3.. values) -> the reference's (0, 1..)."""
    return (col - (FIRST_ID - 1)).clip(lower=0).astype("int32")


def build_workflow(thresholds: list[int], rule: str, out_path: str, keep: list[str] = ()):
    """(features-only workflow, workflow that also carries ``keep``): two graphs over the same
    Categorify op, so fitting the second fits the first."""
    import nvtabular as nvt
    from nvtabular import ops

    freq = {name: int(t) for name, t in zip(CAT_FEATURES, thresholds)}
    categorify = ops.Categorify(freq_threshold=freq, out_path=out_path)

    def features():
        cats = CAT_FEATURES >> categorify >> ops.LambdaOp(reference_ids, dtype=np.int32)
        nums = INT_FEATURES >> ops.LambdaOp(numerical_rule(rule), dtype=np.float32)
        return ["label"] + cats + nums

    return nvt.Workflow(features()), nvt.Workflow(features() + list(keep))


def reference_order(workflow) -> list[int]:
    """Put every Categorify vocabulary in the reference order; returns the cardinalities (kept + 1)."""
    import pandas as pd
    from nvtabular.ops import Categorify

    cats = ops_of(workflow, Categorify)
    cardinalities = {}
    for op in cats:
        for name, path in op.categories.items():
            table = pd.read_parquet(path)
            values = table[table[name].notna()]
            if len(values):
                size = f"{name}_size"
                ordered = values.sort_values([size, name], ascending=[False, True], kind="stable")
                ordered.index = pd.RangeIndex(FIRST_ID, FIRST_ID + len(ordered))
                tmp = f"{path}.tmp-{os.getpid()}"
                ordered.to_parquet(tmp, compression=None)
                os.replace(tmp, path)
            cardinalities[name] = len(values) + 1
    return [cardinalities[name] for name in CAT_FEATURES]


# --- 4. output --------------------------------------------------------------------------------------
def _part_writer(directory: str, mapping: str, dtypes: dict, part_rows: int):
    def write(frame, number: int):
        import pandas as pd

        frame = frame.to_pandas() if hasattr(frame, "to_pandas") else frame
        if mapping == "train" and "key" in frame and (frame["bucket"] >= 0).any():
            frame = frame.sort_values(["key", "file_idx", "line"], kind="stable")
        names = []
        for k, lo in enumerate(range(0, len(frame), part_rows)):
            part = frame.iloc[lo:lo + part_rows]
            table = pd.DataFrame({c: part[c].to_numpy().astype(t) for c, t in dtypes.items()})
            name = f"{mapping}-{number:06d}-{k:04d}.parquet"
            table.to_parquet(os.path.join(directory, name), index=False, row_group_size=part_rows)
            names.append((name, len(part)))
        return pd.DataFrame({"name": pd.Series([n for n, _ in names], dtype=object),
                             "rows": pd.Series([r for _, r in names], dtype="int64")})

    return write


def _ordered(ddf, mapping: str, buckets: int, shuffle: bool):
    """Rows of one mapping in output order (see the module docstring), one partition per bucket when shuffled."""
    rows = ddf[ddf["mapping"] == MAPPING_CODES[mapping]]
    if mapping != "train" or not shuffle:
        return rows
    if buckets == 1:
        return rows.repartition(npartitions=1)
    return rows.set_index("bucket", divisions=list(range(buckets)) + [buckets - 1], drop=False)


def parquet_specs(cardinalities: list[int], rows: dict[str, int], meta: dict, files: dict[str, list[str]]):
    """The Spark pipeline's feature specs, with parquet chunks and the parquet dtypes."""
    from preproc.criteo.finalize import feature_specs

    specs = feature_specs(cardinalities, rows, meta)
    for spec in specs.values():
        spec["feature_spec"]["label"]["dtype"] = "int8"
        for name in INT_FEATURES:
            spec["feature_spec"][name]["dtype"] = "float32"
        spec["source_spec"] = {m: [{"type": "parquet", "features": ["label"] + INT_FEATURES + CAT_FEATURES,
                                    "files": files[m]}] for m in spec["source_spec"]}
        spec["metadata"].update({"engine": "nvtabular", "workflow": WORKFLOW_DIR,
                                 "numerical_dtype": "float32 (parquet has no float16)"})
    return specs


def run(files: list[tuple[int, int, Path]], last_day: int, thresholds: list[int], output: str,
        overwrite: bool = False, bad_row_policy: str = "skip", rules: Rules = Rules(), runtime=None,
        part_rows: int = PART_ROWS, block_bytes: int = BLOCK_BYTES) -> dict:
    """The whole NVTabular pipeline; returns the report (rows per mapping, cardinalities, timings)."""
    from preproc.runtime import dask_cluster

    runtime = runtime or dask_cluster.choose_runtime("cpu", 0, os.cpu_count() or 1, False)
    with dask_cluster.start(runtime) as client:
        return _run(client, runtime, files, last_day, thresholds, output, overwrite, bad_row_policy, rules,
                    part_rows, block_bytes)


def _run(client, runtime, files, last_day, thresholds, output, overwrite, bad_row_policy, rules, part_rows,
         block_bytes):
    warnings.filterwarnings("ignore", message=".*experimental feature.*")
    import dask
    import dask.dataframe as dd
    import pandas as pd
    from merlin.io import Dataset

    timings = {}
    start = time.perf_counter()
    pieces = blocks(files, block_bytes)
    counts = dask.compute(*[dask.delayed(count_lines, pure=True)(b) for b in pieces])
    lines, first = {}, []
    for (file_idx, *_), n in zip(pieces, counts):
        first.append(lines.get(file_idx, 0))
        lines[file_idx] = lines.get(file_idx, 0) + n
    paths = {idx: str(path) for idx, _, path in files}
    too_long = [paths[i] for i, n in lines.items() if n > MAX_FILE_LINES]
    if too_long:
        raise PreprocError(f"{too_long[0]}: more than {MAX_FILE_LINES} lines in one day file (split it)")
    last_idx = [idx for idx, day, _ in files if day == last_day][0]
    cut = test_rows(lines.get(last_idx, 0))
    train_lines = sum(lines.get(idx, 0) for idx, day, _ in files if day < last_day)
    buckets = shuffle_buckets(train_lines)
    shuffle = rules.train_order == "shuffle"
    timings["scan_s"] = time.perf_counter() - start

    # from_delayed, not from_map: distributed 2023.1 hands from_map's arguments over still wrapped.
    parse = dask.delayed(parse_block, pure=True)
    parsed = dd.from_delayed([parse(b, f, last_day, cut, shuffle, rules.seed, buckets)
                              for b, f in zip(pieces, first)], meta=_meta(), verify_meta=False)
    good = parsed.map_partitions(good_rows, meta=_meta().drop(columns=["bad", "day"]))
    if not runtime.cpu:  # GPU runtime: parsed with pandas, then cudf partitions for the workflow
        import cudf
        import dask_cudf  # noqa: F401

        good = good.map_partitions(cudf.from_pandas)
    fit_rows = good if rules.dictionary_days == "all" else good[good["mapping"] == MAPPING_CODES["train"]]

    final = Path(output).absolute()
    with atomic_dir(final, overwrite=overwrite, verify=lambda d: verify_against_spec(
            d, expected, spec_files=("feature_spec.yaml", "feature_spec_validation.yaml"))) as tmp:
        wf_fit_dir = tmp / ".fit"
        features, workflow = build_workflow(thresholds, rules.numerical, str(wf_fit_dir), keep=KEEP)
        start = time.perf_counter()
        workflow.fit(Dataset(fit_rows, cpu=runtime.cpu))
        cardinalities = reference_order(workflow)
        timings["fit_s"] = time.perf_counter() - start
        log.info("nvtabular: fitted (%.1f s), cardinalities %s", timings["fit_s"], cardinalities)

        start = time.perf_counter()
        transformed = workflow.transform(Dataset(good, cpu=runtime.cpu)).to_ddf()
        dtypes = {"label": "int8", **{f: "float32" for f in INT_FEATURES},
                  **{f: categorical_dtype(c) for f, c in zip(CAT_FEATURES, cardinalities)}}
        writes = {}
        for mapping in MAPPINGS:
            (tmp / mapping).mkdir()
            rows = _ordered(transformed, mapping, buckets, shuffle)
            # delayed per partition, not map_partitions(partition_info=...): distributed 2023.1 hands
            # partition_info over still wrapped.
            writer = dask.delayed(_part_writer(str(tmp / mapping), mapping, dtypes, part_rows), pure=True)
            writes[mapping] = [writer(part, number) for number, part in enumerate(rows.to_delayed())]
        stats = parsed[["file_idx", "bad"]].groupby("file_idx")["bad"].agg(["sum", "count"])
        written, bad = dask.compute(writes, stats)
        timings["transform_s"] = time.perf_counter() - start

        per_file = {paths[int(i)]: (int(r["sum"]), int(r["count"])) for i, r in bad.iterrows()}
        report_bad = bad_rows.enforce(per_file, bad_row_policy, what="criteo nvtabular")
        files_of, expected = {}, {}
        for mapping in MAPPINGS:
            parts = pd.concat(written[mapping], ignore_index=True)
            parts = parts[parts["rows"] > 0]
            names = []
            for k, (name, count) in enumerate(zip(parts["name"], parts["rows"])):
                target = f"part_{k:05d}.parquet"
                os.replace(tmp / mapping / name, tmp / mapping / target)
                names.append(f"{mapping}/{target}")
            for leftover in (tmp / mapping).glob(f"{mapping}-*.parquet"):
                leftover.unlink()
            files_of[mapping] = names
            expected[mapping] = int(parts["rows"].sum())
        meta = {"rules": dataclasses.asdict(rules), "thresholds": list(thresholds), "files": [{"path": str(p), "day": d} for _, d, p in files]}
        from preproc.criteo.finalize import write_feature_spec
        for name, spec in parquet_specs(cardinalities, expected, meta, files_of).items():
            write_feature_spec(spec, tmp, name)
        _save_workflow(features, workflow, tmp / WORKFLOW_DIR)
        shutil.rmtree(wf_fit_dir, ignore_errors=True)
        report = {"engine": "nvtabular", "runtime": runtime.mode, "rows": expected, "cardinalities": cardinalities,
                  "thresholds": list(thresholds), "files": {m: len(f) for m, f in files_of.items()},
                  "bad_rows": sum(v["bad_rows"] for v in report_bad.values()), "bad_rows_per_file": report_bad,
                  "timings_s": {k: round(v, 3) for k, v in timings.items()}}
        (tmp / "report.json").write_text(json.dumps(report, indent=1))
    log.info("nvtabular: wrote %s: %s", final, report["rows"])
    return report


def _save_workflow(features, fitted, directory: Path) -> None:
    """Save the features-only workflow (its Categorify op is the one ``fitted`` fitted)."""
    from merlin.schema import Schema

    features.fit_schema(Schema([c for c in fitted.input_schema if c.name not in KEEP]))
    features.save(str(directory))


def format_report(report: dict) -> str:
    lines = [f"engine nvtabular ({report['runtime']})", "mapping      rows   files"]
    for mapping in MAPPINGS:
        lines.append(f"{mapping:<11}{report['rows'][mapping]:>8,} {report['files'][mapping]:>7}")
    lines.append(f"cardinalities: {report['cardinalities']}")
    lines.append(f"bad rows skipped: {report['bad_rows']}")
    lines.append("timings: " + ", ".join(f"{k} {v:.1f}" for k, v in report["timings_s"].items()))
    return "\n".join(lines)
