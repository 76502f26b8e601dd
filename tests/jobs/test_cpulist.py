"""The project's one CPU-list parser (slurm/common/cpulist.py): sysfs text, its import boundary (neither
jobs nor recsys), the engine's NUMA pinning through it, and slurm/bind.sh's shell twin agreeing."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm.common.cpulist import format_cpulist, parse_cpulist

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
BIND_SH = REPO / "slurm" / "bind.sh"


def test_sysfs_text_and_empty_lists():
    assert parse_cpulist("0-3,8\n") == [0, 1, 2, 3, 8]          # as read from sysfs
    assert parse_cpulist(" 4 - 5 , 7 ") == [4, 5, 7]
    assert parse_cpulist("\n", allow_empty=True) == []           # a CPU-less NUMA node
    assert format_cpulist([]) == "" and parse_cpulist(format_cpulist([]), allow_empty=True) == []
    for bad in ("", "\n", "0-", "1,,2", "-1", "2-1", "0-3,3"):
        with pytest.raises(ValueError):
            parse_cpulist(bad)
    with pytest.raises(ValueError):
        parse_cpulist("0-a", allow_empty=True)


def test_module_imports_neither_jobs_nor_recsys():
    code = ("import sys, slurm.common.cpulist\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jobs', 'recsys', 'yaml'))\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_engine_numa_pinning_reads_sysfs_through_the_shared_parser():
    """recsys.train.apply_affinity('numa') pins to NUMA node 0's allowed CPUs (a fresh process:
    it changes its own affinity)."""
    node0 = Path("/sys/devices/system/node/node0/cpulist")
    if not node0.is_file():
        pytest.skip("no NUMA information in sysfs here")
    code = ("import json, os\nfrom recsys.train import apply_affinity\n"
            "allowed = sorted(os.sched_getaffinity(0))\n"
            "mine = apply_affinity('numa', 0, 1)\n"
            "print(json.dumps([mine, sorted(os.sched_getaffinity(0)), allowed]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    mine, now, allowed = json.loads(out.stdout)
    expected = [c for c in parse_cpulist(node0.read_text(), allow_empty=True) if c in allowed] or allowed
    assert mine == now == expected


@pytest.mark.parametrize("cores", ["0-3", "0-1,3,5-6", "2,0,1", "7,4-5"])
def test_bind_sh_reads_cpu_lists_like_the_python_parser(cores):
    """One rank on a GPU-less node gets every core of RECSYS_BIND_CORES: bind.sh's expand/compress
    must print exactly the canonical form of the Python parser."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "RECSYS_"))}
    env.update(RECSYS_BIND_GPUS="0", RECSYS_BIND_CORES=cores, RECSYS_BIND_NUMA="0-7",
               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    out = subprocess.run(["bash", str(BIND_SH), "--dry", "--", "true"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f" cpus={format_cpulist(parse_cpulist(cores))} " in out.stdout, out.stdout


def test_bind_sh_refuses_what_the_python_parser_refuses():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "RECSYS_"))}
    env.update(RECSYS_BIND_GPUS="0", RECSYS_BIND_CORES="0-a", RECSYS_BIND_NUMA="0-7")
    with pytest.raises(ValueError):
        parse_cpulist("0-a")
    out = subprocess.run(["bash", str(BIND_SH), "--dry", "--", "true"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "bind.sh: malformed CPU/node list '0-a' in the RECSYS_BIND_* tables"]
