"""Dependencies, chains, cancel, requeue and the USR2 -> requeue path on the local cluster."""

import json
import os

import pytest

from submit_helpers import hello_lines
from tests.waiting import wait_for

pytestmark = pytest.mark.slurm

HELLO = ["--profile", "ci", "--model", "hello", "--nodes", "1", "--gpus-per-node", "1", "--time", "5"]




def _reason(cluster, job_id):
    return cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"]).stdout.strip()


def test_afterok_second_starts_after_first_ends(cli, slurm_cluster):
    first_dir, first = cli.submit("benchmark", *HELLO, "--name", "first", "--", "--sleep", "2")
    first_id = first["jobs"][0]["job_id"]
    mixed = cli("benchmark", *HELLO, "--after", f"{first_id},999997")     # one unknown id: refused
    assert mixed.returncode == 2 and "--after: slurm knows no job 999997 (" in mixed.stderr, mixed.stderr
    second_dir, second = cli.submit("benchmark", *HELLO, "--name", "second", "--after", first_id)
    with open(os.path.join(second_dir, "main.sbatch")) as handle:
        assert f"#SBATCH --dependency=afterok:{first_id}" in handle.read()
    assert slurm_cluster.wait_job(second["jobs"][0]["job_id"]) == "COMPLETED"
    first_end = max(float(line.split("end=")[1]) for line in
                    open(_rank0(first_dir)).read().splitlines() if line.startswith("BYE"))
    second_start = hello_lines(second_dir)[0]["start"]
    assert second_start >= first_end


def _job_fields(cluster, job_id):
    words = cluster.run(["scontrol", "show", "job", job_id]).stdout.split()
    return dict(w.split("=", 1) for w in words if "=" in w)


def _requeued(cluster, job_id):
    """Requeued: Restarts went up and the job is back in the queue (Slurm holds a requeued job
    back a while, so it is normally PENDING; under load it may already run again)."""
    fields = _job_fields(cluster, job_id)
    return int(fields.get("Restarts", "0")) >= 1 and \
        fields.get("JobState") in ("PENDING", "REQUEUED", "CONFIGURING", "RUNNING")


def _rank0(run_dir):
    logs = os.path.join(run_dir, "logs")
    return os.path.join(logs, next(f for f in os.listdir(logs) if f.endswith(".rank0.log")))


def test_failed_first_job_never_runs_the_second_then_cancel(cli, slurm_cluster):
    first_dir, first = cli.submit("benchmark", *HELLO, "--name", "fails", "--", "--fail")
    first_id = first["jobs"][0]["job_id"]
    second_dir, second = cli.submit("benchmark", *HELLO, "--name", "never", "--after", first_id)
    second_id = second["jobs"][0]["job_id"]
    assert slurm_cluster.wait_job(first_id) == "FAILED"
    reason = wait_for(lambda: "DependencyNeverSatisfied" in _reason(slurm_cluster, second_id)
                       and _reason(slurm_cluster, second_id), timeout=90, what="dependency never satisfied")
    assert reason.startswith("PENDING")
    status = cli("status", second_dir, "--json")          # exit 1: it can never start (issue 47, item 11)
    assert json.loads(status.stdout)["jobs"][0]["state"] == "PENDING" and status.returncode == 1
    watched = cli("status", second_dir, "--watch", timeout=120)     # ends: the job can never start
    assert watched.returncode == 1 and "DependencyNeverSatisfied: a job it waits for" in watched.stdout
    cli("cancel", second_dir, check=True)
    assert slurm_cluster.wait_job(second_id) == "CANCELLED"
    assert hello_lines(second_dir) == []


def test_chain_in_one_command_train_then_evaluate(cli, slurm_cluster):
    run_dir, record = cli.submit("train", *HELLO, "--then-evaluate", "--", "--sleep", "1")
    keys = [j["key"] for j in record["jobs"]]
    assert keys == ["train", "evaluate"]
    train_id = record["jobs"][0]["job_id"]
    assert record["jobs"][1]["after_ok"] == [train_id]
    result = cli("status", run_dir, "--watch")
    assert result.returncode == 0, result.stdout + result.stderr
    kinds = [r["kind"] for r in sorted(hello_lines(run_dir), key=lambda r: r["start"])]
    assert kinds == ["train", "evaluate"]


def test_usr2_forwards_to_step_and_requeues(cli, slurm_cluster):
    run_dir, record = cli.submit("benchmark", *HELLO, "--", "--sleep", "60")
    job_id = record["jobs"][0]["job_id"]
    wait_for(lambda: hello_lines(run_dir), timeout=90, what="the step to start")
    slurm_cluster.run(["scancel", "--batch", "--signal=USR2", job_id], check=True)
    info = os.path.join(run_dir, "logs", f"main-{job_id}.info")
    logs = os.path.join(run_dir, "logs")

    def evidence():
        return {f: open(os.path.join(logs, f)).read() for f in os.listdir(logs)}

    try:
        wait_for(lambda: "requeue_requested=" in open(info).read(), timeout=90, what="the batch script to request a requeue")
        wait_for(lambda: _requeued(slurm_cluster, job_id), timeout=90, what="the job back in the queue with Restarts=1")
    except TimeoutError as exc:
        fields = _job_fields(slurm_cluster, job_id)
        raise AssertionError(f"{exc}: JobState={fields.get('JobState')} Reason={fields.get('Reason')} "
                             f"Restarts={fields.get('Restarts')} logs={evidence()}") from None
    log = open(_rank0(run_dir)).read()
    assert "checkpoint saved on signal" in log
    assert "requeue_failed=" not in open(info).read()
    cli("cancel", run_dir, check=True)
    assert slurm_cluster.wait_job(job_id) == "CANCELLED"


def test_requeue_command(cli, slurm_cluster):
    run_dir, record = cli.submit("benchmark", *HELLO, "--", "--sleep", "60")
    job_id = record["jobs"][0]["job_id"]
    wait_for(lambda: hello_lines(run_dir), timeout=90, what="the step to start")
    out = cli("requeue", run_dir, check=True)
    assert job_id in out.stdout
    wait_for(lambda: _requeued(slurm_cluster, job_id), timeout=90, what="the job back in the queue with Restarts=1")
    cli("cancel", run_dir, check=True)
    assert slurm_cluster.wait_job(job_id) == "CANCELLED"


@pytest.mark.spark
def test_preprocess_train_evaluate_chain_hands_over_data_and_checkpoint(cli, slurm_cluster, tmp_path):
    """Issue 15 item 1, the README's chain `train --preprocess-from RAW --data-path DIR
    --then-evaluate -- --amp` on real MovieLens-shaped data: preprocessing writes DIR, training
    reads it and checkpoints into the run dir, evaluation reads both and logs its metrics."""
    pytest.importorskip("pyspark")
    from jobs.runs import enginelog
    from preproc.movielens.generate import generate

    generate(str(tmp_path / "raw"), users=120, items=150, seed=3)
    data = tmp_path / "ml"
    run_dir, record = cli.submit("train", "--profile", "ci", "--model", "ncf", "--nodes", "1", "--gpus-per-node", "1",
                                 "--time", "10", "--preprocess-from", tmp_path / "raw", "--data-path", data,
                                 "--then-evaluate", "--", "--amp", "--epochs", "1", "--batch-size", "1024",
                                 "--valid-negative", "20")
    assert [j["key"] for j in record["jobs"]] == ["preprocess", "train", "evaluate"]
    result = cli("status", run_dir, "--watch", timeout=840)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (data / "feature_spec.yaml").is_file()
    checkpoints = os.path.join(run_dir, "checkpoints-train")
    assert any(name.startswith("ckpt-") for name in os.listdir(checkpoints))
    train = enginelog.summary(enginelog.job_logs(run_dir, "train"))
    evaluate = enginelog.summary(enginelog.job_logs(run_dir, "evaluate"))
    assert train["checkpoint"].startswith(checkpoints)
    assert evaluate["mode"] == "evaluate" and evaluate["step"] == train["eval_step"]
    for metric in ("hr_at_10", "ndcg_at_10"):    # the same checkpoint on the same data: the same metrics
        assert 0.0 < evaluate[metric] <= 1.0 and evaluate[metric] == pytest.approx(train[metric], abs=1e-4)
    assert "hr_at_10" in result.stdout.split("evaluate")[-1]


def test_status_names_the_failing_rank_and_its_engine_error(cli, slurm_cluster, tmp_path):
    """Issue 15 item 6: a job that passes the submit-side checks but fails in its ranks (here a
    feature spec that is not YAML): status shows the rank and its `recsys-train: error:` line,
    not srun's exit-code line."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "feature_spec.yaml").write_text("feature_spec: [unclosed\n")
    run_dir, record = cli.submit("train", "--profile", "ci", "--model", "ncf", "--nodes", "2",
                                 "--gpus-per-node", "1", "--time", "5", "--", "--data-path", data)
    assert slurm_cluster.wait_job(record["jobs"][0]["job_id"], timeout=300) == "FAILED"
    proc = cli("status", run_dir, "--json")
    assert proc.returncode == 1, proc.stderr          # a failed run (issue 47, item 11)
    status = json.loads(proc.stdout)
    reason = status["jobs"][0]["reason"]
    assert reason.startswith("FAILED: rank ") and "recsys-train: error: " in reason, reason
    assert "feature_spec.yaml" in reason and "srun" not in reason
    shown = cli("status", run_dir).stdout
    assert reason in shown
