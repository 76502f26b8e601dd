"""`recsys-submit study project`: what N GPUs of a profile would deliver, from one measured (or
published, or given) step time, the model's sizes and the profile's fabric.

A phase-level alpha-beta model (docs/studies.md, "Projecting a study" states every formula):

- compute per rank = the calibration's batch-proportional time x (per-GPU batch / calibration's)
  + its fixed time (the optimizer), or with a measured compute curve (one GPU at several
  batches) the calibration's step x curve(b) / curve(b0); x the core-sharing factor (profiles
  with `shared_nodes`: N ranks on one host's C cores; above C the fabric's measured slowdown,
  else N/C), relative to the calibration's; split (jobs.study.projection_split) into a dense part
  scaled as above and an embedding part scaled with the slowest rank's share of the embedding
  work in the engine's placement (its share from a breakdown's lookup phase, else the model's
  arithmetic on the profile's `fabric.gpu` peak rates);
- the embedding placement is the engine's own (``python -m recsys.plan_tables``: the planner
  recsys-train uses), and the slowest rank's tables set the alltoall bytes: ids and vector
  gradients it sends for the other ranks' tables, and its tables' vectors for every other rank;
- the dense gradient allreduce is a constant payload; the replicated tables' sparse gradients
  are allgathered (grow with the ranks);
- a collective over a level costs latency + bytes x nccl-tests' bus factor / the level's bus
  bandwidth (fabric: nominal, or measured); inside a node and between nodes hierarchically;
- the band runs from no overlap (compute + exchanges) to full overlap (the larger of the two),
  with the calibration point's slowest and fastest repeat (a noisy calibration is flagged) and
  the compute split's range;
- a calibration at N > 1 GPUs that still holds its exchanges (--step-ms with --calibration-gpus,
  a study without a breakdown) has them, projected at N, taken out before it is scaled;
- one model size: a published row of a stated size is shown only beside a projection of it;
- a count the profile cannot hold (past max_nodes, several nodes without an inter_node level)
  is refused in one line.

No constant here is fitted: bandwidths and latencies are the profile's fabric (with its
source), compute is the calibration's (and a measured curve's), the core-sharing slowdown the
fabric's measured one. Standard library only (login nodes), PyYAML for a compute-curve file as
for the profiles; the plot uses matplotlib when installed (jobs.study.analysis.plots.load_pyplot).

The arithmetic is in jobs.study.projection_model, the files in jobs.study.projection_output;
this module calibrates and runs the command.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from jobs.errors import RequestError

from .projection_model import (BYTES_PER_PARAM, GRADIENT_EXTRAS_BYTES, PHASES, PLANNER,  # noqa: F401 (the API)
                               PROJECTION_VERSION, Calibration, Projected, Target, Workload, affine_fit,
                               alltoall_bytes, collective_ms, core_share, curve_ms, embedding_work, exchanges_ms,
                               gradient_bytes, layouts_of_argv, layouts_of_workload, project, project_point,
                               within)
from .projection_output import CSV_COLUMNS, csv_text, figure, markdown, write  # noqa: F401 (the API)
from .projection_split import arithmetic_split, breakdown_share, with_split  # noqa: F401 (the API)


# ------------------------------------------------------------------ from a study's report


def calibration_of_report(report: Dict[str, Any], variant: Optional[str] = None):
    """(Calibration, {gpus: measured throughput}, variant) of a study report (jobs.study.analysis.report.build,
    scaling.json): calibrated on the smallest measured point's timed step. With a step breakdown
    there, its exchanges are taken out and its optimizer kept fixed, the parts scaled by timed /
    split step (the split step waits after each unit; the timed step is what a run delivers)."""
    variant = variant or report["variants"][0]
    if variant not in report["variants"]:
        raise RequestError(f"--variant: {variant!r} is not a variant of study {report.get('study')} "
                           f"({', '.join(report['variants'])})")
    rows = [r for r in report["rows"] if (r["variants"].get(variant) or {}).get("throughput")]
    if not rows:
        raise RequestError(f"study {report.get('study')}: no measured point of variant {variant!r} to calibrate on")
    measured = {r["gpus"]: r["variants"][variant]["throughput"] for r in rows}
    base = min(rows, key=lambda r: r["gpus"])
    cell = base["variants"][variant]
    timed = cell["step_time_ms"]
    bd = cell.get("breakdown")
    scaled, fixed, how = timed, 0.0, f"timed step {timed:.3f} ms"
    share, split = None, ""
    if bd and bd.get("mean", {}).get("step_ms"):
        ph = {k: v["ms"] for k, v in bd["mean"]["phases"].items()}
        k = timed / bd["mean"]["step_ms"]
        exchanges = (ph.get("embedding_exchange", 0.0) + ph.get("gradient_exchange", 0.0)) * k
        fixed = ph.get("optimizer", 0.0) * k
        scaled = max(0.0, timed - exchanges - fixed)
        how += f", its breakdown's exchanges out and optimizer fixed (parts x timed/split step {k:.2f})"
        share = breakdown_share(ph, scaled, k)
        split = (f"measured: the step breakdown's lookup, {share:.2f} of the batch-proportional compute"
                 if share is not None else "the step breakdown has no separate lookup term (its compute "
                 "holds the lookups and the dense layers together)")
    exchanges_in = base["gpus"] > 1 and not (bd and bd.get("mean", {}).get("step_ms"))
    calib = Calibration(gpus=base["gpus"], batch_per_gpu=base["batch_per_gpu"], scaled_ms=scaled, fixed_ms=fixed,
                        source=f"study {report.get('study')}, {base['gpus']} GPU(s): {how}", exchanges_in=exchanges_in,
                        embedding_share=share,
                        embedding_share_range=(share, share) if share is not None else (0.0, 0.0),
                        split_source=split)
    return _with_repeats(calib, cell, timed), measured, variant


def _with_repeats(calib: Calibration, cell: Dict[str, Any], timed: float) -> Calibration:
    """The calibration with its repeats' spread (the band's calibration term): the timed step at
    the fastest and the slowest repeat's throughput, as factors on the calibration's compute; a
    cell the study report flags as noisy (jobs.study.analysis.report_facts' spread rule) is marked `noisy`."""
    tput, fast, slow = cell.get("throughput"), cell.get("throughput_max"), cell.get("throughput_min")
    if not (tput and fast and slow) or calib.step_ms <= 0:
        return replace(calib, noisy=cell.get("spread_warning"))
    step_fast, step_slow = timed * tput / fast, timed * tput / slow
    spread = (1.0 - (timed - step_fast) / calib.step_ms, 1.0 + (step_slow - timed) / calib.step_ms)
    return replace(calib, spread=spread, noisy=cell.get("spread_warning"),
                   spread_source=f"{cell.get('n', '?')} repeats: timed step {step_fast:.3f} - {step_slow:.3f} ms "
                                 f"(fastest - slowest repeat)")


# ------------------------------------------------------------------ a measured compute curve

CURVE_VERSION = 1


def _curve_file(path) -> List[Tuple[int, float]]:
    """(batch per GPU, step ms) points of a compute-curve file (YAML or JSON): version 1,
    source, points: [{batch_per_gpu, step_ms}, ...] of one GPU."""
    import yaml
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise RequestError(f"--compute-curve: {path}: not readable ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or data.get("version") != CURVE_VERSION or not isinstance(data.get("points"), list):
        raise RequestError(f"--compute-curve: {path}: not a compute curve (version: {CURVE_VERSION}, source, "
                           "points: [{batch_per_gpu, step_ms}, ...])")
    out = []
    for i, pt in enumerate(data["points"]):
        b = pt.get("batch_per_gpu") if isinstance(pt, dict) else None
        t = pt.get("step_ms") if isinstance(pt, dict) else None
        if isinstance(b, bool) or not isinstance(b, int) or b < 1 or isinstance(t, bool) \
                or not isinstance(t, (int, float)) or not t > 0:
            raise RequestError(f"--compute-curve: {path}: points[{i}]: give batch_per_gpu (a positive integer) "
                               "and step_ms (a positive time)")
        out.append((b, float(t)))
    return out


def compute_curve(paths) -> Tuple[List[Tuple[int, float]], str]:
    """A measured compute curve of one GPU, (points, source), from compute-curve files and/or
    study directories (each: its 1-GPU point's calibration step, exchanges out): at least two
    batches per GPU. RequestError (one line naming the path) otherwise."""
    if isinstance(paths, str):
        paths = [p for p in paths.split(",") if p.strip()]
    points: Dict[int, float] = {}
    for path in paths:
        path = path.strip()
        if os.path.isdir(path) and os.path.isfile(os.path.join(path, "study.json")):
            calib, _, _ = calibration_of_report(_study_report(path))
            if calib.gpus != 1:
                raise RequestError(f"--compute-curve: {path}: its smallest measured point has {calib.gpus} GPUs; "
                                   "a compute curve is one GPU's step at several batches")
            got = [(calib.batch_per_gpu, calib.step_ms)]
        elif os.path.isfile(path):
            got = _curve_file(path)
        else:
            raise RequestError(f"--compute-curve: {path!r} is neither a compute-curve file nor a study directory")
        for b, t in got:
            if b in points and points[b] != t:
                raise RequestError(f"--compute-curve: {path}: batch {b} per GPU is measured twice")
            points[b] = t
    if len(points) < 2:
        raise RequestError("--compute-curve: give one GPU's step at two batch sizes or more "
                           f"(got {len(points)})")
    pts = sorted(points.items())
    return pts, "measured compute curve: " + ", ".join(str(p) for p in paths) + \
        " (batches " + ", ".join(str(b) for b, _ in pts) + " per GPU)"


def with_curve(calibration: Optional[Calibration], paths, batch_per_gpu: int) -> Calibration:
    """The calibration with a measured compute curve: the curve gives the shape of compute vs
    batch per GPU, the calibration (when there is one) its level; without one, the curve's own
    value at `batch_per_gpu` on 1 GPU is the calibration."""
    pts, source = compute_curve(paths)
    if calibration is None:
        return Calibration(gpus=1, batch_per_gpu=batch_per_gpu, scaled_ms=curve_ms(pts, batch_per_gpu),
                           source=source, curve=tuple(pts), curve_source=source)
    return replace(calibration, curve=tuple(pts), curve_source=source)


# ------------------------------------------------------------------ the command


def parse_gpus(text) -> List[int]:
    """--gpus 8,16,64: positive GPU counts (one line naming the flag otherwise)."""
    out = []
    for field_ in str(text).split(","):
        try:
            n = int(field_.strip())
        except ValueError:
            raise RequestError(f"--gpus: {field_.strip()!r} is not a GPU count (give e.g. 8,16,64)") from None
        if n < 1:
            raise RequestError(f"--gpus: {n} is not a positive GPU count")
        out.append(n)
    if not out:
        raise RequestError("--gpus: give at least one GPU count, e.g. 8,16,64")
    return sorted(set(out))


def _variant(spec, label):
    """(variant dict, label) of the spec: the one named, else the first combination."""
    import itertools

    from ..spec import _variant_label
    combos = [dict(zip(spec.variants, c)) for c in itertools.product(*spec.variants.values())] \
        if spec.variants else [{}]
    for combo in combos:
        if label is None or _variant_label(combo) == label:
            return combo, _variant_label(combo)
    raise RequestError(f"--variant: {label!r} is not a variant of the spec "
                       f"({', '.join(_variant_label(c) for c in combos)})")


def _study_report(study_dir):
    """The report of a study directory: the one `study report` wrote, else built now."""
    path = os.path.join(study_dir, "report", "scaling.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    from .report import build
    from ..running.record import StudyRecord, poll
    record = StudyRecord.load(study_dir)
    return build(record, poll(record))


def _published_rows(spec, variant, profile, counts, model_size=None):
    """Published rows of the spec's model on the profile's platform at the spec's batch, precision
    and XLA, whose GPU count is projected, of the projection's model size: {gpus: [row entries]}.
    A row of a stated size (DLRM: small, large, extra_large: other tables) is shown only beside a
    projection of that size (`model_size`: the published calibration row's), never another's."""
    from . import published
    platform = published.platform_of(profile)
    if platform is None:
        return {}
    precision, xla = published.settings_of(spec.engine_args, variant, platform)
    out: Dict[int, List[Dict[str, Any]]] = {}
    for row in published.rows(spec.model, platform):
        same_batch = (row.gpus * row.batch_per_gpu == spec.batch_size) if spec.scaling == "strong" \
            else row.batch_per_gpu == spec.batch_size
        if same_batch and precision in row.throughput and (row.xla is None or row.xla == xla) and row.gpus in counts \
                and row.model_size == model_size:
            out.setdefault(row.gpus, []).append({"throughput": row.throughput[precision], "table": row.table,
                                                 "model_size": row.model_size, "version": row.version})
    return out


def published_calibration(spec, combo, profile) -> Tuple[Calibration, Optional[str]]:
    """(Calibration, model size) a published 1-GPU row gives: NVIDIA's row of the spec's model on
    the profile's platform at the spec's 1-GPU batch, precision and XLA (batch / samples per
    second); the size is the row's (None where the table states none). RequestError (one line)
    when there is none."""
    from . import published
    platform = published.platform_of(profile)
    if platform is None:
        raise RequestError(f"--published: profile {profile.name!r} is not a platform NVIDIA published for")
    precision, xla = published.settings_of(spec.engine_args, combo, platform)
    for row in published.rows(spec.model, platform):
        if row.gpus == 1 and row.batch_per_gpu == spec.batch_size and precision in row.throughput \
                and (row.xla is None or row.xla == xla):
            step = row.batch_per_gpu / row.throughput[precision] * 1000.0
            size = f" {row.model_size} model" if row.model_size else ""
            return Calibration(gpus=1, batch_per_gpu=row.batch_per_gpu, scaled_ms=step,
                               source=f"published {row.table} ({row.version}), {platform} 1 GPU{size} {precision}"
                                      + ("" if row.xla is None else f", xla {str(row.xla).lower()}")
                                      + f": {row.throughput[precision]:,.0f} samples/s"), row.model_size
    raise RequestError(f"--published: NVIDIA published no 1-GPU {spec.model} row on {platform} at batch "
                       f"{spec.batch_size}, {precision}" + (", xla" if xla else "")
                       + " (`recsys-submit study reference --list`)")


def given_calibration(spec, step_ms: float, gpus: Optional[int] = None) -> Calibration:
    """The calibration of a step time the user gives (--step-ms) at `gpus` GPUs (--calibration-gpus,
    default 1: a model that does not fit one GPU is timed where it fits) at the spec's batch. At
    more than one GPU the step still holds its own exchanges (taken out in _project_spec)."""
    if isinstance(step_ms, bool) or not isinstance(step_ms, (int, float)) or not math.isfinite(step_ms) \
            or not step_ms > 0:
        raise RequestError(f"--step-ms: {step_ms!r} is not a positive time in ms (give e.g. 25)"
                           if not isinstance(step_ms, (int, float)) else
                           f"--step-ms: {step_ms:g} is not a positive time in ms (give e.g. 25)")
    n = 1 if gpus is None else gpus
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise RequestError(f"--calibration-gpus: {n!r} is not a positive GPU count")
    if spec.scaling == "strong" and spec.batch_size % n:
        raise RequestError(f"--calibration-gpus: the spec's global batch {spec.batch_size} does not divide over "
                           f"{n} GPUs")
    per_gpu = spec.batch_size // n if spec.scaling == "strong" else spec.batch_size
    return Calibration(gpus=n, batch_per_gpu=per_gpu, scaled_ms=float(step_ms), exchanges_in=n > 1,
                       source=f"--step-ms {step_ms:g}: the step at {n} GPU(s), batch {per_gpu} per GPU")


def run(source, profile, gpus, variant=None, step_ms=None, planner=None, report=None,
        use_published=False, compute_curve=None, calibration_gpus=None) -> Dict[str, Any]:
    """The projection of a study directory (calibrated on its smallest measured point) or of a
    spec file (calibrated on `step_ms`, a step time the user gives at `calibration_gpus` GPUs
    (default 1), or with `use_published` on NVIDIA's published 1-GPU row of the same model, batch
    and precision) onto `gpus` GPU counts of a loaded profile. The measured points of the study
    are projected too and overlaid; the published rows of the same model, size, platform, batch
    and precision are marked. `report`: a study report (dict, or the path of a scaling.json) to
    calibrate a spec file on (a recorded study). `compute_curve`: compute-curve files or 1-GPU
    study directories (see `compute_curve`), one GPU measured at several batches, replacing the
    proportional scaling of compute with the batch."""
    from ..spec import load_spec
    target = Target.of(profile)
    counts = parse_gpus(gpus) if not isinstance(gpus, (list, tuple)) else sorted(set(int(n) for n in gpus))
    if use_published and step_ms is not None:
        raise RequestError("--published/--step-ms: give one calibration, not both")
    if calibration_gpus is not None and step_ms is None:
        raise RequestError("--calibration-gpus: give it with --step-ms (the GPU count that step time was taken "
                           "at); a study directory calibrates on its smallest measured point")
    for n in counts:
        why = target.refusal(n)
        if why:
            raise RequestError(f"--gpus: {why}")
    if os.path.isdir(source) and os.path.isfile(os.path.join(source, "study.json")):
        from ..spec import StudySpec
        from ..running.record import StudyRecord
        record = StudyRecord.load(source)
        spec = StudySpec.from_dict(record.spec, source=os.path.join(source, "study.yaml"))
        report = _study_report(source)
        what = f"study {spec.name}"
    elif os.path.isfile(source):
        spec = load_spec(source)
        what = f"spec {source}"
        if isinstance(report, str):
            with open(report) as f:
                report = json.load(f)
    else:
        raise RequestError(f"SPEC | STUDY_DIR: {source!r} is neither a study spec file nor a study directory")
    combo, label = _variant(spec, variant)
    calibration, measured, size = None, {}, None
    if report is not None:
        try:
            calibration, measured, _ = calibration_of_report(report, label)
        except RequestError:
            if not (use_published or step_ms is not None or compute_curve):
                raise
    if use_published:
        calibration, size = published_calibration(spec, combo, profile)
    elif step_ms is not None:
        calibration = given_calibration(spec, step_ms, calibration_gpus)
    if compute_curve:
        calibration = with_curve(calibration, compute_curve, spec.batch_size)
    elif calibration is None:
        raise RequestError(f"{what}: nothing measured to calibrate on; give --step-ms (a 1-GPU step time "
                           "at the spec's batch) or --published (NVIDIA's 1-GPU row), or run the study's "
                           "smallest point first")
    return _project_spec(spec, combo, label, profile, target, counts, calibration, measured, what, planner,
                         model_size=size, given=step_ms is not None)


def _without_own_exchanges(calibration: Calibration, layout, target: Target) -> Calibration:
    """A calibration at N > 1 GPUs whose step still holds its exchanges, with them taken out: the
    exchanges projected at N on the target's fabric, in full (no overlap at the calibration
    point, the band's slow edge). RequestError (one line) when they are not shorter than the step."""
    own = exchanges_ms(layout, target, calibration.gpus, calibration.batch_per_gpu)
    exchanges = own["embedding_exchange"] + own["gradient_exchange"]
    left = calibration.scaled_ms - exchanges
    if not left > 0:
        raise RequestError(f"calibration ({calibration.source}): its {calibration.step_ms:.3f} ms step at "
                           f"{calibration.gpus} GPUs is not longer than its own exchanges projected on profile "
                           f"{target.profile}'s fabric ({exchanges:.3f} ms): calibrate at fewer GPUs or on a "
                           "measured study with a step breakdown")
    calibration = replace(calibration.with_spread_over(left + calibration.fixed_ms), scaled_ms=left)
    return replace(calibration, exchanges_in=False,
                   source=calibration.source + f"; its own exchanges at {calibration.gpus} GPUs projected on "
                                               f"{target.profile}'s fabric ({exchanges:.3f} ms) taken out")


def _project_spec(spec, combo, label, profile, target, counts, calibration, measured, what, planner=None,
                  model_size=None, given=False):
    """The projection record of a spec's variant at `counts` (and the measured and published
    counts the profile can hold), with the measured points and published rows beside their bands.
    `model_size`: the published calibration row's (only rows of that size are shown); `given`: a
    step time the user gave (refused, naming --calibration-gpus, where the engine's planner finds
    that the model does not fit the GPUs it was timed on, on the target's memory per rank)."""
    from .published import check_data_path, platform_of, settings_of
    from ..spec import point_args
    check_data_path(spec)
    published = _published_rows(spec, combo, profile, set(counts) | set(measured) | set(spec.gpus or []),
                                model_size)
    extra = (set(measured) | set(published) | {calibration.gpus}) - set(counts)
    left_out = {n: target.refusal(n) for n in sorted(extra) if target.refusal(n)}
    counts = sorted(set(counts) | extra - set(left_out))
    argv = {}
    for n in counts:
        if spec.scaling == "strong" and spec.batch_size % n:
            raise RequestError(f"--gpus: the spec's global batch {spec.batch_size} does not divide over {n} GPUs")
        global_batch = spec.batch_size if spec.scaling == "strong" else spec.batch_size * n
        argv[n] = ["--model", spec.model, "--run-mode", "benchmark"] + point_args(spec, global_batch, combo)
    if calibration.gpus in left_out and (given or calibration.exchanges_in):
        raise RequestError(f"--calibration-gpus: {left_out[calibration.gpus]}")
    from jobs.planning.plan import embedding_memory_gb
    memory = embedding_memory_gb(profile.node, target.gpus_per_node, target.gpus_per_node)
    layouts = {}
    if given:       # the count the step was timed at first: the engine's refusal there names --calibration-gpus
        try:
            layouts = layouts_of_argv({calibration.gpus: argv[calibration.gpus]}, planner, memory)
        except RequestError as exc:
            raise RequestError(f"--step-ms: at {calibration.gpus} GPU(s) {exc}; give --calibration-gpus N, a count "
                               "where the model fits and the step was timed") from None
    rest = {n: a for n, a in argv.items() if n not in layouts}
    if rest:
        layouts.update(layouts_of_argv(rest, planner, memory))
    if calibration.exchanges_in:
        calibration = _without_own_exchanges(calibration, layouts[calibration.gpus], target)
    precision, _ = settings_of(spec.engine_args, combo, platform_of(profile))
    if calibration.gpus in layouts:     # else a count past the profile: compute stays one term
        calibration = with_split(calibration, layouts[calibration.gpus], spec.model, precision,
                                 target.fabric.gpu_rates(precision))
    record = project(layouts, calibration, target, spec.scaling, spec.batch_size, spec.model,
                     source=f"{what}, variant {label}")
    record["model_size"] = model_size
    record["not_projected"] = {str(n): why for n, why in left_out.items()}
    for p in record["points"]:
        p["measured_throughput"] = measured.get(p["gpus"])
        p["published"] = published.get(p["gpus"], [])
        if p["measured_throughput"]:
            p["measured_vs_band"] = within(p["measured_throughput"], p["throughput_low"], p["throughput_high"])
        for q in p["published"]:
            q["vs_band"] = within(q["throughput"], p["throughput_low"], p["throughput_high"])
    return record


# ------------------------------------------------------------------ the report's section


def for_report(record, report) -> Optional[Dict[str, Any]]:
    """The "Projection" section's data of `study report` (None when the study's profile has no
    fabric or nothing is measured): the measured points of the first variant with their bands,
    and the bands of the next sizes up (2x, 4x, 8x the largest measured, those the profile's nodes
    hold). A projection the
    engine's planning refuses (a dataset not readable here) is {"error": one line}."""
    from jobs.profiles import load_profile

    from ..spec import StudySpec
    try:
        profile = load_profile(record.profile_path or record.profile)
    except (ValueError, OSError):
        return None
    if profile.fabric is None:
        return None
    try:
        spec = StudySpec.from_dict(record.spec, source=os.path.join(record.study_dir, "study.yaml"))
        combo, label = _variant(spec, report["variants"][0] if report.get("variants") else None)
        calibration, measured, _ = calibration_of_report(report, label)
    except RequestError:
        return None         # nothing measured yet
    top = max(measured)
    target = Target.of(profile)
    counts = [k * top for k in (2, 4, 8) if (spec.scaling != "strong" or spec.batch_size % (k * top) == 0)
              and target.refusal(k * top) is None]       # never past the profile's nodes
    try:
        out = _project_spec(spec, combo, label, profile, target, counts, calibration, measured,
                            f"study {spec.name}")
    except RequestError as exc:
        return {"error": str(exc).splitlines()[0]}
    out["next_sizes"] = counts
    return out
