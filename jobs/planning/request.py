"""The job request a user makes, and its validation against a cluster profile.

A JobRequest says *what* to run (kind, model or dataset, engine arguments) and *how big*
(nodes, GPUs per node, time, array). `resolve()` checks it against a Profile and fills the
profile's defaults, raising RequestError with one line naming the flag at fault, so that
nothing is ever submitted from an impossible request.
"""

import dataclasses
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional

from jobs.schedulers import capabilities
from jobs.errors import RequestError
from jobs.slurmtime import parse_time
from jobs.vocabulary import (BIND_MODES, DATASETS, KINDS, MODEL_DATASET, MODELS, NVTABULAR_DATASETS,
                             NVTABULAR_ONLY_DATASETS, PAYLOADS, PREPROCESS_ENGINES, PREPROCESS_MODES)

from .engine_args import has_flag, refuse_owned

if TYPE_CHECKING:   # pragma: no cover
    from jobs.profiles import Profile

__all__ = ["JobRequest", "Resolved", "resolve", "build_chain", "slug"]
_JOBID = re.compile(r"^\d+(_\d+)?$")
DEFAULT_SIGNAL_SECONDS = 120


@dataclass
class JobRequest:
    """What the user asked for; fields left None take the profile's defaults."""

    kind: str
    profile: str = "local"
    model: Optional[str] = None            # dlrm | wide_deep | ncf | hello (built-in payload)
    dataset: Optional[str] = None          # preprocess: criteo | movielens | outbrain | tabular
    payload: str = "recsys"                # recsys (training engine) | hello (smoke payload)
    nodes: Optional[int] = None          # None: the profile's default (else 1)
    gpus_per_node: Optional[int] = None
    ntasks_per_node: Optional[int] = None  # None: the engine decides (per GPU or per node)
    engine_args: List[str] = field(default_factory=list)
    time: Optional[str] = None
    name: Optional[str] = None
    array: Optional[int] = None            # number of array tasks
    array_parallelism: Optional[int] = None
    after: List[str] = field(default_factory=list)   # afterok on existing job ids
    bind: Optional[str] = None
    hyperthreads: Optional[bool] = None
    signal_seconds: Optional[int] = None
    requeue: bool = True
    python: Optional[str] = None
    # a job name shared with every job this one must never run beside (Slurm: that --job-name
    # and --dependency=singleton): a study's points on a profile whose nodes share hardware
    singleton: Optional[str] = None
    # a copy of the engines and in-job helpers (recsys/, slurm/) the job runs instead of this
    # checkout: a study's frozen code (jobs.study.running.frozen)
    code_dir: Optional[str] = None
    # preprocessing
    preprocess_mode: str = "single"
    input: Optional[str] = None
    output: Optional[str] = None
    shards: Optional[int] = None           # criteo array mode: transform tasks
    preprocess_engine: str = "spark"       # spark | nvtabular

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise RequestError(f"request: unknown field {unknown[0]!r}")
        return cls(**data)


@dataclass(frozen=True)
class Resolved:
    """A validated request with every default filled from the profile."""

    request: JobRequest
    profile: "Profile"
    engine: str                 # recsys | hello | preproc
    name: str                   # Slurm-safe job name
    time_seconds: int           # always finite: the USR2 checkpoint signal needs an end
    gpus_per_node: int
    ntasks_per_node: int
    bind: str
    hyperthreads: bool
    signal_seconds: int

    @property
    def ranks(self):
        return self.request.nodes * self.ntasks_per_node


def slug(text, limit=64):
    """Job names and run-directory names: only [A-Za-z0-9._-], so they are inert everywhere."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("._-")
    return (cleaned or "job")[:limit]


def _positive(value, flag, allow_none=True):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{flag}: {value!r} is not an integer")
    if value <= 0:
        raise RequestError(f"{flag}: must be at least 1, got {value}")


def _defaults(profile):
    return dict(profile.defaults or {})


def resolve(request, profile):
    """Validate `request` against `profile`; return a Resolved or raise RequestError."""
    req = request
    if req.kind not in KINDS:
        raise RequestError(f"kind: unknown kind {req.kind!r} (choose from {', '.join(KINDS)})")
    if req.model == "hello":
        req = dataclasses.replace(req, payload="hello", model=None)
    if req.payload not in PAYLOADS:
        raise RequestError(f"--payload: unknown payload {req.payload!r} (choose from {', '.join(PAYLOADS)})")

    if req.kind == "preprocess":
        engine = "preproc"
        if req.dataset is None and req.model in MODEL_DATASET:
            req = dataclasses.replace(req, dataset=MODEL_DATASET[req.model])
        if req.dataset is None:
            raise RequestError(f"--dataset: required for preprocess (choose from {', '.join(DATASETS)}, "
                               "or give a --model that implies one)")
        if req.dataset not in DATASETS:
            raise RequestError(f"--dataset: unknown dataset {req.dataset!r} (choose from {', '.join(DATASETS)})")
        if req.preprocess_mode not in PREPROCESS_MODES:
            raise RequestError(f"--mode: unknown preprocess mode {req.preprocess_mode!r} "
                               f"(choose from {', '.join(PREPROCESS_MODES)})")
        if req.preprocess_mode == "array" and req.dataset != "criteo":
            raise RequestError(f"--mode array: only criteo has array stages, not {req.dataset}")
        if req.dataset in NVTABULAR_ONLY_DATASETS and req.preprocess_engine == "spark":
            req = dataclasses.replace(req, preprocess_engine="nvtabular")   # its only engine
        if req.dataset == "tabular" and not has_flag(req.engine_args, "--config"):
            raise RequestError("--dataset tabular: name the table's YAML after `--`: -- --config FILE")
        if req.preprocess_engine not in PREPROCESS_ENGINES:
            raise RequestError(f"--engine: unknown preprocessing engine {req.preprocess_engine!r} "
                               f"(choose from {', '.join(PREPROCESS_ENGINES)})")
        if req.preprocess_engine == "nvtabular":
            if req.dataset not in NVTABULAR_DATASETS:
                raise RequestError(f"--engine nvtabular: {req.dataset} has no NVTabular workflow "
                                   f"(datasets: {', '.join(NVTABULAR_DATASETS)})")
            if req.preprocess_mode == "array":
                raise RequestError("--engine nvtabular: no array stages (use --mode single or multinode)")
        for flag, value in (("--input", req.input), ("--output", req.output)):
            if not value:
                raise RequestError(f"{flag}: required for preprocess")
        if req.preprocess_mode == "array":
            _positive(req.shards, "--shards", allow_none=False)
        elif req.shards is not None:
            raise RequestError("--shards: only used with --mode array")
        if req.preprocess_mode != "multinode" and req.nodes not in (None, 1):
            _positive(req.nodes, "--nodes", allow_none=False)
            raise RequestError(f"--nodes: preprocess --mode {req.preprocess_mode} runs on one node; "
                               "use --mode multinode for a Spark cluster over several nodes")
    else:
        engine = req.payload
        if engine == "recsys" and req.model is None:
            raise RequestError(f"--model: required for {req.kind} (choose from {', '.join(MODELS)}, hello)")
        if engine == "recsys" and req.model not in MODELS:
            raise RequestError(f"--model: unknown model {req.model!r} (choose from {', '.join(MODELS)}, hello)")
        if req.preprocess_mode != "single" or req.shards is not None:
            raise RequestError("--mode/--shards: only for preprocess")
        if req.preprocess_engine != "spark":
            raise RequestError("--engine: only for preprocess")

    refuse_owned(req.engine_args, engine)

    defaults = _defaults(profile)
    if req.nodes is None:
        req = dataclasses.replace(req, nodes=int(defaults.get("nodes", 1)) if engine != "preproc"
                                  or req.preprocess_mode == "multinode" else 1)
    _positive(req.nodes, "--nodes", allow_none=False)
    _positive(req.gpus_per_node, "--gpus-per-node")
    _positive(req.ntasks_per_node, "--ntasks-per-node")
    _positive(req.array, "--array")
    _positive(req.array_parallelism, "--array-parallelism")
    if req.array_parallelism is not None and req.array is None and req.kind != "preprocess":
        raise RequestError("--array-parallelism: needs --array")
    if req.array is not None and req.kind == "preprocess":
        raise RequestError("--array: preprocess arrays come from --mode array --shards N")
    if req.signal_seconds is not None:
        _positive(req.signal_seconds, "--signal-seconds")
    for dep in req.after:
        if not _JOBID.match(str(dep)):
            raise RequestError(f"--after: {dep!r} is not a Slurm job id")

    node = profile.node
    max_nodes = profile.max_nodes or 1
    if req.nodes > max_nodes:
        raise RequestError(f"--nodes: {req.nodes} nodes requested but profile {profile.name!r} has {max_nodes}")
    gpus = req.gpus_per_node
    if gpus is None:
        gpus = int(defaults.get("gpus_per_node", node.gpus) or 0)
    if node.gpus == 0 and capabilities(profile.scheduler).gpuless_ranks:
        # A GPU-less machine: "GPUs per node" counts ranks, none of them gets a GPU.
        req = dataclasses.replace(req, ntasks_per_node=req.ntasks_per_node or max(gpus, 1))
        gpus = 0
    if gpus > node.gpus:
        raise RequestError(f"--gpus-per-node: {gpus} GPUs per node requested but profile "
                           f"{profile.name!r} nodes have {node.gpus}")
    if engine == "preproc":
        ntasks = req.ntasks_per_node or 1
    else:
        ntasks = req.ntasks_per_node or max(gpus, 1)
    logical_cpus = node.sockets * node.cores_per_socket * node.threads_per_core
    if ntasks > logical_cpus:
        raise RequestError(f"--ntasks-per-node: {ntasks} tasks per node but profile {profile.name!r} "
                           f"nodes have {logical_cpus} CPUs")

    time_text = req.time or defaults.get("time") or profile.default_time or "01:00:00"
    time_what = "--time" if req.time else f"profile {profile.name}: default_time"
    time_seconds = parse_time(time_text, time_what)
    if time_seconds is None:
        raise RequestError(f"{time_what}: {time_text!r} gives no end time, so the USR2 checkpoint signal "
                           "can never fire; give a finite limit")
    signal_seconds = req.signal_seconds or int(defaults.get("signal_seconds", DEFAULT_SIGNAL_SECONDS))
    if signal_seconds >= time_seconds:
        # Keep the checkpoint signal inside the time limit (e.g. a 1-minute smoke job).
        if req.signal_seconds is not None:
            raise RequestError(f"--signal-seconds: {signal_seconds} s is not shorter than --time "
                               f"{time_text} ({time_seconds} s)")
        signal_seconds = max(1, time_seconds // 4)

    bind = req.bind or defaults.get("binding") or defaults.get("bind") or "exclusive"
    if bind not in BIND_MODES:
        raise RequestError(f"--bind: unknown binding mode {bind!r} (choose from {', '.join(BIND_MODES)})")
    ht = req.hyperthreads
    if ht is None:
        ht = bool(defaults.get("hyperthreads", False))

    if req.name:
        name = slug(req.name)
    elif engine == "preproc":
        name = f"preprocess-{req.dataset}"
    elif engine in ("hello", "collectives"):
        name = f"{req.kind}-{engine}"
    else:
        name = f"{req.kind}-{req.model}"
    return Resolved(request=req, profile=profile, engine=engine, name=name,
                    time_seconds=time_seconds, gpus_per_node=gpus, ntasks_per_node=ntasks,
                    bind=bind, hyperthreads=ht, signal_seconds=signal_seconds)


_CHAIN_DROPS = ("payload", "nodes", "gpus_per_node", "ntasks_per_node", "name", "bind", "hyperthreads")


def build_chain(kind, model=None, *, engine_args=(), after=(), array=None, array_parallelism=None,
                preprocess_from=None, data_path=None, then_evaluate=False, dataset=None,
                preprocess_mode="single", input=None, output=None, shards=None, preprocess_engine="spark",
                **common):
    """The JobRequest chain of one job command: [preprocess ->] job [-> evaluate], each waiting
    (afterok) for the one before. The CLI's job subcommands and the Python API both build their
    chains here. `common` holds the JobRequest sizing fields shared by the chain (profile, nodes,
    gpus_per_node, time, bind, ...); `preprocess_from` RAW preprocesses into `data_path` first,
    with `preprocess_mode`/`shards` (and `array_parallelism` for an array-mode preprocess)."""
    unknown = sorted(set(common) - {f.name for f in dataclasses.fields(JobRequest)})
    if unknown:
        raise RequestError(f"request: unknown field {unknown[0]!r}")
    after = [a.strip() for item in after for a in str(item).split(",") if a.strip()]
    if kind == "preprocess":
        own = {k: v for k, v in common.items() if k != "payload"}
        return [JobRequest(kind=kind, model=model, dataset=dataset, preprocess_mode=preprocess_mode,
                           input=input, output=output, shards=shards, array_parallelism=array_parallelism,
                           preprocess_engine=preprocess_engine, engine_args=list(engine_args), after=after,
                           **own)]
    for flag, value in (("--dataset", dataset), ("--input", input), ("--output", output)):
        if value is not None and not (flag == "--dataset" and preprocess_from):
            raise RequestError(f"{flag}: only for preprocess")
    if (preprocess_mode != "single" or shards is not None or preprocess_engine != "spark") and not preprocess_from:
        raise RequestError("--mode/--shards/--engine: only for preprocess (or with --preprocess-from)")
    # with an array-mode preprocess in the chain, --parallelism caps its transform array
    pre_cap = array_parallelism if preprocess_from and preprocess_mode == "array" else None
    main_cap = None if pre_cap is not None else array_parallelism
    engine = list(engine_args)
    if data_path:
        engine = ["--data-path", data_path] + engine
    chain = []
    if preprocess_from:
        if kind != "train":
            raise RequestError("--preprocess-from: only with train")
        if not data_path:
            raise RequestError("--preprocess-from: needs --data-path (the preprocessed output)")
        chain.append(JobRequest(kind="preprocess", dataset=dataset or MODEL_DATASET.get(model),
                                preprocess_mode=preprocess_mode, input=preprocess_from, output=data_path,
                                shards=shards, after=after, array_parallelism=pre_cap,
                                preprocess_engine=preprocess_engine,
                                **{k: v for k, v in common.items() if k not in _CHAIN_DROPS}))
        after = []
    chain.append(JobRequest(kind=kind, model=model, array=array, array_parallelism=main_cap,
                            engine_args=engine, after=after, **common))
    if then_evaluate:
        if kind != "train":
            raise RequestError("--then-evaluate: only with train")
        chain.append(JobRequest(kind="evaluate", model=model, engine_args=engine,
                                **{k: v for k, v in common.items() if k != "name"}))
    return chain
