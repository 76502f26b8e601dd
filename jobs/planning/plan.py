"""Launch planning: a resolved request becomes one or more Slurm jobs (JobSpecs).

A plan is an ordered list of JobSpecs; each names the earlier specs it waits for (afterok, or
afterany between the chunks of a split array). Train/evaluate/benchmark requests are one job
(optionally an array); criteo preprocessing in array mode is dictionary -> transform array
(split into chunks no larger than MaxArraySize, each chunk offsetting RECSYS_TASK_INDEX) ->
finalize; multinode preprocessing, and a RAPIDS (GPU) Spark run on one node, is one job that starts
a Spark standalone cluster over its nodes (Spark's local mode schedules no GPUs). Several requests chain (preprocess -> train -> evaluate) through afterok.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional, Tuple

from jobs.errors import RequestError
from slurm.common.node_memory import NODE_MEMORY_PERCENT
from slurm.common.spark_layout import gpu_resource_conf

from . import container_paths, engine_args
from .argv import EngineLog, RunPath, SlurmHelper, job_python
from .engine_args import absolute
from .request import resolve

if TYPE_CHECKING:   # pragma: no cover
    from jobs.profiles import Profile

# Per-engine launch setting: one rank per GPU ("gpu") or one per node ("node"), whether each
# rank goes through the binding wrapper, and whether >1 rank needs an MPI world.
ENGINES = {
    "recsys": {"tasks": "gpu", "bind": True, "mpi": True},
    "hello": {"tasks": "gpu", "bind": True, "mpi": True},
    "collectives": {"tasks": "gpu", "bind": True, "mpi": True},      # recsys.collectives: a fabric's figures
    "preproc": {"tasks": "node", "bind": False, "mpi": False},
}


@dataclass
class JobSpec:
    """One job of a plan (an array counts as one job): everything a backend needs to render
    or launch it, so that nothing reaches back into the request."""

    key: str                              # unique in the run: main, dictionary, transform.0, ...
    name: str                             # Slurm job name (already slug-safe)
    profile: "Profile"                    # the cluster it runs on
    kind: str                             # train | evaluate | predict | benchmark | preprocess
    subject: str                          # model, dataset or "hello" (the script's title)
    engine: str                           # recsys | hello | preproc (a key of ENGINES)
    time_seconds: int                     # time limit
    signal_seconds: int                   # USR2 this long before the limit
    requeue: bool                         # requeue on USR2
    bind_mode: str                        # exclusive | numa | interleave | off (slurm/bind.sh)
    hyperthreads: bool                    # bind the hyperthread siblings too
    nodes: int
    ntasks_per_node: int
    gpus_per_node: int
    command: List[str]                    # argv of one rank (or of the batch step)
    launcher: str = "srun"                # srun: one step of ranks; batch: the script runs it once
    bind: bool = True                     # wrap each rank in slurm/bind.sh
    array: Optional[Tuple[int, int, Optional[int]]] = None   # (first, last, cap)
    task_offset: int = 0
    task_count: Optional[int] = None
    after_ok: List[str] = field(default_factory=list)        # keys of earlier specs
    after_any: List[str] = field(default_factory=list)       # keys (chunks of a capped array)
    external_after: List[str] = field(default_factory=list)  # job ids outside this run
    env: dict = field(default_factory=dict)                  # extra exports for this job
    # the engine's --checkpoint-dir as the batch host sees it (the requeue progress guard lists it,
    # the lead-time warning reads it): with a container, the host path of its mount
    checkpoint_dir: Optional[str] = None
    singleton: Optional[str] = None       # JobRequest.singleton: the job name it shares, one at a time
    code_dir: Optional[str] = None        # JobRequest.code_dir: the copy of recsys/ and slurm/ it runs

    @property
    def array_size(self):
        return 0 if self.array is None else self.array[1] - self.array[0] + 1


def rank_command(spec):
    """argv of one rank: the engine command behind slurm/bind.sh when the engine binds."""
    if not (spec.bind and ENGINES[spec.engine]["bind"]):
        return list(spec.command)
    wrapper = ["bash", SlurmHelper("bind.sh"), "--mode", spec.bind_mode]
    if spec.hyperthreads:
        wrapper.append("--ht")
    return wrapper + ["--"] + list(spec.command)


def split_array(count, max_array_size):
    """[(offset, size)] chunks with size <= max_array_size (Slurm indices must be < MaxArraySize)."""
    step = max(1, int(max_array_size))
    return [(start, min(step, count - start)) for start in range(0, count, step)]


# An array larger than MaxArraySize is split into at most this many jobs (one sbatch each); more
# is refused before anything is submitted (`--array 10000000` would be thousands of jobs).
MAX_ARRAY_CHUNKS = 10


def _array_specs(base, count, cap, max_array_size, flag="--array"):
    """Array JobSpecs for `count` tasks; chunks run one after another when capped so that the
    cap holds over the whole array, in parallel otherwise. More tasks than MAX_ARRAY_CHUNKS
    chunks of the cluster's MaxArraySize hold: RequestError naming `flag` and the limit."""
    limit = MAX_ARRAY_CHUNKS * max(1, int(max_array_size))
    if count > limit:
        raise RequestError(f"{flag} {count}: at most {limit} tasks ({MAX_ARRAY_CHUNKS} jobs of the cluster's "
                           f"MaxArraySize {max_array_size}); ask for fewer tasks or give each task more work")
    chunks = split_array(count, max_array_size)
    specs = []
    for index, (offset, size) in enumerate(chunks):
        key = base.key if len(chunks) == 1 else f"{base.key}.{index}"
        spec = dataclasses.replace(
            base, key=key, array=(0, size - 1, cap), task_offset=offset, task_count=count,
            after_ok=list(base.after_ok), after_any=list(base.after_any))
        if cap is not None and specs:
            spec.after_any.append(specs[-1].key)
        specs.append(spec)
    return specs


def engine_argv(res, handoff=()):
    """The training engine's own arguments for a resolved request: model, run mode, the user's
    arguments (paths made absolute) and what the chain hands over (plan), without the interpreter.
    The one argv every reader of the job's engine flags reads (checks, checkpoint dir, chain)."""
    req = res.request
    return ["--model", req.model, "--run-mode", req.kind] + engine_args.absolute_paths(req.engine_args) + list(handoff)


def _engine_command(res, python, argv):
    req = res.request
    if res.engine == "hello":
        return [python, "-m", "jobs.hello", "--kind", req.kind] + list(req.engine_args)
    if res.engine == "collectives":
        return [python, "-m", "recsys.collectives"] + engine_args.absolute_paths(req.engine_args, ("--out",))
    command = [python, "-m", "recsys.train"] + list(argv)
    if not engine_args.has_flag(argv, "--log-path"):
        command += ["--log-path", EngineLog()]     # the user's own --log-path wins
    return command


def embedding_memory_gb(node, gpus_per_node, ntasks_per_node):
    """Memory one rank has for its embedding tables and weights: its GPU's memory when ranks own
    GPUs, else the node's memory shared by its ranks (None when the profile does not say)."""
    if gpus_per_node and node.gpu_memory_gb:
        return float(node.gpu_memory_gb)
    if node.memory_gb:
        return round(float(node.memory_gb) / max(1, ntasks_per_node), 3)
    return None


def _engine_env(res):
    """The training engine's defaults that come from the profile (the engine reads them from its
    environment): the per-rank embedding memory budget of --embedding-placement auto."""
    if res.engine != "recsys":
        return {}
    budget = embedding_memory_gb(res.profile.node, res.gpus_per_node, res.ntasks_per_node)
    return {} if budget is None else {"RECSYS_EMBEDDING_MEMORY_GB": f"{budget:g}"}


def plan_request(res, max_array_size=None, key_prefix="", handoff=()):
    """The JobSpecs of one resolved request, in submission order; `handoff`: engine arguments
    the chain adds (the checkpoint dir a train job writes for the evaluate job after it)."""
    req, profile = res.request, res.profile
    python = job_python(profile, req.python)
    max_array = int(max_array_size or profile.max_array_size or 1001)
    prefix = f"{key_prefix}." if key_prefix else ""
    subject = req.dataset if res.engine == "preproc" else (req.model or res.engine)
    common = dict(profile=profile, kind=req.kind, subject=subject, engine=res.engine,
                  time_seconds=res.time_seconds, signal_seconds=res.signal_seconds,
                  requeue=req.requeue, bind_mode=res.bind, hyperthreads=res.hyperthreads,
                  nodes=req.nodes, ntasks_per_node=res.ntasks_per_node,
                  gpus_per_node=res.gpus_per_node, external_after=list(req.after), singleton=req.singleton,
                  code_dir=req.code_dir)

    if res.engine != "preproc":
        argv = engine_argv(res, handoff) if res.engine == "recsys" else []
        # the requeue guard watches the checkpoint dir the engine really gets, handed over or not
        ckpt = engine_args.checkpoint_dir(argv) if req.kind == "train" else None
        ckpt = container_paths.host_path(profile, ckpt, "--checkpoint-dir")
        base = JobSpec(key=f"{prefix}main" if not prefix else key_prefix, name=res.name,
                       command=_engine_command(res, python, argv), bind=True,
                       env=_engine_env(res), checkpoint_dir=ckpt, **common)
        if req.array:
            return _array_specs(base, req.array, req.array_parallelism, max_array)
        return [base]

    preproc = [python, "-m", "preproc", req.dataset]
    io = ["--input", absolute(req.input), "--output", absolute(req.output)]
    stage_args = engine_args.absolute_paths(req.engine_args, engine_args.PREPROC_PATH_FLAGS)
    if req.preprocess_engine != "spark":
        io += ["--engine", req.preprocess_engine]
    mode = req.preprocess_mode
    rapids = (req.preprocess_engine == "spark" and res.gpus_per_node > 0
              and engine_args.has_flag(stage_args, "--rapids-jar"))
    container_paths.check_preprocess(res, stage_args)
    if mode == "single" and not rapids:
        # CPU Spark in local[N] mode (or NVTabular's own LocalCUDACluster / threads): one process;
        # LocalCUDACluster spills to dask's temporary-directory: the profile's node-local scratch
        spill = {"DASK_TEMPORARY_DIRECTORY": profile.scratch} if req.preprocess_engine == "nvtabular" \
            and profile.scratch else {}
        return [JobSpec(key=key_prefix or "preprocess", name=res.name, bind=False,
                        command=preproc + ["run"] + io + stage_args, env=spill, **common)]
    if mode in ("single", "multinode"):
        # Spark's local mode schedules no GPUs (spark-rapids: it hangs or uses one GPU), so a RAPIDS
        # run on one node starts the same standalone master + worker inside the job as several do.
        node = profile.node
        cores = node.sockets * node.cores_per_socket * node.threads_per_core
        shape = {"nodes": req.nodes, "cores": cores, "memory_gb": int(node.memory_gb), "gpus": res.gpus_per_node,
                 "rapids": rapids, "scratch": profile.scratch,
                 "start_seconds": (profile.defaults or {}).get("cluster_start_seconds")}
        launcher, flags = MULTINODE_CLUSTERS[req.preprocess_engine](shape)
        cmd = launcher + preproc + ["run"] + io + flags + stage_args
        common["ntasks_per_node"] = 1
        # the cluster helpers start their daemons and checks with the driver's interpreter
        return [JobSpec(key=key_prefix or "preprocess", name=res.name, bind=False,
                        launcher="batch", command=cmd, env={"RECSYS_PYTHON": python}, **common)]
    # criteo array mode: dictionary -> transform array -> finalize (CPU pieces: no GPUs)
    one = dict(common, nodes=1, ntasks_per_node=1, gpus_per_node=0)
    dictionary = JobSpec(key=f"{prefix}dictionary", name=f"{res.name}-dict", bind=False,
                         command=preproc + ["dictionary"] + io + stage_args, **one)
    one["external_after"] = []
    transform = JobSpec(key=f"{prefix}transform", name=f"{res.name}-transform", bind=False,
                        command=preproc + ["transform"] + io, after_ok=[dictionary.key], **one)
    transforms = _array_specs(transform, req.shards, req.array_parallelism, max_array, flag="--shards")
    finalize = JobSpec(key=f"{prefix}finalize", name=f"{res.name}-finalize", bind=False,
                       command=preproc + ["finalize", "--output", absolute(req.output)],
                       after_ok=[t.key for t in transforms], **one)
    return [dictionary] + transforms + [finalize]


def _spark_standalone(shape):
    """A Spark standalone cluster over the job's nodes; the driver sizes its executors from the shape.
    A RAPIDS run: each worker offers the node's GPUs (--gpus-per-node), and the executor cores and
    the executor/task GPU amounts of slurm/common/spark_layout.py (the rule the driver applies too) are
    handed to the driver as --spark-conf, so the script shows them; the user's own --spark-conf
    after `--` comes later and wins. The workers offer the same cores the driver sizes its
    executors from (the profile's node), shuffle on the profile's node-local scratch."""
    launcher = ["bash", SlurmHelper("spark-standalone.sh"), "--worker-cores", str(shape["cores"])]
    launcher += _cluster_settings(shape, "--local-dirs")
    driver = ["--nodes", str(shape["nodes"]), "--node-cores", str(shape["cores"]),
              "--node-memory-gb", str(shape["memory_gb"]), "--gpus-per-node", str(shape["gpus"])]
    if shape.get("rapids"):
        launcher += ["--gpus-per-node", str(shape["gpus"])]
        for key, value in gpu_resource_conf(shape["cores"], shape["gpus"]).items():
            driver += ["--spark-conf", f"{key}={value}"]
    return launcher + ["--"], driver


def _dask_cluster(shape):
    """A dask scheduler + one worker per node (dask-cuda workers on GPU nodes) for NVTabular. The
    node's workers share ``NODE_MEMORY_PERCENT`` of its memory: slurm/dask-cluster.sh gives each of
    them its part (distributed's --memory-limit is per worker process)."""
    return (["bash", SlurmHelper("dask-cluster.sh"), "--gpus-per-node", str(shape["gpus"]),
             "--node-memory-gb", str(max(1, shape["memory_gb"] * NODE_MEMORY_PERCENT // 100))]
            + _cluster_settings(shape, "--local-directory") + ["--"],
            ["--nodes", str(shape["nodes"])])


def _cluster_settings(shape, scratch_flag):
    """The profile's settings of a cluster helper: its start-up timeout (defaults.cluster_start_seconds)
    and its node-local scratch (`scratch`, under the helper's `scratch_flag`)."""
    out = []
    if shape.get("start_seconds"):
        out += ["--timeout", str(shape["start_seconds"])]
    if shape.get("scratch"):
        out += [scratch_flag, shape["scratch"]]
    return out


# Multinode preprocessing: the cluster each engine starts inside the allocation (launcher
# prefix, driver flags), from the shape {nodes, cores, memory_gb, gpus} of the job.
MULTINODE_CLUSTERS = {"spark": _spark_standalone, "nvtabular": _dask_cluster}


def _exits(specs):
    """Specs no other spec of the same request waits for: what a chained request waits on."""
    waited = {k for s in specs for k in s.after_ok + s.after_any}
    return [s.key for s in specs if s.key not in waited]


def run_name(resolved):
    """Name of a run: its main (first non-preprocess) request, else the first."""
    main = [r for r in resolved if r.engine != "preproc"]
    return (main or resolved)[0].name


def _handoff(res, resolved_later, checkpoints, key):
    """Engine arguments the chain hands a request: a train job that an evaluate job of the same
    model follows writes its checkpoints into the run dir (checkpoints-<key>) unless the user
    named a --checkpoint-dir; an evaluate job without one reads the last such train job's.
    `checkpoints` maps model -> checkpoint dir of the chain's train jobs so far (updated)."""
    req = res.request
    if res.engine != "recsys":
        return []
    own = engine_args.checkpoint_dir(req.engine_args)
    if req.kind == "train":
        evaluated = any(r.engine == "recsys" and r.request.kind == "evaluate" and r.request.model == req.model
                        for r in resolved_later)
        if own is None and evaluated:
            checkpoints[req.model] = RunPath(f"checkpoints-{key}")
            return ["--checkpoint-dir", checkpoints[req.model]]
        if own is not None:
            checkpoints[req.model] = absolute(own)
        return []
    if req.kind == "evaluate" and own is None and req.model in checkpoints:
        return ["--checkpoint-dir", checkpoints[req.model]]
    return []


def _produced(res, handoff):
    """Paths a job writes that later jobs of the chain read: a preprocess output, a train job's
    checkpoint dir."""
    req = res.request
    if res.engine == "preproc":
        return [absolute(req.output)]
    if res.engine == "recsys" and req.kind == "train":
        ckpt = engine_args.checkpoint_dir(engine_argv(res, handoff))
        return [ckpt] if ckpt else []
    return []


def plan(requests, profile, max_array_size=None, submitting=False, check_data=None):
    """Resolve and plan a chain of requests; each request's first jobs wait (afterok) for the
    previous request's last jobs, and gets what earlier ones write (_handoff).
    The training engine's arguments are checked by its own parser and start-up checks
    (jobs.planning.engine_args.check), for a render or dry run too: flags, values, the batch over
    the ranks; with `check_data` (default: `submitting`; a dry run of a submission) its data named;
    when `submitting` (not rendering: a script may be for another machine), also present on this
    host unless an earlier job of the chain writes it.
    Returns (resolved list, JobSpec list)."""
    resolved_all = [resolve(request, profile) for request in requests]
    if submitting:
        container_paths.check_image_file(profile)
    resolved, specs = [], []
    previous_exits = []
    chained = len(requests) > 1
    checkpoints, produced = {}, []
    for index, res in enumerate(resolved_all):
        prefix = ""
        if chained:
            prefix = res.request.kind
            if any(r.request.kind == prefix for r in resolved):
                prefix = f"{prefix}{index}"
        handoff = _handoff(res, resolved_all[index + 1:], checkpoints, prefix or "main")
        container_paths.check_training(res)
        # container paths: refused when no mount covers them, checked on this host at their host paths
        argv = engine_argv(res, handoff) if res.engine == "recsys" else []
        host_argv = container_paths.host_argv(res.profile, argv)
        if res.engine == "recsys":
            # one check for submit, --dry-run and render (issue 48): flags, values, batch split;
            # data named unless rendering, present only when submitting (a script may be for another machine)
            try:
                engine_args.check(host_argv, res.ranks, check_data=submitting if check_data is None else check_data,
                                  check_existence=submitting and not res.request.after, produced=produced)
            except RequestError as exc:
                raise RequestError(container_paths.in_container_words(str(exc), argv, host_argv)) from None
        if res.engine in ("recsys", "collectives") and (submitting or check_data):
            engine_args.check_interpreter(res.profile, res.request.python)
        produced += [container_paths.host_path(res.profile, p, "--output") for p in _produced(res, handoff)]
        own = plan_request(res, max_array_size, key_prefix=prefix, handoff=handoff)
        if previous_exits:
            own_keys = {s.key for s in own}
            for spec in own:
                if not any(k in own_keys for k in spec.after_ok + spec.after_any):
                    spec.after_ok = previous_exits + spec.after_ok
        previous_exits = _exits(own)
        resolved.append(res)
        specs.extend(own)
    return resolved, specs
