"""Rank -> CPU/memory/GPU/NIC binding, computed from a node type's tables.

This is the pure reference of what ``slurm/bind.sh`` does inside every rank
(the tests run the wrapper with ``--dry`` and compare it with this module).
The rendered batch script exports :func:`bind_env` of the profile's node type;
the wrapper indexes those tables by the rank's GPU.

Modes (memory policy in brackets):

``exclusive``   the GPU's exclusive core set from the table  [membind to the GPU's NUMA node]
``numa``        every core of the GPU's NUMA node             [membind to that node]
``interleave``  every core of the GPU's NUMA node             [interleave over all nodes, as DLRM]
``off``         no CPU or memory binding (GPU and NIC are still assigned)

``hyperthreads`` adds the HT sibling of every core.  The NIC is assigned only
when the job spans several nodes (a single node talks over NVLink/shared memory).
A node type without GPUs (the ``local`` profile) shares its cores out evenly
between the ``local_size`` ranks of the node instead of using a per-GPU table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from jobs.vocabulary import BIND_MODES as BINDING_MODES
from slurm.common.cpulist import format_cpulist

from .topology import NodeType

__all__ = ["RankBinding", "rank_binding", "bind_env", "bind_args", "BINDING_MODES"]


@dataclass(frozen=True)
class RankBinding:
    """Where one rank runs: ``mems is None`` means all memory nodes."""

    cpus: List[int]
    mems: Optional[List[int]]
    policy: str  # 'membind' | 'interleave' | 'off'
    gpu: Optional[int]
    nic: Optional[str]

    def describe(self) -> str:
        """The ``cpus=.. mems=.. policy=.. gpu=.. nic=..`` part of bind.sh's dry line."""
        mems = "all" if self.mems is None else format_cpulist(self.mems)
        return (f"cpus={format_cpulist(self.cpus) or 'all'} mems={mems} policy={self.policy} "
                f"gpu={'none' if self.gpu is None else self.gpu} nic={self.nic or 'none'}")

    def numactl_args(self) -> List[str]:
        """numactl options applying this binding (empty for ``off``)."""
        if self.policy == "off":
            return []
        args = [f"--physcpubind={format_cpulist(self.cpus)}"]
        if self.policy == "interleave":
            args.append("--interleave=all")
        else:
            args.append(f"--membind={format_cpulist(self.mems or [])}")
        return args


def _with_siblings(node: NodeType, cpus: List[int], hyperthreads: bool) -> List[int]:
    return sorted(set(cpus) | set(node.siblings(cpus) if hyperthreads else []))


def _gpuless_block(node: NodeType, local_rank: int, local_size: int) -> List[int]:
    """A GPU-less node: contiguous, even share of the physical cores per rank."""
    cores = sorted(c for n in node.numa_cpus for c in node.physical_cpus(n))
    if local_rank >= local_size:
        raise ValueError(f"local rank {local_rank} is not below the {local_size} ranks of the node")
    n = len(cores)
    if local_size > n:
        return [cores[local_rank % n]]
    return cores[local_rank * n // local_size:(local_rank + 1) * n // local_size]


def rank_binding(node: NodeType, local_rank: int, mode: str, hyperthreads: bool = False,
                 multinode: bool = False, local_size: int = 1,
                 gpu: Optional[int] = None) -> RankBinding:
    """The binding of the rank with ``local_rank`` on ``node``.

    ``gpu`` overrides the GPU (default: GPU number ``local_rank``; bind.sh uses
    the Slurm-assigned GPU when the step has one).  ``local_size`` is the number
    of ranks on the node and only matters for nodes without GPUs.
    """
    if mode not in BINDING_MODES:
        raise ValueError(f"unknown binding mode {mode!r} (use {', '.join(BINDING_MODES)})")
    if local_rank < 0:
        raise ValueError(f"negative local rank {local_rank}")
    if node.gpus:
        g = local_rank if gpu is None else gpu
        if not 0 <= g < node.gpus:
            raise ValueError(f"local rank {local_rank} has no GPU: node type {node.name} "
                             f"has {node.gpus} GPUs")
        numa = node.gpu_numa[g]
        own = node.gpu_cores[g]
        nic = node.nics[g] if multinode and node.nics else None
    else:
        g, nic = None, None
        own = _gpuless_block(node, local_rank, max(local_size, 1))
        numa = node.numa_of_cpu(own[0])
    if mode == "off":
        return RankBinding([], None, "off", g, nic)
    if mode == "exclusive":
        mems = sorted({node.numa_of_cpu(c) for c in own})
        return RankBinding(_with_siblings(node, own, hyperthreads), mems, "membind", g, nic)
    local = _with_siblings(node, node.physical_cpus(numa), hyperthreads)
    if mode == "numa":
        return RankBinding(local, [numa], "membind", g, nic)
    return RankBinding(local, None, "interleave", g, nic)


def bind_env(node: NodeType) -> Dict[str, str]:
    """The RECSYS_BIND_* tables of ``node`` that bind.sh reads (all values strings).

    ``RECSYS_BIND_CPUS``/``_MEMS``/``_NICS`` are indexed by GPU, ``_NUMA`` by NUMA
    node id (physical cores only), ``_CORES`` lists every physical core (used
    when the node has no GPUs), ``RECSYS_HT_OFFSET`` is empty without HT.
    """
    last = max(node.numa_cpus) if node.numa_cpus else -1
    ht = node.ht_offset if node.ht_offset and node.threads_per_core > 1 else None
    return {
        "RECSYS_BIND_GPUS": str(node.gpus),
        "RECSYS_BIND_CPUS": ";".join(format_cpulist(c) for c in node.gpu_cores),
        "RECSYS_BIND_MEMS": ";".join(str(n) for n in node.gpu_numa),
        "RECSYS_BIND_NICS": ";".join(node.nics),
        "RECSYS_BIND_NUMA": ";".join(
            format_cpulist(node.physical_cpus(n)) if n in node.numa_cpus else ""
            for n in range(last + 1)),
        "RECSYS_BIND_CORES": format_cpulist(
            [c for n in node.numa_cpus for c in node.physical_cpus(n)]),
        "RECSYS_HT_OFFSET": "" if ht is None else str(ht),
    }


def bind_args(mode: str, hyperthreads: bool = False) -> List[str]:
    """bind.sh options for a binding mode (what the rendered srun line passes)."""
    if mode not in BINDING_MODES:
        raise ValueError(f"unknown binding mode {mode!r} (use {', '.join(BINDING_MODES)})")
    return ["--mode", mode] + (["--ht"] if hyperthreads else [])
