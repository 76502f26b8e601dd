"""Golden files: the whole rendered sbatch text of the DGX A100 (one node, several nodes) and
DGX A100 pod (container) scripts, so that any change to rendering shows up as a diff.

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
import sys
from pathlib import Path

import pytest

from jobs.planning.request import JobRequest
from jobs.submit import render_plan

pytestmark = pytest.mark.fast

GOLDEN = Path(__file__).resolve().parent / "golden"
REPO = str(Path(__file__).resolve().parents[2])
UPDATE = os.environ.get("RECSYS_UPDATE_GOLDEN") == "1"

CASES = {
    "dgxa100-1node": (JobRequest(kind="train", model="dlrm", nodes=1), "dgxa100"),
    "dgxa100-2nodes": (JobRequest(kind="train", model="dlrm", nodes=2), "dgxa100"),
    "dgxa100-pod-4nodes": (JobRequest(kind="train", model="wide_deep", nodes=4), "dgxa100-pod"),
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
    request, profile = CASES[case]
    run_dir = str(tmp_path / "runs" / "golden-run")
    [(spec, text)] = render_plan([request], profile, run_dir=run_dir)
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
