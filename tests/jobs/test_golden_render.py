"""Golden files: the whole rendered sbatch text of the DGX A100 scripts (no container) and of every
job kind with the DGX A100 pod profile (a pyxis container), so that any change to rendering shows
up as a diff; and checks that with the pod profile every step, daemon and driver runs in the
container (docs/submitting.md, "Containers").

The files are tests/jobs/golden/<case>.sbatch.  Volatile parts are normalised before the
comparison: the run directory -> <run_dir>, the checkout -> <repo>, this interpreter -> <python>,
a submission token -> <token>, the profile's content hash -> <profile_sha256> (checked apart: it
changes with the profile file, not with the rendering).  After an intended rendering change, regenerate them with

    RECSYS_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/jobs/test_golden_render.py -q

and read the diff (git diff tests/jobs/golden) before committing it: the binding tables,
`srun --mpi=pmix -N ...`, the container flags and the USR2 trap/requeue lines must stay right
(docs/binding.md, /work/shared/reference/hpc-facts.md).
"""

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.planning.request import JobRequest
from jobs.submit import render_plan

pytestmark = pytest.mark.fast

GOLDEN = Path(__file__).resolve().parent / "golden"
REPO = str(Path(__file__).resolve().parents[2])
UPDATE = os.environ.get("RECSYS_UPDATE_GOLDEN") == "1"

def _study_point():
    """The JobRequest of one point of a study (docs/studies/dlrm-strong.yaml), as `recsys-submit
    study` submits it."""
    from jobs.profiles.loader import load_profile
    from jobs.study.spec import expand, load_spec

    spec = load_spec(str(Path(REPO) / "docs" / "studies" / "dlrm-strong.yaml"))
    points = expand(spec, load_profile("dgxa100-pod"))
    return points[-1].request(spec, "dgxa100-pod")


def _preprocess(mode, engine="spark", **extra):
    return JobRequest(kind="preprocess", dataset="criteo", preprocess_mode=mode, preprocess_engine=engine,
                      input="/data/criteo/raw", output="/data/criteo/parquet", **extra)


# case -> (request, profile, index of the plan's script to compare). Every job kind with the
# dgxa100-pod profile (a pyxis container: every step, daemon and driver runs in it); the
# dgxa100 ones (no container) pin that such scripts do not change.
CASES = {
    "dgxa100-1node": (lambda: JobRequest(kind="train", model="dlrm", nodes=1), "dgxa100", 0),
    "dgxa100-2nodes": (lambda: JobRequest(kind="train", model="dlrm", nodes=2), "dgxa100", 0),
    "dgxa100-preprocess-multinode-spark": (lambda: _preprocess("multinode", nodes=2), "dgxa100", 0),
    "dgxa100-pod-4nodes": (lambda: JobRequest(kind="train", model="wide_deep", nodes=4), "dgxa100-pod", 0),
    "dgxa100-pod-evaluate": (lambda: JobRequest(kind="evaluate", model="dlrm", nodes=1,
                                                engine_args=["--data-path", "/data/criteo/parquet"]),
                             "dgxa100-pod", 0),
    "dgxa100-pod-benchmark": (lambda: JobRequest(kind="benchmark", model="dlrm", nodes=2), "dgxa100-pod", 0),
    "dgxa100-pod-study-point": (_study_point, "dgxa100-pod", 0),
    # preprocessing: the pod's image for it (dgxa100-pod's NGC TensorFlow image has no Spark)
    "dgxa100-pod-preprocess-single": (lambda: _preprocess("single", nodes=1), "dgxa100-pod-spark", 0),
    # RAPIDS on one node: a Spark standalone master and worker inside the allocation, not local mode
    "dgxa100-pod-preprocess-single-rapids": (
        lambda: _preprocess("single", nodes=1, engine_args=["--rapids-jar", "/opt/rapids/rapids-4-spark.jar"]),
        "dgxa100-pod-spark", 0),
    "dgxa100-pod-preprocess-array-dictionary": (lambda: _preprocess("array", shards=4), "dgxa100-pod-spark", 0),
    "dgxa100-pod-preprocess-array-transform": (lambda: _preprocess("array", shards=4), "dgxa100-pod-spark", 1),
    "dgxa100-pod-preprocess-multinode-spark": (lambda: _preprocess("multinode", nodes=2), "dgxa100-pod-spark", 0),
    # no built-in image declares NVTabular: the dask helper without a container (the container
    # mechanics of the helpers are the Spark case's: allocation-cluster.sh)
    "dgxa100-preprocess-multinode-nvtabular": (lambda: _preprocess("multinode", "nvtabular", nodes=2),
                                               "dgxa100", 0),
}


@pytest.fixture(autouse=True)
def builtin_profiles_only(tmp_path, monkeypatch):
    """A user's own profiles named like the built-ins must not change the text."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RECSYS_PROFILE_PATH", raising=False)


def normalise(text, run_dir):
    text = text.replace(os.path.abspath(run_dir), "<run_dir>")
    text = re.sub(r"(?<![\w/.-])" + re.escape(sys.executable) + r"(?![\w/.-])", "<python>", text)
    text = text.replace(REPO, "<repo>")
    text = re.sub(r"\b[0-9a-f]{64}\b", "<profile_sha256>", text)
    return re.sub(r"\b[0-9a-f]{16}\b", "<token>", text)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_script_matches_golden_file(case, tmp_path):
    make_request, profile, index = CASES[case]
    run_dir = str(tmp_path / "runs" / "golden-run")
    spec, text = render_plan([make_request()], profile, run_dir=run_dir)[index]
    exports = f"export RECSYS_JOB_PROFILE={profile}\nexport RECSYS_JOB_PROFILE_SHA256={spec.profile.content_sha256()}\n"
    assert f"\n{exports}" in text
    got = normalise(text, run_dir)
    path = GOLDEN / f"{case}.sbatch"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        tmp = path.with_suffix(".sbatch.tmp")
        tmp.write_text(got)
        tmp.replace(path)
    assert path.is_file(), f"{path} missing: regenerate with RECSYS_UPDATE_GOLDEN=1"
    want = path.read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                            f"golden/{case}.sbatch", "rendered now"))
        pytest.fail(f"rendered {case} script differs from {path} "
                    f"(intended? regenerate with RECSYS_UPDATE_GOLDEN=1 and review):\n{diff}",
                    pytrace=False)


def _step(text):
    """The script's step: from `# --- the step ---` to the `&` that backgrounds it."""
    return text.split("# --- the step ---\n", 1)[1].split(" &\nrecsys_step_pid=$!", 1)[0]


@pytest.mark.parametrize("case", sorted(c for c in CASES if CASES[c][1].startswith("dgxa100-pod")))
def test_container_profile_runs_the_step_in_the_container(case, tmp_path):
    """dgxa100-pod: the srun ranks get the job's container flags and start with container-entry.sh
    (the checkout before the image's own PYTHONPATH, which no host value replaces); a multinode step
    hands the flags to its cluster helper (which starts the daemons and the driver with them);
    never a bare python."""
    make_request, profile, index = CASES[case]
    run = os.path.abspath(str(tmp_path / "run"))
    _, text = render_plan([make_request()], profile, run_dir=run)[index]
    step = _step(text)
    assert "export RECSYS_CONTAINER_SRUN_FLAGS" in text
    assert '"--container-name=recsys-${SLURM_JOB_ID:-local}"' in text
    env = re.search(r"--container-env=(\S+)", text).group(1).split(",")
    assert env[0] == "OMPI_MCA_btl" and "PYTHONPATH" not in env and "PYTHONPATH" not in step
    assert f"--container-workdir={run}\n" in text
    if step.startswith("srun "):
        entry = '"${recsys_container[@]}" bash "$RECSYS_SLURM_DIR/container-entry.sh"'
        assert step.index(entry) < step.index(" python -m "), step
    else:
        helper = re.match(r'bash "\$RECSYS_SLURM_DIR/(spark-standalone|dask-cluster)\.sh" ', step)
        assert helper, step


@pytest.mark.parametrize("case", sorted(c for c in CASES if CASES[c][1] == "dgxa100"))
def test_host_profile_has_no_container_pieces(case, tmp_path):
    make_request, profile, index = CASES[case]
    _, text = render_plan([make_request()], profile, run_dir=str(tmp_path / "run"))[index]
    assert "container" not in text.replace('echo "container="', "")
    assert "PYTHONPATH" not in text


def test_helpers_get_the_rendered_container_flags_word_for_word(tmp_path):
    """The rendered container section, run by bash, and slurm/allocation-cluster.sh sourced after
    it: the helpers' srun prefix is the script's flags, the job id expanded, one word each."""
    _, text = render_plan([_preprocess("multinode", nodes=2)], "dgxa100-pod-spark", run_dir=str(tmp_path / "run"))[0]
    block = text.split("# --- container (pyxis)", 1)[1].split("# --- record what ran where ---", 1)[0]
    block = block.split("\n", 1)[1]
    script = (f"set -euo pipefail\n{block}\n"
              f"source {REPO}/slurm/allocation-cluster.sh\n"
              "container_env SPARK_HOME SPARK_MASTER_URL\n"
              "printf 'here=%s\\n' \"${here[@]}\"; printf 'container=%s\\n' \"${container[@]}\"\n")
    env = dict(os.environ, SLURM_JOB_ID="4242", SLURMD_NODENAME="dgx-001")
    out = subprocess.run(["bash", "-c", script], env=env, text=True, capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    here = [line[5:] for line in out.stdout.splitlines() if line.startswith("here=")]
    container = [line[10:] for line in out.stdout.splitlines() if line.startswith("container=")]
    run = os.path.abspath(str(tmp_path / "run"))
    assert container == [
        "--container-image=/lustre/images/recsys-spark-3.5.sqsh",
        "--container-name=recsys-4242",
        f"--container-mounts=/lustre/datasets:/data,/lustre/checkpoints:/checkpoints,{REPO}:{REPO}:ro,{run}:{run},"
        "/raid/scratch:/raid/scratch",
        f"--container-workdir={run}",
        "--container-env=OMPI_MCA_btl,RECSYS_PYTHON,SPARK_HOME,SPARK_MASTER_URL"]
    assert here == ["srun", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--overlap",
                    "--kill-on-bad-exit=1", "--nodelist=dgx-001"] + container + [
                        "bash", f"{REPO}/slurm/container-entry.sh"]
    # without a container (no RECSYS_CONTAINER_SRUN_FLAGS) the helpers exec their commands as before
    bare = (f"set -euo pipefail\nsource {REPO}/slurm/allocation-cluster.sh\ncontainer_env SPARK_HOME\n"
            "printf 'here=%s\\n' \"${here[@]}\"; echo \"n=${#container[@]}\"\n")
    env.pop("RECSYS_CONTAINER_SRUN_FLAGS", None)
    out = subprocess.run(["bash", "-c", bare], env=env, text=True, capture_output=True, timeout=30)
    assert out.returncode == 0 and out.stdout == "here=env\nn=0\n", (out.stdout, out.stderr)


@pytest.mark.parametrize("helper", ["spark-standalone.sh", "dask-cluster.sh"])
def test_cluster_helpers_start_every_process_through_the_container_prefix(helper):
    """Each python, daemon and driver a helper starts on its node goes through "${here[@]}"; each
    srun over the nodes carries the container flags (empty without a container)."""
    lines = (Path(REPO) / "slurm" / helper).read_text().splitlines()
    code = [line for line in lines if not line.lstrip().startswith("#")]
    starts = [line for line in code if re.search(r'(^|\$\()"\$PY"|^"\$@" &|^"\$SPARK_HOME/bin/spark-class"', line.strip())]
    assert not starts, f"{helper}: started outside the container prefix: {starts}"
    assert sum('"${here[@]}" "$@" &' in line for line in code) == 1
    for i, line in enumerate(code):
        if re.match(r"\s*srun ", line):
            command = " ".join(code[i:i + 3])
            assert '${container[@]+"${container[@]}"}' in command, f"{helper}: srun without the container flags: {line}"
            # in the container, the workers start with container-entry.sh (the checkout on PYTHONPATH)
            assert '${entry[@]+"${entry[@]}"}' in command, f"{helper}: srun without the container entry: {line}"
    # the job's container is created on every node before the first timeout starts
    assert code.index(next(c for c in code if "containers_on_all_nodes" in c)) < \
        code.index(next(c for c in code if "deadline=" in c))


def test_other_batch_commands_become_a_container_step(tmp_path):
    """A batch step that is not a cluster helper still runs its Python in the container: one
    srun task with the job's flags (no plan makes one today; the backend must not run it bare)."""
    import dataclasses

    from jobs.backends.slurm.script import render

    [(spec, _)] = render_plan([_preprocess("single", nodes=1)], "dgxa100-pod-spark", run_dir=str(tmp_path / "run"))
    step = _step(render(dataclasses.replace(spec, launcher="batch"), str(tmp_path / "run")))
    assert re.match(r'srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --overlap '
                    r'--kill-on-bad-exit=1 "\$\{recsys_container\[@\]\}" \\\n    '
                    r'bash "\$RECSYS_SLURM_DIR/container-entry.sh" python -m preproc criteo run ', step), step


def test_run_dir_pyxis_cannot_mount_is_refused(tmp_path):
    from jobs.errors import RequestError

    with pytest.raises(RequestError, match=r"^--runs-dir: .* contains ',' or ':'"):
        render_plan([_preprocess("single", nodes=1)], "dgxa100-pod-spark", run_dir=str(tmp_path / "a,b"))
