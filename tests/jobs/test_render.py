"""Rendering and planning without a cluster: DGX A100 binding lines, arrays, chains, time parsing."""

import os
import re
import subprocess

import pytest


from jobs.errors import RequestError
from jobs.planning.plan import plan, split_array
from jobs.profiles import load_profile
from jobs.planning.request import JobRequest
from jobs.slurmtime import format_time, parse_time
from jobs.submit import render_plan

pytestmark = pytest.mark.fast

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script(request, profile, tmp_path):
    [(spec, text)] = render_plan([request], profile, run_dir=str(tmp_path / "run"))
    return text


def _bind_lines(text):
    """The binding table exports and the per-rank wrapper invocation of a rendered script."""
    exports = [line for line in text.splitlines() if line.startswith(("export RECSYS_BIND", "export RECSYS_HT"))]
    wrapper = next(line.strip() for line in text.splitlines() if 'bind.sh"' in line)
    return exports, wrapper.rstrip("\\").strip()


@pytest.mark.parametrize("ht", [False, True])
def test_dgxa100_rendered_binding_per_local_rank(tmp_path, ht):
    request = JobRequest(kind="train", model="dlrm", nodes=2, hyperthreads=ht)
    text = _script(request, "dgxa100", tmp_path)
    assert "#SBATCH --ntasks-per-node=8" in text and "#SBATCH --gres=gpu:8" in text
    assert "srun --mpi=pmix -N 2 --ntasks-per-node=8" in text
    exports, wrapper = _bind_lines(text)
    assert wrapper.startswith('bash "$RECSYS_SLURM_DIR/bind.sh" --mode exclusive')
    dry = wrapper.replace("--mode", "--dry --mode", 1).rstrip("-").strip() + " -- true"
    expected = {0: ("48-55", "3"), 1: ("56-63", "3"), 2: ("16-23", "1"), 3: ("24-31", "1"),
                4: ("112-119", "7"), 5: ("120-127", "7"), 6: ("80-87", "5"), 7: ("88-95", "5")}
    for local, (cpus, mems) in expected.items():
        if ht:
            lo, hi = map(int, cpus.split("-"))
            cpus = f"{cpus},{lo + 128}-{hi + 128}"
        script = "\n".join(exports + [f"export RECSYS_SLURM_DIR={REPO}/slurm", dry])
        env = dict(os.environ, SLURM_LOCALID=str(local), SLURM_PROCID=str(8 + local), SLURM_NTASKS="16",
                   SLURM_NNODES="2", SLURM_NODEID="1", SLURM_NTASKS_PER_NODE="8")
        out = subprocess.run(["bash", "-c", script], env=env, text=True, capture_output=True)
        assert out.returncode == 0, out.stderr
        assert f"local_rank={local} " in out.stdout
        assert f" cpus={cpus} " in out.stdout and f" mems={mems} " in out.stdout, out.stdout
        assert f"rank={8 + local} " in out.stdout


def test_container_flags_once_and_profile_extras(tmp_path):
    text = _script(JobRequest(kind="benchmark", model="wide_deep", nodes=4), "dgxa100-pod", tmp_path)
    assert text.count("--container-image=") == 1 and "--container-name=recsys-" in text
    assert "--container-mounts=" in text and f"--container-workdir={tmp_path / 'run'}" in text
    assert re.search(r"^#SBATCH --signal=B:USR2@\d+$", text, re.M)
    assert "trap recsys_on_usr2 USR2" in text and 'recsys_requeue_id="$SLURM_JOB_ID"' in text
    assert 'scontrol requeue "$recsys_requeue_id"' in text
    assert "python -m recsys.train --model wide_deep --run-mode benchmark" in text
    # the ranks run this checkout's code and write the run dir from inside the image
    repo = REPO
    mounts = re.search(r"--container-mounts=(\S+)", text).group(1).split(",")
    assert f"{repo}:{repo}:ro" in mounts and "/lustre/datasets:/data" in mounts
    assert any(m.startswith(str(tmp_path)) for m in mounts), mounts
    assert '"${recsys_container[@]}" bash "$RECSYS_SLURM_DIR/container-entry.sh"' in text


def test_criteo_array_plan_split_and_chained(tmp_path):
    profile = load_profile("ci")
    request = JobRequest(kind="preprocess", dataset="criteo", preprocess_mode="array", shards=5,
                         array_parallelism=2, input="/raw", output="/out")
    _, specs = plan([request], profile, max_array_size=2)
    assert [s.key for s in specs] == ["dictionary", "transform.0", "transform.1", "transform.2", "finalize"]
    assert [s.task_offset for s in specs[1:4]] == [0, 2, 4]
    assert [s.array for s in specs[1:4]] == [(0, 1, 2), (0, 1, 2), (0, 0, 2)]
    assert specs[1].after_ok == ["dictionary"] and specs[2].after_any == ["transform.0"]
    assert specs[-1].after_ok == ["transform.0", "transform.1", "transform.2"]
    parts = render_plan([request], profile, run_dir=str(tmp_path / "r"), max_array_size=2)
    transform = parts[2][1]
    assert "export RECSYS_TASK_INDEX=$(( 2 + SLURM_ARRAY_TASK_ID ))" in transform
    assert "export RECSYS_TASK_COUNT=5" in transform
    assert '#SBATCH --dependency="afterok:<dictionary>,afterany:<transform.0>"' in transform


def test_preprocess_train_evaluate_chain_and_multinode(tmp_path):
    profile = load_profile("ci")
    chain = [JobRequest(kind="preprocess", dataset="criteo", preprocess_mode="multinode", nodes=3,
                        input="/raw", output="/data"),
             JobRequest(kind="train", model="dlrm", engine_args=["--data-path", "/data"]),
             JobRequest(kind="evaluate", model="dlrm", engine_args=["--data-path", "/data"])]
    _, specs = plan(chain, profile)
    assert [s.key for s in specs] == ["preprocess", "train", "evaluate"]
    assert specs[1].after_ok == ["preprocess"] and specs[2].after_ok == ["train"]
    text = render_plan(chain, profile, run_dir=str(tmp_path / "r"))[0][1]
    # the workers offer the cores the driver sizes its executors from (the profile's node)
    assert '"$RECSYS_SLURM_DIR/spark-standalone.sh" --worker-cores 2 -- ' in text
    assert "#SBATCH --nodes=3" in text and "#SBATCH --ntasks-per-node=1" in text
    assert "--node-cores 2 --node-memory-gb 3 --gpus-per-node 2" in text


def test_split_array_and_time_formats():
    assert split_array(5, 2) == [(0, 2), (2, 2), (4, 1)]
    assert split_array(3, 1001) == [(0, 3)]
    assert parse_time("30") == 1800 and parse_time("1:30") == 90
    assert parse_time("2:00:00") == 7200 and parse_time("1-2") == 93600
    assert parse_time("1-0:30") == 88200 and parse_time("1-00:00:01") == 86401
    assert parse_time("UNLIMITED") is None
    assert format_time(93600) == "1-02:00:00" and format_time(90) == "00:01:30"
    for bad in ("", "1:2:3:4", "1-", "-1", "1h", "0", "00:00:00", "1-2-3"):
        with pytest.raises(RequestError):
            parse_time(bad)


def test_signal_seconds_must_fit_in_time_limit():
    profile = load_profile("ci")
    with pytest.raises(RequestError, match="--signal-seconds"):
        plan([JobRequest(kind="train", model="ncf", time="1", signal_seconds=120)], profile)


def test_embedding_memory_budget_comes_from_the_profile(tmp_path):
    """--embedding-placement auto needs each rank's memory: its GPU's on GPU nodes, else the node's
    memory shared by its ranks; preprocessing jobs get none."""
    gpu = _script(JobRequest(kind="train", model="dlrm"), "dgxa100", tmp_path)
    assert "export RECSYS_EMBEDDING_MEMORY_GB=80\n" in gpu
    cpu = _script(JobRequest(kind="train", model="dlrm", gpus_per_node=2), "ci", tmp_path)
    node = load_profile("ci").node
    assert f"export RECSYS_EMBEDDING_MEMORY_GB={node.memory_gb / 2:g}\n" in cpu
    pre = _script(JobRequest(kind="preprocess", dataset="movielens", input="a", output="b"), "ci", tmp_path)
    assert "RECSYS_EMBEDDING_MEMORY_GB" not in pre
