"""`recsys-submit predict` (issue 45 section 2): the engine's `--run-mode predict`, set by the
subcommand as evaluate's is; `--predictions DIR` made absolute (jobs run in their run dir) and
checked at submission by the engine's own checks: new or empty, where the job can write it."""

import os
import subprocess
import sys

import pytest

from jobs.api import build_chain
from jobs.planning.plan import plan
from jobs.profiles import load_profile

pytestmark = pytest.mark.fast

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WD = dict(profile="ci", nodes=1, gpus_per_node=1, time="5")


def _inputs(root):
    """A dataset and a checkpoint directory the submit-side check accepts (it lists, never parses)."""
    os.makedirs(root / "data")
    (root / "data" / "feature_spec.yaml").write_text("")
    os.makedirs(root / "ck" / "ckpt-0000000010")
    (root / "ck" / "ckpt-0000000010" / "meta.json").write_text("{}")
    return str(root / "data"), str(root / "ck")


def test_predict_job_runs_the_engines_predict_mode_with_an_absolute_predictions_dir(tmp_path):
    data, ck = _inputs(tmp_path)
    os.chdir(tmp_path)
    chain = build_chain("predict", "wide_deep", data_path=data, engine_args=["--checkpoint-dir", ck,
                                                                             "--predictions", "scores"], **WD)
    _, specs = plan(chain, load_profile("ci"), submitting=True)
    (argv,) = [[str(a) for a in s.command] for s in specs]
    assert argv[argv.index("--run-mode") + 1] == "predict"
    assert argv[argv.index("--predictions") + 1] == str(tmp_path / "scores")


@pytest.mark.parametrize("engine_args, needle", [
    (["--checkpoint-dir", "{ck}"], "--run-mode predict needs --predictions DIR"),
    (["--predictions", "{tmp}/p"], "--run-mode predict needs --checkpoint-dir"),
    (["--checkpoint-dir", "{ck}", "--predictions", "{tmp}/data"], "--predictions {tmp}/data: not empty"),
    (["--checkpoint-dir", "{ck}", "--predictions", "{tmp}/data/feature_spec.yaml"], "exists and is not a directory"),
])
def test_predict_job_refused_before_anything_is_submitted(tmp_path, engine_args, needle):
    data, ck = _inputs(tmp_path)
    runs = tmp_path / "runs"
    env = dict(os.environ, RECSYS_RUNS_DIR=str(runs))
    args = [a.format(ck=ck, tmp=tmp_path) for a in engine_args]
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "predict", "--profile", "local", "--model", "wide_deep",
                           "--", "--data-path", data, *args], cwd=REPO, env=env, text=True, capture_output=True)
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and needle.format(tmp=tmp_path) in err[0], proc.stderr
    assert not runs.exists()
