"""The test cluster with MariaDB + slurmdbd: finished jobs are visible to sacct."""
import pytest

pytestmark = pytest.mark.slurm


def test_sacct_records_finished_job(slurm_cluster_acct):
    c = slurm_cluster_acct
    jobid = c.run(["sbatch", "--parsable", "-N1", "--output=/dev/null", "--wrap", "true"], check=True).stdout.strip()
    assert c.wait_job(jobid) == "COMPLETED"
    # slurmdbd receives the record asynchronously: poll for it with a timeout.
    import time
    deadline = time.monotonic() + 30
    while True:
        out = c.run(["sacct", "-n", "-X", "-P", "-j", jobid, "-o", "JobID,State"]).stdout.strip()
        if out == f"{jobid}|COMPLETED" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert out == f"{jobid}|COMPLETED"
