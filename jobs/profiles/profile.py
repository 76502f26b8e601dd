"""A cluster profile as loaded: the scheduler, the node type (jobs.profiles.topology) and the
cluster-level Slurm settings (partition, account, container, environment, MPI type, ...): what
the submission layer needs to know about a cluster. Plain frozen data."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from slurm.common.cpulist import format_cpulist

from .fabric import Fabric
from .topology import NodeType


@dataclass(frozen=True)
class Container:
    """A pyxis/enroot container the job steps run in."""

    image: str
    mounts: List[str] = field(default_factory=list)
    workdir: Optional[str] = None     # no longer set: steps start in the run dir (kept for old records)
    # what the image holds (schema.IMAGE_CONTENTS); None: not declared, nothing is checked against it
    provides: Optional[List[str]] = None


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
    # the nodes share hardware (emulated nodes on one host): points of a study run one at a
    # time, and MPI ranks yield their core when idle (SHARED_NODES_ENV)
    shared_nodes: bool = False
    # how fast the GPUs talk inside a node and between nodes (jobs.profiles.fabric); None: not described
    fabric: Optional[Fabric] = None
    # node-local disk (a host path on every node) for Spark shuffle and dask spilling; None: /tmp
    scratch: Optional[str] = None

    def as_dict(self) -> Dict[str, Any]:
        """Plain data in the profile-file format (CPU sets as cpulists), plus ``path``.

        Without ``path`` it loads back as an equal profile, which makes it the
        record of the exact profile a run used.
        """
        data = asdict(self)
        node = data["node"]
        node["numa_cpus"] = {n: format_cpulist(c) for n, c in node["numa_cpus"].items()}
        node["gpu_cores"] = [format_cpulist(c) for c in node["gpu_cores"]]
        if data.get("fabric") is not None:
            data["fabric"] = _without_none(data["fabric"])
        return data

    def content_sha256(self) -> str:
        """SHA-256 of the resolved, validated content (``extends`` and node references applied),
        as canonical JSON without ``path``: the same profile hashes alike wherever it was loaded
        from, and a run's summary can name the exact profile it ran under."""
        data = self.as_dict()
        data.pop("path", None)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _without_none(value):
    """A fabric mapping as the file writes it: keys without a value left out."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None and v != {}}
    return value


@dataclass(frozen=True)
class ProfileRef:
    """Where a profile of a given name was found on the search path."""

    name: str
    path: str
    source: str  # 'builtin' | 'user' | 'env'
