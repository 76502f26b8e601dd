"""Outbrain -> Wide & Deep reference dataset with NVTabular (``outbrain run --engine nvtabular``).

Builds the same dataset as the Spark engine (preproc.outbrain.pipeline, reference
feature set of preproc.outbrain.features): same rows, split, ids, lists and numericals
(to float tolerance), same output layout and ``feature_spec.yaml``.

Two steps, as NVIDIA's recipe splits them:

1. Raw tables -> one event x ad frame (pandas): the CSVs are parsed with the
   Spark engine's bad-row rules, clicks_train is joined to events,
   promoted_content and both documents' metadata, and every display is split
   train/test by the same rule (``xxhash64(display_id, seed)`` rank per day).
2. An ``nvtabular.Workflow`` fitted on the training rows turns that frame into
   features: thresholded CTRs and view counts (``TrainingCtr``, a stat op),
   ``FillMissing`` / ``LogOp`` / ``Normalize``, the exact training median for
   unknown document ages (``ExactMedianFill``), the page/ad cosine similarities
   (``DocumentCosine``), the page document's attribute lists through
   ``JoinExternal``, and Spark-compatible hashed ids (``SparkHashBucket``).
   The fitted workflow is saved as ``OUT/workflow`` (``nvtabular.Workflow.load``
   then ``transform`` of a frame from :func:`joined_frame` applies the same
   transform to new data).

Where the workflow runs is decided as for Criteo (``--device auto|cpu|gpu``,
``preproc.runtime.dask_cluster``): pandas partitions on dask's threads (CPU, the
default without GPUs), cudf partitions on a ``LocalCUDACluster`` with one worker
per GPU (``--device gpu``, or ``auto`` where GPUs are visible and cudf imports),
or the workers of a dask cluster started by slurm/dask-cluster.sh. On the GPU,
NVTabular's own operators (``FillMissing``, ``LogOp``, ``Normalize``,
``JoinExternal``) and the statistics' group-bys run on cudf; the operators whose
rule is Spark's bit for bit (the xxhash64 ids, the exact median, the cosine, the
thresholded CTR lookups) are pandas/numpy code and run on a host copy of each
partition (``on_host``), handing cudf back. ``Categorify`` is not used because its
ids depend on the fitted data's frequencies, while the hashed ids are
data-independent and equal Spark's bit for bit. Step 1 and the final gather are
in memory (sized for one node).
"""
from __future__ import annotations

import csv
import logging
import os
import re
import struct

import numpy as np
import pandas as pd

from preproc.errors import PreprocError
from preproc.outbrain.features import (DOC_ATTRIBUTES, LABEL, MAP, REFERENCE_AGES, REFERENCE_COUNTS,
                                       REFERENCE_CTR_MIN_VIEWS, REFERENCE_MULTIHOT_ATTRIBUTE, REFERENCE_SOURCES,
                                       default_sizes, feature_layout, feature_spec_dict)
from preproc.outbrain.nvt_ops import (AsFloat32, DaysSincePublished, DocumentCosine, EmptyListToZero, ExactMedianFill,
                                      PlatformId, SparkHashBucket, TrainingCtr, hash_strings, id_strings, spark_xxhash64,
                                      to_cudf, to_host)
from preproc.outbrain.tables import DAY_MS, TABLES, check_split_sizes, locate_tables

log = logging.getLogger("preproc.outbrain_nvt")
_INTEGER = re.compile(r"^[+-]?[0-9]+$")


# ---------------------------------------------------------------- step 1: tables -> joined frame
def read_table(path: str, table: str):
    """(frame of the table's typed columns without bad rows, (bad rows, rows)) under the Spark engine's
    rules (preproc.dataio.textio.parse_delimited): field count, integer/double syntax, required fields."""
    columns = TABLES[table]
    header = ",".join(c for c, _, _ in columns)
    lines = pd.read_csv(path, sep="\x01", header=None, names=["_line"], dtype=str, keep_default_na=False,
                        quoting=csv.QUOTE_NONE, skip_blank_lines=False, compression="infer")["_line"]
    lines = lines.str.replace(r"\r$", "", regex=True)
    lines = lines[(lines.str.strip() != "") & (lines != header)]
    fields = lines.str.split(",", regex=False)
    bad = fields.str.len() != len(columns)
    out = {}
    for i, (name, typ, required) in enumerate(columns):
        text = fields.str[i].str.strip()
        empty = text.isna() | (text == "")
        if typ == "string":
            value, unparsable = text.where(~empty, None), pd.Series(False, index=text.index)
        elif typ in ("bigint", "int"):
            ok = text.fillna("").str.match(_INTEGER)
            value = pd.to_numeric(text.where(ok & ~empty), errors="coerce").astype("Int64")
            unparsable = ~empty & ~ok
        else:
            value = pd.to_numeric(text.where(~empty), errors="coerce")
            unparsable = ~empty & value.isna()
        bad |= unparsable | (empty & required)
        out[name] = value
    frame = pd.DataFrame(out)[~bad].reset_index(drop=True)
    return frame, (int(bad.sum()), int(len(lines)))


def load_tables(paths: dict, bad_rows: str = "skip"):
    from preproc.dataio import bad_rows as bad_rows_policy

    tables, counts = {}, {}
    for table, path in paths.items():
        tables[table], counts[path] = read_table(path, table)
    report = bad_rows_policy.enforce(counts, bad_rows, "outbrain")
    return tables, report


def split_displays(events: pd.DataFrame, split_days: int, train_fraction: float, seed: int) -> pd.DataFrame:
    """(display_id, is_train): the Spark engine's per-day rank of xxhash64(display_id, seed)."""
    ids = events["display_id"].astype("int64")
    day = np.floor(events["timestamp"].astype("int64").to_numpy() / DAY_MS).astype("int64")
    hashed = [spark_xxhash64(struct.pack("<q", int(d)), seed) for d in ids]
    frame = pd.DataFrame({"display_id": ids.to_numpy(), "day": day, "_h": hashed})
    frame = frame.sort_values(["day", "_h", "display_id"], kind="mergesort")
    frame["_rank"] = frame.groupby("day").cumcount() + 1
    n = frame.groupby("day")["display_id"].transform("size")
    keep = np.floor(n * float(train_fraction) + 0.5)  # Spark's round(): half up
    frame["is_train"] = (frame["day"] < split_days) & (frame["_rank"] <= keep)
    return frame[["display_id", "is_train"]]


def joined_frame(tables: dict, split: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (display, ad): clicks x events x promoted content x both documents' metadata,
    with the reference column names (and ``is_train`` when ``split`` is given)."""
    meta = tables["documents_meta"]
    publish_ms = (pd.to_datetime(meta["publish_time"], format="%Y-%m-%d %H:%M:%S", errors="coerce")
                  .astype("int64") // 1_000_000).astype("float64")
    publish_ms[pd.to_datetime(meta["publish_time"], format="%Y-%m-%d %H:%M:%S", errors="coerce").isna()] = np.nan
    page = pd.DataFrame({"document_id": meta["document_id"], "page_source_id": meta["source_id"],
                         "page_publisher_id": meta["publisher_id"], "publish_time": publish_ms})
    ad = pd.DataFrame({"ad_document_id": meta["document_id"], "ad_source_id": meta["source_id"],
                       "ad_publisher_id": meta["publisher_id"], "publish_time_promo": publish_ms})
    promoted = tables["promoted_content"].rename(columns={"document_id": "ad_document_id"})
    events = tables["events"]
    if split is not None:
        events = events.merge(split, on="display_id")
    rows = (tables["clicks_train"].merge(events, on="display_id")
            .merge(promoted, on="ad_id", how="left")
            .merge(page, on="document_id", how="left")
            .merge(ad, on="ad_document_id", how="left"))
    rows = rows.rename(columns={src: name for name, src in REFERENCE_SOURCES.items()})
    rows = rows.drop(columns=["uuid"])
    for c in REFERENCE_SOURCES:  # nullable ids as float64 (exact below 2**53) for the dask/merlin dtypes
        rows[c] = rows[c].astype("float64")
    rows["display_id"] = rows["display_id"].astype("int64")
    rows["timestamp"] = rows["timestamp"].astype("int64")
    rows[LABEL] = rows[LABEL].astype("int64")
    return rows.reset_index(drop=True)


def attribute_frames(tables: dict) -> dict:
    """{attribute: (document_id, key string, confidence)}, one row per (document, key) at its highest confidence."""
    out = {}
    for attribute, (table, key) in DOC_ATTRIBUTES.items():
        t = tables[table]
        keys = id_strings(t[key]) if key != "entity_id" else t[key].astype(object)
        frame = pd.DataFrame({"document_id": t["document_id"].astype("int64"), "key": keys,
                              "conf": t["confidence_level"].astype("float64")})
        out[attribute] = frame.groupby(["document_id", "key"], as_index=False)["conf"].max()
    return out


def document_lists(attributes: dict, multihot: dict, seed: int) -> pd.DataFrame:
    """Per page document: the hashed multi-hot lists (decreasing confidence, ties by key, at most hotness)."""
    lists = None
    for name, (buckets, hotness) in multihot.items():
        frame = attributes[REFERENCE_MULTIHOT_ATTRIBUTE[name]]
        frame = frame.sort_values(["document_id", "conf", "key"], ascending=[True, False, True], kind="mergesort")
        frame = frame.groupby("document_id", sort=False).head(hotness).copy()
        frame["id"] = hash_strings(frame["key"], buckets, seed)
        docs, starts = np.unique(frame["document_id"].to_numpy(), return_index=True)
        ids = np.split(frame["id"].to_numpy(dtype="int32"), starts[1:])
        grouped = pd.DataFrame({"document_id": docs, name: ids})
        lists = grouped if lists is None else lists.merge(grouped, on="document_id", how="outer")
    lists["document_id"] = lists["document_id"].astype("float64")
    return lists


def make_workflow(attributes: dict, lists: pd.DataFrame, buckets: dict, multihot: dict, seed: int):
    """The unfitted ``nvtabular.Workflow`` of the reference features (input: a :func:`joined_frame`)."""
    import nvtabular as nvt
    from nvtabular.ops import FillMissing, JoinExternal, LogOp, Normalize

    hashed_inputs = sorted({n if not n.startswith("geo_location") else "geo_location" for n in buckets})
    onehot = hashed_inputs >> SparkHashBucket(buckets, seed)
    platform = ["platform"] >> PlatformId()
    ctr = list(REFERENCE_CTR_MIN_VIEWS) >> TrainingCtr(REFERENCE_CTR_MIN_VIEWS, REFERENCE_COUNTS)
    rates = ctr[[f"{c}_ctr" for c in REFERENCE_CTR_MIN_VIEWS]]
    counts = ctr[list(REFERENCE_COUNTS)] >> FillMissing(fill_val=0) >> LogOp() >> Normalize()
    ages = (["timestamp", "publish_time", "publish_time_promo"] >> DaysSincePublished()
            >> ExactMedianFill() >> LogOp())
    sims = ["document_id", "document_id_promo"] >> DocumentCosine(attributes)
    joined = ["document_id"] >> JoinExternal(lists, on="document_id", how="left",
                                             columns_ext=["document_id", *multihot])
    lists_out = joined[list(multihot)] >> EmptyListToZero()
    numerical = (rates + counts + ages + sims) >> AsFloat32()
    label = [LABEL] >> AsFloat32()
    return nvt.Workflow(label + numerical + onehot + platform + lists_out + [MAP])


# ---------------------------------------------------------------- output
def _arrow_table(frame: pd.DataFrame, layout, with_map: bool):
    import pyarrow as pa

    numerical, onehot, multihot = layout
    arrays, fields = [], []
    arrays.append(pa.array(frame[LABEL].to_numpy(dtype="float32")))
    fields.append(pa.field(LABEL, pa.float32()))
    for n in numerical:
        arrays.append(pa.array(frame[n].to_numpy(dtype="float32")))
        fields.append(pa.field(n, pa.float32()))
    for n in onehot:
        arrays.append(pa.array(frame[n].to_numpy(dtype="int32")))
        fields.append(pa.field(n, pa.int32()))
    for n in multihot:
        arrays.append(pa.array([np.asarray(v, dtype="int32") for v in frame[n]], type=pa.list_(pa.int32())))
        fields.append(pa.field(n, pa.list_(pa.int32())))
    if with_map:
        arrays.append(pa.array(frame[MAP].to_numpy(dtype="int64")))
        fields.append(pa.field(MAP, pa.int64()))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def write_parts(frame: pd.DataFrame, stage, name: str, num_files: int, layout, by_display: bool) -> list[str]:
    """``<stage>/<name>/part_NNNNN.parquet``, exactly ``num_files``: round-robin rows, or (test) by
    ``display_id mod num_files`` sorted by display id, as the Spark engine lays them out."""
    import pyarrow.parquet as pq

    if by_display:
        index = (frame[MAP] % num_files).to_numpy()
        frame = frame.assign(_f=index).sort_values(["_f", MAP], kind="mergesort")
        index = frame["_f"].to_numpy()
    else:
        index = np.arange(len(frame)) % num_files
    os.makedirs(os.path.join(stage, name), exist_ok=True)
    files = []
    for i in range(num_files):
        part = frame[index == i]
        if part.empty:
            raise PreprocError(f"{name}: file {i} of --num-files {num_files} would be empty "
                               "(fewer rows or groups than files; lower --num-files)")
        rel = os.path.join(name, f"part_{i:05d}.parquet")
        pq.write_table(_arrow_table(part, layout, with_map=by_display), os.path.join(stage, rel))
        files.append(rel)
    return files


def run(input_dir: str, output: str, num_files: int = 1, split_days: int = 11, train_fraction: float = 0.8,
        seed: int = 0, buckets=None, multihot=None, bad_rows: str = "skip", overwrite: bool = False,
        runtime=None) -> dict:
    """The whole NVTabular pipeline on ``runtime`` (a ``preproc.runtime.dask_cluster.Runtime``; default
    CPU threads); returns the feature-spec dict written to ``output``."""
    from merlin.io import Dataset

    from preproc.dataio import textio
    from preproc.dataio.output import atomic_dir, verify_against_spec
    from preproc.runtime import dask_cluster

    runtime = runtime or dask_cluster.choose_runtime("cpu", 0, os.cpu_count() or 1, False)

    default_buckets, default_multihot = default_sizes("reference")
    buckets = dict(buckets or default_buckets)
    multihot = dict(multihot or default_multihot)
    paths = locate_tables(input_dir)
    tables, report = load_tables(paths, bad_rows)
    clicked = tables["events"][tables["events"]["display_id"].isin(tables["clicks_train"]["display_id"])]
    rows = joined_frame(tables, split_displays(clicked, split_days, train_fraction, seed))
    attributes = attribute_frames(tables)
    lists = document_lists(attributes, multihot, seed)
    # JoinExternal moves its table to the partitions' device itself; lists go to cudf as Python lists
    workflow = make_workflow(attributes, lists if runtime.cpu else to_cudf(lists), buckets, multihot, seed)
    train_rows, test_rows = rows[rows["is_train"]].drop(columns="is_train"), rows[~rows["is_train"]].drop(
        columns="is_train")
    expected = {"train": len(train_rows), "test": len(test_rows)}
    check_split_sizes(expected, input_dir)
    log.info("outbrain (nvtabular): %d train and %d test rows on %s", expected["train"], expected["test"],
             runtime.describe())
    if not runtime.cpu:   # cudf partitions: the GPU runs NVTabular's operators and the statistics
        train_rows, test_rows = to_cudf(train_rows), to_cudf(test_rows)
    with dask_cluster.start(runtime):
        train_ds, test_ds = Dataset(train_rows, cpu=runtime.cpu), Dataset(test_rows, cpu=runtime.cpu)
        workflow.fit(train_ds)
        train = to_host(workflow.transform(train_ds).to_ddf().compute())
        test = to_host(workflow.transform(test_ds).to_ddf().compute())
    layout = feature_layout("reference", buckets, multihot)
    with atomic_dir(output, overwrite, verify=lambda stage: verify_against_spec(stage, expected)) as stage:
        train_files = write_parts(train, stage, "train", num_files, layout, by_display=False)
        test_files = write_parts(test, stage, "test", num_files, layout, by_display=True)
        workflow.save(os.path.join(stage, "workflow"))
        stats = {"age_medians": {c: _op_of(workflow, "ExactMedianFill").medians[c] for c in REFERENCE_AGES},
                 "count_moments": _count_moments(workflow)}
        metadata = {"dataset": "outbrain", "engine": "nvtabular", "feature_set": "reference", "rows": expected,
                    "split_days": split_days, "train_fraction": train_fraction, "seed": seed,
                    "ctr_min_views": REFERENCE_CTR_MIN_VIEWS, **stats, "bad_rows": report,
                    "workflow": "workflow"}
        spec = feature_spec_dict(layout, train_files, test_files, metadata)
        textio.write_feature_spec(spec, stage)
    log.info("outbrain (nvtabular): wrote %s", output)
    return spec


def _ops(workflow):
    seen, stack = [], [workflow.output_node]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.append(node)
            stack.extend(node.parents_with_dependencies)
    return [n.op for n in seen if n.op is not None]


def _op_of(workflow, class_name: str):
    return next(op for op in _ops(workflow) if type(op).__name__ == class_name)


def _count_moments(workflow) -> dict:
    normalize = _op_of(workflow, "Normalize")
    return {c: {"mean": float(normalize.means[c]), "std": float(normalize.stds[c])} for c in REFERENCE_COUNTS}

