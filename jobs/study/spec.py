"""A scaling study spec (YAML or CLI flags) and its expansion into points.

A point is one benchmark job of the engine: nodes x GPUs per node, the batch it runs (strong
scaling: the global batch stays fixed; weak: the batch per GPU does), one combination of the
variants (e.g. amp: [false, true] x xla: [false, true]) and one repeat. A spec is checked like a
profile, and every point against the profile and the engine's own flag parser, before anything
is created or submitted: bad input is one line naming the spec key or the point (StudyError,
exit 2). Running the points is jobs.study.running's; the table and plot are jobs.study.analysis's.
"""

import hashlib
import itertools
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import yaml

from jobs.errors import RequestError
from jobs.planning import engine_args
from jobs.planning.plan import plan
from jobs.planning.request import JobRequest, slug
from jobs.slurmtime import parse_time
from jobs.vocabulary import MODELS
from slurm.common.checker import Problems, unknown_key
from slurm.common.yamlfile import YamlFileError, keyname, load_yaml_file, shown

SPEC_VERSION = 1
MODES = ("strong", "weak")
PLACEMENTS = ("jobs", "allocation")
# key -> meaning; a spec with any other key is refused
KEYS = {
    "version": "spec format version (1)",
    "name": "study name (the study directory is study-<name> under the runs dir)",
    "description": "free text",
    "model": "dlrm | wide_deep | ncf",
    "scaling": "strong (fixed global batch) | weak (fixed batch per GPU)",
    "batch_size": "strong: the global batch; weak: the batch per GPU",
    "gpus": "GPU counts, e.g. [1, 2, 4, 8]; the profile's node size makes them nodes x GPUs/node",
    "points": "explicit points: [{nodes: N, gpus_per_node: G}, ...] (instead of gpus)",
    "variants": "engine settings crossed with the points, e.g. {amp: [false, true]}",
    "repeats": "runs of every point (the table shows their median and min-max)",
    "warmup_steps": "benchmark warm-up steps (excluded from throughput)",
    "steps": "timed benchmark steps",
    "breakdown_steps": "steps run after the timed ones as a split step, timing each phase (0: none)",
    "time": "time limit of each point's job (Slurm format)",
    "data_path": "dataset directory (else synthetic data)",
    "synthetic": "true: synthetic data (the default without data_path)",
    "engine_args": "further engine flags, e.g. ['--embedding-dim', '16']",
    "profile_steps": "START-END: a tf.profiler trace of those benchmark steps at every point, every rank "
                     "(docs/tensorboard.md); off by default",
    "placement": "jobs (each point its own job, the default) | allocation (every point in one allocation, "
                 "on its first nodes: jobs.study.running.allocation)",
}
# variant values -> engine flags; any other variant key k is the engine flag --k (booleans are
# switches, other values its argument)
PRECISION = {"tf32": [], "fp32": ["--no-tf32"], "amp": ["--amp"]}
MAX_POINTS = 10_000         # sizes x variant combinations x repeats: more is a typo, not a study
MAX_ENGINE_ARGS = 1_000
ID_LIMIT = 64               # a point id's variant part longer than this keeps a prefix and a hash


class StudyError(RequestError):
    """A bad study spec or point (one line, exit 2, nothing submitted)."""


@dataclass(frozen=True)
class Point:
    """One job of the study."""

    id: str
    nodes: int
    gpus_per_node: int
    gpus: int                       # ranks in all ("GPUs"; ranks on a GPU-less machine)
    batch_per_gpu: int
    global_batch: int
    variant: Dict[str, Any]
    variant_label: str              # "default" when the study has no variants
    repeat: int
    engine_args: List[str]

    def request(self, spec, profile_name):
        """The JobRequest of this point (the engine's benchmark mode)."""
        return JobRequest(kind="benchmark", profile=profile_name, model=spec.model, nodes=self.nodes,
                          gpus_per_node=self.gpus_per_node, engine_args=list(self.engine_args),
                          time=spec.time, name=slug(f"{spec.name}-{self.id}"))

    def to_dict(self):
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class StudySpec:
    """A validated study spec (defaults filled)."""

    name: str
    model: str
    scaling: str = "strong"
    batch_size: int = 4096
    gpus: Optional[List[int]] = None
    points: Optional[List[Dict[str, int]]] = None
    variants: Dict[str, List[Any]] = field(default_factory=dict)
    repeats: int = 1
    warmup_steps: int = 20
    steps: int = 100
    breakdown_steps: int = 20
    time: Optional[str] = None
    data_path: Optional[str] = None
    synthetic: Optional[bool] = None
    engine_args: List[str] = field(default_factory=list)
    description: str = ""
    placement: Optional[str] = None     # None: jobs
    profile_steps: Optional[str] = None   # --profile-steps of every point; None: no trace
    version: int = SPEC_VERSION
    source: str = "spec"           # where it came from, for error messages (not stored)

    def to_dict(self):
        """Every key but `source` (and `placement` when not given: a study.yaml written before it
        existed stays the same spec)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__
                if k != "source" and not (k in ("placement", "profile_steps") and getattr(self, k) is None)}

    @classmethod
    def from_dict(cls, data, source="spec"):
        """Check every key of a spec mapping; StudyError names the key at fault, and carries every
        mistake of the spec (``problems``, in the order of the keys' checks), each one line."""
        if not isinstance(data, dict):
            raise StudyError(f"{source}: a study spec is a mapping of keys ({', '.join(KEYS)})")
        ck = Problems(source, StudyError)
        # a value is shown only through shown(): a YAML alias bomb or a nested value printed
        # with !r took exponential time (slurm/common/yamlfile.py)
        for key in data:
            if key not in KEYS:
                with ck:
                    ck.fail(keyname(key), unknown_key(key, KEYS))
        with ck:
            version = data.get("version", SPEC_VERSION)
            if isinstance(version, bool) or version != SPEC_VERSION:
                ck.fail("version", f"{shown(version)} is not a spec version this recsys-submit reads ({SPEC_VERSION})")
        model = data.get("model")
        with ck:
            if not isinstance(model, str) or model not in MODELS:
                ck.fail("model", f"{shown(model)} is not one of {', '.join(MODELS)}")
        name = data.get("name") or model
        with ck:
            if not isinstance(name, str) or slug(name) != name:
                ck.fail("name", f"{shown(name)}: use only letters, digits, '.', '_' and '-' (at most 64)")
        scaling = data.get("scaling", "strong")
        with ck:
            if not isinstance(scaling, str) or scaling not in MODES:
                ck.fail("scaling", f"{shown(scaling)} is not one of {', '.join(MODES)}")
        ints = {}
        for key, default in (("batch_size", 4096), ("repeats", 1), ("steps", 100), ("warmup_steps", 20),
                             ("breakdown_steps", 20)):
            value = data.get(key, default)
            least = 0 if key in ("warmup_steps", "breakdown_steps") else 1
            with ck:
                if isinstance(value, bool) or not isinstance(value, int) or value < least:
                    ck.fail(key, f"{shown(value)} is not a {'non-negative' if least == 0 else 'positive'} integer")
                ints[key] = value
        gpus, points = data.get("gpus"), data.get("points")
        sizes = None                     # the number of sizes, once gpus or points is good
        with ck:
            if gpus is not None and points is not None:
                ck.fail("points", "give either gpus or points, not both")
            if gpus is None and points is None:
                ck.fail("points", "no points: give gpus: [1, 2, 4, ...] or points: [{nodes: 1, gpus_per_node: 1}, ...]")
            if gpus is not None:
                if not isinstance(gpus, list) or not gpus:
                    ck.fail("gpus", "empty point list; give GPU counts such as [1, 2, 4, 8]")
                for value in gpus:
                    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                        ck.fail("gpus", f"{shown(value)} is not a positive GPU count")
                seen = set()
                for value in gpus:
                    if value in seen:
                        ck.fail("gpus", f"repeats the count {value} (use repeats: for repeated runs)")
                    seen.add(value)
                sizes = len(gpus)
            if points is not None:
                points = _points(points, ck)
                sizes = len(points)
        variants = data.get("variants") or {}
        with ck:
            if not isinstance(variants, dict):
                variants = {}
                ck.fail("variants", "a mapping of engine setting -> list of values, e.g. {amp: [false, true]}")
        for key, values in variants.items():
            with ck:
                _check_variant(key, values, ck)
        engine_args = data.get("engine_args") or []
        with ck:
            if not isinstance(engine_args, list) or not all(isinstance(a, (str, int, float)) for a in engine_args):
                ck.fail("engine_args", "a list of engine flags and values, e.g. ['--embedding-dim', '16']")
            if len(engine_args) > MAX_ENGINE_ARGS:
                ck.fail("engine_args", f"{len(engine_args)} entries, more than {MAX_ENGINE_ARGS}")
            engine_args = [str(a) for a in engine_args]
            for flag in ("--batch-size", "--benchmark-steps", "--benchmark-warmup-steps", "--breakdown-steps",
                         "--run-mode", "--mode", "--model", "--profile-steps"):
                if any(a == flag or a.startswith(flag + "=") for a in engine_args):
                    ck.fail("engine_args", f"{flag} is set by the study (use its own key)")
        data_path = data.get("data_path")
        synthetic = data.get("synthetic")
        with ck:
            if data_path is not None and not isinstance(data_path, str):
                ck.fail("data_path", f"{shown(data_path)} is not a path")
        with ck:
            if synthetic is not None and not isinstance(synthetic, bool):
                ck.fail("synthetic", f"{shown(synthetic)} is not true or false")
            if data_path and synthetic:
                ck.fail("synthetic", "give data_path or synthetic: true, not both")
        time = data.get("time")
        with ck:
            if time is not None:
                if isinstance(time, bool) or not isinstance(time, (str, int)) or len(str(time)) > 32:
                    ck.fail("time", f"{shown(time)} is not a Slurm time limit such as \"04:00:00\"")
                try:
                    parse_time(str(time), "time")
                except RequestError as exc:
                    ck.add(f"{source}: {exc}")
                time = str(time)
        placement = data.get("placement")
        with ck:
            if placement is not None and (not isinstance(placement, str) or placement not in PLACEMENTS):
                ck.fail("placement", f"{shown(placement)} is not one of {', '.join(PLACEMENTS)}")
        profile_steps = data.get("profile_steps")
        with ck:
            if profile_steps is not None:
                profile_steps = _profile_steps(profile_steps, ints, ck)
        description = data.get("description") or ""
        with ck:
            if isinstance(description, (list, dict)):
                ck.fail("description", f"must be text, got {shown(description)}")
        with ck:
            if sizes is not None and "repeats" in ints:
                count = sizes * ints["repeats"]
                for values in variants.values():
                    count *= len(values) if isinstance(values, list) else 1
                    if count > MAX_POINTS:
                        break
                if count > MAX_POINTS:
                    ck.fail("points", f"more than {MAX_POINTS} points (sizes x variant combinations x repeats)")
        ck.raise_problems()
        return cls(name=name, model=model, scaling=scaling, gpus=gpus, points=points, variants=variants,
                   time=time, data_path=data_path, synthetic=synthetic, engine_args=engine_args,
                   description=str(description), placement=placement, profile_steps=profile_steps,
                   source=source, **ints)


def _points(points, ck):
    """``points:`` as ``[{nodes, gpus_per_node}]`` (StudySpec.from_dict's check of that key)."""
    if not isinstance(points, list) or not points:
        ck.fail("points", "empty point list")
    clean = []
    for i, point in enumerate(points):
        if not isinstance(point, dict) or "nodes" not in point:
            ck.fail(f"points[{i}]", f"expected {{nodes: N, gpus_per_node: G}}, got {shown(point)}")
        for key in point:
            if key not in ("nodes", "gpus_per_node"):
                ck.fail(f"points[{i}].{keyname(key)}", unknown_key(key, ("nodes", "gpus_per_node")))
            value = point[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                ck.fail(f"points[{i}].{key}", f"{shown(value)} is not a positive integer")
        clean.append({"nodes": point["nodes"], "gpus_per_node": point.get("gpus_per_node")})
    return clean


def _check_variant(key, values, ck):
    """One ``variants:`` entry: an engine setting name and a non-empty list of plain values."""
    if not isinstance(key, str) or not key.replace("_", "").replace("-", "").isalnum():
        ck.fail(f"variants.{keyname(key)}", "not an engine setting name")
    if not isinstance(values, list) or not values:
        ck.fail(f"variants.{key}", "give a non-empty list of values")
    for value in values:
        if not isinstance(value, (bool, int, float, str)):
            ck.fail(f"variants.{key}", f"{shown(value)} is not a plain value")
    if key == "precision":
        for value in values:
            if value not in PRECISION:
                ck.fail("variants.precision", f"{shown(value)} is not one of {', '.join(PRECISION)}")


def _profile_steps(profile_steps, ints, ck):
    """``profile_steps:`` as "START-END" inside the point's benchmark steps."""
    start, _, end = str(profile_steps).partition("-") if isinstance(profile_steps, str) else ("", "", "")
    if len(profile_steps if isinstance(profile_steps, str) else "") > 24 \
            or not (start.isdigit() and end.isdigit()) or not 1 <= int(start) <= int(end):
        ck.fail("profile_steps", f"{shown(profile_steps)} is not START-END benchmark steps, e.g. \"30-32\"")
    total = ints.get("warmup_steps", 20) + ints.get("steps", 100)
    if int(end) > total:
        ck.fail("profile_steps", f"{profile_steps}: a point runs {total} benchmark steps (warmup_steps + steps)")
    return str(profile_steps)


def load_spec(path):
    """A StudySpec from a YAML file; StudyError (one line naming the file and key) otherwise."""
    try:
        data = load_yaml_file(path)
    except YamlFileError as exc:
        raise StudyError(str(exc)) from None
    return StudySpec.from_dict(data, source=path)


def _variant_args(variant):
    args = []
    for key, value in variant.items():
        if key == "precision":
            args += PRECISION[value]
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            continue
        else:
            args += [flag, str(value)]
    return args


def _variant_label(variant):
    if not variant:
        return "default"
    return ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in variant.items())


def _variant_id(label):
    """The variant part of a point id: the label as a slug, whole while it fits ID_LIMIT; a longer
    one keeps a readable prefix and a hash of the whole label, so that two long labels that differ
    only at the end stay apart (a cut at 64 made them one id) and an id never changes."""
    text = slug(label.replace(",", "_").replace("=", "-"), limit=None)
    if len(text) <= ID_LIMIT:
        return text
    digest = hashlib.sha256(label.encode("utf-8")).hexdigest()[:10]
    return text[:ID_LIMIT - len(digest) - 1].rstrip("._-") + "-" + digest


def _sizes(spec, profile):
    """[(nodes, gpus_per_node)] of the spec's points on `profile`."""
    if spec.points is not None:
        return [(p["nodes"], p["gpus_per_node"]) for p in spec.points]
    node = profile.node
    per_node = node.gpus or node.sockets * node.cores_per_socket * node.threads_per_core
    out = []
    for gpus in spec.gpus:
        if gpus <= per_node:
            out.append((1, gpus))
        elif gpus % per_node:
            raise StudyError(f"{spec.source}: gpus: {gpus} GPUs do not fill whole nodes of {per_node} "
                             f"(profile {profile.name})")
        else:
            out.append((gpus // per_node, per_node))
    return out


def point_args(spec, global_batch, variant):
    """The recsys-train flags of a point of the spec (without --model and the run mode, which the
    job request carries): its data, batch, benchmark steps, the spec's and the variant's flags."""
    base = ["--data-path", spec.data_path] if spec.data_path else ["--synthetic"]
    return base + ["--batch-size", str(global_batch),
                   "--benchmark-warmup-steps", str(spec.warmup_steps),
                   "--benchmark-steps", str(spec.steps)] \
        + (["--breakdown-steps", str(spec.breakdown_steps)] if spec.breakdown_steps else []) \
        + (["--profile-steps", spec.profile_steps] if spec.profile_steps else []) \
        + list(spec.engine_args) + _variant_args(variant)


def expand(spec, profile):
    """Every Point of the spec on a loaded Profile, checked against the profile (sizes, time)
    and the engine's flag parser. StudyError names the point at fault."""
    variants = [dict(zip(spec.variants, combo)) for combo in itertools.product(*spec.variants.values())] \
        if spec.variants else [{}]
    points = []
    for nodes, gpn in _sizes(spec, profile):
        size_id = f"n{nodes}x{gpn if gpn is not None else 'd'}"
        probe = JobRequest(kind="benchmark", profile=profile.name, model=spec.model, nodes=nodes,
                           gpus_per_node=gpn, time=spec.time, name="probe")
        try:        # once per size: the variants and repeats of a size plan the same
            resolved, _ = plan([probe], profile)
        except RequestError as exc:
            raise StudyError(f"{spec.source}: point {size_id}: {exc}") from None
        res = resolved[0]
        gpn = res.request.gpus_per_node if res.request.gpus_per_node is not None else res.gpus_per_node
        ranks = res.ranks
        if spec.scaling == "strong":
            if spec.batch_size % ranks:
                raise StudyError(f"{spec.source}: batch_size: {spec.batch_size} does not divide over the "
                                 f"{ranks} GPUs of point {size_id}")
            per_gpu, global_batch = spec.batch_size // ranks, spec.batch_size
        else:
            per_gpu, global_batch = spec.batch_size, spec.batch_size * ranks
        for variant in variants:
            for repeat in range(spec.repeats):
                label = _variant_label(variant)
                pid = f"g{ranks}-n{nodes}x{gpn}" + ("" if not variant else "-" + _variant_id(label)) + f"-r{repeat}"
                args = point_args(spec, global_batch, variant)
                points.append(Point(id=pid, nodes=nodes, gpus_per_node=gpn, gpus=ranks, batch_per_gpu=per_gpu,
                                    global_batch=global_batch, variant=dict(variant), variant_label=label,
                                    repeat=repeat, engine_args=args))
    seen = {}
    for point in points:
        other = seen.setdefault(point.id, point)
        if other is not point:
            raise StudyError(f"{spec.source}: points: point {point.id} appears twice (variants "
                             f"{shown(other.variant_label)} and {shown(point.variant_label)} give one id)")
    checked = set()
    for point in points:
        if tuple(point.engine_args) not in checked:     # repeats and sizes share most argv
            check_engine_args(spec, point)
            checked.add(tuple(point.engine_args))
    return points


def check_engine_args(spec, point):
    """Let the engine refuse a flag (unknown flag, bad value) before submission, with the one check
    that submit, --dry-run and render make (jobs.planning.engine_args.check; the data is the
    study's, checked when it runs). recsys.train checks without importing TensorFlow."""
    argv = ["--model", spec.model, "--run-mode", "benchmark"] + list(point.engine_args)
    try:
        engine_args.check(argv, 1, check_data=False, check_existence=False)
    except RequestError as exc:
        message = str(exc).split("(after `--`): ", 1)[-1]
        raise StudyError(f"{spec.source}: point {point.id}: the engine rejects its flags: {message}") from None


def spec_from_flags(model, gpus, scaling="strong", batch_size=None, variants=(), repeats=None,
                    warmup_steps=None, steps=None, breakdown_steps=None, time=None, data_path=None, name=None,
                    engine_args=()):
    """A StudySpec for a quick sweep from CLI flags (`--gpus 1,2,4 --variant amp=false,true`)."""
    data = {"model": model, "scaling": scaling, "engine_args": list(engine_args)}
    try:
        data["gpus"] = [int(g) for g in str(gpus).replace(",", " ").split()]
    except ValueError:
        raise StudyError(f"--gpus: {gpus!r} is not a list of GPU counts such as 1,2,4,8") from None
    parsed = {}
    for item in variants:
        key, sep, values = str(item).partition("=")
        if not sep or not key:
            raise StudyError(f"--variant: {item!r} is not KEY=V1,V2 (e.g. amp=false,true)")
        parsed[key] = [_flag_value(v) for v in values.split(",") if v != ""]
    if parsed:
        data["variants"] = parsed
    for key, value in (("batch_size", batch_size), ("repeats", repeats), ("warmup_steps", warmup_steps),
                       ("steps", steps), ("breakdown_steps", breakdown_steps), ("time", time),
                       ("data_path", data_path), ("name", name)):
        if value is not None:
            data[key] = value
    return StudySpec.from_dict(data, source="--gpus/--variant flags")


def _flag_value(text):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def spec_yaml(spec):
    """The spec as YAML (what the study directory keeps as study.yaml)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)    # libyaml when built with it: same text
    return yaml.dump(spec.to_dict(), Dumper=dumper, sort_keys=False)


def is_study_dir(path):
    return os.path.isfile(os.path.join(path, "study.json"))
