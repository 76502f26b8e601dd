"""Node topology: the hardware of one node type (GPUs, sockets, cores, NUMA nodes, per-GPU
cores and NICs) and its detection from this machine's sysfs.

What a profile file may say about a node is checked in jobs.profiles.schema; the text form
of CPU sets is slurm.common.cpulist (shared with the engine). Standard library only (login nodes).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from slurm.common.cpulist import parse_cpulist

__all__ = ["NodeType", "detect_local_node"]


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


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
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
