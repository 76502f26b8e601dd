"""The combination matrix (issue 45): the engine's own choices, combined pairwise, each run a few
steps on CPU ranks.

Factors: the options of recsys.train's parser (model, embedding placement and implementation,
--amp, --restore, reader, run mode: a new choice value joins by itself) and the rank count (1, 2).
tests/recsys/combinations.py picks rows so that every pair of values is in at least one run that
exercises it; a run the engine refuses (distributed-embeddings needs its CUDA package, absent on
CPU ranks) exercises only its refused value. The data: small parquet datasets (both readers read them). The seeds are the matrix's first finds (Wide & Deep --amp model-parallel on 2 ranks: it
deadlocked; a restored run: its throughput timed the restore's first steps).

Each run asserts: exit 0, or the expected one-line refusal before the first step; a finite loss;
equal replicas (the summary's sampled and, where nothing is model-parallel, full digests); the
summary's throughput within a factor of its own step records after the warm-up; TensorBoard holds
each step once. A restored run (and every evaluate and predict run) first trains 2 steps into a checkpoint with
the same flags. Runs go side by side, a few ranks at a time.
"""
from __future__ import annotations

import glob
import math
import subprocess
import time

import pytest

from tests.recsys.combinations import all_pairs, pairwise, parser_factors, row_pairs
from tests.recsys.conftest import REPO, SMALL, base_env, mpirun_cmd, read_log, records, summary, train_cmd

FACTORS = ("model", "embedding_placement", "embedding_implementation", "amp", "restore", "reader", "mode")
RANKS = (1, 2)
STEPS, WARMUP, LOG_EVERY = 6, 2, 2       # the timed steps: the last STEPS - WARMUP of an attempt
RESTORE_AT = 2                           # a restored run's checkpoint step
THROUGHPUT_FACTOR = 5.0                  # the summary against its step records (the bug: 56x; timed
                                         # per call, the records per log interval: up to 3x apart here)
SLOTS = 3                                # ranks running at once (CI: 2 cores)
# Rows the engine refuses before the first step on CPU ranks, and the words of its one line.
DE = ("embedding_implementation", "distributed-embeddings")
ROWS = {"dlrm": {"train": 2048, "test": 512}, "wide_deep": {"train": 2048, "test": 512}, "ncf": {"train": 3000}}
EVAL_BATCH = {"dlrm": 512, "wide_deep": 512, "ncf": 8192}
SEEDS = ({"model": "wide_deep", "embedding_placement": "model_parallel", "embedding_implementation": "horovod-alltoall",
          "amp": True, "restore": False, "reader": "tfdata", "mode": "train", "ranks": 2},
         {"model": "dlrm", "embedding_placement": "auto", "embedding_implementation": "horovod-alltoall",
          "amp": False, "restore": True, "reader": "tfdata", "mode": "train", "ranks": 1})


NCF_PREDICT = (("model", "ncf"), ("mode", "predict"))


def refusal(row):
    """(the pairs a refused row exercises, words its one line holds), or None: the row runs."""
    if row.get("embedding_implementation") == DE[1]:
        # (evaluate, predict: no checkpoint could be written, and that is refused first; NCF's
        # predict is refused before the checkpoint is looked for)
        return {p for p in row_pairs(row) if DE in p}, ("distributed_embeddings", "distributed-embeddings",
                                                        "--run-mode evaluate needs a checkpoint",
                                                        "--run-mode predict needs a checkpoint",
                                                        "NCF's test mapping is a ranking set")
    if (row.get("model"), row.get("mode")) == ("ncf", "predict"):
        return {p for p in row_pairs(row) if all(v in p for v in NCF_PREDICT)}, ("NCF's test mapping is a ranking set",)
    return None


def covers(row):
    refused = refusal(row)
    return refused[0] if refused else row_pairs(row)


def factors():
    from recsys.train import build_parser
    out = parser_factors(build_parser(), FACTORS)
    out["ranks"] = list(RANKS)
    return out


def matrix():
    return pairwise(factors(), seeds=SEEDS, covers=covers)


@pytest.mark.fast
def test_matrix_is_pairwise_and_follows_the_parser():
    """Every pair of values is exercised by a row; a value added to the parser joins the matrix."""
    f = factors()
    rows = matrix()
    assert set().union(*(covers(r) for r in rows)) == all_pairs(f)
    assert set(f["mode"]) >= {"train", "evaluate", "benchmark", "inference"} and f["amp"] == [False, True]
    grown = dict(f, reader=f["reader"] + ["newreader"])
    more = pairwise(grown, seeds=SEEDS, covers=covers)
    assert set().union(*(covers(r) for r in more)) == all_pairs(grown)
    assert any(r["reader"] == "newreader" for r in more)
    assert len(rows) <= 2 * len(f["mode"]) * len(f["model"])      # far fewer than the product


def _args(row, data, out, mode, restore, max_steps):
    a = ["--model", row["model"], "--data-path", data, *SMALL[row["model"]], "--epochs", "1",
         "--eval-batch-size", EVAL_BATCH[row["model"]],
         "--max-steps", max_steps, "--log-every", LOG_EVERY, "--benchmark-warmup-steps", WARMUP,
         "--benchmark-steps", STEPS - WARMUP, "--run-mode", mode, "--reader", row["reader"],
         "--embedding-placement", row["embedding_placement"],
         "--embedding-implementation", row["embedding_implementation"],
         "--checkpoint-dir", out / "ckpt", "--tensorboard-dir", out / "tb"]
    a += ["--amp"] if row["amp"] else []
    a += ["--restore"] if restore else []
    a += ["--predictions", out / "predictions"] if mode == "predict" else []
    return a


class _Run:
    """One engine run of a row (its checkpointing pre-run first, when it needs one)."""

    def __init__(self, index, row, data, out):
        self.index, self.row, self.out = index, row, out
        self.refused = refusal(row)
        needs_ckpt = (row["restore"] or row["mode"] in ("evaluate", "predict")) and not self.refused
        steps = [_args(row, data, out, "train", False, RESTORE_AT)] if needs_ckpt else []
        steps.append(_args(row, data, out, row["mode"], row["restore"], STEPS) + ["--log-path", out / "log.jsonl"])
        self.steps, self.proc, self.results = steps, None, []

    def start(self):
        cmd = train_cmd(*self.steps[len(self.results)])
        cmd = cmd if self.row["ranks"] == 1 else mpirun_cmd(self.row["ranks"], cmd)
        self.proc = subprocess.Popen(cmd, env=base_env(), cwd=REPO, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)

    def poll(self):
        """True when every step of the run has ended (a failed pre-run ends it)."""
        if self.proc.poll() is None:
            return False
        stdout, stderr = self.proc.communicate()
        self.results.append(subprocess.CompletedProcess(self.proc.args, self.proc.returncode, stdout, stderr))
        if self.proc.returncode == 0 and len(self.results) < len(self.steps):
            self.start()
            return False
        return True


def _run_all(runs, timeout):
    todo, running, end = list(runs), [], time.monotonic() + timeout
    try:
        while todo or running:
            busy = sum(r.row["ranks"] for r in running)
            fits = [r for r in todo if busy + r.row["ranks"] <= SLOTS or not running]
            if fits:                     # the first that fits (a 1-rank run beside a 2-rank one)
                fits[0].start()
                todo.remove(fits[0])
                running.append(fits[0])
                continue
            running = [r for r in running if not r.poll()]
            assert time.monotonic() < end, f"the matrix ran past {timeout} s: {[r.row for r in running]}"
            time.sleep(0.2)     # polling the processes, not a synchronisation
    finally:
        for r in running:
            if r.proc.poll() is None:
                r.proc.kill()


def _step_events(run_dir):
    """{tag: [steps]} of every scalar event in a rank directory's event files (duplicates kept)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    out = {}
    for path in sorted(glob.glob(f"{run_dir}/events.out.tfevents.*")):
        for event in EventFileLoader(path).Load():
            for value in event.summary.value:
                out.setdefault(value.tag, []).append(event.step)
    return out


def _check(run):
    row, label = run.row, f"row {run.index} {run.row}"
    res = run.results[-1]
    errors = [line for line in res.stderr.splitlines() if line.startswith("recsys-train: error:")]
    if run.refused:
        assert res.returncode != 0 and len(set(errors)) == 1, f"{label}: {res.stderr[-2000:]}"
        assert any(w in errors[0] for w in run.refused[1]), f"{label}: {errors[0]}"
        assert not (run.out / "log.jsonl").exists() or not records(read_log(run.out / "log.jsonl"), "step")
        return
    assert len(run.results) == len(run.steps) and res.returncode == 0, f"{label}: {res.stderr[-3000:]}"
    s = summary(read_log(run.out / "log.jsonl"))
    log = read_log(run.out / "log.jsonl")
    for key in ("first_loss", "final_loss"):
        assert key not in s or math.isfinite(s[key]), f"{label}: {key} {s.get(key)}"
    if row["ranks"] > 1:
        assert len(set(s["replica_state_digests"])) == 1, label
    steps = records(log, "step")
    if row["mode"] == "train":
        first = s["first_timed_step"]
        assert first == (RESTORE_AT if row["restore"] else 0) + WARMUP + 1, f"{label}: {s}"
        timed = [r for r in steps if r["step"] - LOG_EVERY >= first - 1]
        assert timed, label
        records_rate = sum(LOG_EVERY for _ in timed) / sum(LOG_EVERY / r["samples_per_s"] for r in timed)
        ratio = s["throughput_samples_per_s"] / records_rate
        assert 1 / THROUGHPUT_FACTOR < ratio < THROUGHPUT_FACTOR, f"{label}: summary {s['throughput_samples_per_s']:.0f} " \
                                                                  f"samples/s, step records {records_rate:.0f}"
        events = _step_events(run.out / "tb" / "rank0")
        loss_steps = events.get("train/loss", [])
        assert sorted(loss_steps) == sorted(set(loss_steps)), f"{label}: TensorBoard steps {loss_steps}"
        assert set(loss_steps) >= {r["step"] for r in steps}, f"{label}: {loss_steps}"


@pytest.fixture(scope="module")
def parquet_data(tmp_path_factory):
    """{model: directory} of small parquet datasets (2 files a mapping: one per rank)."""
    from recsys.data import synthetic
    out = {}
    for model, rows in ROWS.items():
        out[model] = tmp_path_factory.mktemp(f"matrix-{model}")
        synthetic.generate(synthetic.default_spec(model, num_files=2, fmt="parquet"), str(out[model]), rows, seed=7)
    return out


def test_combination_matrix(parquet_data, tmp_path):
    rows = matrix()
    data = parquet_data
    runs = [_Run(i, r, data[r["model"]], tmp_path / f"row{i}") for i, r in enumerate(rows)]
    # the longest (2 ranks, a pre-run) first: the short ones fill the gaps at the end
    runs.sort(key=lambda r: (-r.row["ranks"] * len(r.steps) * (0 if r.refused else 1), r.index))
    t0 = time.monotonic()
    _run_all(runs, timeout=900)
    print(f"combination matrix: {len(rows)} rows, {sum(len(r.results) for r in runs)} engine runs, "
          f"{time.monotonic() - t0:.0f} s")
    failed = []
    for run in sorted(runs, key=lambda r: r.index):
        try:
            _check(run)
        except AssertionError as exc:
            failed.append(str(exc).splitlines()[0][:600])
    assert not failed, f"{len(failed)} of {len(rows)} rows failed:\n" + "\n".join(failed)
