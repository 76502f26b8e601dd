"""A single-node NVTabular job spills to the profile's node-local scratch (issue 47, item 11), as
the multinode one does (dask-cluster.sh --local-directory): its LocalCUDACluster took dask's
default temporary directory, inside the container. The plan exports DASK_TEMPORARY_DIRECTORY; dask
itself (this venv's) reads it as the directory preproc.runtime.dask_cluster hands the workers."""
import os
import subprocess
import sys

import pytest

from jobs.planning.plan import plan
from jobs.planning.request import JobRequest
from jobs.profiles import load_profile
from jobs.submit import render_plan

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("isolated_profile_search_path")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_single_node_nvtabular_spills_to_the_profiles_scratch(tmp_path):
    (tmp_path / "nvt.yaml").write_text("extends: dgxa100-pod\ncontainer:\n  provides: [nvtabular]\n")
    profile = load_profile(str(tmp_path / "nvt.yaml"))
    request = JobRequest(kind="preprocess", dataset="criteo", preprocess_mode="single", nodes=1,
                         preprocess_engine="nvtabular", input="/data/raw", output="/data/out")
    _, [spec] = plan([request], profile)
    assert spec.env == {"DASK_TEMPORARY_DIRECTORY": "/raid/scratch"}
    [(_, text)] = render_plan([request], profile, run_dir=str(tmp_path / "run"))
    assert "export DASK_TEMPORARY_DIRECTORY=/raid/scratch" in text
    assert "DASK_TEMPORARY_DIRECTORY" in text.split("--container-env=")[1].split()[0]   # wins in the container
    _, [plain] = plan([request], load_profile("ci"))          # no scratch: dask's own default
    assert "DASK_TEMPORARY_DIRECTORY" not in plain.env
    out = subprocess.run([sys.executable, "-c", "from preproc.runtime.dask_cluster import spill_directory; "
                          "print(spill_directory())"], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, DASK_TEMPORARY_DIRECTORY=str(tmp_path / "scratch")))
    assert out.stdout.strip() == str(tmp_path / "scratch"), out.stderr
