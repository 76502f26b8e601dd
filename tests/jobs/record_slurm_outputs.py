"""Record what the real Slurm commands print, for the fast parser tests (tests/jobs/test_slurm_parsers.py).

    .venv/bin/python tests/jobs/record_slurm_outputs.py          # rewrites tests/jobs/recorded/

Brings up the local test cluster (slurm/dev/local-cluster.sh) twice, without and with accounting
(slurmdbd), puts jobs into known states, and saves the output of every query the Slurm backend
makes (jobs.backends.slurm.queries and commands: the same argv) with its exit code and stderr.
The states each job must be in are written by this script from how it made the job, never from
the parsers under test:

- ok          `true`                            COMPLETED
- bad         `exit 3`                          FAILED
- never       afterok on bad                    PENDING, reason DependencyNeverSatisfied
- cancelled   `sleep 600`, then scancel         CANCELLED
- running     `sleep 600`                       RUNNING (comment recsys:<token>)
- array       `--array=0-3%1 sleep 600`         task 0 RUNNING, tasks 1-3 PENDING (throttled)

and, for the study's look at the shared study job name (queries.SQUEUE_NAMED), jobs of that name
(`--dependency=singleton`) from two users, with batch scripts where a study keeps them:

- mine        root, study-mine/points/...       RUNNING
- mine_next   root, study-later/points/...      PENDING, reason Dependency (the singleton)
- theirs      nobody, study-theirs/allocations/ RUNNING (the singleton is per user)
- theirs_held nobody, --hold                    PENDING, reason JobHeldUser
- other_name  root, another job name            not listed

Run it after a Slurm upgrade or a change to the queries, and review `git diff tests/jobs/recorded`.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from jobs.backends.slurm.commands import SQUEUE_TOKENS  # noqa: E402
from jobs.backends.slurm.queries import SACCT_IDS, SACCT_STATES, SQUEUE_IDS, SQUEUE_NAMED, SQUEUE_STATES  # noqa: E402
from jobs.study.running.run import SHARED_NAME  # noqa: E402

CLUSTER = REPO / "slurm" / "dev" / "local-cluster.sh"
OUT = REPO / "tests" / "jobs" / "recorded"
TOKEN = "0123456789abcdef"
UNKNOWN_ID = "999999"


class Cluster:
    def __init__(self, accounting):
        self.dir = Path(tempfile.mkdtemp(prefix="recsys-record-"))
        self.accounting = accounting
        args = ["bash", str(CLUSTER), "up", "--dir", str(self.dir)] + (["--accounting"] if accounting else [])
        proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise SystemExit(f"record: the local cluster did not start:\n{proc.stderr[-2000:]}")
        self.env = dict(os.environ, SLURM_CONF=str(self.dir / "etc" / "slurm.conf"))

    def run(self, args, check=True):
        proc = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise SystemExit(f"record: {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def sbatch(self, *args):
        out = self.run(["sbatch", "--parsable", "--ntasks=1", "--cpus-per-task=1", "--time=10",
                        "--output=/dev/null", *args]).stdout
        return out.strip().split(";")[0]

    def word(self, job_id):
        """Slurm's own state word of a job, read the plainest way (squeue %T, else scontrol)."""
        out = self.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).stdout.split()
        if out:
            return out[0]
        text = self.run(["scontrol", "-o", "show", "job", job_id], check=False).stdout
        return next((w.split("=", 1)[1] for w in text.split() if w.startswith("JobState=")), "")

    def wait_for(self, what, condition, timeout=120):
        deadline = time.monotonic() + timeout
        delay = 0.2
        while not condition():
            if time.monotonic() > deadline:
                raise SystemExit(f"record: {what} did not happen within {timeout} s")
            time.sleep(delay)
            delay = min(2.0, delay * 1.5)

    def down(self):
        subprocess.run(["bash", str(CLUSTER), "down", "--dir", str(self.dir)], capture_output=True, timeout=120)
        shutil.rmtree(self.dir, ignore_errors=True)


def snapshot(cluster):
    """Jobs in every state the parsers must read; returns {label: job id}."""
    jobs = {"ok": cluster.sbatch("--wrap", "true"), "bad": cluster.sbatch("--wrap", "exit 3")}
    jobs["never"] = cluster.sbatch(f"--dependency=afterok:{jobs['bad']}", "--wrap", "true")
    jobs["cancelled"] = cluster.sbatch("--wrap", "sleep 600")
    jobs["running"] = cluster.sbatch(f"--comment=recsys:{TOKEN}", "--wrap", "sleep 600")
    jobs["array"] = cluster.sbatch("--array=0-3%1", "--wrap", "sleep 600")
    cluster.run(["scancel", jobs["cancelled"]])

    def settled():
        reason = cluster.run(["squeue", "-h", "-j", jobs["never"], "-o", "%r"], check=False).stdout.strip()
        return (cluster.word(jobs["ok"]) == "COMPLETED" and cluster.word(jobs["bad"]) == "FAILED"
                and cluster.word(jobs["cancelled"]) == "CANCELLED" and cluster.word(jobs["running"]) == "RUNNING"
                and cluster.word(f"{jobs['array']}_0") == "RUNNING" and reason == "DependencyNeverSatisfied")

    cluster.wait_for("the snapshot states", settled)
    if cluster.accounting:      # sacct learns about jobs a few seconds after squeue
        def in_sacct():
            text = cluster.run(SACCT_IDS + ["-j", ",".join(jobs.values())], check=False).stdout
            finished = cluster.run(SACCT_STATES + ["-j", jobs["bad"]], check=False).stdout
            return all(j in text for j in jobs.values()) and "FAILED" in finished
        cluster.wait_for("sacct to know every job", in_sacct)
    return jobs


def record_shared_name(cluster, manifest):
    """Jobs of the shared study name from two users (root and nobody), and what squeue says of
    them (noacct-squeue-named.txt); the scripts lie where a study keeps its points' scripts."""
    os.chmod(cluster.dir, 0o755)    # the other user's job runs from the slurmd spool under it
    root = Path(tempfile.mkdtemp(prefix="recsys-record-runs-"))
    os.chmod(root, 0o755)

    def script(relative):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\nsleep 600\n")
        for parent in [path.parent, *path.parent.parents]:
            if parent == root.parent:
                break
            os.chmod(parent, 0o755)
        return str(path)

    named = ["--chdir=/tmp", f"--job-name={SHARED_NAME}", "--dependency=singleton"]
    jobs = {"mine": cluster.sbatch(*named, script("study-mine/points/g1-r0-1/main.sbatch"))}
    cluster.wait_for("the first study job to run", lambda: cluster.word(jobs["mine"]) == "RUNNING")
    jobs["mine_next"] = cluster.sbatch(*named, script("study-later/points/g1-r0-1/main.sbatch"))
    jobs["theirs"] = cluster.sbatch("--uid=nobody", *named, script("study-theirs/allocations/allocation-1/allocation.sbatch"))
    cluster.wait_for("the other user's study job to run", lambda: cluster.word(jobs["theirs"]) == "RUNNING")
    jobs["theirs_held"] = cluster.sbatch("--uid=nobody", "--hold", *named, script("study-theirs/points/g2-r0-1/main.sbatch"))
    jobs["other_name"] = cluster.sbatch("--chdir=/tmp", "--job-name=something-else", "--wrap", "sleep 600")

    def settled():
        reasons = cluster.run(["squeue", "-h", "-j", f"{jobs['mine_next']},{jobs['theirs_held']}", "-o", "%i %r"],
                              check=False).stdout
        return f"{jobs['mine_next']} Dependency" in reasons and f"{jobs['theirs_held']} JobHeldUser" in reasons

    cluster.wait_for("the pending reasons", settled)
    outputs = {}
    try:
        record(cluster, "noacct-squeue-named", SQUEUE_NAMED + [f"--name={SHARED_NAME}"], outputs)
    finally:
        cluster.run(["scancel", ",".join(jobs.values())], check=False)
        shutil.rmtree(root, ignore_errors=True)
    manifest["shared_name"] = {
        "jobs": jobs, "outputs": outputs, "runs_dir": str(root), "users": {"mine": "root", "theirs": "nobody"},
        "expect": {"mine": "RUNNING", "mine_next": "PENDING", "theirs": "RUNNING", "theirs_held": "PENDING"}}


def record(cluster, name, argv, outputs):
    proc = cluster.run(argv, check=False)
    (OUT / f"{name}.txt").write_text(proc.stdout)
    outputs[name] = {"argv": argv, "returncode": proc.returncode, "stderr": proc.stderr.strip()}


def record_cluster(accounting, manifest):
    cluster = Cluster(accounting)
    tag = "acct" if accounting else "noacct"
    outputs = {}
    try:
        jobs = snapshot(cluster)
        ids = ",".join(jobs.values())
        record(cluster, f"{tag}-squeue-states", SQUEUE_STATES + ["-j", ids], outputs)
        record(cluster, f"{tag}-squeue-ids", SQUEUE_IDS + ["-j", f"{ids},{UNKNOWN_ID}"], outputs)
        record(cluster, f"{tag}-squeue-ids-unknown", SQUEUE_IDS + ["-j", UNKNOWN_ID], outputs)
        record(cluster, f"{tag}-squeue-token", SQUEUE_TOKENS, outputs)
        record(cluster, f"{tag}-scontrol-job-completed", ["scontrol", "show", "job", jobs["ok"]], outputs)
        record(cluster, f"{tag}-scontrol-job-array-task", ["scontrol", "show", "job", f"{jobs['array']}_2"], outputs)
        record(cluster, f"{tag}-scontrol-config", ["scontrol", "show", "config"], outputs)
        # what scontrol says of a job it has no record of (never existed, or purged after MinJobAge)
        record(cluster, f"{tag}-scontrol-job-unknown", ["scontrol", "show", "job", UNKNOWN_ID], outputs)
        if accounting:
            record(cluster, "acct-sacct-states", SACCT_STATES + ["-j", ids], outputs)
            record(cluster, "acct-sacct-ids", SACCT_IDS + ["-j", f"{ids},{UNKNOWN_ID}"], outputs)
        else:
            record(cluster, "noacct-sacct-states", SACCT_STATES + ["-j", ids], outputs)
        cluster.run(["scancel", ids], check=False)
        if not accounting:
            record_shared_name(cluster, manifest)
    finally:
        cluster.down()
    manifest[tag] = {"jobs": jobs, "outputs": outputs}


def main():
    if shutil.which("slurmctld") is None:
        raise SystemExit("record: Slurm is not installed here (bash tests/install.sh)")
    OUT.mkdir(parents=True, exist_ok=True)
    manifest = {
        "version": 1,
        "slurm": subprocess.run(["slurmctld", "-V"], capture_output=True, text=True).stdout.strip(),
        "recorded": time.strftime("%Y-%m-%d"),
        "token": TOKEN,
        "unknown_id": UNKNOWN_ID,
        # the toolkit state each job is in, by how this script made it (jobs.states words)
        "expect": {"ok": "COMPLETED", "bad": "FAILED", "never": "PENDING", "cancelled": "CANCELLED",
                   "running": "RUNNING", "array_0": "RUNNING", "array_1": "PENDING", "array_2": "PENDING",
                   "array_3": "PENDING"},
    }
    for accounting in (False, True):
        record_cluster(accounting, manifest)
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"recorded {sum(len(m['outputs']) for k, m in manifest.items() if k in ('acct', 'noacct'))} "
          f"outputs of {manifest['slurm']} in {OUT}")


if __name__ == "__main__":
    main()
