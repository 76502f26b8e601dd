"""Issue 15: the training engine's arguments are checked at submission with the engine's own
parser (recsys.train, no TensorFlow), `--run-mode` is the engine's name for its mode, and a
chain hands its evaluate job the train job's checkpoint dir (as rendered; the run itself is in
test_slurm_chain.py)."""

import json
import os
import subprocess
import sys

import pytest

from jobs.api import build_chain
from jobs.errors import RequestError
from jobs.planning.plan import plan
from jobs.profiles import load_profile

pytestmark = pytest.mark.fast

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NCF = dict(profile="ci", nodes=1, gpus_per_node=1, time="5")


def _dataset(root):
    """A directory the submit-side check accepts (it lists, never parses, the feature spec)."""
    os.makedirs(root, exist_ok=True)
    open(os.path.join(root, "feature_spec.yaml"), "w").close()
    return str(root)


def _commands(chain):
    _, specs = plan(chain, load_profile("ci"), submitting=True)
    return {spec.key: [str(a) for a in spec.command] for spec in specs}


def _flag(argv, flag):
    return argv[argv.index(flag) + 1]


def test_train_then_evaluate_hands_over_the_checkpoint_dir_through_the_run_dir(tmp_path):
    data = _dataset(tmp_path / "data")
    cmds = _commands(build_chain("train", "ncf", data_path=data, then_evaluate=True, engine_args=["--amp"], **NCF))
    assert _flag(cmds["train"], "--checkpoint-dir") == _flag(cmds["evaluate"], "--checkpoint-dir") \
        == "$RECSYS_RUN_DIR/checkpoints-train"
    assert _flag(cmds["train"], "--run-mode") == "train" and _flag(cmds["evaluate"], "--run-mode") == "evaluate"
    assert all(_flag(c, "--data-path") == data and "--amp" in c for c in cmds.values())
    # the user's own --checkpoint-dir (relative: made absolute, jobs run in their run dir) wins for both
    os.chdir(tmp_path)
    cmds = _commands(build_chain("train", "ncf", data_path=data, then_evaluate=True,
                                 engine_args=["--checkpoint-dir=ck"], **NCF))
    assert all(f"--checkpoint-dir={tmp_path / 'ck'}" in c for c in (cmds["train"], cmds["evaluate"]))
    assert "$RECSYS_RUN_DIR/checkpoints-train" not in " ".join(cmds["train"] + cmds["evaluate"])


def test_preprocess_output_and_checkpoint_of_a_chain_need_not_exist_yet(tmp_path):
    """What an earlier job of the chain writes is not looked for on the submit host."""
    out = str(tmp_path / "not-yet")
    cmds = _commands(build_chain("train", "ncf", preprocess_from=str(tmp_path / "raw"), data_path=out,
                                 then_evaluate=True, **NCF))
    assert sorted(cmds) == ["evaluate", "preprocess", "train"]
    assert ["--output", out] == cmds["preprocess"][cmds["preprocess"].index("--output"):][:2]
    with pytest.raises(RequestError, match=f"--data-path {out}: no such directory"):
        _commands(build_chain("train", "ncf", data_path=out, **NCF))


@pytest.mark.parametrize("engine_args,kind,needle", [
    ([], "train", "give --data-path DIR, --feature-spec FILE or --synthetic"),
    (["--data-path", "/nonexistent/criteo"], "train", "--data-path /nonexistent/criteo: no such directory"),
    (["--feature-spec", "/nonexistent/spec.yaml"], "benchmark", "--feature-spec /nonexistent/spec.yaml: no such file"),
    (["--synthetic", "--bogus"], "train", "engine arguments (after `--`): unrecognized arguments: --bogus"),
    (["--synthetic", "--batch-size", "x"], "train", "argument --batch-size: invalid int value: 'x'"),
    (["--synthetic"], "evaluate", "--run-mode evaluate needs --checkpoint-dir"),
    (["--synthetic", "--checkpoint-dir", "/nonexistent/ck"], "evaluate", "needs a checkpoint in --checkpoint-dir"),
    (["--synthetic", "--run-mode", "benchmark"], "train", "engine argument --run-mode: set by recsys-submit"),
    (["--synthetic", "--batch-size", "1025"], "benchmark", "--batch-size 1025 is not divisible by the 2 ranks"),
])
def test_engine_arguments_refused_before_anything_exists(tmp_path, engine_args, kind, needle):
    runs = tmp_path / "runs"
    env = dict(os.environ, RECSYS_RUNS_DIR=str(runs))
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", kind, "--profile", "local", "--model", "ncf",
                           "--gpus-per-node", "2", "--time", "5", "--", *engine_args],
                          cwd=REPO, env=env, text=True, capture_output=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("recsys-submit: error: ") and needle in lines[0], lines[0]
    assert proc.stdout == "" and not runs.exists()


def test_render_does_not_look_for_data_nor_load_the_engine(tmp_path):
    """A rendered script may be for another machine, and render stays a fast login-node command:
    it checks the engine's flags with the engine's parser (issue 48) but looks for no data and
    starts no framework."""
    chain = build_chain("train", "dlrm", engine_args=["--data-path", "/cluster/only/criteo"], **NCF)
    _, specs = plan(chain, load_profile("ci"))
    assert "/cluster/only/criteo" in specs[0].command
    code = ("import sys\nfrom jobs.cli import main\n"
            "main(['render', 'train', '--profile', 'ci', '--model', 'dlrm', '--', '--data-path', '/x'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'horovod', 'numpy', 'pyarrow', 'keras')), file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, text=True, capture_output=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr.strip() == "[]", proc.stderr


def test_the_check_imports_the_engine_parser_only(tmp_path):
    """jobs stays a login-node package: checking engine arguments loads recsys.train's parser and
    its pure-Python helpers, never TensorFlow, Horovod, NumPy or pyarrow."""
    data = _dataset(tmp_path / "data")
    code = ("import json, sys\n"
            "from jobs.api import build_chain\nfrom jobs.planning.plan import plan\nfrom jobs.profiles import load_profile\n"
            f"plan(build_chain('train', 'ncf', data_path={data!r}, then_evaluate=True, profile='ci', nodes=1, "
            "gpus_per_node=1), load_profile('ci'), submitting=True)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('recsys', 'tensorflow', 'horovod', 'numpy', 'pyarrow', 'pandas', 'pyspark', 'keras'))))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, text=True, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    # the configuration and the placement are pure Python (the placement's implementation names)
    assert loaded <= {"recsys", "recsys.train", "recsys.configuration", "recsys.configuration.flags",
                      "recsys.configuration.train_config", "recsys.configuration.checks",
                      "recsys.configuration.predictions", "recsys.errors", "recsys.runtime",
                      "recsys.runtime.distributed", "recsys.models", "recsys.models.defaults", "recsys.checkpoints",
                      "recsys.checkpoints.atomic", "recsys.placement", "recsys.placement.decision",
                      "recsys.placement.planner", "recsys.placement.tables"}, loaded
    assert "recsys.train" in loaded


def test_engine_mode_flag_is_run_mode_and_mode_is_a_deprecated_alias(capsys):
    from recsys.train import build_parser

    args = build_parser().parse_args(["--model", "ncf", "--run-mode", "benchmark"])
    assert args.mode == "benchmark" and capsys.readouterr().err == ""
    args = build_parser().parse_args(["--model", "ncf", "--mode", "evaluate"])
    assert args.mode == "evaluate"
    assert capsys.readouterr().err.splitlines() == [
        "recsys-train: warning: --mode is deprecated; use --run-mode evaluate"]
    help_text = build_parser().format_help()
    assert "--run-mode" in help_text and "--mode " not in help_text.replace("--run-mode", "")
