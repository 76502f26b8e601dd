"""Bad input: one-line error, non-zero exit, nothing submitted (no job, no run directory)."""

import os

import pytest

pytestmark = pytest.mark.slurm

CASES = [
    (["train", "--profile", "no-such-profile", "--model", "dlrm"], "unknown profile"),
    (["train", "--profile", "ci", "--model", "dlrm", "--nodes", "5"], "--nodes"),
    (["train", "--profile", "ci", "--model", "dlrm", "--gpus-per-node", "3"], "--gpus-per-node"),
    (["train", "--profile", "ci", "--model", "dlrm", "--nodes", "0"], "--nodes"),
    (["train", "--profile", "ci", "--model", "dlrm", "--nodes", "-1"], "--nodes"),
    (["train", "--profile", "ci", "--model", "dlrm", "--gpus-per-node", "0"], "--gpus-per-node"),
    (["benchmark", "--profile", "ci", "--model", "hello", "--array", "0"], "--array"),
    (["benchmark", "--profile", "ci", "--model", "hello", "--array", "4", "--parallelism", "-2"],
     "--array-parallelism"),
    (["train", "--profile", "ci", "--model", "bert"], "unknown model"),
    (["render", "finetune", "--profile", "ci", "--model", "dlrm"], "argument KIND: invalid choice: 'finetune'"),
    (["train", "--profile", "ci", "--model", "dlrm", "--time", "1:2:3:4"], "--time"),
    (["train", "--profile", "ci", "--model", "dlrm", "--time", "90min"], "--time"),
    (["train", "--profile", "ci", "--model", "dlrm", "--time", "0"], "--time"),
    (["train", "--profile", "ci", "--model", "dlrm", "--time", "-5"], "--time"),
    (["train", "--profile", "ci", "--model", "dlrm", "--nodes", "two"], "--nodes"),
    (["train", "--profile", "ci", "--model", "dlrm", "--after", "12;touch"], "--after"),
    (["preprocess", "--profile", "ci", "--dataset", "imagenet", "--input", "a", "--output", "b"],
     "unknown dataset"),
    (["preprocess", "--profile", "ci", "--dataset", "movielens", "--mode", "array", "--shards", "2",
      "--input", "a", "--output", "b"], "--mode array"),
    (["preprocess", "--profile", "ci", "--dataset", "criteo", "--output", "b"], "--input"),
    # engine flags the submission layer owns: refused, naming what to use instead
    (["train", "--profile", "ci", "--model", "dlrm", "--", "--synthetic", "--mode", "benchmark"],
     "engine argument --mode: set by recsys-submit"),
    (["benchmark", "--profile", "ci", "--model", "ncf", "--", "--mode=train"], "use the subcommand"),
    (["train", "--profile", "ci", "--model", "dlrm", "--", "--model", "ncf"], "engine argument --model"),
    (["preprocess", "--profile", "ci", "--dataset", "criteo", "--input", "a", "--output", "b", "--",
      "--output", "c"], "use recsys-submit preprocess --output"),
    (["train", "--profile", "ci", "--model", "dlrm", "--", "--synthetic", "--run-mode", "evaluate"],
     "engine argument --run-mode: set by recsys-submit"),
    # the engine's own parser and checks, at submission (issue 15 item 6)
    (["train", "--profile", "ci", "--model", "dlrm", "--nodes", "1"], "give --data-path DIR, --feature-spec FILE or --synthetic"),
    (["train", "--profile", "ci", "--model", "dlrm", "--", "--data-path", "/nonexistent/criteo"],
     "--data-path /nonexistent/criteo: no such directory"),
    (["train", "--profile", "ci", "--model", "dlrm", "--", "--synthetic", "--no-such-flag"],
     "unrecognized arguments: --no-such-flag"),
    # --after ids Slurm does not know (issue 15 item 8): one squeue call, refused
    (["benchmark", "--profile", "ci", "--model", "hello", "--after", "999999,999998"],
     "--after: slurm knows no job 999999, 999998"),
]


@pytest.mark.parametrize("args,needle", CASES, ids=[" ".join(c[0][:1] + c[0][3:]) for c in CASES])
def test_bad_input_is_one_line_and_submits_nothing(cli, slurm_cluster, args, needle):
    before = _queued(slurm_cluster)
    proc = cli(*args)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("recsys-submit: error:") and needle in lines[0], lines[0]
    assert proc.stdout == ""
    assert not os.path.exists(cli.runs_dir) or os.listdir(cli.runs_dir) == []
    assert _queued(slurm_cluster) <= before      # no new job appeared


def _queued(cluster):
    return set(cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split())


def test_malformed_profile_file(cli, slurm_cluster, tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("scheduler: slurm\nnode: [unclosed\n")
    proc = cli("train", "--profile", str(bad), "--model", "dlrm")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "broken.yaml" in proc.stderr
    assert not os.path.exists(cli.runs_dir)
