"""Rank binding: the pure function against the DGX tables, and slurm/bind.sh against the pure
function (dry output for topologies this host lacks, real affinity on the cores it has)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.profiles.binding import bind_args, bind_env, rank_binding
from jobs.profiles import load_profile

pytestmark = pytest.mark.fast

BIND_SH = Path(__file__).resolve().parents[2] / "slurm" / "bind.sh"
RANK_VARS = ("SLURM_", "OMPI_", "PMIX_", "RECSYS_", "CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK",
             "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "UCX_NET_DEVICES")
AFFINITY = "import os; print(sorted(os.sched_getaffinity(0)))"


@pytest.fixture(autouse=True)
def no_user_profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RECSYS_PROFILE_PATH", raising=False)


def clean_env(**extra):
    """The test process's environment without any rank/Slurm/binding variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(RANK_VARS)}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def bind(args, env, check=True):
    proc = subprocess.run(["bash", str(BIND_SH), *args], env=env, capture_output=True, text=True,
                          timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def node(name):
    return load_profile(name).node


# ------------------------------------------------------------------ the pure function

def test_dgxa100_rank0_and_rank2_follow_the_table():
    a100 = node("dgxa100")
    r0 = rank_binding(a100, 0, "exclusive")
    assert (r0.cpus, r0.mems, r0.policy, r0.gpu, r0.nic) == (list(range(48, 56)), [3], "membind", 0, None)
    r0ht = rank_binding(a100, 0, "exclusive", hyperthreads=True)
    assert r0ht.cpus == list(range(48, 56)) + list(range(176, 184))
    r2 = rank_binding(a100, 2, "exclusive")
    assert (r2.cpus, r2.mems) == (list(range(16, 24)), [1])
    assert r0ht.describe() == "cpus=48-55,176-183 mems=3 policy=membind gpu=0 nic=none"
    assert r0ht.numactl_args() == ["--physcpubind=48-55,176-183", "--membind=3"]


def test_dgxa100_all_ranks_numa_interleave_off_and_nic():
    a100 = node("dgxa100")
    expected_mems = [3, 3, 1, 1, 7, 7, 5, 5]
    for r in range(8):
        home = expected_mems[r]
        numa = rank_binding(a100, r, "numa", multinode=True)
        assert numa.cpus == list(range(16 * home, 16 * home + 16)) and numa.mems == [home]
        assert numa.nic == a100.nics[r]
        inter = rank_binding(a100, r, "interleave", hyperthreads=True)
        assert inter.mems is None and inter.policy == "interleave"
        assert inter.cpus == list(range(16 * home, 16 * home + 16)) + list(range(16 * home + 128, 16 * home + 144))
        assert inter.numactl_args()[1] == "--interleave=all"
        off = rank_binding(a100, r, "off", multinode=True)
        assert (off.cpus, off.mems, off.policy, off.gpu, off.nic) == ([], None, "off", r, a100.nics[r])
        assert off.numactl_args() == []


def test_dgx1_and_dgx2_linear():
    dgx1, dgx2 = node("dgx1"), node("dgx2")
    for r in range(8):
        b = rank_binding(dgx1, r, "exclusive", hyperthreads=True)
        assert b.cpus == list(range(5 * r, 5 * r + 5)) + list(range(5 * r + 40, 5 * r + 45))
        assert b.mems == [0 if r < 4 else 1]
    for r in range(16):
        b = rank_binding(dgx2, r, "exclusive", multinode=True)
        assert b.cpus == list(range(3 * r, 3 * r + 3)) and b.mems == [r // 8]
        assert b.nic == dgx2.nics[r]
    assert rank_binding(dgx2, 9, "numa").cpus == list(range(24, 48))


def test_gpuless_node_shares_cores_between_ranks():
    local = node("ci")  # stand-in topology; a GPU-less copy of it
    from dataclasses import replace
    cpu_only = replace(local, gpus=0, gpu_numa=[], gpu_cores=[])
    assert [rank_binding(cpu_only, r, "exclusive", local_size=2).cpus for r in range(2)] == [[0], [1]]
    assert rank_binding(cpu_only, 0, "exclusive", local_size=1).cpus == [0, 1]
    assert rank_binding(cpu_only, 2, "exclusive", local_size=3).cpus == [0]
    assert rank_binding(cpu_only, 0, "exclusive").gpu is None


def test_invalid_requests_raise():
    a100 = node("dgxa100")
    with pytest.raises(ValueError, match="local rank 8 has no GPU"):
        rank_binding(a100, 8, "exclusive")
    with pytest.raises(ValueError, match="unknown binding mode 'tight'"):
        rank_binding(a100, 0, "tight")
    with pytest.raises(ValueError, match="unknown binding mode"):
        bind_args("tight")
    assert bind_args("numa", True) == ["--mode", "numa", "--ht"]


def test_bind_env_tables():
    env = bind_env(node("dgxa100"))
    assert env["RECSYS_BIND_CPUS"] == "48-55;56-63;16-23;24-31;112-119;120-127;80-87;88-95"
    assert env["RECSYS_BIND_MEMS"] == "3;3;1;1;7;7;5;5"
    assert env["RECSYS_BIND_NICS"] == "mlx5_0;mlx5_1;mlx5_2;mlx5_3;mlx5_6;mlx5_7;mlx5_8;mlx5_9"
    assert env["RECSYS_HT_OFFSET"] == "128" and env["RECSYS_BIND_GPUS"] == "8"
    assert env["RECSYS_BIND_NUMA"].split(";")[3] == "48-63"
    assert bind_env(node("ci"))["RECSYS_HT_OFFSET"] == ""


# ---------------------------------------------- bind.sh --dry equals the pure function

@pytest.mark.parametrize("profile", ["dgxa100", "dgx2"])
def test_bind_sh_dry_matches_rank_binding_for_every_local_rank(profile):
    topo = node(profile)
    tables = bind_env(topo)
    for mode in ("exclusive", "numa", "interleave", "off"):
        for ht in (False, True):
            for local_rank in range(topo.gpus):
                multinode = (local_rank + ht) % 2 == 1  # both cases, fewer runs
                env = clean_env(SLURM_LOCALID=local_rank, SLURM_PROCID=8 + local_rank,
                                SLURM_NNODES=2 if multinode else 1, **tables)
                args = ["--mode", mode] + (["--ht"] if ht else []) + ["--dry", "--", "train.py", "a b"]
                out = bind(args, env).stdout
                expected = rank_binding(topo, local_rank, mode, hyperthreads=ht, multinode=multinode)
                assert out == (f"rank={8 + local_rank} local_rank={local_rank} {expected.describe()} "
                               "cmd=train.py a\\ b\n")


def test_bind_sh_dry_dgxa100_table_values():
    env = clean_env(SLURM_LOCALID=0, **bind_env(node("dgxa100")))
    assert "cpus=48-55,176-183 mems=3 " in bind(["--ht", "--dry", "--", "x"], env).stdout
    env["SLURM_LOCALID"] = "2"
    assert "cpus=16-23 mems=1 " in bind(["--dry", "--", "x"], env).stdout


def test_bind_sh_dry_gpuless_matches_rank_binding():
    from dataclasses import replace
    cpu_only = replace(node("dgx1"), gpus=0, gpu_numa=[], gpu_cores=[], nics=[])
    tables = bind_env(cpu_only)
    for size in (1, 3, 80):
        for r in sorted({0, size // 2, size - 1}):
            env = clean_env(LOCAL_RANK=r, LOCAL_WORLD_SIZE=size, **tables)
            out = bind(["--mode", "exclusive", "--dry", "--", "x"], env).stdout
            assert out == f"rank={r} local_rank={r} {rank_binding(cpu_only, r, 'exclusive', local_size=size).describe()} cmd=x\n"


# ------------------------------------------------------------ real runs on this host

def test_real_binding_with_ci_profile_pins_each_rank_to_its_core():
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1 available to the test process")
    tables = bind_env(node("ci"))
    for local_rank in (0, 1):
        env = clean_env(LOCAL_RANK=local_rank, **tables)
        proc = bind(["--", sys.executable, "-c",
                     AFFINITY + "; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['RANK'])"], env)
        assert proc.stdout.splitlines() == [str([local_rank]), f"{local_rank} {local_rank}"]


def test_rank_environment_exported_from_slurm_variables():
    env = clean_env(SLURM_LOCALID=1, SLURM_PROCID=5, SLURM_NTASKS=8, SLURM_NODEID=2,
                    SLURM_STEP_TASKS_PER_NODE="2(x4)", SLURM_NNODES=4, SLURM_STEP_GPUS="2,3",
                    CUDA_VISIBLE_DEVICES="0,1", **bind_env(node("dgxa100")))
    show = ("import os; print(' '.join(os.environ.get(k, '-') for k in ('RANK', 'LOCAL_RANK', "
            "'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'NODE_RANK', 'CUDA_VISIBLE_DEVICES', 'UCX_NET_DEVICES', "
            "'OMPI_MCA_btl_openib_if_include')))")
    out = bind(["--mode", "off", "--", sys.executable, "-c", show], env).stdout.split()
    # Slurm gave GPUs 2,3 (renumbered 0,1 in the cgroup): local rank 1 -> physical GPU 3.
    assert out == ["5", "1", "8", "2", "2", "1", "mlx5_3:1", "mlx5_3:1"]
    dry = bind(["--dry", "--", "x"], env).stdout
    assert "gpu=3 nic=mlx5_3 " in dry and "cpus=24-31 mems=1 " in dry


@pytest.mark.parametrize("nnodes, var", [(1, "SLURM_NNODES"), (2, "SLURM_NNODES"), (3, "RECSYS_NNODES")])
def test_nic_exported_only_when_the_job_spans_several_nodes(nnodes, var):
    env = clean_env(SLURM_LOCALID=4, **{var: nnodes}, **bind_env(node("dgxa100")))
    show = "import os; print(os.environ.get('UCX_NET_DEVICES', 'unset'))"
    out = bind(["--mode", "off", "--", sys.executable, "-c", show], env).stdout.strip()
    assert out == ("mlx5_6:1" if nnodes > 1 else "unset")


def test_ompi_and_plain_local_rank_variables():
    env = clean_env(OMPI_COMM_WORLD_LOCAL_RANK=1, OMPI_COMM_WORLD_RANK=3, OMPI_COMM_WORLD_SIZE=4,
                    OMPI_COMM_WORLD_LOCAL_SIZE=2, LOCAL_RANK=0, **bind_env(node("ci")))
    assert bind(["--dry", "--", "x"], env).stdout.startswith("rank=3 local_rank=1 cpus=1 mems=0 ")


def test_binding_the_host_cannot_honour_fails_unless_not_strict():
    env = clean_env(SLURM_LOCALID=0, **bind_env(node("dgxa100")))
    proc = bind(["--", sys.executable, "-c", "print('ran')"], env, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith("bind.sh: rank 0: cannot bind to cpus 48-55: cpu 48 is not available")
    env["RECSYS_BIND_STRICT"] = "0"
    proc = bind(["--", sys.executable, "-c", "print('ran')"], env)
    assert proc.stdout == "ran\n" and "running unbound" in proc.stderr


def test_bad_invocations_give_one_line_errors():
    env = clean_env(SLURM_LOCALID=8, **bind_env(node("dgxa100")))
    cases = [
        (["--dry", "--", "x"], env, "bind.sh: local rank 8 has no GPU: the node type has 8 GPUs"),
        (["--mode", "tight", "--", "x"], env, "bind.sh: --mode: must be exclusive, numa, interleave or off"),
        (["--dry"], env, "bind.sh: no command to run"),
        (["--bogus", "--", "x"], env, "bind.sh: unknown option '--bogus'"),
        (["--dry", "--", "x"], dict(env, SLURM_LOCALID="1;rm"), "bind.sh: local rank "),
    ]
    for args, e, start in cases:
        proc = bind(args, e, check=False)
        assert proc.returncode == 2 and proc.stderr.startswith(start), (args, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1


def test_command_arguments_are_passed_verbatim_never_evaluated(tmp_path):
    env = clean_env(LOCAL_RANK=0, **bind_env(node("ci")))
    marker = tmp_path / "pwned"
    evil = [f"$(touch {marker})", f"; touch {marker}", "`id`", "a b"]
    proc = bind(["--mode", "off", "--", sys.executable, "-c", "import sys; print(sys.argv[1:])", *evil],
                env)
    assert proc.stdout.strip() == str(evil)
    dry = bind(["--dry", "--", "prog", *evil], env).stdout
    assert not marker.exists() and "\\$\\(touch" in dry


def test_verbose_prints_the_binding_line_to_stderr():
    env = clean_env(LOCAL_RANK=1, RECSYS_BIND_VERBOSE=1, **bind_env(node("ci")))
    proc = bind(["--mode", "off", "--", "true"], env)
    assert proc.stderr == "rank=1 local_rank=1 cpus=all mems=all policy=off gpu=1 nic=none cmd=true\n"


def test_without_numactl_falls_back_to_taskset_then_to_strictness(tmp_path):
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1 available to the test process")
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("bash", "sed", "cat", "taskset"):
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"{tool} not installed")
        (tools / tool).symlink_to(found)
    env = clean_env(LOCAL_RANK=1, PATH=str(tools), **bind_env(node("ci")))
    argv = ["--", sys.executable, "-c", AFFINITY]
    proc = bind(argv, env)
    assert proc.stdout.strip() == "[1]" and "numactl not found" in proc.stderr
    (tools / "taskset").unlink()
    proc = bind(argv, env, check=False)
    assert proc.returncode == 2 and "neither numactl nor taskset found" in proc.stderr
    proc = bind(argv, dict(env, RECSYS_BIND_STRICT="0"))
    assert proc.stdout.strip() == str(sorted(os.sched_getaffinity(0)))


def test_missing_tables_are_a_one_line_error_but_off_still_runs():
    env = clean_env(LOCAL_RANK=0)
    proc = bind(["--", "true"], env, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("bind.sh: no binding tables in the environment")
    assert bind(["--mode", "off", "--", "echo", "ran"], env).stdout == "ran\n"
