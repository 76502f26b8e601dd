"""The built-in DGX profiles and the sbatch template (issue 34, items 9 and 10): every setting has
a reason or goes, and the rendered dgxa100-pod scripts are run through bash where a CPU machine
can run them (the NCCL interface check, the container entry, the cluster helpers up to their
first srun)."""

import os
import re
import subprocess

import pytest

from jobs.planning.request import JobRequest
from jobs.profiles import ProfileError, load_profile
from jobs.submit import render_plan

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("isolated_profile_search_path")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLURM = os.path.join(REPO, "slurm")


def _render(request, profile, tmp_path):
    return render_plan([request], profile, run_dir=str(tmp_path / "run"))[0][1]


@pytest.fixture(scope="module")
def pod_train(tmp_path_factory):
    run = tmp_path_factory.mktemp("pod")
    request = JobRequest(kind="train", model="dlrm", nodes=2, engine_args=["--synthetic"])
    return _render(request, "dgxa100-pod", run), run


def test_pod_directives_and_environment(pod_train):
    text, run = pod_train
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    # --exclusive alone gives every core but only the default memory
    assert directives.index("#SBATCH --mem=0") == directives.index("#SBATCH --exclusive") + 1
    # SHARP without NCCL's CollNet, a 10-minute switch wait, a guessed interface name: gone
    assert not any("--network" in d or "--switches" in d for d in directives), directives
    assert "NCCL_SOCKET_IFNAME" not in text.split("# --- profile environment ---")[1].split("\n#")[0]
    flags = re.search(r"recsys_container=\(\n(.*?)\n\)", text, re.S).group(1).split()
    assert f"--container-workdir={run / 'run'}" in flags        # steps start in the run dir
    env = next(f for f in flags if f.startswith("--container-env="))
    assert "PYTHONPATH" not in env.split("=", 1)[1].split(","), env   # the image's own value stays
    assert "/raid/scratch:/raid/scratch" in next(f for f in flags if f.startswith("--container-mounts="))
    assert '"${recsys_container[@]}" bash "$RECSYS_SLURM_DIR/container-entry.sh"' in text
    assert "PYTHONPATH=" not in text.split("# --- the step ---")[1]


def test_container_entry_appends_to_the_images_pythonpath(tmp_path):
    """What a step runs first in the container: the checkout before the image's PYTHONPATH, no
    user site-packages; then the command itself (exec)."""
    script = 'bash "$RECSYS_SLURM_DIR/container-entry.sh" python3 -c ' \
             '"import os, site, sys; print(os.environ[\'PYTHONPATH\']); print(site.ENABLE_USER_SITE)"'
    env = dict(os.environ, RECSYS_SLURM_DIR=SLURM, PYTHONPATH="/opt/image/lib")
    env.pop("PYTHONNOUSERSITE", None)
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f"{REPO}:/opt/image/lib", "False"]


def test_nccl_interface_checked_in_the_job(pod_train, tmp_path):
    """NCCL_SOCKET_IFNAME is a site setting; the rendered script stops in one line when this node
    has no such interface (here: no ib0), and goes on when it has (lo, a prefix, an exclusion)."""
    text, _ = pod_train
    line = next(ln for ln in text.splitlines() if "node-check.sh" in ln and not ln.startswith("#"))
    for value, rc in (("ib0", 2), ("lo", 0), ("=lo", 0), ("l", 0), ("=l", 2), ("^docker,lo", 0), ("", 0)):
        env = dict(os.environ, RECSYS_SLURM_DIR=SLURM, NCCL_SOCKET_IFNAME=value)
        out = subprocess.run(["bash", "-c", line + "\necho after"], env=env, capture_output=True, text=True)
        assert out.returncode == rc, (value, out)
        if rc:
            assert out.stderr.count("\n") == 1 and f"NCCL_SOCKET_IFNAME={value}: no such network interface" \
                in out.stderr and "lo" in out.stderr
        else:
            assert out.stdout == "after\n"


def test_sharp_without_collnet_refused(tmp_path):
    path = tmp_path / "sharp.yaml"
    path.write_text("extends: dgxa100-pod\nsbatch_extra: [--network=sharp]\n")
    with pytest.raises(ProfileError, match=r": sbatch_extra: --network=sharp without env NCCL_COLLNET_ENABLE"):
        load_profile(str(path))
    path.write_text("extends: dgxa100-pod\nsbatch_extra: [--network=sharp]\nenv: {NCCL_COLLNET_ENABLE: '1'}\n")
    assert load_profile(str(path)).sbatch_extra == ["--network=sharp"]


@pytest.mark.parametrize("name", ["dgxa100-pod", "dgxa100-pod-spark", "dgxa100", "dgx1", "dgx2"])
def test_every_builtin_setting_has_a_reason(name):
    """Each setting line of the built-in DGX profiles (outside the node tables and the fabric
    section, which cite their sources) carries a comment, on its line or right above it."""
    lines = open(os.path.join(REPO, "cluster_profiles", f"{name}.yaml")).read().splitlines()
    section, missing = None, []
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            section = line.split(":")[0]
        if section in ("node", "fabric", "description", "extends", "scheduler", "name"):
            continue
        if line.rstrip().endswith(":"):       # a section header: its entries say why
            continue
        above = lines[i - 1].lstrip() if i else ""
        if "#" not in line and not above.startswith("#"):
            missing.append(line)
    assert not missing, f"{name}: settings without a reason: {missing}"


def test_cluster_helpers_get_the_profiles_settings(tmp_path):
    """Spark workers offer the cores the driver sizes its executors from; shuffle and spilling on
    the profile's node-local scratch; the start-up timeout from the profile."""
    pre = dict(kind="preprocess", dataset="criteo", preprocess_mode="multinode", nodes=2, input="/data/criteo/raw",
               output="/data/criteo/parquet")
    spark = _render(JobRequest(**pre), "dgxa100-pod-spark", tmp_path)
    helper = spark.split("# --- the step ---\n")[1].splitlines()[0]
    worker_cores = re.search(r"spark-standalone.sh\" .*--worker-cores (\d+)", helper).group(1)
    assert re.search(rf" -- .* --node-cores {worker_cores} ", helper), helper
    assert "--timeout 300" in helper and "--local-dirs /raid/scratch" in helper
    path = tmp_path / "nvt.yaml"
    path.write_text("extends: dgxa100-pod\ncontainer:\n  provides: [nvtabular]\n")
    dask = _render(JobRequest(preprocess_engine="nvtabular", **pre), str(path), tmp_path)
    helper = dask.split("# --- the step ---\n")[1].splitlines()[0]
    assert "dask-cluster.sh\"" in helper and "--timeout 300" in helper
    assert "--local-directory /raid/scratch" in helper


@pytest.mark.parametrize("helper", ["spark-standalone.sh", "dask-cluster.sh"])
def test_helpers_create_the_container_on_every_node_first(tmp_path, helper):
    """With a container, the first srun of a helper starts the job's container on all its nodes
    (the image import), before anything waits on the start-up timeout. pyxis cannot run here: a
    stand-in srun records its arguments and fails, which the helper reports in one line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/srun.log\nexit 1\n')
    (bin_dir / "scontrol").write_text("#!/bin/bash\nprintf 'node1\\nnode2\\nnode3\\n'\n")
    for tool in ("srun", "scontrol"):
        os.chmod(bin_dir / tool, 0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="7", SLURM_JOB_NODELIST="node[1-3]",
               RECSYS_CONTAINER_SRUN_FLAGS="--container-image=img\n--container-name=recsys-7",
               RECSYS_RUN_DIR=str(tmp_path))
    out = subprocess.run(["bash", os.path.join(SLURM, helper), "--timeout", "5", "--", "true"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert "could not start the job's container on its 3 node(s)" in out.stderr
    calls = (tmp_path / "srun.log").read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("--nodes=3 --ntasks=3 --ntasks-per-node=1 --overlap "
                                                   "--kill-on-bad-exit=1 --container-image=img "
                                                   "--container-name=recsys-7"), calls
    assert calls[0].endswith(" true"), calls
