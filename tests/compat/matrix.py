"""Runs recsys-train of this checkout under each given Python (one per TensorFlow stack) and
writes the result table (tests/compat/run.sh builds the venvs and calls this).

    python tests/compat/matrix.py --repo . --out DIR tf2.12=/path/venv/bin/python ...

Per stack that the engine accepts, for every model on the default synthetic data (one epoch):
``train``, ``evaluate`` of that checkpoint, ``train --amp``, ``train --xla``, and DLRM ``train``
with ``TF_USE_LEGACY_KERAS=1`` exported; then the first and the last accepted stack evaluate
each other's checkpoints. A stack the engine refuses must refuse every model and mode in one line,
exit 2. ``--horovod``: per stack the engine accepts, a 2-rank allreduce and 2-rank runs under mpirun
where the venv has Horovod, or a row with the error run.sh recorded where Horovod 0.28.1 did not build
or import (``horovod-build-failed.txt`` in the venv); ``--srun``: under srun too; ``--horovod-only``:
those rows alone, without the one-rank runs.
Writes DIR/results.json and DIR/results.md; exit 1 when any check failed. Standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

MODELS = ("dlrm", "wide_deep", "ncf")
METRIC = {"dlrm": "auc", "wide_deep": "map_at_12", "ncf": "hr_at_10"}
RUN_TIMEOUT_S = 900
# Open MPI on one host (the first five of tests/mpi_env.py's): TCP over loopback, root allowed.
MPI_ENV = {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# 2-rank runs where the venv has Horovod: (model, extra flags)
# what a stack the engine refuses is asked to do (each must be the same one-line refusal)
REFUSED_MODES = (("train", ()), ("evaluate", ("--run-mode", "evaluate")), ("train --amp", ("--amp",)),
                 ("train --xla", ("--xla",)))
HOROVOD_RUNS = (("ncf", ()), ("dlrm", ("--embedding-placement", "model_parallel")))
# Each rank: Horovod's own allreduce (sum) and the engine's wrappers (recsys.runtime.distributed), into its own
# file (mpirun interleaves the ranks' stdout). Both ranks must write [3.0, 2, [2.5, 7.0], [0, 1]].
ALLREDUCE = ("import json, sys\nfrom recsys.runtime import tfcompat\ntfcompat.prepare()\nimport numpy as np\n"
             "import tensorflow as tf\nimport horovod.tensorflow as hvd\nfrom recsys.runtime.distributed import Distributed\n"
             "d = Distributed(True)\ns = hvd.allreduce(tf.constant(1.0 + d.rank), op=hvd.Sum)\n"
             "m = d.allreduce_max(np.array([1.5 + d.rank, 7.0 - d.rank]))\n"
             "with open(f'{sys.argv[1]}/rank{d.rank}.json', 'w') as f:\n"
             "    json.dump([float(s), d.size, m.tolist(), d.allgather_object(d.rank)], f)\n")
ALLREDUCE_WANT = [3.0, 2, [2.5, 7.0], [0, 1]]
PROBE = ("import json, os; from recsys.runtime import tfcompat; f = tfcompat.detect(); "
         "d = tfcompat.decide(f, os.environ); "
         "print(json.dumps({'tensorflow': f.tensorflow, 'keras': f.keras, 'tf_keras': f.tf_keras, "
         "'error': d.error, 'uses': d.keras}))")


def env_for(repo, extra=None):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(repo), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONHASHSEED="0")
    env.update(extra or {})
    return env


def read_log(path):
    out = {}
    try:
        for line in Path(path).read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") in ("summary", "eval"):
                out[rec["type"]] = rec
    except (OSError, ValueError):
        pass
    return out


def launcher(ranks, srun, extra_env=None):
    """(argv prefix, environment additions) that start ``ranks`` ranks: srun, mpirun, or none for one."""
    mpirun = []
    if srun:        # (partition, SLURM_CONF) of a local Slurm cluster: srun --mpi=pmix starts the ranks
        extra_env = {**MPI_ENV, "SLURM_CONF": srun[1], **(extra_env or {})}
        mpirun = ["srun", "--mpi=pmix", "-N1", f"--ntasks={ranks}", f"--ntasks-per-node={ranks}",
                  "--cpus-per-task=1", "-p", srun[0], "--time=10"]
    elif ranks > 1:
        extra_env = {**MPI_ENV, **(extra_env or {})}
        mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), "--bind-to", "none"]
        for name in sorted(set(MPI_ENV) | {"PATH", "PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES"}):
            mpirun += ["-x", name]
    return mpirun, extra_env


def run_allreduce(python, repo, work, srun=None):
    """Horovod's allreduce and the engine's collectives on 2 ranks: (problems, seconds, stderr tail)."""
    work.mkdir(parents=True, exist_ok=True)
    mpirun, extra_env = launcher(2, srun)
    t0 = time.time()
    proc = subprocess.run([*mpirun, python, "-c", ALLREDUCE, str(work)], cwd=str(repo),
                          env=env_for(repo, extra_env), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    problems = [f"exit {proc.returncode}"] if proc.returncode else []
    for rank in (0, 1):
        try:
            got = json.loads((work / f"rank{rank}.json").read_text())
        except (OSError, ValueError):
            got = None
        if got != ALLREDUCE_WANT:
            problems.append(f"rank {rank} wrote {got}, not {ALLREDUCE_WANT}")
    return problems, round(time.time() - t0, 1), proc.stderr.strip().splitlines()[-3:] if problems else []


def horovod_missing(python):
    """Why the venv of ``python`` has no usable Horovod: the first errors run.sh recorded, or None."""
    failed = Path(python).parent.parent / "horovod-build-failed.txt"
    try:
        text = failed.read_text()
    except OSError:
        return None
    # paths inside the venv's TensorFlow headers and pip's build directory, shortened
    text = re.sub(r"\S*/site-packages/(tensorflow/include/)", r"\1", text)
    text = re.sub(r"\S*/pip-wheel-[^/\s]+/horovod_[^/\s]+/", "", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines or ["(no error lines recorded)"]


def run_train(python, repo, model, ck, log, flags=(), extra_env=None, ranks=1, srun=None):
    mpirun, extra_env = launcher(ranks, srun, extra_env)
    argv = [*mpirun, python, "-m", "recsys.train", "--model", model, "--synthetic", "--epochs", "1",
            "--checkpoint-dir", str(ck), "--log-path", str(log), "--log-every", "1000", *flags]
    t0 = time.time()
    proc = subprocess.run(argv, cwd=str(repo), env=env_for(repo, extra_env), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    return proc, round(time.time() - t0, 1)


def result_row(stack, probe, model, mode, proc, seconds, log, want=None):
    records = read_log(log)
    summary = records.get("summary", {})
    metric = METRIC[model]
    value = summary.get(metric)
    if value is None and "eval" in records:
        value = records["eval"].get(metric)
    prov = summary.get("provenance") or {}
    row = {"stack": stack, "model": model, "mode": mode, "exit": proc.returncode, "seconds": seconds,
           "metric": metric, "value": value, "digest": summary.get("weights_digest"),
           "tensorflow": prov.get("tensorflow"), "keras": prov.get("keras"),
           "stderr_tail": proc.stderr.strip().splitlines()[-3:] if proc.returncode else []}
    problems = []
    if proc.returncode != 0:
        problems.append(f"exit {proc.returncode}")
    elif value is None:
        problems.append("no metric in the log")
    if want is not None and value is not None and abs(value - want) > 1e-6:
        problems.append(f"{metric} {value} != {want} of the training run")
    if proc.returncode == 0 and prov.get("tensorflow") != probe["tensorflow"]:
        problems.append(f"provenance tensorflow {prov.get('tensorflow')} != {probe['tensorflow']}")
    expected_keras = probe["tf_keras"] if probe["uses"].startswith("tf-keras") else probe["keras"]
    if proc.returncode == 0 and prov.get("keras") != expected_keras:
        problems.append(f"provenance keras {prov.get('keras')} != {expected_keras}")
    row["problems"] = problems
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--horovod", action="store_true",
                        help="2-rank runs under mpirun on the stacks whose venv has Horovod (hold "
                             "/tmp/recsys-cluster.lock: tests/compat/run.sh does)")
    parser.add_argument("--srun", action="store_true",
                        help="also run the 2-rank runs under srun --mpi=pmix on a local Slurm cluster "
                             "(slurm/dev/local-cluster.sh, started and stopped here)")
    parser.add_argument("--horovod-only", action="store_true",
                        help="with --horovod / --srun: only the Horovod rows (no one-rank runs)")
    parser.add_argument("stacks", nargs="+", help="NAME=PYTHON")
    args = parser.parse_args(argv)
    args.horovod = args.horovod or args.srun or args.horovod_only
    slurm = start_slurm(args.repo) if args.srun else None
    try:
        return run_all(args, slurm)
    finally:
        if slurm:
            subprocess.run(["bash", str(args.repo / "slurm/dev/local-cluster.sh"), "down", "--dir", SLURM_DIR],
                           capture_output=True, timeout=300)


SLURM_DIR = "/tmp/recsys-compat-slurm"    # slurmstepd's sockets live under it: keep it short


def start_slurm(repo):
    """(partition, SLURM_CONF) of a freshly started local Slurm cluster."""
    subprocess.run(["bash", str(repo / "slurm/dev/local-cluster.sh"), "up", "--dir", SLURM_DIR], check=True,
                   capture_output=True, timeout=300)
    conf = f"{SLURM_DIR}/etc/slurm.conf"
    out = subprocess.run(["sinfo", "-h", "-o", "%P"], env={**os.environ, "SLURM_CONF": conf}, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return out.split()[0].rstrip("*"), conf


def run_all(args, slurm):
    repo = args.repo.resolve()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    t_all = time.time()
    rows, accepted, probes = [], [], {}

    def say(text):
        print(f"[matrix {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    for item in args.stacks:
        stack, python = item.split("=", 1)
        probe = json.loads(subprocess.run([python, "-c", PROBE], cwd=str(repo), env=env_for(repo), text=True,
                                          capture_output=True, check=True).stdout)
        probes[stack] = probe
        say(f"{stack}: tensorflow {probe['tensorflow']} keras {probe['keras']} tf-keras {probe['tf_keras']}: "
            f"{probe['error'] or 'tf.keras = ' + probe['uses']}")
        work = args.out / stack
        if probe["error"]:
            for model, (mode, flags) in ((m, f) for m in MODELS for f in REFUSED_MODES):
                ck = work / model / f"ck-{len(rows)}"
                if "evaluate" in flags:     # with a checkpoint to evaluate (else the flag check stops it first)
                    src = next((args.out / s / model / "ck" for s, _ in accepted), None)
                    if src is None:
                        continue
                    shutil.copytree(src, ck)
                proc, secs = run_train(python, repo, model, ck, work / model / "log.jsonl", flags)
                lines = proc.stderr.strip().splitlines()
                ok = proc.returncode == 2 and len(lines) == 1 and lines[0] == f"recsys-train: error: {probe['error']}"
                rows.append({"stack": stack, "model": model, "mode": mode, "refused": True, "exit": proc.returncode,
                             "seconds": secs, "metric": None, "value": None, "digest": None,
                             "tensorflow": probe["tensorflow"], "keras": probe["keras"], "stderr_tail": lines[-3:],
                             "problems": [] if ok else ["not a one-line refusal with exit 2"]})
                say(f"{stack} {model} {mode} refused: exit {proc.returncode} in {secs} s: {lines[-1] if lines else ''}")
            continue
        accepted.append((stack, python))
        for model in MODELS if not args.horovod_only else ():
            base = work / model
            runs = [("train", base / "ck", base / "train.jsonl", (), None, None),
                    ("evaluate", base / "ck", base / "evaluate.jsonl", ("--run-mode", "evaluate"), None, "train"),
                    ("train --amp", base / "ck-amp", base / "amp.jsonl", ("--amp",), None, None),
                    ("train --xla", base / "ck-xla", base / "xla.jsonl", ("--xla",), None, None)]
            if model == "dlrm":
                runs.append(("train, TF_USE_LEGACY_KERAS=1 set", base / "ck-legacy", base / "legacy.jsonl", (),
                             {"TF_USE_LEGACY_KERAS": "1"}, None))
            trained = {}
            for mode, ck, log, flags, extra, same_as in runs:
                proc, secs = run_train(python, repo, model, ck, log, flags, extra)
                row = result_row(stack, probe, model, mode, proc, secs, log,
                                 want=trained.get(same_as) if same_as else None)
                trained[mode] = row["value"]
                rows.append(row)
                say(f"{stack} {model} {mode}: exit {row['exit']} {row['metric']} {row['value']} "
                    f"digest {row['digest']} in {secs} s {'; '.join(row['problems'])}")
        has_hvd = args.horovod and subprocess.run([python, "-c", "import horovod.tensorflow"], cwd=str(repo), env=env_for(repo),
                                 capture_output=True).returncode == 0
        launchers = [("mpirun", None)] + ([("srun", slurm)] if slurm else [])
        if args.horovod and not has_hvd:
            why = horovod_missing(python) or ["no Horovod in this venv (tests/compat/run.sh --horovod builds it)"]
            rows.append({"stack": stack, "model": "horovod", "mode": "Horovod 0.28.1 build and import",
                         "exit": None, "seconds": 0, "metric": None, "value": None, "digest": None,
                         "tensorflow": probe["tensorflow"], "keras": probe["keras"], "stderr_tail": why,
                         "problems": [f"no Horovod: {why[0]}"]})
            say(f"{stack}: no Horovod: {' | '.join(why)}")
        for launcher_name, srun in launchers if has_hvd else ():
            problems, secs, tail = run_allreduce(python, repo, work / f"allreduce-{launcher_name}", srun)
            rows.append({"stack": stack, "model": "horovod", "mode": f"2 ranks ({launcher_name}) allreduce",
                         "exit": None, "seconds": secs, "metric": None, "value": None, "digest": None,
                         "tensorflow": probe["tensorflow"], "keras": probe["keras"], "stderr_tail": tail,
                         "problems": problems})
            say(f"{stack} allreduce ({launcher_name}) in {secs} s: {'; '.join(problems) or 'ok'}")
        for (via, srun), (model, flags) in ((l, r) for l in launchers for r in HOROVOD_RUNS) if has_hvd else ():
            base = work / model
            mode = " ".join((f"2 ranks ({via})",) + flags)
            log = base / f"2r-{via}.jsonl"
            proc, secs = run_train(python, repo, model, base / f"ck-2r-{via}", log, flags, ranks=2, srun=srun)
            row = result_row(stack, probe, model, mode, proc, secs, log)
            summary = read_log(log).get("summary", {})
            digests = summary.get("replica_weight_digests") or []
            # replicated: both ranks hold the same weights; model parallel: each its own tables
            same = len(set(digests)) == 1 or "model_parallel" in flags
            row["replica_digests"] = digests
            if proc.returncode == 0 and (summary.get("world_size") != 2 or len(digests) != 2 or not same):
                row["problems"].append(f"world size {summary.get('world_size')}, replica digests {digests}")
            rows.append(row)
            say(f"{stack} {model} {mode}: exit {row['exit']} {row['metric']} {row['value']} "
                f"digest {row['digest']} in {secs} s {'; '.join(row['problems'])}")
    # checkpoints written by one version, read by another (the oldest and the newest both ways)
    if len(accepted) >= 2 and not args.horovod_only:
        pairs = [(accepted[0], accepted[-1]), (accepted[-1], accepted[0])]
        for (writer, _), (reader, python) in pairs:
            for model in MODELS:
                src = args.out / writer / model / "ck"
                ck = args.out / "cross" / f"{writer}-to-{reader}" / model / "ck"
                shutil.copytree(src, ck)
                want = next((r["value"] for r in rows if r["stack"] == writer and r["model"] == model
                             and r["mode"] == "evaluate"), None)
                log = ck.parent / "evaluate.jsonl"
                proc, secs = run_train(python, repo, model, ck, log, ("--run-mode", "evaluate"))
                row = result_row(reader, probes[reader], model, f"evaluate {writer}'s checkpoint", proc, secs, log,
                                 want=want)
                rows.append(row)
                say(f"{reader} {model} evaluate {writer}'s checkpoint: exit {row['exit']} {row['metric']} "
                    f"{row['value']} in {secs} s {'; '.join(row['problems'])}")
    total = round(time.time() - t_all)
    (args.out / "results.json").write_text(json.dumps({"rows": rows, "probes": probes, "seconds": total}, indent=1))
    (args.out / "results.md").write_text(pivot(rows, probes) + "\n\n" + table(rows, probes)
                                         + f"\n\n{total} s for the runs.\n")
    print(pivot(rows, probes))
    failed = [r for r in rows if r["problems"]]
    say(f"{len(rows)} runs in {total} s, {len(failed)} with problems")
    return 1 if failed else 0


def pivot(rows, probes):
    """The docs table: a row per (model, mode), a column per stack; metric (first 8 digits of the weights digest)."""
    stacks = list(dict.fromkeys(r["stack"] for r in rows))
    keys = list(dict.fromkeys((r["model"], r["mode"]) for r in rows))
    cells = {(r["stack"], r["model"], r["mode"]): r for r in rows}
    head = []
    for stack in stacks:
        probe = probes[stack]
        keras = (f"tf-keras {probe['tf_keras']}" if (probe["uses"] or "").startswith("tf-keras")
                 else f"Keras {probe['keras']}")
        head.append(f"TF {probe['tensorflow']}, {keras}")
    lines = ["| model | mode | " + " | ".join(head) + " |", "|---|---|" + "---|" * len(stacks)]
    for model, mode in keys:
        out = []
        for stack in stacks:
            r = cells.get((stack, model, mode))
            if r is None:
                out.append("")
            elif r.get("refused"):
                out.append("refused, exit 2" if not r["problems"] else "; ".join(r["problems"]))
            elif r["problems"]:
                out.append("FAILED: " + "; ".join(r["problems"]))
            elif r["value"] is None:        # a check without a metric (the allreduce)
                out.append("ok")
            elif len(set(r.get("replica_digests") or ())) > 1:     # model parallel: each rank its own
                out.append(f"{r['metric']} {r['value']:.4f} (ranks: "
                           + " / ".join(d[:8] for d in r["replica_digests"]) + ")")
            else:
                out.append(f"{r['metric']} {r['value']:.4f} ({(r['digest'] or '-')[:8]})")
        lines.append(f"| {model} | {mode} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def table(rows, probes):
    lines = ["| stack | TensorFlow | tf.keras | model | mode | metric | weights digest | s | result |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        probe = probes[r["stack"]]
        keras = (f"tf-keras {probe['tf_keras']}" if (probe["uses"] or "").startswith("tf-keras")
                 else f"keras {probe['keras']}")
        value = f"{r['metric']} {r['value']:.4f}" if r["value"] is not None else "-"
        if r.get("refused"):
            result = "refused: exit 2, one line" if not r["problems"] else "; ".join(r["problems"])
        else:
            result = "ok" if not r["problems"] else "; ".join(r["problems"])
        lines.append(f"| {r['stack']} | {probe['tensorflow']} | {keras} | {r['model']} | {r['mode']} | {value} | "
                     f"{(r['digest'] or '-')[:10]} | {r['seconds']} | {result} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
