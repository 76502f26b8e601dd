"""The job-id and sacct parsers the toolkit owns (issue 48, item 4): they were submitit's private
read_job_id / SlurmInfoWatcher.read_info, which pinned submitit to one release. Recorded outputs
of the real test cluster (tests/jobs/recorded/) and the forms Slurm's documentation gives."""
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import states
from jobs.backends.slurm import queries

pytestmark = pytest.mark.fast

RECORDED = Path(__file__).resolve().parent / "recorded"
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("job_id, tasks", [
    ("12", ["12"]), (" 12\n", ["12"]), ("12_3", ["12_3"]), ("12_007", ["12_7"]),
    ("12_[0-3]", ["12_0", "12_1", "12_2", "12_3"]), ("6_[1-3%1]", ["6_1", "6_2", "6_3"]),
    ("12_[1,4-5]", ["12_1", "12_4", "12_5"]), ("12_[7]", ["12_7"]), ("12_[2,5%4]", ["12_2", "12_5"]),
    ("12+0", ["12+0"]),                     # a heterogeneous job's component: kept as Slurm names it
])
def test_job_ids_as_slurm_prints_them(job_id, tasks):
    assert queries.expand_job_id(job_id) == tasks


def test_an_array_task_that_is_not_a_number_is_an_error():
    with pytest.raises(ValueError):
        queries.expand_job_id("12_x")


def test_sacct_rows_steps_ranges_and_odd_ids():
    text = ("JobID|State|ExitCode|NodeList\n"
            "40|COMPLETED|0:0|node1\n40.batch|COMPLETED|0:0|node1\n40.0|COMPLETED|0:0|node1\n"
            "41_[0-1,3%2]|PENDING|0:0|None assigned\n41_2|RUNNING|0:0|node2\n"
            "42|CANCELLED by 0|0:15|node3\n|FAILED|1:0|\n43_?|FAILED|1:0|node4\n")
    assert queries.parse_sacct(text) == {
        "40": states.COMPLETED, "41_0": states.PENDING, "41_1": states.PENDING, "41_3": states.PENDING,
        "41_2": states.RUNNING, "42": states.CANCELLED}
    assert queries.parse_sacct("JobID|State|ExitCode|NodeList\n") == {} == queries.parse_sacct("")


def test_recorded_sacct_and_squeue_name_every_array_task():
    found = queries.parse_sacct((RECORDED / "acct-sacct-states.txt").read_text())
    queued, _ = queries.parse_squeue((RECORDED / "acct-squeue-states.txt").read_text())
    arrays = {task.split("_")[0] for task in found if "_" in task}
    assert arrays and all(f"{a}_{i}" in found and f"{a}_{i}" in queued for a in arrays for i in range(4))


def test_the_slurm_backend_parses_without_submitit():
    """Status polls do not import submitit (only the local backend uses it, through its public API)."""
    code = ("import sys\nfrom jobs.backends.slurm import queries, poll\n"
            f"queries.parse_sacct(open({str(RECORDED / 'acct-sacct-states.txt')!r}).read())\n"
            f"queries.parse_squeue(open({str(RECORDED / 'acct-squeue-states.txt')!r}).read())\n"
            "print(sorted(m for m in sys.modules if m.startswith('submitit')))\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stderr + res.stdout
