"""NVIDIA's published training throughput of DLRM, Wide & Deep and NCF, as data.

The numbers are package data (published_results.yaml, copied from the DeepLearningExamples
README of each model, which the file names per table); this module loads and checks it once
and answers: the rows of a model on a platform, the row a study point matches, the platform of
a profile, and the study spec that reproduces a published table (`recsys-submit study
reference`).

A platform is the name of a profile's node type (`node.name`: dgxa100, dgx1, dgx2), so every
profile that extends a built-in one, or reuses its node type (`node: dgxa100`, as dgxa100-pod
does), matches that platform's rows; `dgxa100-40gb` rows match only a node type of that name,
which no built-in profile has. A point matches a row when model, platform, GPUs, batch per GPU,
precision (tf32/fp32/amp) and XLA (when the row states it) agree; rows of tables marked
`match: false` (an older README, TensorFlow 1 where TensorFlow 2 was published) never match.
Every table names its version (the README's commit, date or container: NVIDIA changed its own
figures by 10-100 % between versions), and a row's `source` carries it, so a report names the
version it compared with; DLRM is matched against the 23.02 table (`dlrm_tf2_2302`), the 2022
table (`dlrm_tf2`) is kept, not matched.
When two rows fit one point (DLRM on 8 A100s: the large and the extra-large model), the first
listed wins and the report names its model size.
"""

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import yaml

from jobs.errors import RequestError
from slurm.common.yamlfile import YamlFileError, load_yaml_file

from ..spec import StudySpec, _variant_args

DATA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "published_results.yaml")
PRECISIONS = ("tf32", "fp32", "amp")
# a reference spec's data_path until the user sets it: `study run` refuses it, a dry run shows it
DATA_PLACEHOLDER_PREFIX = "<"
# benchmark steps of the reference specs (DLRM: NVIDIA's 1000; the others chosen here)
REFERENCE_STEPS = {"dlrm": (100, 1000), "wide_deep": (50, 400), "ncf": (20, 200)}
REFERENCE_DATA = {"dlrm": "Criteo 1TB preprocessed for DLRM (python -m preproc criteo)",
                  "wide_deep": "Outbrain preprocessed for Wide & Deep (python -m preproc outbrain)",
                  "ncf": "ml-20m preprocessed for NCF (python -m preproc movielens)"}


class PublishedDataError(RequestError):
    """The package data is malformed (a broken install or edit): names the table and row."""


@dataclass(frozen=True)
class Row:
    """One published throughput row: both precisions of one platform, size, batch and XLA."""

    table: str                      # table id, e.g. wide_deep_tf2
    model: str                      # dlrm | wide_deep | ncf
    platform: str
    gpus: int
    batch_per_gpu: int
    xla: Optional[bool]             # None: the README does not say
    throughput: Dict[str, float]    # precision -> samples/s (the platform's full precision and amp)
    model_size: Optional[str]
    source: str
    framework: str
    match: bool                     # whether study points are matched against this row
    version: str = ""               # the README's commit / date / container the numbers come from

    def amp_speedup(self) -> Optional[float]:
        """NVIDIA's "throughput speedup (full precision to mixed precision)" of this row."""
        full = next((self.throughput[p] for p in ("tf32", "fp32") if p in self.throughput), None)
        amp = self.throughput.get("amp")
        return amp / full if full and amp else None

    def to_dict(self):
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Published:
    """The loaded package data."""

    platforms: Dict[str, Dict[str, Any]]
    tables: List[Dict[str, Any]]
    rows: List[Row]

    def full_precision(self, platform) -> Optional[str]:
        return (self.platforms.get(platform) or {}).get("full_precision")


_CACHE: Dict[str, Published] = {}


def load(path=DATA_FILE) -> Published:
    """The published results (checked; cached per path). PublishedDataError names a bad entry."""
    if path not in _CACHE:
        try:
            data = load_yaml_file(path)
        except YamlFileError as exc:
            raise PublishedDataError(f"cannot read the published results: {exc}") from None
        _CACHE[path] = _check(data, path)
    return _CACHE[path]


def _check(data, path) -> Published:
    def fail(where, message):
        raise PublishedDataError(f"{path}: {where}: {message}")

    if not isinstance(data, dict) or data.get("version") != 1:
        fail("version", "expected a mapping of version 1")
    platforms = data.get("platforms")
    if not isinstance(platforms, dict) or not platforms:
        fail("platforms", "expected a mapping of platform -> {full_precision, profile}")
    for name, info in platforms.items():
        if not isinstance(info, dict) or info.get("full_precision") not in ("tf32", "fp32"):
            fail(f"platforms.{name}", "full_precision must be tf32 or fp32")
    tables = data.get("tables")
    if not isinstance(tables, list) or not tables:
        fail("tables", "expected a list of tables")
    rows, ids = [], set()
    for t, table in enumerate(tables):
        where = f"tables[{t}]"
        if not isinstance(table, dict):
            fail(where, "expected a mapping")
        tid = table.get("id")
        if not isinstance(tid, str) or tid in ids:
            fail(f"{where}.id", f"{tid!r} is missing or repeated")
        ids.add(tid)
        where = f"tables.{tid}"
        if table.get("model") not in ("dlrm", "wide_deep", "ncf"):
            fail(f"{where}.model", f"{table.get('model')!r} is not dlrm, wide_deep or ncf")
        for key in ("source", "framework"):
            if not isinstance(table.get(key), str) or not table[key]:
                fail(f"{where}.{key}", "missing (every table names where its numbers come from)")
        version = table.get("version")
        if not isinstance(version, dict) or not any(version.get(k) for k in ("commit", "container", "note")):
            fail(f"{where}.version", "a mapping naming the README's commit or container, or a note saying why "
                                     "neither is known (NVIDIA's figures change between versions)")
        version_text = ", ".join(str(x) for x in (
            version.get("commit") and f"commit {version['commit']}", version.get("date"),
            version.get("container") and f"container {version['container']}") if x) or str(version.get("note"))
        if not isinstance(table.get("match"), bool):
            fail(f"{where}.match", "true or false")
        throughput = table.get("throughput")
        if not isinstance(throughput, list) or not throughput:
            fail(f"{where}.throughput", "expected a list of rows")
        for r, row in enumerate(throughput):
            rwhere = f"{where}.throughput[{r}]"
            if not isinstance(row, dict):
                fail(rwhere, "expected a mapping")
            unknown = set(row) - {"platform", "gpus", "batch_per_gpu", "xla", "model_size"} - set(PRECISIONS)
            if unknown:
                fail(rwhere, f"unknown key(s) {sorted(unknown)}")
            platform = row.get("platform")
            if platform not in platforms:
                fail(f"{rwhere}.platform", f"{platform!r} is not one of {', '.join(platforms)}")
            for key in ("gpus", "batch_per_gpu"):
                value = row.get(key)
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    fail(f"{rwhere}.{key}", f"{value!r} is not a positive integer")
            if "xla" in row and not isinstance(row["xla"], bool):
                fail(f"{rwhere}.xla", f"{row['xla']!r} is not true or false")
            expected = {platforms[platform]["full_precision"], "amp"}
            given = {p for p in PRECISIONS if p in row}
            if given != expected:
                fail(rwhere, f"precisions {sorted(given)}; a {platform} row gives {sorted(expected)}")
            for p in given:
                value = row[p]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    fail(f"{rwhere}.{p}", f"{value!r} is not a positive throughput (samples/s)")
            rows.append(Row(table=tid, model=table["model"], platform=platform, gpus=row["gpus"],
                            batch_per_gpu=row["batch_per_gpu"], xla=row.get("xla"),
                            throughput={p: float(row[p]) for p in PRECISIONS if p in row},
                            model_size=row.get("model_size"), source=f"{table['source']}, version {version_text}",
                            framework=table["framework"], match=table["match"], version=version_text))
    return Published(platforms=platforms, tables=tables, rows=rows)


def rows(model=None, platform=None, matched_only=True) -> List[Row]:
    """Published rows of a model on a platform (None: any), in the data's order."""
    return [r for r in load().rows if (model is None or r.model == model)
            and (platform is None or r.platform == platform) and (r.match or not matched_only)]


def platform_of_node(node_name) -> Optional[str]:
    """The published platform of a node type name, or None."""
    return node_name if node_name in load().platforms else None


def platform_of(profile) -> Optional[str]:
    """The published platform of a loaded jobs.profiles.Profile (its node type's name), or None."""
    return platform_of_node(getattr(profile.node, "name", None))


def precision_of(args, platform) -> str:
    """tf32 | fp32 | amp of a point's engine flags on a platform: --amp is amp; otherwise the
    platform's full precision on V100 platforms (fp32: no TF32 there), else tf32, or fp32 under
    --no-tf32."""
    args = [str(a) for a in args]
    if "--amp" in args:
        return "amp"
    if load().full_precision(platform) == "fp32" or "--no-tf32" in args:
        return "fp32"
    return "tf32"


def settings_of(engine_args, variant, platform) -> Tuple[str, bool]:
    """(precision, xla) of a point: its spec's engine_args followed by its variant's flags."""
    args = [str(a) for a in engine_args or []] + _variant_args(variant or {})
    return precision_of(args, platform), "--xla" in args


def match(model, platform, gpus, batch_per_gpu, precision, xla) -> Optional[Row]:
    """The first matching published row (model, platform, GPUs, batch per GPU, precision, XLA when
    stated), or None."""
    if platform is None:
        return None
    for row in rows(model, platform):
        if row.gpus == gpus and row.batch_per_gpu == batch_per_gpu and precision in row.throughput \
                and (row.xla is None or row.xla == xla):
            return row
    return None


def is_placeholder(data_path) -> bool:
    """Whether a spec's data_path is the placeholder a reference spec is written with."""
    return isinstance(data_path, str) and data_path.startswith(DATA_PLACEHOLDER_PREFIX) and data_path.endswith(">")


def check_data_path(spec):
    """Refuse (one line) a spec whose data_path is still a reference spec's placeholder."""
    if is_placeholder(spec.data_path):
        raise RequestError(f"{spec.source}: data_path: {spec.data_path} is a placeholder; set it to your "
                           "dataset directory before `study run` (a reference study measures the real data)")


def reference_spec(model, profile) -> Tuple[StudySpec, str]:
    """(StudySpec, YAML text) of the study that reproduces NVIDIA's published table of `model` on
    the platform of a loaded profile: the published sizes and batch per GPU, the precisions
    (and XLA settings, when published) as variants, 3 repeats, the data path a placeholder.
    RequestError (one line) when nothing is published for that model and platform."""
    platform = platform_of(profile)
    if platform is None:
        raise RequestError(f"--profile: profile {profile.name!r} has node type {profile.node.name!r}, not a "
                           f"platform NVIDIA published for ({', '.join(_platforms_with_rows())}); "
                           "`recsys-submit study reference --list` shows what is published")
    found = rows(model, platform)
    if not found:
        elsewhere = sorted({r.platform for r in rows(model)})
        raise RequestError(f"--model: NVIDIA published no {model} throughput for {platform} (profile "
                           f"{profile.name}); {model} is published for {', '.join(elsewhere) or 'no platform'} "
                           "(`recsys-submit study reference --list`)")
    sizes = sorted({(r.gpus, r.batch_per_gpu) for r in found})
    if len({g * b for g, b in sizes}) == 1:
        scaling, batch = "strong", sizes[0][0] * sizes[0][1]
    elif len({b for _, b in sizes}) == 1:
        scaling, batch = "weak", sizes[0][1]
    else:       # not in today's data: every published table keeps its global batch
        raise RequestError(f"--model: the published {model} sizes on {platform} ({sizes}) keep neither the "
                           "global batch nor the batch per GPU; no single study spec runs them")
    full = load().full_precision(platform)
    variants: Dict[str, list] = {"precision": [full, "amp"]}
    xla = sorted({r.xla for r in found if r.xla is not None})
    if xla:
        variants["xla"] = xla
    warmup, steps = REFERENCE_STEPS[model]
    table = found[0]
    model_sizes = []
    for r in found:
        if r.model_size and r.model_size not in model_sizes:
            model_sizes.append(r.model_size)
    why_steps = ("NVIDIA's benchmark averages 1000 steps" if model == "dlrm" else
                 "steps chosen by recsys-submit; the README does not fix them")
    description = (f"NVIDIA's published {model} training throughput on {platform} ({table.table}, {table.framework}): "
                   f"{warmup} warm-up + {steps} timed steps ({why_steps})"
                   + (f"; published model sizes {', '.join(model_sizes)}: the dataset's tables decide the size"
                      if model_sizes else "") + ".")
    data = {"version": 1, "name": f"reference-{model}-{platform}", "description": description, "model": model,
            "scaling": scaling, "batch_size": batch, "gpus": [g for g, _ in sizes], "variants": variants,
            "repeats": 3, "warmup_steps": warmup, "steps": steps,
            "data_path": f"<set me: {REFERENCE_DATA[model]}>"}
    spec = StudySpec.from_dict(data, source="study reference")
    text = yaml.safe_dump(data, sort_keys=False, width=10_000, default_flow_style=None)
    out = [f"# Generated by `recsys-submit study reference --model {model} --profile {profile.name}`: the",
           f"# study that reproduces NVIDIA's published table ({table.source}).",
           "# Points: " + "; ".join(f"{g} GPU{'s' if g > 1 else ''}, batch {b} per GPU" for g, b in sizes)
           + f" ({scaling} scaling at {'global' if scaling == 'strong' else 'per-GPU'} batch {batch}).",
           "# `study report` shows, per point, the published throughput and measured / published."]
    for line in text.splitlines():
        if line.startswith("data_path:"):
            out.append("# data_path: a placeholder that `study run` refuses until you set your dataset directory")
        out.append(line)
    return spec, "\n".join(out) + "\n"


def _platforms_with_rows():
    return sorted({r.platform for r in rows()})


def _profiles_by_platform():
    """{platform: [profile names]} of the profiles on the search path (unloadable ones skipped)."""
    from jobs.profiles import list_profiles, load_profile

    out = {}
    for ref in list_profiles():
        try:
            platform = platform_of(load_profile(ref.path))
        except Exception:       # a broken user profile does not hide the published data
            continue
        if platform:
            out.setdefault(platform, []).append(ref.name)
    return out


def listing(model=None, profile=None) -> List[Dict[str, Any]]:
    """What is published, for which profiles: one entry per row of the matched tables (filtered
    by model and by a loaded profile's platform), with the profiles on the search path whose
    node type is that platform. RequestError when the filter leaves nothing."""
    platform = platform_of(profile) if profile is not None else None
    if profile is not None and platform is None:
        raise RequestError(f"--profile: profile {profile.name!r} has node type {profile.node.name!r}, not a "
                           f"platform NVIDIA published for ({', '.join(_platforms_with_rows())})")
    found = rows(model, platform)
    if not found:
        raise RequestError(f"--model: NVIDIA published no {model} throughput"
                           + (f" for {platform}" if platform else ""))
    profiles = _profiles_by_platform()
    return [dict(r.to_dict(), profiles=profiles.get(r.platform, []), amp_speedup=r.amp_speedup()) for r in found]


def listing_text(entries) -> str:
    head = ("model", "platform", "profiles", "GPUs", "batch/GPU", "xla", "precisions (samples/s)", "amp speedup",
            "table")
    lines = [head]
    for e in entries:
        lines.append((e["model"] + (f" ({e['model_size']})" if e["model_size"] else ""), e["platform"],
                      ",".join(e["profiles"]) or "(none)", str(e["gpus"]), str(e["batch_per_gpu"]),
                      "-" if e["xla"] is None else str(e["xla"]).lower(),
                      " ".join(f"{p} {v:,.0f}" for p, v in e["throughput"].items()),
                      f"{e['amp_speedup']:.2f}" if e["amp_speedup"] else "-", e["table"]))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    sources = []
    for e in entries:
        if f"{e['table']}: {e['source']}" not in sources:
            sources.append(f"{e['table']}: {e['source']}")
    return "\n".join(text + [""] + [f"source {s}" for s in sources]) + "\n"


__all__ = ["Row", "Published", "PublishedDataError", "load", "rows", "match", "platform_of", "platform_of_node",
           "precision_of", "settings_of", "reference_spec", "listing", "listing_text", "is_placeholder",
           "check_data_path"]
