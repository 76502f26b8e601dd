"""``python -m recsys.place_tables`` on bad input, a plan that does not fit, and every rank's tables.

In-process calls of ``recsys.place_tables.main`` (it imports neither TensorFlow nor NumPy)."""
from __future__ import annotations

import re

import pytest

from recsys import place_tables as cli

pytestmark = pytest.mark.fast


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "0", "--cardinalities", "10,20"], "--gpus must be >= 1, got 0"),
    (["--cardinalities", "0,20"], "--cardinalities: table 0 has 0 rows, must be >= 1"),
    (["--cardinalities", "10,x"], "--cardinalities: 'x' (table 1) is not an integer"),
    (["--embedding-dim", "0", "--cardinalities", "10,20"], "--embedding-dim must be >= 1, got 0"),
    (["--gpu-memory-gb", "-1", "--cardinalities", "10,20"], "--gpu-memory-gb must be > 0, got -1"),
    (["--memory-fraction", "1.5", "--cardinalities", "10,20"], "--memory-fraction must be in (0, 1], got 1.5"),
    (["--column-slice-threshold", "0", "--cardinalities", "10"], "--column-slice-threshold must be >= 1"),
    (["--model", "ncf", "--cardinalities", "10"], "--model ncf takes --cardinalities USERS,ITEMS"),
    (["--model", "ncf", "--feature-spec", "/nonexistent/feature_spec.yaml"], "/nonexistent/feature_spec.yaml"),
    (["--cardinalities", "10", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--gpus", "2"], "one of the arguments --feature-spec --cardinalities is required"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("python -m recsys.place_tables: error: ") and message in err, err


@pytest.mark.parametrize("model, cards", [("ncf", "100,200"), ("wide_deep", "100,200,300"), ("dlrm", "5,6")])
def test_each_model_plans(capsys, model, cards):
    code, out, err = run(capsys, "--model", model, "--cardinalities", cards, "--gpus", 2, "--gpu-memory-gb", 1)
    assert code == 0 and err == "" and "fits" in out and "rank 1:" in out


def test_does_not_fit_says_how_many_gpus_would(capsys):
    # 4e9 x 128 fp32 rows plus SGD: 2048 GB of weights; 36 GB usable per GPU -> 57 ranks by memory, 64 by the plan
    argv = ["--cardinalities", "4000000000,39060,17295,7424", "--gpu-memory-gb", 40]
    code, out, err = run(capsys, *argv, "--gpus", 2)
    assert code == 1 and "DOES NOT FIT" in out and err.count("\n") == 1, err
    n = int(re.search(r"(\d+) GPUs would fit it \(--gpus \1\)", err).group(1))
    assert run(capsys, *argv, "--gpus", n)[0] == 0
    assert run(capsys, *argv, "--gpus", n - 1)[0] == 1
    # replicated: more GPUs never help, and the line says so
    code, _, err = run(capsys, "--model", "ncf", "--cardinalities", "4000000000,10", "--gpus", 2)
    assert code == 1 and "more GPUs do not help" in err and err.count("\n") == 1


def test_every_rank_lists_all_its_tables(capsys):
    cards = ",".join(["1000"] * 30)                    # 30 tables: more than any shortened listing kept
    code, out, _ = run(capsys, "--cardinalities", cards, "--gpus", 2, "--gpu-memory-gb", 1)
    assert code == 0 and "(+" not in out
    listed = [name for line in out.splitlines() if re.match(r"\s+rank \d+: ", line)
              for name in re.findall(r"cat_\d+", line)]
    assert sorted(listed) == sorted(f"cat_{i}" for i in range(30))
    code, out, _ = run(capsys, "--cardinalities", cards, "--gpus", 1, "--gpu-memory-gb", 1)
    assert code == 0 and all(f"cat_{i}" in out for i in range(30))


def test_gpus_that_fit_is_the_smallest():
    for need in (3, 5, 64, 100, 1000):
        assert cli.gpus_that_fit(lambda g: g >= need, 2) == need
    assert cli.gpus_that_fit(lambda g: False, 2) is None
