"""The one rule for how a Spark GPU job lays out its executors on a node, and the GPU amounts.

Why here: the submission layer (``jobs``: the plan writes the amounts into the rendered job
script, so ``--dry-run`` shows them) and the preprocessing driver (``preproc.runtime.spark``:
the session's ``spark.*`` properties) must agree, and neither may import the other; ``slurm.common``
is the leaf both already import (see ``slurm/common/cpulist.py``). Pure, stdlib only.

The rule (spark-rapids docs, "Getting Started" and FAQ "How are spark.executor.cores,
spark.task.resource.gpu.amount, and spark.rapids.sql.concurrentGpuTasks related?"; issue
NVIDIA/spark-rapids#8651):

* one GPU per executor (``spark.executor.resource.gpu.amount=1``; the plugin supports no more),
  so one executor per GPU of the node, each with ``node cores // GPUs`` cores;
* ``spark.task.resource.gpu.amount = 1 / spark.executor.cores``, so that as many tasks run on an
  executor as it has cores (how many of them touch the GPU at once is
  ``spark.rapids.sql.concurrentGpuTasks``, a separate setting);
* Spark turns a fractional amount ``a`` into ``floor(1 / a)`` task slots per GPU (fractions must
  be <= 0.5, a whole 1 is fine), so the amount is written rounded *down* to 6 significant digits:
  ``floor(1 / a)`` is then exactly the executor's core count (1/7 -> 0.142857, not 0.1429, which
  would give 6 slots).
"""
from __future__ import annotations

import math
from typing import Dict, Tuple

__all__ = ["gpu_executors", "task_gpu_amount", "gpu_resource_conf"]


def gpu_executors(node_cores: int, gpus_per_node: int) -> Tuple[int, int]:
    """(executors per node, cores per executor): one executor per GPU, the cores split evenly."""
    if gpus_per_node < 1:
        raise ValueError(f"GPUs per node must be >= 1, got {gpus_per_node}")
    if node_cores < gpus_per_node:
        raise ValueError(f"{node_cores} cores cannot feed {gpus_per_node} GPUs")
    return gpus_per_node, node_cores // gpus_per_node


def task_gpu_amount(executor_cores: int) -> str:
    """``spark.task.resource.gpu.amount`` for an executor of ``executor_cores`` cores and one GPU:
    1/cores written so that Spark's floor(1/amount) task slots equal the cores exactly."""
    if executor_cores < 1:
        raise ValueError(f"executor cores must be >= 1, got {executor_cores}")
    if executor_cores == 1:
        return "1"
    exact = 1.0 / executor_cores
    scale = 10 ** (5 - math.floor(math.log10(exact)))     # 6 significant digits
    amount = math.floor(exact * scale) / scale
    text = f"{amount:.{max(0, round(math.log10(scale)))}f}".rstrip("0")
    assert math.floor(1.0 / float(text)) == executor_cores, (executor_cores, text)
    return text


def gpu_resource_conf(node_cores: int, gpus_per_node: int) -> Dict[str, str]:
    """The ``spark.*`` properties the rule fixes for a GPU node: executor cores, executor and task
    GPU amounts."""
    _, cores = gpu_executors(node_cores, gpus_per_node)
    return {"spark.executor.cores": str(cores),
            "spark.executor.resource.gpu.amount": "1",
            "spark.task.resource.gpu.amount": task_gpu_amount(cores)}
