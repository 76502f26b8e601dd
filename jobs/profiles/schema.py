"""Profile validation: which keys a profile file may have, their types, and the consistency
rules of a node's topology tables.

Checks a raw (already YAML-parsed, ``extends``-merged) mapping and returns plain checked
values; jobs.profiles.loader builds the Profile from them and owns finding and reading the files.
Every problem is a :class:`ProfileError` whose message is one line ``<file>: <key.path>:
<problem>``. Independent keys are all checked: the error raised is the first problem, and its
``problems`` lists every one (``recsys-submit profiles validate`` prints them all, one per line);
a check that depends on a bad value (the NUMA tables on a bad core count) is skipped.
Standard library only (login nodes).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Optional

from jobs.schedulers import SCHEDULERS, capabilities  # the scheduler names and their node limits
from jobs.slurmtime import parse_time  # sbatch's time-limit semantics, the one parser
from jobs.vocabulary import BIND_MODES as BINDING_MODES  # one home for the binding modes
from slurm.common.errors import ToolkitError
from slurm.common.checker import Problems  # the toolkit's one checker of a file a user wrote
from slurm.common.yamlfile import control_char, printable, typename  # one home for the YAML words, one-line messages

from .fabric import fabric_from_raw
from .topology import NodeType

__all__ = [
    "ProfileError", "Checker", "check_profile", "node_from_raw", "typename", "has_control", "control_problems",
    "BINDING_MODES", "MPI_TYPES", "SCHEDULERS",
    "NODE_KEYS", "PROFILE_KEYS", "CONTAINER_KEYS", "DEFAULT_KEYS",
]

MPI_TYPES = ("pmix", "pmi2", "none")


class ProfileError(ToolkitError, ValueError):
    """A profile could not be found, parsed or validated (one-line message)."""

    def __init__(self, file: Any, key: str, problem: str):
        self.file, self.key, self.problem = str(file), key, problem
        where = printable(f"{self.file}: {key}" if key else self.file)    # one line, whatever the names
        super().__init__(f"{where}: {problem}")
        self.problems: List[str] = [str(self)]    # every problem of the file, one line each, this one first


_SWITCHES_RE = re.compile(r"\d+(@[0-9:-]+)?")      # fullmatch: `$` would let a final newline through
# free text that no job script shows (a folded YAML block ends with a newline)
_FREE_TEXT = ("description",)


def has_control(text: str) -> bool:
    """Whether `text` holds a control character (a newline ends a script's comment line and
    starts a command; a tab or escape sequence is never meant)."""
    return control_char(text) is not None


def control_problems(file: Any, data: Any, key: str = "") -> List["ProfileError"]:
    """One problem per string of a raw profile mapping, keys included, that holds a control
    character: every value may reach the rendered sbatch script (names, paths, container fields,
    env, setup lines, partition, ...), and a newline there becomes shell code."""
    problems: List[ProfileError] = []
    if isinstance(data, dict):
        for k, v in data.items():
            path = f"{key}.{k}" if key else str(k)
            if isinstance(k, str) and has_control(k):
                problems.append(ProfileError(file, path, "the key has a control character"))
            elif not (key == "" and k in _FREE_TEXT):
                problems += control_problems(file, v, path)
    elif isinstance(data, list):
        for i, v in enumerate(data):
            problems += control_problems(file, v, f"{key}[{i}]")
    elif isinstance(data, str) and has_control(data):
        char = control_char(data)
        what = "line separator" if char in "\u2028\u2029" else "control character"
        problems.append(ProfileError(file, key, f"has the {what} {char!r} (a value that reaches "
                                                "the job script must be printable text on one line)"))
    return problems


class Checker(Problems):
    """The profile's :class:`slurm.common.checker.Problems`: every mistake a ProfileError."""

    def __init__(self, file: str):
        super().__init__(file, ProfileError, ProfileError)


NODE_KEYS = {"name", "gpus", "gpu_model", "gpu_memory_gb", "sockets", "cores_per_socket",
             "threads_per_core", "memory_gb", "numa_cpus", "gpu_numa", "gpu_cores",
             "ht_offset", "nics"}
PROFILE_KEYS = {"name", "description", "extends", "scheduler", "node", "max_nodes",
                "partition", "account", "qos", "default_time", "max_array_size", "mpi",
                "container", "setup", "env", "sbatch_extra", "switches", "python", "defaults",
                "shared_nodes", "fabric", "scratch"}
CONTAINER_KEYS = {"image", "mounts", "workdir", "provides"}
# what a container image may declare it holds (container.provides): the submission refuses a job
# whose engine the image lacks; an image that declares nothing is not checked (unknown, not lacking)
IMAGE_CONTENTS = ("tensorflow", "horovod", "spark", "rapids", "nvtabular")
# defaults: key -> (type, check or choices)
DEFAULT_KEYS: Dict[str, Any] = {
    "binding": (str, BINDING_MODES),
    "hyperthreads": (bool, None),
    "signal_seconds": (int, None),
    "time": (str, None),
    "gpus_per_node": (int, None),
    "nodes": (int, None),
    "exclusive": (bool, None),
    "runs_dir": (str, None),
    # a Unix group that may read (not write) this site's run and study directories; without it
    # they are private to their owner (they hold the profile's env values and the scripts)
    "runs_group": (str, None),
    # seconds the multinode preprocessing helpers (slurm/spark-standalone.sh, dask-cluster.sh) give
    # their master and workers to come up, after the job's container exists on every node (120)
    "cluster_start_seconds": (int, None),
    # hangs (recsys.monitoring.watchdog, docs/reliability.md): the engine's no-progress limit in seconds
    # (recsys-train --hang-timeout; without it the limit scales with the step time), and Horovod's
    # own stall check (a warning naming the missing ranks after CHECK, the job ended after SHUTDOWN)
    "hang_timeout": (int, None),
    # the watchdog's limit before the first step (Horovod's init, tracing) and outside the steps (1800)
    "startup_timeout": (int, None),
    "horovod_stall_check_seconds": (int, None),
    "horovod_stall_shutdown_seconds": (int, None),
    # the hardware sampler (slurm/hwsample.py, on unless false) and the study report's warning of a
    # GPU busy less than gpu_min_utilization % of its samples' median (default 50)
    "hw_sample": (bool, None),
    "gpu_min_utilization": (int, None),
    # the GPUs' base SM clock (MHz, the spec sheet's) that a study report warns below; without it,
    # each GPU's default application clock as nvidia-smi gives it (on some GPUs that is the boost)
    "gpu_base_clock_mhz": (int, None),
}
# defaults that reach the job as environment variables (jobs.backends.slurm.script.job_env)
DEFAULTS_ENV = {"hang_timeout": "RECSYS_HANG_TIMEOUT", "startup_timeout": "RECSYS_STARTUP_TIMEOUT",
                "horovod_stall_check_seconds": "HOROVOD_STALL_CHECK_TIME_SECONDS",
                "horovod_stall_shutdown_seconds": "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
                "hw_sample": "RECSYS_HW_SAMPLE"}


def defaults_env(defaults) -> Dict[str, str]:
    """The environment a profile's hang and stall defaults give its jobs."""
    values = {key: (defaults or {}).get(key) for key in DEFAULTS_ENV}
    return {var: str(int(value) if isinstance(value, bool) else value)
            for key, var in DEFAULTS_ENV.items() if (value := values[key]) is not None}


def node_from_raw(ck: Checker, raw: Any, default_name: str, p: str = "node") -> Optional[NodeType]:
    """The NodeType of a node mapping; problems are recorded in `ck` (None when there are any)."""
    before = len(ck.lines)
    data = ck.collect(lambda: ck.mapping(raw, p))
    if data is None:
        return None
    ck.no_unknown(data, NODE_KEYS, f"{p}.")
    get = ck.collect
    name = get(lambda: ck.string(data, "name", f"{p}.name", default=default_name), default_name)
    gpus = get(lambda: ck.integer(data, "gpus", f"{p}.gpus", required=True, minimum=0))
    sockets = get(lambda: ck.integer(data, "sockets", f"{p}.sockets", required=True, minimum=1))
    cps = get(lambda: ck.integer(data, "cores_per_socket", f"{p}.cores_per_socket", required=True, minimum=1))
    tpc = get(lambda: ck.integer(data, "threads_per_core", f"{p}.threads_per_core", default=1, minimum=1))
    ht_offset = get(lambda: ck.integer(data, "ht_offset", f"{p}.ht_offset", minimum=1))
    gpu_model = get(lambda: ck.string(data, "gpu_model", f"{p}.gpu_model"))
    gpu_memory_gb = get(lambda: ck.number(data, "gpu_memory_gb", f"{p}.gpu_memory_gb"))
    memory_gb = get(lambda: ck.number(data, "memory_gb", f"{p}.memory_gb"))
    nics = get(lambda: _nics(ck, data, p), [])
    if None in (gpus, sockets, cps, tpc):
        return None     # the tables below are checked against these counts
    if nics and len(nics) != gpus:
        ck.record(f"{p}.nics", f"has {len(nics)} entries for {gpus} GPUs "
                  "(one per GPU, repeat a NIC shared by a GPU pair)")
    cores = sockets * cps
    logical = cores * tpc
    if ht_offset is not None:
        if tpc != 2:
            ck.record(f"{p}.ht_offset", f"needs threads_per_core: 2, got {tpc}")
            return None
        if ht_offset < cores or ht_offset + cores > logical:
            ck.record(f"{p}.ht_offset", f"{ht_offset} does not map the {cores} cores "
                      f"into the {logical} logical CPUs")
            return None
    numa = get(lambda: _numa(ck, data, p, (sockets, cps, tpc), ht_offset))
    if numa is None:
        return None
    numa, owner = numa
    gpu_numa = get(lambda: _gpu_numa(ck, data, p, gpus, numa))
    gpu_cores = get(lambda: _gpu_cores(ck, data, p, gpus, cores, owner, gpu_numa)) if gpu_numa is not None else None
    if len(ck.lines) > before or gpu_cores is None:      # a None part has its problem recorded
        return None
    return NodeType(
        name=name, gpus=gpus, gpu_model=gpu_model, gpu_memory_gb=gpu_memory_gb,
        sockets=sockets, cores_per_socket=cps, threads_per_core=tpc, memory_gb=memory_gb,
        numa_cpus=dict(sorted(numa.items())), gpu_numa=gpu_numa, gpu_cores=gpu_cores,
        ht_offset=ht_offset, nics=nics)


def _nics(ck: Checker, data, p: str) -> List[str]:
    nics = ck.str_list(data, "nics", f"{p}.nics")
    for i, nic in enumerate(nics):
        if not re.fullmatch(r"[A-Za-z0-9_.:-]+", nic):
            ck.fail(f"{p}.nics[{i}]", f"invalid device name {nic!r}")
    return nics


def _numa(ck: Checker, data, p: str, shape, ht_offset):
    """({NUMA node: cpus}, {cpu: NUMA node}) of node.numa_cpus, every bad entry recorded;
    `shape`: (sockets, cores per socket, threads per core)."""
    sockets, cps, tpc = shape
    cores = sockets * cps
    logical = cores * tpc
    raw_numa = ck.mapping(ck.typed(data, "numa_cpus", dict, f"{p}.numa_cpus", required=True),
                          f"{p}.numa_cpus")
    numa: Dict[int, List[int]] = {}
    owner: Dict[int, int] = {}
    bad = False
    for nid, cpus_raw in raw_numa.items():
        key = f"{p}.numa_cpus.{nid}"
        if isinstance(nid, bool) or not isinstance(nid, int) or nid < 0:
            ck.record(key, "NUMA node ids must be non-negative integers")
            bad = True
            continue
        cpus = ck.collect(lambda: ck.cpulist(cpus_raw, key))
        if cpus is None:
            bad = True
            continue
        for c in cpus:
            if c >= logical:
                ck.record(key, f"cpu {c} is beyond the {logical} logical CPUs "
                          f"({sockets} sockets x {cps} cores x {tpc} threads)")
                bad = True
                break
            if c in owner:
                ck.record(key, f"cpu {c} is also in NUMA node {owner[c]}")
                bad = True
                break
            owner[c] = nid
        numa[nid] = cpus
    if bad:
        return None
    for node, cpus in numa.items():
        for c in cpus:
            if c >= cores and (ht_offset is None or owner.get(c - ht_offset) != node):
                ck.fail(f"{p}.numa_cpus.{node}",
                              f"cpu {c} is neither a physical core (< {cores}) nor the HT "
                              f"sibling of a core of NUMA node {node}")
    for c in range(cores):
        if c not in owner:
            ck.fail(f"{p}.numa_cpus", f"core {c} is in no NUMA node")
    return numa, owner


def _gpu_numa(ck: Checker, data, p: str, gpus: int, numa) -> List[int]:
    gpu_numa_raw = ck.typed(data, "gpu_numa", list, f"{p}.gpu_numa", default=[])
    if len(gpu_numa_raw) != gpus:
        ck.fail(f"{p}.gpu_numa", f"has {len(gpu_numa_raw)} entries for {gpus} GPUs")
    gpu_numa = []
    for i, n in enumerate(gpu_numa_raw):
        if isinstance(n, bool) or not isinstance(n, int):
            ck.fail(f"{p}.gpu_numa[{i}]", f"must be an integer, got {typename(n)}")
        if n not in numa:
            ck.fail(f"{p}.gpu_numa[{i}]", f"NUMA node {n} does not exist (nodes: {sorted(numa)})")
        gpu_numa.append(n)
    return gpu_numa


def _gpu_cores(ck: Checker, data, p: str, gpus: int, cores: int, owner, gpu_numa) -> List[List[int]]:
    gpu_cores_raw = ck.typed(data, "gpu_cores", list, f"{p}.gpu_cores", default=[])
    if len(gpu_cores_raw) != gpus:
        ck.fail(f"{p}.gpu_cores", f"has {len(gpu_cores_raw)} entries for {gpus} GPUs")
    gpu_cores: List[List[int]] = []
    used: Dict[int, int] = {}
    for i, raw_set in enumerate(gpu_cores_raw):
        key = f"{p}.gpu_cores[{i}]"
        cset = ck.cpulist(raw_set, key)
        if not cset:
            ck.fail(key, "empty core set")
        for c in cset:
            if c >= cores:
                ck.fail(key, f"core {c} is beyond the {cores} physical cores "
                                   "(list physical cores; HT siblings are added by the binding)")
            if c in used:
                ck.fail(key, f"core {c} is also in the core set of GPU {used[c]}")
            if owner.get(c) != gpu_numa[i]:
                ck.fail(key, f"core {c} is not on GPU {i}'s NUMA node {gpu_numa[i]}")
            used[c] = i
        gpu_cores.append(cset)
    return gpu_cores


def _container_from_raw(ck: Checker, raw: Any) -> Optional[Dict[str, Any]]:
    if raw is None:
        return None
    data = ck.mapping(raw, "container")
    ck.no_unknown(data, CONTAINER_KEYS, "container.")
    mounts = ck.collect(lambda: ck.str_list(data, "mounts", "container.mounts"), [])
    for i, m in enumerate(mounts):
        parts = m.split(":")
        if ":" not in m or m.startswith(":"):
            ck.record(f"container.mounts[{i}]", f"must be SRC:DST[:FLAGS], got {m!r}")
        elif "," in m:
            ck.record(f"container.mounts[{i}]", "must not contain ',' (one mount per entry)")
        elif not (parts[0].startswith("/") and parts[1].startswith("/")):
            # the submission translates container paths to host paths through these (jobs.profiles.mounts)
            ck.record(f"container.mounts[{i}]", f"SRC and DST must be absolute paths, got {m!r}")
    if data.get("workdir") is not None:
        ck.record("container.workdir", "not used any more: every step starts in the job's run "
                  "directory (where its relative paths point); remove the key")
    provides = ck.collect(lambda: ck.str_list(data, "provides", "container.provides"), [])
    for i, word in enumerate(provides):
        if word not in IMAGE_CONTENTS:
            ck.record(f"container.provides[{i}]",
                      f"{word!r} is not one of {', '.join(IMAGE_CONTENTS)}")
    return {"image": ck.collect(lambda: ck.string(data, "image", "container.image", required=True)),
            "mounts": mounts, "workdir": None,
            "provides": provides if data.get("provides") is not None else None}


def _defaults_from_raw(ck: Checker, raw: Any) -> Dict[str, Any]:
    if raw is None:
        return {}
    data = ck.mapping(raw, "defaults")
    ck.no_unknown(data, DEFAULT_KEYS, "defaults.")
    out = {}
    for key, (typ, choices) in DEFAULT_KEYS.items():
        if key not in data:
            continue
        path = f"defaults.{key}"
        if typ is int:
            out[key] = ck.collect(lambda: ck.integer(data, key, path, minimum=1))
        elif typ is str:
            out[key] = ck.collect(lambda: ck.string(data, key, path, choices=choices))
        else:
            out[key] = ck.collect(lambda: ck.typed(data, key, typ, path))
    if out.get("time") is not None:
        ck.collect(lambda: _check_time(ck, out["time"], "defaults.time"))
    return out


def _check_time(ck: Checker, value: str, key: str) -> None:
    try:
        seconds = parse_time(value, key)
    except ValueError as exc:
        ck.fail(key, str(exc).split(": ", 1)[-1])
    if seconds is None:
        ck.fail(key, f"{value!r}: give a finite time limit (the checkpoint signal needs one)")


# what ranks on nodes that share cores need: Open MPI spins on its progress engine while it
# waits unless told to yield, so on oversubscribed cores a waiting rank steals the time of the
# rank it waits for (`ompi_info --all`: mpi_yield_when_idle; Open MPI sets it itself only when a
# node has more ranks than slots, which `--oversubscribe` permits but does not make true)
SHARED_NODES_ENV = {"OMPI_MCA_mpi_yield_when_idle": "1"}


def _env_from_raw(ck: Checker, raw: Any, shared_nodes: bool = False) -> Dict[str, str]:
    """The profile's env; a shared-nodes profile gets SHARED_NODES_ENV unless it sets those."""
    out = dict(SHARED_NODES_ENV) if shared_nodes else {}
    if raw is None:
        return out
    data = ck.mapping(raw, "env")
    for k, v in data.items():
        if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            ck.record(f"env.{k}", "not a valid environment variable name")
        elif isinstance(v, bool) or not isinstance(v, (str, int, float)):
            ck.record(f"env.{k}", f"must be a string or number, got {typename(v)} (quote it)")
        else:
            out[k] = str(v)
    return out


def _switches(ck: Checker, data) -> Optional[str]:
    switches = data.get("switches")
    if switches is None:
        return None
    switches = str(switches) if isinstance(switches, int) and not isinstance(switches, bool) \
        else ck.string(data, "switches", "switches")
    if not _SWITCHES_RE.fullmatch(switches):
        ck.fail("switches", f"must be COUNT[@MAX_WAIT] like '1@00:10:00', got {switches!r}")
    return switches


def _sbatch_extra(ck: Checker, data) -> List[str]:
    sbatch_extra = ck.str_list(data, "sbatch_extra", "sbatch_extra")
    for i, opt in enumerate(sbatch_extra):
        if not opt.startswith("--"):
            ck.record(f"sbatch_extra[{i}]",
                      f"must be a long option like '--network=sharp', got {opt!r}")
    return sbatch_extra


def _scratch(ck: Checker, data) -> Optional[str]:
    scratch = ck.string(data, "scratch", "scratch")
    if scratch is not None and not scratch.startswith("/"):
        ck.fail("scratch", f"must be an absolute path on node-local disk, got {scratch!r}")
    return scratch


def _sharp(ck: Checker, sbatch_extra: List[str], env: Dict[str, str]) -> None:
    """``--network=sharp`` reserves SHARP resources for the job, which NCCL uses only through its
    CollNet plugin (NCCL_COLLNET_ENABLE=1 and the nccl-rdma-sharp plugin in the image)."""
    if any(opt.replace(" ", "=").startswith("--network=") and "sharp" in opt for opt in sbatch_extra) \
            and env.get("NCCL_COLLNET_ENABLE") != "1":
        ck.fail("sbatch_extra", "--network=sharp without env NCCL_COLLNET_ENABLE: \"1\" (NCCL uses SHARP "
                                      "only through CollNet): set it, or drop --network=sharp")


def check_profile(ck: Checker, data: Dict[str, Any], name: str,
                  resolve_node: Callable[[str], NodeType]) -> Dict[str, Any]:
    """The checked fields of a Profile (``container`` as a mapping) from a merged raw mapping;
    ``resolve_node`` turns a string ``node:`` (a profile name, a path, ``detect``) into a node.
    Every independent key is checked; then the first problem is raised, carrying them all."""
    ck.no_unknown(data, PROFILE_KEYS)
    get = ck.collect
    scheduler = get(lambda: ck.string(data, "scheduler", "scheduler", default="slurm", choices=SCHEDULERS))
    raw_node = data.get("node")
    node = None
    if raw_node is None:
        ck.record("node", "required key is missing (a node-type mapping, a profile "
                  "name whose node to reuse, or 'detect')")
    elif isinstance(raw_node, str):
        node = get(lambda: resolve_node(raw_node))
    else:
        node = node_from_raw(ck, raw_node, name)
    max_nodes = get(lambda: ck.integer(data, "max_nodes", "max_nodes", default=1, minimum=1))
    node_limit = capabilities(scheduler).max_nodes if scheduler else None
    if max_nodes is not None and node_limit is not None and max_nodes > node_limit:
        ck.record("max_nodes", f"a {scheduler} profile has at most {node_limit} node(s)")
    shared = get(lambda: ck.typed(data, "shared_nodes", bool, "shared_nodes", False, False), False)
    default_time = get(lambda: ck.string(data, "default_time", "default_time", default="01:00:00"))
    if default_time is not None:
        get(lambda: _check_time(ck, default_time, "default_time"))
    fields = dict(
        description=get(lambda: ck.string(data, "description", "description", default="")) or "",
        scheduler=scheduler, node=node, max_nodes=max_nodes,
        partition=get(lambda: ck.string(data, "partition", "partition")),
        account=get(lambda: ck.string(data, "account", "account")),
        qos=get(lambda: ck.string(data, "qos", "qos")),
        default_time=default_time,
        max_array_size=get(lambda: ck.integer(data, "max_array_size", "max_array_size", default=1001, minimum=1)),
        mpi=get(lambda: ck.string(data, "mpi", "mpi", default="pmix", choices=MPI_TYPES)),
        container=get(lambda: _container_from_raw(ck, data.get("container"))),
        setup=get(lambda: ck.str_list(data, "setup", "setup"), []),
        env=get(lambda: _env_from_raw(ck, data.get("env"), shared), {}),
        sbatch_extra=get(lambda: _sbatch_extra(ck, data), []),
        switches=get(lambda: _switches(ck, data)),
        python=get(lambda: ck.string(data, "python", "python")),
        defaults=get(lambda: _defaults_from_raw(ck, data.get("defaults")), {}),
        shared_nodes=shared,
        fabric=get(lambda: fabric_from_raw(ck, data.get("fabric"))),
        scratch=get(lambda: _scratch(ck, data)),
    )
    if fields["sbatch_extra"] is not None and fields["env"] is not None:
        get(lambda: _sharp(ck, fields["sbatch_extra"], fields["env"]))
    ck.raise_problems()
    return fields
