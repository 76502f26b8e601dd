"""A user's table -> feature-spec dataset with an NVTabular workflow (``preproc tabular run``),
and the saved workflow applied to new rows (``preproc tabular apply``).

``run``:

1. read (preproc.tabular.read): typed pandas partitions, bad rows flagged with their
   reason; one pass counts the label's values (a column not coded 0/1 is refused, naming
   the values and the ``positive`` key), the bad rows per file with their column, reason
   and first rows (``--bad-rows skip|fatal``; skip fails above ``--max-bad-rows`` of the
   rows), the time column's value counts (time split) and the longest multi-hot list
   (default ``max_hotness``);
2. split (preproc.tabular.split): every good row is marked train, test or validation
   (``split.validation_fraction``, taken from the non-test rows; 0: none);
3. the workflow (preproc.tabular.workflow) is fitted on the training rows only, its
   vocabularies put in frequency order, then it transforms every good row (pandas on
   CPU, cudf partitions on GPU, a dask cluster's workers in multinode mode);
4. write: ``train/part_NNNNN.parquet``, ``test/part_NNNNN.parquet`` and
   ``validation/part_NNNNN.parquet``, exactly ``--num-files`` each (training rows
   round-robin by row number; test and validation rows by ``map mod num_files`` when there
   is a group column, sorted by it, so a group never spans two files), every numerical value checked finite, each split checked to hold
   both classes; the feature specs
   (preproc.tabular.spec), ``tabular.yaml`` (the config as applied), ``workflow/``
   (the fitted features-only ``nvtabular.Workflow``) and ``report.json``.

The output is written to a temporary sibling, verified against every spec (files
present, rows per mapping = rows written) and renamed into place.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
import warnings
from pathlib import Path

import numpy as np

from preproc.dataio import bad_rows
from preproc.dataio.output import atomic_dir, input_files, verify_against_spec
from preproc.errors import PreprocError
from preproc.tabular import content, read, split
from preproc.tabular.config import LABEL, TabularConfig, parse_config
from preproc.tabular.spec import SPEC, feature_spec, spec_file, stored
from slurm.common.yamlfile import YamlFileError, load_yaml_file
from preproc.tabular.workflow import build, frequency_order, statistics

log = logging.getLogger("preproc.tabular")
WORKFLOW_DIR = "workflow"
CONFIG_FILE = "tabular.yaml"
KEEP = ("_row", "_test", "_valid")
SCAN_ONLY = ("_bad", "_file", "_why", "_label_kind", "_label_other")   # read's columns the scan alone reads
MAX_BAD_ROWS = bad_rows.MAX_SHARE   # the share of rows `--bad-rows skip` may drop (--max-bad-rows)
MAP = "map"


# --- partition functions (module level: they travel to dask workers) -------------------------------
def good_rows(frame):
    """Rows that are not bad, indexed 0..n-1 (Categorify finds nulls by position)."""
    return frame[~frame["_bad"]].drop(columns=list(SCAN_ONLY)).reset_index(drop=True)


def mark_random(frame, seed: int, fraction: float, by_group: bool, validation: float = 0.0):
    groups = frame[MAP] if by_group else None
    rows = frame["_row"].to_numpy()
    test = split.random_test_rows(rows, seed, fraction, groups)
    valid = split.random_validation_rows(rows, seed, validation, fraction, groups) if validation else test & False
    return frame.assign(_test=test, _valid=valid & ~test)


def mark_time(frame, cut: float, validation_cut: float | None = None):
    test = (frame["_time"] >= cut).to_numpy()
    valid = (frame["_time"] >= validation_cut).to_numpy() & ~test if validation_cut is not None else test & False
    return frame.assign(_test=test, _valid=valid)


def training_rows(frame):
    return frame[~(frame["_test"] | frame["_valid"])].reset_index(drop=True)


def longest_lists(frame, columns: list):
    import pandas as pd

    return pd.Series({c: max([len(v) for v in frame[c]], default=0) for c in columns}, dtype="int64")


def to_cudf(frame):
    """A pandas partition as cudf (list columns as Python lists, which cudf reads as list columns)."""
    import cudf

    frame = frame.copy()
    for c in frame.columns:
        if frame[c].dtype == object and len(frame) and isinstance(frame[c].iloc[0], np.ndarray):
            frame[c] = [list(v) for v in frame[c]]
    return cudf.from_pandas(frame)


def assign_parts(frame, num_files: int, by_map: bool):
    """``_part``: training rows 0..N-1 by row number, test rows N..2N-1, validation rows 2N..3N-1
    (test and validation by group when ``by_map``)."""
    row = frame["_row"] % num_files
    test, valid = frame["_test"], frame["_valid"]
    key = (frame[MAP] % num_files) if by_map else row
    part = row.where(~test, key + num_files).where(~valid, key + 2 * num_files)
    return frame.assign(_part=part.astype("int64"))


def _arrow_table(frame, config: TabularConfig, with_map: bool):
    import pyarrow as pa

    columns = stored(config, with_map)
    lists = {m.column for m in config.multihot}
    ids = {c.column for c in config.categorical}
    arrays, fields = [], []
    for name in columns:
        if name in lists:
            array = pa.array([np.asarray(v, dtype=np.int32) for v in frame[name]], type=pa.list_(pa.int32()))
        elif name in ids:
            array = pa.array(frame[name].to_numpy(dtype=np.int32))
        elif name == MAP:
            array = pa.array(frame[name].to_numpy(dtype=np.int64))
        else:
            array = pa.array(frame[name].to_numpy(dtype=np.float32))
        arrays.append(array)
        fields.append(pa.field(name, array.type))
    for name in config.key_columns.values():       # keys as they are (not in the specs' features)
        array = pa.array(frame[name].tolist())
        arrays.append(array)
        fields.append(pa.field(name, array.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def part_writer(directory: str, config: TabularConfig, num_files: int, mappings=("train", "test")):
    """Writes partition ``i`` (of ``_part``) as ``<mapping>/part_{i mod N}.parquet``; returns its
    [rows, positive labels, non-finite value count per numerical column...]."""

    def write(frame, number: int):
        import pyarrow.parquet as pq

        frame = frame.to_pandas() if hasattr(frame, "to_pandas") else frame
        mapping = mappings[number // num_files]
        by_map = mapping != "train" and bool(config.map)
        frame = frame.sort_values([MAP, "_row"] if by_map else ["_row"], kind="stable")
        nonfinite = [int((~np.isfinite(frame[n.column].to_numpy(dtype=np.float64))).sum())
                     for n in config.numerical]
        if len(frame):
            path = os.path.join(directory, mapping, f"part_{number % num_files:05d}.parquet")
            pq.write_table(_arrow_table(frame, config, with_map=mapping != "train"), path)
        return [len(frame), float(frame[LABEL].sum())] + nonfinite

    return write


# --- the pipeline ----------------------------------------------------------------------------------
def run(input_path: str, config: TabularConfig, output: str, num_files: int = 1, overwrite: bool = False,
        bad_row_policy: str = "skip", runtime=None, max_bad_rows: float = MAX_BAD_ROWS) -> dict:
    """The whole pipeline; returns the report (rows, cardinalities, statistics, timings)."""
    from preproc.runtime import dask_cluster

    files = input_files(input_path)
    runtime = runtime or dask_cluster.choose_runtime("cpu", 0, os.cpu_count() or 1, False)
    with dask_cluster.start(runtime):
        return _run(files, config, output, num_files, overwrite, bad_row_policy, runtime, max_bad_rows)


def _scan(parsed, config: TabularConfig, bad_row_policy: str, files: list, max_bad_rows: float = MAX_BAD_ROWS,
          check_content: bool = True):
    """One pass: the label's values (refused unless 0/1), bad rows per file with their reasons
    (enforced), time value counts, longest lists, and (``check_content``: a table to fit on, not
    new rows) what each column holds (preproc.tabular.content). -> (good rows, facts)."""
    import dask
    import pandas as pd

    good = parsed.map_partitions(good_rows, meta=good_rows(read.meta(config)))
    tasks = {"bad": parsed[["_file", "_bad"]].groupby("_file")["_bad"].agg(["sum", "count"]),
             "why": parsed["_why"].value_counts(),
             "first_bad": parsed.map_partitions(read.first_bad_rows, meta=read.first_bad_rows(read.meta(config))),
             "label_kinds": parsed["_label_kind"].value_counts(),
             "label_other": parsed["_label_other"].dropna().value_counts()}
    if config.split_method == "time":
        tasks["times"] = good["_time"].value_counts()
    elif check_content:         # the split's counts, in this pass (an empty mapping is refused before the fit)
        tasks["marks"] = good.map_partitions(mark_random, config.seed, config.test_fraction, bool(config.map),
                                             config.validation_fraction)[["_test", "_valid"]].sum()
    if check_content:
        tasks["content"] = content.tasks(good, config)
    lists = [m.column for m in config.multihot if m.max_hotness is None]
    if lists:
        tasks["lists"] = good.map_partitions(longest_lists, lists,
                                             meta=pd.Series([], dtype="int64")).to_delayed()
    (facts,) = dask.compute(tasks)
    read.check_labels(facts["label_kinds"], facts["label_other"], config)
    bad = facts["bad"].sort_index()
    offsets = dict(zip((int(i) for i in bad.index), np.cumsum([0] + [int(c) for c in bad["count"]])[:-1].tolist()))
    counts = {str(files[int(i)]): (int(r["sum"]), int(r["count"])) for i, r in bad.iterrows()}
    details = read.describe_bad_rows(facts["first_bad"], facts["why"], config, offsets, files)
    facts["bad_report"] = bad_rows.enforce(counts, bad_row_policy, what="tabular", max_share=max_bad_rows,
                                           details=details)
    facts["rows"] = sum(c for _, c in counts.values())
    facts["bad_rows"] = sum(b for b, _ in counts.values())
    facts["warnings"] = []
    if check_content and facts["rows"] > facts["bad_rows"]:
        facts["warnings"] = content.check(facts["content"], facts["rows"] - facts["bad_rows"], config)
    for line in facts["warnings"]:
        log.warning("tabular: %s", line)
    hotness = {m.column: m.max_hotness for m in config.multihot}
    for c in lists:
        hotness[c] = max([int(s[c]) for s in facts["lists"]] + [1])
    facts["hotness"] = hotness
    return good, facts


def _run(files, config: TabularConfig, output, num_files, overwrite, bad_row_policy, runtime, max_bad_rows) -> dict:
    warnings.filterwarnings("ignore", message=".*experimental feature.*")
    import dask
    from merlin.io import Dataset

    timings, start = {}, time.perf_counter()
    parsed, _ = read.input_frame(files, config)
    good, facts = _scan(parsed, config, bad_row_policy, files, max_bad_rows)
    if facts["rows"] == facts["bad_rows"]:
        raise PreprocError(f"--input: no usable rows ({facts['bad_rows']} bad of {facts['rows']})")
    split_meta = {"method": config.split_method, "test_fraction": config.test_fraction, "seed": config.seed,
                  "validation_fraction": config.validation_fraction}
    mappings = ("train", "test") + (("validation",) if config.validation_fraction else ())
    marked = good._meta.assign(_test=np.zeros(0, bool), _valid=np.zeros(0, bool))
    if config.split_method == "time":
        if len(facts["times"]) < 2:
            raise PreprocError(f"split: every row has the same {config.time!r}: nothing to split by time "
                               "(use split.method random)")
        cut = float(split.time_cut(facts["times"], config.test_fraction))
        split_meta["cut"] = cut
        validation_cut = None
        if config.validation_fraction:
            validation_cut = float(split.time_cut(facts["times"], config.test_fraction + config.validation_fraction))
            split_meta["validation_cut"] = validation_cut
        good = good.map_partitions(mark_time, cut, validation_cut, meta=marked)
        _refuse_empty(facts, config, mappings, (cut, validation_cut))
    else:
        _refuse_empty(facts, config, mappings)
        good = good.map_partitions(mark_random, config.seed, config.test_fraction, bool(config.map),
                                   config.validation_fraction, meta=marked)
    if "_time" in good.columns:
        good = good.drop(columns=["_time"])
    if not runtime.cpu:
        import dask_cudf  # noqa: F401

        good = good.map_partitions(to_cudf)
    timings["read_s"] = time.perf_counter() - start

    final = Path(output).absolute()
    spec_files = tuple(dict.fromkeys((SPEC,) + tuple(spec_file(m) for m in config.models)))
    expected = {}
    with atomic_dir(final, overwrite=overwrite,
                    verify=lambda d: verify_against_spec(d, expected, spec_files=spec_files)) as tmp:
        start = time.perf_counter()
        features, workflow = build(config, str(tmp / ".fit"), facts["hotness"], keep=_keep(config))
        train = good.map_partitions(training_rows, meta=good._meta)
        workflow.fit(Dataset(train, cpu=runtime.cpu))
        cardinalities = frequency_order(workflow)
        timings["fit_s"] = time.perf_counter() - start

        start = time.perf_counter()
        transformed = workflow.transform(Dataset(good, cpu=runtime.cpu)).to_ddf()
        parts = transformed.map_partitions(assign_parts, num_files, bool(config.map))
        n_parts = len(mappings) * num_files
        parts = parts.set_index("_part", divisions=list(range(n_parts)) + [n_parts - 1], drop=False)
        for mapping in mappings:
            (tmp / mapping).mkdir()
        writer = dask.delayed(part_writer(str(tmp), config, num_files, mappings), pure=True)
        written = dask.compute(*[writer(part, i) for i, part in enumerate(parts.to_delayed())])
        timings["transform_s"] = time.perf_counter() - start

        _check_written(written, config, num_files, mappings)
        files_of = {m: [f"{m}/part_{i:05d}.parquet" for i in range(num_files)] for m in mappings}
        expected.update({m: int(sum(w[0] for w in written[k * num_files:(k + 1) * num_files]))
                         for k, m in enumerate(mappings)})
        positives = {m: float(sum(w[1] for w in written[k * num_files:(k + 1) * num_files]))
                     for k, m in enumerate(mappings)}
        _check_classes(expected, positives, config)
        stats = statistics(workflow, config)
        metadata = {"dataset": "tabular", "engine": "nvtabular", "runtime": runtime.mode, "rows": dict(expected),
                    "label_rate": {m: round(positives[m] / max(expected[m], 1), 6) for m in expected},
                    "split": split_meta, "cardinalities": cardinalities, "numerical": stats,
                    "max_hotness": facts["hotness"], "bad_rows": facts["bad_rows"], "input_rows": facts["rows"],
                    "config": CONFIG_FILE, "workflow": WORKFLOW_DIR, "models": list(config.models),
                    **({"keys": config.key_columns} if config.keys else {})}
        _write_specs(tmp, config, cardinalities, facts["hotness"], files_of, metadata)
        _save_workflow(features, workflow, tmp / WORKFLOW_DIR, _keep(config))
        shutil.rmtree(tmp / ".fit", ignore_errors=True)
        _write_yaml(tmp / CONFIG_FILE, config.to_dict())
        report = {"rows": dict(expected), "label_rate": metadata["label_rate"], "split": split_meta,
                  "cardinalities": cardinalities, "numerical": stats,
                  "bad_rows": facts["bad_rows"], "bad_rows_per_file": facts["bad_report"], "runtime": runtime.mode,
                  "models": list(config.models), "warnings": facts["warnings"], "timings_s": {k: round(v, 3) for k, v in timings.items()}}
        (tmp / "report.json").write_text(json.dumps(report, indent=1))
    log.info("tabular: wrote %s: %s", final, report["rows"])
    return report


def _check_classes(rows: dict, positives: dict, config: TabularConfig) -> None:
    """A split of one class trains a constant (train) or has no AUC (test): refused, one line."""
    for mapping in rows:
        if positives[mapping] in (0, rows[mapping]):
            value = 1 if positives[mapping] else 0
            key = "split.validation_fraction" if mapping == "validation" else "the split's test_fraction"
            raise PreprocError(f"{mapping}: all {rows[mapping]} rows have label {value}: a split needs both "
                               f"classes (check `label` in {config.source}"
                               + (f": positive {list(config.positive)} " if config.positive else " ")
                               + f"and {key})")


def _refuse_empty(facts: dict, config: TabularConfig, mappings: tuple, cuts: tuple = ()) -> None:
    """The one-line refusal of an empty mapping (test first, then train, validation) before the fit
    (NVTabular fails on no training rows), from the scan's counts: the random split's marks counted in
    its pass, the time split's from the time column's value counts (``cuts``: test, validation cut)."""
    total = facts["rows"] - facts["bad_rows"]
    if config.split_method == "time":
        times = facts["times"]
        test = int(times[times.index >= cuts[0]].sum())
        valid = int(times[(times.index >= cuts[1]) & (times.index < cuts[0])].sum()) if cuts[1] is not None else 0
    else:
        test, valid = (int(facts["marks"][c]) for c in ("_test", "_valid"))
    rows = {"test": test, "train": total - test - valid, "validation": valid}
    order = tuple(m for m in ("test", "train", "validation") if m in mappings)
    _check_written([[rows[m], 0.0] + [0] * len(config.numerical) for m in order], config, 1, order)


def _check_written(written, config: TabularConfig, num_files: int, mappings=("train", "test")) -> None:
    for k, mapping in enumerate(mappings):
        rows = [w[0] for w in written[k * num_files:(k + 1) * num_files]]
        if 0 in rows:
            unit = "groups" if mapping != "train" and config.map else "rows"
            key = "split.validation_fraction (0: no validation mapping)" if mapping == "validation" else \
                "split.test_fraction"
            if num_files == 1:
                raise PreprocError(f"{mapping}: no {mapping} rows ({sum(w[0] for w in written)} usable rows in "
                                   f"all): a dataset needs training and test rows: use a larger table or "
                                   f"another {key} in {config.source}")
            raise PreprocError(f"{mapping}: file {rows.index(0)} of --num-files {num_files} would be empty "
                               f"({sum(rows)} {mapping} rows; fewer {unit} than files: lower --num-files"
                               + (f" or change {key} in {config.source})" if mapping == "validation" else ")"))
    for i, n in enumerate(config.numerical):
        bad = sum(w[2 + i] for w in written)
        if bad:
            raise PreprocError(f"numerical column {n.column!r}: {bad} values not finite after the "
                               f"{n.transform} transform (use transform log or none for it)")


def _write_specs(directory: Path, config: TabularConfig, cardinalities: dict, hotness: dict, files: dict,
                 metadata: dict) -> None:
    for index, model in enumerate(config.models):
        spec = feature_spec(config, model, cardinalities, hotness, files, metadata)
        names = [spec_file(model)] + ([SPEC] if index == 0 else [])
        for name in names:
            _write_yaml(directory / name, spec)


def _write_yaml(path: Path, data: dict) -> None:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=None))


def _keep(config: TabularConfig) -> tuple:
    """Columns the transform carries past the features: the bookkeeping and the key columns."""
    return KEEP + tuple(config.key_columns.values())


def _save_workflow(features, fitted, directory: Path, keep: tuple = KEEP) -> None:
    """Save the features-only workflow (its operators are the ones ``fitted`` fitted)."""
    from merlin.schema import Schema

    features.fit_schema(Schema([c for c in fitted.input_schema if c.name not in keep]))
    features.save(str(directory))


# --- new data through the saved workflow ----------------------------------------------------------
def apply(dataset: str, input_path: str, output: str, num_files: int = 1, overwrite: bool = False,
          bad_row_policy: str = "skip", runtime=None, max_bad_rows: float = MAX_BAD_ROWS) -> dict:
    """Rows of ``input_path`` (the same columns) transformed by ``dataset``'s saved workflow into a
    dataset with one mapping, ``test``, and the same feature specs (ids, cardinalities, statistics of
    the original training rows); evaluate a trained model on it, or predict. Rows without the label
    column (in every file) get the placeholder label 0 and the specs' ``metadata.labels: false``:
    such a dataset can only be predicted on."""
    from preproc.runtime import dask_cluster

    root = Path(dataset)
    if not (root / CONFIG_FILE).is_file() or not (root / WORKFLOW_DIR).is_dir():
        raise PreprocError(f"--dataset: {dataset}: no {CONFIG_FILE} and {WORKFLOW_DIR}/ "
                           "(not written by preproc tabular run)")
    try:
        config = parse_config(load_yaml_file(root / CONFIG_FILE), str(root / CONFIG_FILE))
        specs = {m: load_yaml_file(root / spec_file(m)) for m in config.models}
    except YamlFileError as exc:
        raise PreprocError(f"--dataset: {exc}") from None
    files = input_files(input_path)
    runtime = runtime or dask_cluster.choose_runtime("cpu", 0, os.cpu_count() or 1, False)
    with dask_cluster.start(runtime):
        return _apply(root, config, specs, files, output, num_files, overwrite, bad_row_policy, runtime,
                      max_bad_rows)


def _apply(root, config, specs, files, output, num_files, overwrite, bad_row_policy, runtime, max_bad_rows) -> dict:
    warnings.filterwarnings("ignore", message=".*experimental feature.*")
    import dask
    import nvtabular as nvt
    from merlin.io import Dataset

    labels = _has_labels(files, config)
    config = config if labels else dataclasses.replace(config, label=None)
    parsed, _ = read.input_frame(files, config)
    good, facts = _scan(parsed, _for_apply(config), bad_row_policy, files, max_bad_rows, check_content=False)
    good = good.map_partitions(lambda f: f.assign(_test=np.ones(len(f), bool), _valid=np.zeros(len(f), bool)),
                               meta=good._meta.assign(_test=np.zeros(0, bool), _valid=np.zeros(0, bool)))
    if "_time" in good.columns:
        good = good.drop(columns=["_time"])
    if not runtime.cpu:
        import dask_cudf  # noqa: F401

        good = good.map_partitions(to_cudf)
    saved = nvt.Workflow.load(str(root / WORKFLOW_DIR))
    workflow = nvt.Workflow(saved.output_node + list(_keep(config)))   # the fitted operators, plus the bookkeeping
    data = Dataset(good, cpu=runtime.cpu)
    workflow.fit_schema(data.schema)
    transformed = workflow.transform(data).to_ddf()
    parts = transformed.map_partitions(assign_parts, num_files, bool(config.map))
    parts = parts.set_index("_part", divisions=list(range(num_files, 2 * num_files)) + [2 * num_files - 1],
                            drop=False)
    final = Path(output).absolute()
    expected = {}
    spec_names = tuple(dict.fromkeys((SPEC,) + tuple(spec_file(m) for m in config.models)))
    with atomic_dir(final, overwrite=overwrite,
                    verify=lambda d: verify_against_spec(d, expected, spec_files=spec_names)) as tmp:
        (tmp / "test").mkdir()
        writer = dask.delayed(part_writer(str(tmp), config, num_files, mappings=("test", "test")), pure=True)
        written = dask.compute(*[writer(part, num_files + i) for i, part in enumerate(parts.to_delayed())])
        _check_written(written, config, num_files, mappings=("test",))
        expected["test"] = int(sum(w[0] for w in written))
        paths = [f"test/part_{i:05d}.parquet" for i in range(num_files)]
        for index, model in enumerate(config.models):
            spec = specs[model]
            spec["source_spec"] = {"test": [{"type": "parquet", "features": stored(config, True), "files": paths}]}
            spec["metadata"] = dict(spec["metadata"], rows={"test": expected["test"]},
                                    applied_to=[str(f) for f in files], fitted_on=str(root.absolute()),
                                    bad_rows=facts["bad_rows"], **({} if labels else {"labels": False}))
            for name in [spec_file(model)] + ([SPEC] if index == 0 else []):
                _write_yaml(tmp / name, spec)
    return {"rows": dict(expected), "bad_rows": facts["bad_rows"], "labels": labels}


def _has_labels(files: list, config: TabularConfig) -> bool:
    """Whether the new rows carry the label column: in every file (True) or in none (False); a mix
    is refused in one line (a dataset either has labels to evaluate on or has none)."""
    fmt = read.input_format(files, config)
    have = [config.label in read.file_columns(f, fmt, config.csv_separator) for f in files]
    if any(have) and not all(have):
        raise PreprocError(f"{files[have.index(False)]}: has no label column {config.label!r}, which "
                           f"{files[have.index(True)]} has: give rows with labels or rows without, not both")
    return all(have)


def _for_apply(config: TabularConfig) -> TabularConfig:
    """The config for scanning new rows: no time split, and every multi-hot ``max_hotness`` fixed (the
    saved workflow cuts the lists itself), so the scan only counts bad rows."""
    return dataclasses.replace(config, split_method="random",
                               multihot=tuple(dataclasses.replace(m, max_hotness=m.max_hotness or 1)
                                              for m in config.multihot))
