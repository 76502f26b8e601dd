"""Cluster profiles: validated YAML descriptions of a cluster and its node type.

A profile says everything the submission layer needs to know about a cluster:
the scheduler, the node type (GPUs, sockets, cores, NUMA nodes, which cores and
NIC belong to which GPU), and the cluster-level Slurm settings (partition,
account, container, environment, MPI type, ...).  Profiles are looked up by name
on a search path (built-ins in ``cluster_profiles/``, then
``~/.config/recsys-submit/profiles/``, then every directory of
``RECSYS_PROFILE_PATH``; later ones override earlier ones) or loaded from a file.

Validation is strict: unknown keys, wrong types and inconsistent topology raise
:class:`ProfileError` whose message is one line ``<file>: <key.path>: <problem>``.
Only pyyaml and the standard library are used (login nodes).
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import yaml

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it

__all__ = [
    "ProfileError", "ProfileRef", "NodeType", "Container", "Profile",
    "list_profiles", "load_profile", "search_path", "parse_cpulist",
    "format_cpulist", "detect_local_node",
    "BINDING_MODES", "MPI_TYPES", "SCHEDULERS",
]

USER_PROFILE_DIR = Path("~/.config/recsys-submit/profiles")
PATH_ENV = "RECSYS_PROFILE_PATH"
from jobs.vocabulary import BIND_MODES as BINDING_MODES  # noqa: E402 (one home)
MPI_TYPES = ("pmix", "pmi2", "none")
from jobs.backends import SCHEDULERS  # noqa: E402 (the backend registry's names)


class ProfileError(ValueError):
    """A profile could not be found, parsed or validated (one-line message)."""

    def __init__(self, file: Any, key: str, problem: str):
        self.file, self.key, self.problem = str(file), key, problem
        where = f"{self.file}: {key}" if key else self.file
        super().__init__(f"{where}: {problem}")


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class NodeType:
    """One node's hardware: GPUs, CPU topology and the per-GPU affinity tables."""

    name: str
    gpus: int
    gpu_model: Optional[str]
    gpu_memory_gb: Optional[float]
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    memory_gb: Optional[float]
    numa_cpus: Dict[int, List[int]]
    gpu_numa: List[int]
    gpu_cores: List[List[int]]
    ht_offset: Optional[int] = None
    nics: List[str] = field(default_factory=list)

    @property
    def cores(self) -> int:
        """Number of physical cores (CPU ids 0..cores-1 are the physical ones)."""
        return self.sockets * self.cores_per_socket

    @property
    def logical_cpus(self) -> int:
        return self.cores * self.threads_per_core

    def physical_cpus(self, numa_node: int) -> List[int]:
        """Physical cores of one NUMA node (HT siblings left out)."""
        return [c for c in self.numa_cpus[numa_node] if c < self.cores]

    def numa_of_cpu(self, cpu: int) -> int:
        for node, cpus in self.numa_cpus.items():
            if cpu in cpus:
                return node
        raise KeyError(cpu)

    def siblings(self, cpus: List[int]) -> List[int]:
        """The HT siblings of ``cpus`` (empty when the node has no hyperthreads)."""
        if not self.ht_offset or self.threads_per_core < 2:
            return []
        return [c + self.ht_offset for c in cpus]


@dataclass(frozen=True)
class Container:
    """A pyxis/enroot container the job steps run in."""

    image: str
    mounts: List[str] = field(default_factory=list)
    workdir: Optional[str] = None


@dataclass(frozen=True)
class Profile:
    """A cluster: scheduler, node type and cluster-level job settings."""

    name: str
    path: Optional[str]
    description: str
    scheduler: str
    node: NodeType
    max_nodes: int
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    default_time: str = "01:00:00"
    max_array_size: int = 1001
    mpi: str = "pmix"
    container: Optional[Container] = None
    setup: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    sbatch_extra: List[str] = field(default_factory=list)
    switches: Optional[str] = None
    python: Optional[str] = None
    defaults: Dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        """Plain data in the profile-file format (CPU sets as cpulists), plus ``path``.

        Without ``path`` it loads back as an equal profile, which makes it the
        record of the exact profile a run used.
        """
        data = asdict(self)
        node = data["node"]
        node["numa_cpus"] = {n: format_cpulist(c) for n, c in node["numa_cpus"].items()}
        node["gpu_cores"] = [format_cpulist(c) for c in node["gpu_cores"]]
        return data


@dataclass(frozen=True)
class ProfileRef:
    """Where a profile of a given name was found on the search path."""

    name: str
    path: str
    source: str  # 'builtin' | 'user' | 'env'


# ------------------------------------------------------------------ small parsers

_CPULIST_RE = re.compile(r"^\s*\d+(\s*-\s*\d+)?\s*$")


def parse_cpulist(text: Any) -> List[int]:
    """``"0-3,8"`` (Linux cpulist) or ``[0, 1]`` or ``5`` -> sorted unique ints."""
    if isinstance(text, bool):
        raise ValueError(f"not a CPU list: {text!r}")
    if isinstance(text, int):
        items: List[int] = [text]
    elif isinstance(text, list):
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in text):
            raise ValueError(f"not a CPU list: {text!r}")
        items = list(text)
    elif isinstance(text, str):
        items = []
        for part in text.split(","):
            if not _CPULIST_RE.match(part):
                raise ValueError(f"not a CPU list: {text!r}")
            lo, _, hi = part.partition("-")
            lo_i, hi_i = int(lo), int(hi) if hi else int(lo)
            if hi_i < lo_i:
                raise ValueError(f"descending range {part.strip()!r} in CPU list")
            items.extend(range(lo_i, hi_i + 1))
    else:
        raise ValueError(f"not a CPU list: {text!r}")
    if any(x < 0 for x in items):
        raise ValueError(f"negative CPU id in {text!r}")
    if len(set(items)) != len(items):
        raise ValueError(f"CPU listed twice in {text!r}")
    return sorted(items)


def format_cpulist(cpus: List[int]) -> str:
    """Sorted ints -> canonical cpulist ``"48-55,176-183"`` (``""`` when empty)."""
    out, cpus = [], sorted(set(cpus))
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


_SWITCHES_RE = re.compile(r"^\d+(@[0-9:-]+)?$")


# ---------------------------------------------------------------- the validator


class _Checker:
    """Typed access to a raw YAML mapping that reports ``file: key: problem``."""

    def __init__(self, file: str):
        self.file = file

    def fail(self, key: str, problem: str) -> ProfileError:
        return ProfileError(self.file, key, problem)

    def mapping(self, value: Any, key: str) -> Dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a mapping, got {_typename(value)}")
        return value

    def no_unknown(self, data: Dict[str, Any], allowed, prefix: str = "") -> None:
        for k in data:
            if k not in allowed:
                close = difflib.get_close_matches(str(k), sorted(allowed), n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise self.fail(f"{prefix}{k}",
                                f"unknown key ({hint}allowed: {', '.join(sorted(allowed))})")

    def typed(self, data, key: str, types, path: str, required=False, default=None):
        if key not in data or data[key] is None:
            if required:
                raise self.fail(path, "required key is missing")
            return default
        value = data[key]
        want = types if isinstance(types, tuple) else (types,)
        if isinstance(value, bool) and bool not in want:
            raise self.fail(path, f"must be {_names(want)}, got bool")
        if not isinstance(value, want):
            raise self.fail(path, f"must be {_names(want)}, got {_typename(value)}")
        return value

    def integer(self, data, key, path, required=False, default=None, minimum=None):
        value = self.typed(data, key, int, path, required, default)
        if value is not None and minimum is not None and value < minimum:
            raise self.fail(path, f"must be >= {minimum}, got {value}")
        return value

    def number(self, data, key, path, default=None):
        value = self.typed(data, key, (int, float), path, False, default)
        if value is not None and value <= 0:
            raise self.fail(path, f"must be positive, got {value}")
        return value

    def string(self, data, key, path, required=False, default=None, choices=None):
        value = self.typed(data, key, str, path, required, default)
        if value is not None and choices and value not in choices:
            raise self.fail(path, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def str_list(self, data, key, path) -> List[str]:
        value = self.typed(data, key, list, path, default=[])
        for i, item in enumerate(value):
            if not isinstance(item, str) or isinstance(item, bool):
                raise self.fail(f"{path}[{i}]", f"must be a string, got {_typename(item)}")
        return list(value)

    def cpulist(self, value, path) -> List[int]:
        try:
            return parse_cpulist(value)
        except ValueError as exc:
            raise self.fail(path, str(exc)) from None


def _typename(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", int: "integer", float: "number",
            bool: "bool", type(None): "null"}.get(type(value), type(value).__name__)


_ARTICLE = {"mapping": "a mapping", "list": "a list", "string": "a string", "integer": "an integer",
            "number": "a number", "bool": "true or false"}


def _names(types) -> str:
    names = [_typename(t()) for t in types]
    if names == ["integer", "number"]:
        names = ["number"]
    return " or ".join(_ARTICLE.get(n, n) for n in names)


NODE_KEYS = {"name", "gpus", "gpu_model", "gpu_memory_gb", "sockets", "cores_per_socket",
             "threads_per_core", "memory_gb", "numa_cpus", "gpu_numa", "gpu_cores",
             "ht_offset", "nics"}
PROFILE_KEYS = {"name", "description", "extends", "scheduler", "node", "max_nodes",
                "partition", "account", "qos", "default_time", "max_array_size", "mpi",
                "container", "setup", "env", "sbatch_extra", "switches", "python", "defaults"}
CONTAINER_KEYS = {"image", "mounts", "workdir"}
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
}


def _node_from_raw(ck: _Checker, raw: Any, default_name: str, p: str = "node") -> NodeType:
    data = ck.mapping(raw, p)
    ck.no_unknown(data, NODE_KEYS, f"{p}.")
    name = ck.string(data, "name", f"{p}.name", default=default_name)
    gpus = ck.integer(data, "gpus", f"{p}.gpus", required=True, minimum=0)
    sockets = ck.integer(data, "sockets", f"{p}.sockets", required=True, minimum=1)
    cps = ck.integer(data, "cores_per_socket", f"{p}.cores_per_socket", required=True, minimum=1)
    tpc = ck.integer(data, "threads_per_core", f"{p}.threads_per_core", default=1, minimum=1)
    ht_offset = ck.integer(data, "ht_offset", f"{p}.ht_offset", minimum=1)
    cores = sockets * cps
    logical = cores * tpc
    if ht_offset is not None:
        if tpc != 2:
            raise ck.fail(f"{p}.ht_offset", f"needs threads_per_core: 2, got {tpc}")
        if ht_offset < cores or ht_offset + cores > logical:
            raise ck.fail(f"{p}.ht_offset",
                          f"{ht_offset} does not map the {cores} cores into the {logical} logical CPUs")

    raw_numa = ck.mapping(ck.typed(data, "numa_cpus", dict, f"{p}.numa_cpus", required=True),
                          f"{p}.numa_cpus")
    numa: Dict[int, List[int]] = {}
    owner: Dict[int, int] = {}
    for nid, cpus_raw in raw_numa.items():
        key = f"{p}.numa_cpus.{nid}"
        if isinstance(nid, bool) or not isinstance(nid, int) or nid < 0:
            raise ck.fail(key, "NUMA node ids must be non-negative integers")
        cpus = ck.cpulist(cpus_raw, key)
        for c in cpus:
            if c >= logical:
                raise ck.fail(key, f"cpu {c} is beyond the {logical} logical CPUs "
                                   f"({sockets} sockets x {cps} cores x {tpc} threads)")
            if c in owner:
                raise ck.fail(key, f"cpu {c} is also in NUMA node {owner[c]}")
            owner[c] = nid
        numa[nid] = cpus
    for nid, cpus in numa.items():
        for c in cpus:
            if c >= cores and (ht_offset is None or owner.get(c - ht_offset) != nid):
                raise ck.fail(f"{p}.numa_cpus.{nid}",
                              f"cpu {c} is neither a physical core (< {cores}) nor the HT "
                              f"sibling of a core of NUMA node {nid}")
    for c in range(cores):
        if c not in owner:
            raise ck.fail(f"{p}.numa_cpus", f"core {c} is in no NUMA node")

    gpu_numa_raw = ck.typed(data, "gpu_numa", list, f"{p}.gpu_numa", default=[])
    if len(gpu_numa_raw) != gpus:
        raise ck.fail(f"{p}.gpu_numa", f"has {len(gpu_numa_raw)} entries for {gpus} GPUs")
    gpu_numa = []
    for i, n in enumerate(gpu_numa_raw):
        if isinstance(n, bool) or not isinstance(n, int):
            raise ck.fail(f"{p}.gpu_numa[{i}]", f"must be an integer, got {_typename(n)}")
        if n not in numa:
            raise ck.fail(f"{p}.gpu_numa[{i}]",
                          f"NUMA node {n} does not exist (nodes: {sorted(numa)})")
        gpu_numa.append(n)

    gpu_cores_raw = ck.typed(data, "gpu_cores", list, f"{p}.gpu_cores", default=[])
    if len(gpu_cores_raw) != gpus:
        raise ck.fail(f"{p}.gpu_cores", f"has {len(gpu_cores_raw)} entries for {gpus} GPUs")
    gpu_cores, used = [], {}
    for i, raw_set in enumerate(gpu_cores_raw):
        key = f"{p}.gpu_cores[{i}]"
        cset = ck.cpulist(raw_set, key)
        if not cset:
            raise ck.fail(key, "empty core set")
        for c in cset:
            if c >= cores:
                raise ck.fail(key, f"core {c} is beyond the {cores} physical cores "
                                   "(list physical cores; HT siblings are added by the binding)")
            if c in used:
                raise ck.fail(key, f"core {c} is also in the core set of GPU {used[c]}")
            if owner.get(c) != gpu_numa[i]:
                raise ck.fail(key, f"core {c} is not on GPU {i}'s NUMA node {gpu_numa[i]}")
            used[c] = i
        gpu_cores.append(cset)

    nics = ck.str_list(data, "nics", f"{p}.nics")
    if nics and len(nics) != gpus:
        raise ck.fail(f"{p}.nics", f"has {len(nics)} entries for {gpus} GPUs "
                                   "(one per GPU, repeat a NIC shared by a GPU pair)")
    for i, nic in enumerate(nics):
        if not re.match(r"^[A-Za-z0-9_.:-]+$", nic):
            raise ck.fail(f"{p}.nics[{i}]", f"invalid device name {nic!r}")

    return NodeType(
        name=name, gpus=gpus,
        gpu_model=ck.string(data, "gpu_model", f"{p}.gpu_model"),
        gpu_memory_gb=ck.number(data, "gpu_memory_gb", f"{p}.gpu_memory_gb"),
        sockets=sockets, cores_per_socket=cps, threads_per_core=tpc,
        memory_gb=ck.number(data, "memory_gb", f"{p}.memory_gb"),
        numa_cpus=dict(sorted(numa.items())), gpu_numa=gpu_numa, gpu_cores=gpu_cores,
        ht_offset=ht_offset, nics=nics)


def _container_from_raw(ck: _Checker, raw: Any) -> Optional[Container]:
    if raw is None:
        return None
    data = ck.mapping(raw, "container")
    ck.no_unknown(data, CONTAINER_KEYS, "container.")
    mounts = ck.str_list(data, "mounts", "container.mounts")
    for i, m in enumerate(mounts):
        if ":" not in m or m.startswith(":"):
            raise ck.fail(f"container.mounts[{i}]", f"must be SRC:DST[:FLAGS], got {m!r}")
        if "," in m:
            raise ck.fail(f"container.mounts[{i}]", "must not contain ',' (one mount per entry)")
    return Container(image=ck.string(data, "image", "container.image", required=True),
                     mounts=mounts, workdir=ck.string(data, "workdir", "container.workdir"))


def _defaults_from_raw(ck: _Checker, raw: Any) -> Dict[str, Any]:
    if raw is None:
        return {}
    data = ck.mapping(raw, "defaults")
    ck.no_unknown(data, DEFAULT_KEYS, "defaults.")
    out = {}
    for key, (typ, choices) in DEFAULT_KEYS.items():
        if key not in data:
            continue
        if typ is int:
            out[key] = ck.integer(data, key, f"defaults.{key}", minimum=1)
        elif typ is str:
            out[key] = ck.string(data, key, f"defaults.{key}", choices=choices)
        else:
            out[key] = ck.typed(data, key, typ, f"defaults.{key}")
    if "time" in out:
        _check_time(ck, out["time"], "defaults.time")
    return out


def _check_time(ck: _Checker, value: str, key: str) -> None:
    from jobs.slurmtime import parse_time  # SUBMIT's parser: the one sbatch semantics
    try:
        seconds = parse_time(value, key)
    except ValueError as exc:
        raise ck.fail(key, str(exc).split(": ", 1)[-1]) from None
    if seconds is None:
        raise ck.fail(key, f"{value!r}: give a finite time limit (the checkpoint signal needs one)")


def _env_from_raw(ck: _Checker, raw: Any) -> Dict[str, str]:
    if raw is None:
        return {}
    data = ck.mapping(raw, "env")
    out = {}
    for k, v in data.items():
        if not isinstance(k, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
            raise ck.fail(f"env.{k}", "not a valid environment variable name")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ck.fail(f"env.{k}", f"must be a string or number, got {_typename(v)} (quote it)")
        out[k] = str(v)
    return out


def _profile_from_raw(ck: _Checker, data: Dict[str, Any], name: str, path: Optional[str],
                      resolve_node: Callable[[str], NodeType]) -> Profile:
    ck.no_unknown(data, PROFILE_KEYS)
    scheduler = ck.string(data, "scheduler", "scheduler", default="slurm", choices=SCHEDULERS)
    raw_node = data.get("node")
    if raw_node is None:
        raise ck.fail("node", "required key is missing (a node-type mapping, a profile "
                              "name whose node to reuse, or 'detect')")
    if isinstance(raw_node, str):
        node = detect_local_node() if raw_node == "detect" else resolve_node(raw_node)
    else:
        node = _node_from_raw(ck, raw_node, name)
    max_nodes = ck.integer(data, "max_nodes", "max_nodes", default=1, minimum=1)
    if scheduler == "local" and max_nodes != 1:
        raise ck.fail("max_nodes", "a local profile has exactly one node")
    default_time = ck.string(data, "default_time", "default_time", default="01:00:00")
    _check_time(ck, default_time, "default_time")
    switches = data.get("switches")
    if switches is not None:
        switches = str(switches) if isinstance(switches, int) and not isinstance(switches, bool) \
            else ck.string(data, "switches", "switches")
        if not _SWITCHES_RE.match(switches):
            raise ck.fail("switches", f"must be COUNT[@MAX_WAIT] like '1@00:10:00', got {switches!r}")
    sbatch_extra = ck.str_list(data, "sbatch_extra", "sbatch_extra")
    for i, opt in enumerate(sbatch_extra):
        if not opt.startswith("--"):
            raise ck.fail(f"sbatch_extra[{i}]", f"must be a long option like '--network=sharp', got {opt!r}")
    return Profile(
        name=name, path=path,
        description=ck.string(data, "description", "description", default="") or "",
        scheduler=scheduler, node=node, max_nodes=max_nodes,
        partition=ck.string(data, "partition", "partition"),
        account=ck.string(data, "account", "account"),
        qos=ck.string(data, "qos", "qos"),
        default_time=default_time,
        max_array_size=ck.integer(data, "max_array_size", "max_array_size", default=1001, minimum=1),
        mpi=ck.string(data, "mpi", "mpi", default="pmix", choices=MPI_TYPES),
        container=_container_from_raw(ck, data.get("container")),
        setup=ck.str_list(data, "setup", "setup"),
        env=_env_from_raw(ck, data.get("env")),
        sbatch_extra=sbatch_extra, switches=switches,
        python=ck.string(data, "python", "python"),
        defaults=_defaults_from_raw(ck, data.get("defaults")),
    )


# ------------------------------------------------------------------ search path


def builtin_dir() -> Path:
    """The ``cluster_profiles/`` directory shipped with the package."""
    import cluster_profiles
    return Path(cluster_profiles.__file__).resolve().parent


def search_path() -> List[tuple]:
    """``[(dir, source), ...]`` in increasing priority."""
    dirs = [(builtin_dir(), "builtin"), (USER_PROFILE_DIR.expanduser(), "user")]
    for entry in os.environ.get(PATH_ENV, "").split(os.pathsep):
        if entry.strip():
            dirs.append((Path(entry).expanduser(), "env"))
    return dirs


def list_profiles() -> List[ProfileRef]:
    """Every profile on the search path, by name (later directories override)."""
    found: Dict[str, ProfileRef] = {}
    for directory, source in search_path():
        if not directory.is_dir():
            continue
        for f in sorted(directory.iterdir()):
            if f.suffix in (".yaml", ".yml") and f.is_file():
                found[f.stem] = ProfileRef(f.stem, str(f), source)
    return sorted(found.values(), key=lambda r: r.name)


def _is_path(name_or_path: str) -> bool:
    return "/" in name_or_path or name_or_path.endswith((".yaml", ".yml"))


def _find(name: str, referrer: str = "--profile", key: str = "") -> Path:
    for ref in list_profiles():
        if ref.name == name:
            return Path(ref.path)
    known = ", ".join(r.name for r in list_profiles()) or "none"
    raise ProfileError(referrer, key, f"unknown profile {name!r} (known: {known}; "
                                      f"add directories with {PATH_ENV})")


def _read_yaml(path: Path) -> Dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(path, "file", f"cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ProfileError(path, where, f"malformed YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError(path, "top level", f"must be a mapping, got {_typename(data)}")
    return data


def _merge(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    """Mappings merge key by key; anything else in ``over`` replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _resolve_raw(path: Path, stack: tuple) -> Dict[str, Any]:
    """Read a profile file and apply ``extends`` (a profile name or path)."""
    if str(path) in stack:
        chain = [Path(p).stem for p in stack + (str(path),)]
        raise ProfileError(path, "extends", "cycle: " + " -> ".join(chain))
    data = _read_yaml(path)
    parent = data.get("extends")
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ProfileError(path, "extends", f"must be a profile name, got {_typename(parent)}")
    parent_path = Path(parent).expanduser() if _is_path(parent) else _find(parent, str(path), "extends")
    base = _resolve_raw(parent_path, stack + (str(path),))
    base = {k: v for k, v in base.items() if k not in ("name", "extends")}
    child = {k: v for k, v in data.items() if k != "extends"}
    if isinstance(child.get("node"), (dict, str)):  # a new node replaces the inherited one
        base.pop("node", None)
    return _merge(base, child)


def _load_path(path: Path, stack: tuple = (), by_name: bool = False) -> Profile:
    data = _resolve_raw(path, stack)
    ck = _Checker(str(path))
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise ck.fail("name", "must be a non-empty string")
    if by_name and name != path.stem:
        raise ck.fail("name", f"{name!r} differs from the file name {path.name!r} "
                              "(profiles on the search path are named by their file)")

    def resolve_node(ref: str) -> NodeType:
        ref_path = Path(ref).expanduser() if _is_path(ref) else _find(ref, str(path), "node")
        if str(ref_path) in stack or ref_path == path:
            raise ck.fail("node", f"node reference {ref!r} refers back to this profile")
        return _load_path(ref_path, stack + (str(path),), by_name=not _is_path(ref)).node

    return _profile_from_raw(ck, data, name, str(path), resolve_node)


def load_profile(name_or_path: str) -> Profile:
    """Load and validate a profile by name (search path) or by file path."""
    if not isinstance(name_or_path, str) or not name_or_path:
        raise ProfileError("profile", "name", "empty profile name")
    if _is_path(name_or_path):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ProfileError(path, "file", "no such profile file")
        return _load_path(path)
    return _load_path(_find(name_or_path), by_name=True)


# ----------------------------------------------------------- local topology


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def detect_local_node(root: str = "/", name: str = "local") -> NodeType:
    """This machine's topology from sysfs (``root`` lets tests use a fake tree).

    Every logical CPU this process may run on counts as a core (laptops and
    workstations number HT siblings in different ways, and the binding must use
    the kernel's CPU ids), NUMA nodes come from ``/sys/devices/system/node``.
    NVIDIA GPUs are counted from ``/proc/driver/nvidia/gpus`` (no NVML import);
    each is put on its PCI device's NUMA node and gets an even share of that
    node's cores.  Without sysfs this degrades to one NUMA node of
    ``os.cpu_count()`` CPUs.
    """
    base = Path(root)
    sysdir = base / "sys/devices/system"
    online_txt = _read(sysdir / "cpu/online")
    online = parse_cpulist(online_txt) if online_txt else list(range(os.cpu_count() or 1))
    if root == "/" and hasattr(os, "sched_getaffinity"):
        allowed = os.sched_getaffinity(0)
        online = [c for c in online if c in allowed] or online
    numa: Dict[int, List[int]] = {}
    for nd in sorted(sysdir.glob("node/node[0-9]*")):
        txt = _read(nd / "cpulist")
        cpus = [c for c in parse_cpulist(txt) if c in online] if txt else []
        if cpus:
            numa[int(nd.name[4:])] = cpus
    if sorted(c for cpus in numa.values() for c in cpus) != online:
        numa = {0: online}
    span = max(online) + 1
    packages = {_read(sysdir / f"cpu/cpu{c}/topology/physical_package_id") for c in online}
    sockets = len(packages) if span % max(1, len(packages)) == 0 else 1
    gpu_numa: List[int] = []
    gpus_dir = base / "proc/driver/nvidia/gpus"
    if gpus_dir.is_dir():
        for gpu in sorted(gpus_dir.iterdir()):
            node_txt = _read(base / "sys/bus/pci/devices" / gpu.name.lower() / "numa_node")
            nid = int(node_txt) if node_txt and node_txt.lstrip("-").isdigit() else -1
            gpu_numa.append(nid if nid in numa else min(numa))
    gpu_cores: List[List[int]] = []
    for i, nid in enumerate(gpu_numa):
        peers = [j for j, m in enumerate(gpu_numa) if m == nid]
        k, cpus = peers.index(i), numa[nid]
        lo, hi = k * len(cpus) // len(peers), (k + 1) * len(cpus) // len(peers)
        gpu_cores.append(cpus[lo:hi] or [cpus[k % len(cpus)]])
    meminfo = _read(base / "proc/meminfo") or ""
    m = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
    return NodeType(
        name=name, gpus=len(gpu_numa), gpu_model=None, gpu_memory_gb=None,
        sockets=sockets, cores_per_socket=span // sockets, threads_per_core=1,
        memory_gb=round(int(m.group(1)) / 2**20, 1) if m else None,
        numa_cpus=numa, gpu_numa=gpu_numa, gpu_cores=gpu_cores, ht_offset=None, nics=[])
