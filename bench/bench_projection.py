"""The projection (`recsys-submit study project`) checked against every published multi-GPU figure
it can be checked against, and against the emulated cluster's measured study.

    .venv/bin/python bench/bench_projection.py            # the validation table (markdown)
    .venv/bin/python bench/bench_projection.py --json     # the same rows as JSON
    .venv/bin/python bench/bench_projection.py --ci-fabric median   # the ci rows without the fabric's ranges

Each row: the case, its calibration (a 1-GPU figure of the same table, model and size), the
projected band at the target GPU count (throughput, no overlap - full overlap), the published or
measured figure, and its error against the nearer edge of the band (0 inside). No constant is
fitted: bandwidths and latencies come from the target profile's `fabric:` (with its source),
compute from the calibration row. docs/benchmarks.md, "`study project` against published and measured figures", shows the table.

Cases:
- NVIDIA's single-node rows (jobs/study/analysis/published_results.yaml, the matched tables): every
  multi-GPU row with a 1-GPU row of the same table, platform, model size, precision and XLA.
  Wide & Deep on the reference Outbrain feature set (preproc.outbrain.features); NCF on ml-20m
  (138,493 users, 26,744 items, the README's dataset). dlrm_tf2_2302 has no 1-GPU row of the
  large model: not projected (the small model's 1-GPU row is never scaled to the large one).
  dgxa100-40gb rows (NCF) are projected on the dgxa100 profile's fabric: the same NVSwitch.
- distributed-embeddings' synthetic tiny and small models (README at 4cb42d4; tables, widths,
  hotness and MLPs from config_v3.py), DGX A100, global batch 65536, Adagrad: 1 GPU to 8/16/32.
- the emulated cluster's recorded studies, measured on the ci cluster to validate the ci
  projection (rows "ci validation (measured on ci)"): docs/studies/emulated-dlrm-strong.json
  (a tiny DLRM, with compute vs batch from its measured 1-rank curve,
  bench/emulated-dlrm-compute-curve.yaml, bench/bench_compute_curve.py) and
  docs/studies/emulated-ncf-strong.json (a small NCF, replicated tables: another model and size
  than the fabric was measured with), when the ci profile has a fabric: calibrated on the 1-rank
  point, projected to 2/4/8 ranks with the ci fabric's measured core sharing
  (bench/bench_core_sharing.py) and its exchanges measured at that sharing, with their range
  (bench/bench_collectives_ci.py --core-sharing).
The published rows have one 1-GPU batch each (no table publishes 1 GPU at two batches of the
same model): their compute stays proportional to the batch per GPU, the model's one-point rule.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from jobs.profiles import load_profile  # noqa: E402
from jobs.study.analysis import projection as P  # noqa: E402
from jobs.study.analysis import published  # noqa: E402

# ml-20m (MovieLens 20M, the NCF README's dataset): users and items of ratings.csv
ML20M_USERS, ML20M_ITEMS = 138493, 26744
DE_SOURCE = ("NVIDIA-Merlin/distributed-embeddings examples/benchmarks/synthetic_models "
             "(README.md and config_v3.py at 4cb42d4)")
# config_v3.py: (num_tables, nnz per input, rows, width, shared): a shared table is looked up by
# every input of nnz (one vector each); otherwise num_tables x len(nnz) tables, one input each
DE_MODELS = {
    "tiny": dict(tables=[(1, [1, 10], 10000, 8, True), (1, [1, 10], 1000000, 16, True),
                         (1, [1, 10], 25000000, 16, True), (1, [1], 25000000, 16, False), (16, [1], 10, 8, False),
                         (10, [1], 1000, 8, False), (4, [1], 10000, 8, False), (2, [1], 100000, 16, False),
                         (19, [1], 1000000, 16, False)], mlp=[256, 128], numerical=10),
    "small": dict(tables=[(5, [1, 30], 10000, 16, True), (3, [1, 30], 4000000, 32, True),
                          (1, [1, 30], 50000000, 32, True), (1, [1], 50000000, 32, False), (30, [1], 10, 16, False),
                          (30, [1], 1000, 16, False), (5, [1], 10000, 16, False), (5, [1], 100000, 32, False),
                          (27, [1], 4000000, 32, False)], mlp=[512, 256, 128], numerical=10),
}
DE_BATCH = 65536
# the emulated study's 1-rank step measured at its per-rank batches (bench/bench_compute_curve.py)
EMULATED_CURVE = os.path.join(ROOT, "bench", "emulated-dlrm-compute-curve.yaml")
ADAGRAD_SLOTS = 1
# the emulated cluster's recorded studies (bench/bench_emulated_study.py --separate-jobs [--spec]):
# (name, the model in words, its measured compute curve or None); measured on the ci cluster to
# validate the ci projection, which the rows' case says
EMULATED_STUDIES = (("emulated-dlrm-strong", "tiny DLRM", EMULATED_CURVE),
                    ("emulated-ncf-strong", "small NCF", None))
CI_VALIDATION = "ci validation (measured on ci)"


def de_workload(name):
    """The Workload of a distributed-embeddings synthetic model: its tables (a shared table: its
    inputs' ids and one vector per input), the MLP over the concatenated vectors and numericals
    (the last layer projects to 1), model-parallel input (dp_input false, the benchmark's default)."""
    cfg = DE_MODELS[name]
    tables, width_in = [], cfg["numerical"]
    for k, (count, nnz, rows, width, shared) in enumerate(cfg["tables"]):
        for i in range(count):
            if shared:
                tables.append([f"t{k}_{i}", rows, width, sum(nnz), len(nnz)])
                width_in += width * len(nnz)
            else:
                for j, hot in enumerate(nnz):
                    tables.append([f"t{k}_{i}_{j}", rows, width, hot, 1])
                    width_in += width
    dense, prev = 0, width_in
    for units in cfg["mlp"] + [1]:
        dense += prev * units + units
        prev = units
    return P.Workload(model=f"de-synthetic-{name}", tables=tables, dense_params=dense, model_parallel=True,
                      implementation="distributed-embeddings", dp_input=False, optimizer_slots=ADAGRAD_SLOTS,
                      source=DE_SOURCE)


def _target(profile_name):
    return P.Target.of(load_profile(profile_name))


def de_rows():
    out = []
    for row in published_de():
        name, ms = row["model"], row["ms"]
        work = de_workload(name)
        counts = sorted(int(n) for n in ms)
        layouts = P.layouts_of_workload(work, counts)
        calib = P.Calibration(gpus=1, batch_per_gpu=DE_BATCH, scaled_ms=float(ms[1]),
                              source=f"distributed-embeddings {name}, 1 GPU, {ms[1]} ms")
        for n in counts:
            if n == 1:
                continue
            profile = "dgxa100" if n <= 8 else "dgxa100-pod"
            target = _target(profile)
            calib = P.with_split(calib, layouts[1], work.model, "tf32", target.fabric.gpu_rates("tf32"))
            rec = P.project({n: layouts[n]}, calib, target, "strong", DE_BATCH, work.model)
            p = rec["points"][0]
            measured = DE_BATCH / float(ms[n]) * 1000.0
            out.append(_row(f"DE synthetic {name}", profile, 1, n, "tf32", None, calib, p, measured,
                            f"{DE_SOURCE}: {ms[n]} ms"))
    return out


def published_de():
    """distributed-embeddings' published step times (bench/de_synthetic_published.yaml, with its
    source), the only published multi-node figures."""
    import yaml
    path = os.path.join(ROOT, "bench", "de_synthetic_published.yaml")
    with open(path) as f:
        return yaml.safe_load(f)["de_synthetic_step_ms"]


def _row(case, profile, from_gpus, gpus, precision, xla, calib, p, figure, source):
    band = P.within(figure, p["throughput_low"], p["throughput_high"])
    middle = math.sqrt(p["throughput_low"] * p["throughput_high"])
    return {"middle": middle, "vs_middle": figure / middle - 1.0, "split": calib.split_source,
            "embedding_share": calib.embedding_share, "embedding_work_ratio": p.get("embedding_work_ratio"),
            "exchange_share": (p["phases_ms"]["embedding_exchange"] + p["phases_ms"]["gradient_exchange"])
            / p["step_ms_serial"],
            "case": case, "profile": profile, "from_gpus": from_gpus, "gpus": gpus, "precision": precision,
            "xla": xla, "calibration": calib.source, "low": p["throughput_low"], "high": p["throughput_high"],
            "dominant": p["dominant"], "figure": figure, "source": source, **band}


def _feature_spec_dir(model, tmp):
    """A dataset directory holding only the feature spec of the published dataset."""
    import yaml
    d = os.path.join(tmp, model)
    os.makedirs(d, exist_ok=True)
    if model == "wide_deep":
        from preproc.outbrain import features as F
        spec = F.feature_spec_dict(F.feature_layout("reference", *F.default_sizes("reference")),
                                   ["train.parquet"], ["test.parquet"], {})
    else:
        from recsys.data.synthetic import default_spec
        spec = default_spec("ncf", num_users=ML20M_USERS, num_items=ML20M_ITEMS).to_dict()
    with open(os.path.join(d, "feature_spec.yaml"), "w") as f:
        yaml.safe_dump(spec, f)
    return d


def nvidia_rows(tmp):
    out = []
    for model in ("wide_deep", "ncf"):
        data = _feature_spec_dir(model, tmp)
        rows = published.rows(model)
        batches = {r.batch_per_gpu for r in rows if r.gpus == 1}
        if len(batches) != 1:
            raise SystemExit(f"{model}: the 1-GPU rows have batches {sorted(batches)}; one expected (strong scaling)")
        batch = batches.pop()
        # the engine's tables and placement at every GPU count, in one call of its planning command
        layouts = P.layouts_of_argv({n: ["--model", model, "--run-mode", "benchmark", "--data-path", data,
                                         "--batch-size", str(batch)] for n in {r.gpus for r in rows}})
        for row in rows:
            if row.gpus == 1:
                continue
            ones = [r for r in rows if r.gpus == 1 and r.table == row.table and r.platform == row.platform
                    and r.model_size == row.model_size and r.xla == row.xla]
            if not ones:
                continue
            one = ones[0]
            profile = "dgxa100" if row.platform.startswith("dgxa100") else row.platform
            for precision in row.throughput:
                step = batch / one.throughput[precision] * 1000.0
                calib = P.Calibration(gpus=1, batch_per_gpu=batch, scaled_ms=step,
                                      source=f"{one.table} {one.platform} 1 GPU {precision}: {one.throughput[precision]:,.0f} samples/s")
                target = _target(profile)
                calib = P.with_split(calib, layouts[1], model, precision, target.fabric.gpu_rates(precision))
                rec = P.project({row.gpus: layouts[row.gpus]}, calib, target, "strong", batch, model)
                p = rec["points"][0]
                case = {"wide_deep": "Wide & Deep", "ncf": "NCF"}[model]
                out.append(_row(f"{case} {row.platform}", profile, 1, row.gpus, precision, row.xla, calib, p,
                                row.throughput[precision], f"{row.table} ({row.version})"))
    return out


def ci_fabric_as(fabric, figures):
    """The ci fabric with `figures`: "full" (as measured: medians, ranges, the exchange at each
    core sharing), "median" (ranges dropped), "levels" (ranges and the core-sharing exchange
    dropped: the 2-rank levels' medians only); what each term of issue 46 moves, in the docs."""
    if figures == "full":
        return fabric
    strip = ("range", "latency_range")
    measured = {level: ({c: {k: v for k, v in e.items() if k not in strip} for c, e in colls.items()}
                        if isinstance(colls, dict) else colls) for level, colls in fabric.measured.items()}
    sharing = dict(fabric.core_sharing)
    exchange = sharing.pop("exchange", None)
    if figures == "median" and exchange:
        sharing["exchange"] = {k: {level: {c: {x: y for x, y in e.items() if x not in strip} for c, e in colls.items()}
                                   for level, colls in levels.items()} for k, levels in exchange.items()}
    elif figures == "levels":
        sharing.pop("exchange_source", None)
    return dataclasses.replace(fabric, measured=measured, core_sharing=sharing)


def emulated_rows(figures="full"):
    """The emulated cluster's recorded studies (EMULATED_STUDIES), when the ci profile has a
    (measured) fabric: what is measured on the ci cluster to validate the ci projection.
    `figures`: which of the ci fabric's measured figures (ci_fabric_as)."""
    prof = load_profile("ci")
    if prof.fabric is None:
        return []
    prof = dataclasses.replace(prof, fabric=ci_fabric_as(prof.fabric, figures))
    out = []
    for name, what, curve in EMULATED_STUDIES:
        stem = os.path.join(ROOT, "docs", "studies", name)
        if not os.path.isfile(stem + ".json"):
            continue
        curves = [curve] if curve and os.path.isfile(curve) else None
        record = P.run(stem + ".yaml", prof, [1, 2, 4, 8], step_ms=None, report=stem + ".json", compute_curve=curves)
        calib = P.Calibration(**record["calibration"])
        for p in record["points"]:
            if p["gpus"] > 1 and p.get("measured_throughput"):
                out.append(_row(f"{CI_VALIDATION}: {what}", "ci", 1, p["gpus"], "fp32", False, calib, p,
                                p["measured_throughput"], f"docs/studies/{name}.json"))
    return out


def validation_rows(figures="full"):
    with tempfile.TemporaryDirectory() as tmp:
        return nvidia_rows(tmp) + de_rows() + emulated_rows(figures)


def markdown(rows):
    lines = ["| case | profile | GPUs | precision | xla | projected samples/s (no overlap - full overlap) | "
             "published / measured | error vs nearer edge | within 20 % | vs middle | embedding share | dominant |",
             "|---|---|---|---|---|---|---:|---:|---|---:|---|---|"]
    for r in rows:
        xla = "-" if r["xla"] is None else str(r["xla"]).lower()
        lines.append(f"| {r['case']} | {r['profile']} | {r['from_gpus']} -> {r['gpus']} | {r['precision']} | {xla} | "
                     f"{r['low']:,.0f} - {r['high']:,.0f} | {r['figure']:,.0f} | "
                     f"{'inside' if r['inside'] else format(100 * r['error'], '+.1f') + ' %'} | "
                     f"{'yes' if r['ok'] else 'no'} | {100 * r['vs_middle']:+.1f} % | {_share_text(r)} | "
                     f"{r['dominant']} |")
    lines += ["", _coverage(rows, "figures")]
    ci = [r for r in rows if r["case"].startswith(CI_VALIDATION)]
    if ci and len(ci) < len(rows):
        lines += ["", "Of them, " + _coverage(ci, f"{CI_VALIDATION.replace(' (measured on ci)', '')} figures "
                                          "(measured on the ci cluster)")]
    return "\n".join(lines) + "\n"


def _coverage(rows, what):
    """The closing line of a set of rows: the band's measured coverage and its middle's error."""
    ok = sum(r["ok"] for r in rows)
    inside = sum(r["inside"] for r in rows)
    return (f"{inside} of {len(rows)} {what} inside the band, {ok} inside it or within 20 % of its nearer "
            f"edge; geometric-mean error of the band's middle (the geometric mean of its edges) against the figures: "
            f"{100 * geomean_error(rows):.1f} %.")


def _share_text(row):
    """The row's compute split for the table: the embedding share and the work ratio it scales by."""
    if row["embedding_share"] is None:
        return "not known"
    ratio = row.get("embedding_work_ratio")
    return f"{row['embedding_share']:.2f}" + ("" if ratio is None else f" x {ratio:.3f}")


def geomean_error(rows) -> float:
    """The geometric mean over the rows of |band's middle - figure| / figure, the error per-kernel
    performance models report (a row exactly on its middle counts as 1e-4, not 0)."""
    if not rows:
        return 0.0
    errors = [max(1e-4, abs(r["middle"] - r["figure"]) / r["figure"]) for r in rows]
    return math.exp(sum(math.log(e) for e in errors) / len(errors))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ci-fabric", choices=("full", "median", "levels"), default="full",
                    help="the ci rows on the ci fabric as measured (full), without its ranges (median), or "
                         "without ranges and the exchange measured at each core sharing (levels)")
    args = ap.parse_args(argv)
    rows = validation_rows(args.ci_fabric)
    print(json.dumps(rows, indent=2) if args.json else markdown(rows), end="\n" if args.json else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
