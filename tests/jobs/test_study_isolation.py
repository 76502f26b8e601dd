"""Studies on shared nodes isolated across users, without a cluster: Slurm's singleton orders only
one user's jobs, so `study run` looks at the queue of the shared study job name (every user's,
one squeue call, fed here the output recorded from the real test cluster with jobs of two
users: tests/jobs/record_slurm_outputs.py) and refuses, before anything exists, while another
user's study job is queued or running, unless --overlap-other-users; this user's other studies'
jobs are said, a stuck one as stuck."""

import json
from pathlib import Path

import pytest

from jobs.backends.base import QueuedJob
from jobs.backends.slurm import queries
from jobs.backends.slurm.backend import SlurmBackend
from jobs.errors import SlurmCommandError
from jobs.profiles import load_profile
from jobs.study.running import run
from jobs.study.spec import StudySpec

pytestmark = pytest.mark.fast

RECORDED = Path(__file__).resolve().parent / "recorded"
SHARED = json.loads((RECORDED / "manifest.json").read_text())["shared_name"]
QUEUE = queries.parse_named((RECORDED / "noacct-squeue-named.txt").read_text())
JOBS = SHARED["jobs"]
MINE = f"{SHARED['runs_dir']}/study-mine"       # the study whose `run` looks (its own job is left to it)


class Queue(SlurmBackend):
    """The Slurm backend with the recorded queue and no controller."""

    jobs = QUEUE

    def queued_named(self, name):
        assert name == run.SHARED_NAME
        if isinstance(self.jobs, Exception):
            raise self.jobs
        return self.jobs

    def accounting(self):
        return False


def test_another_users_study_job_refuses_in_one_line_naming_it():
    said = []
    with pytest.raises(run.StudyError) as info:
        run.check_shared_queue(Queue(load_profile("ci")), MINE, log=said.append, me="root")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"study: job {JOBS['theirs']} of user nobody (study-theirs, RUNNING) (and 1 more) "
                              "shares these nodes")
    assert "--overlap-other-users" in message and "nothing submitted" in message
    # this user's other study runs first: said; this study's own job: left to the study
    assert said == [f"job {JOBS['mine_next']} yours (study-later, PENDING: Dependency) runs before this study's "
                    f"points (one {run.SHARED_NAME} job of a user at a time)"]


def test_overlap_other_users_goes_on_and_says_each_job():
    said = []
    jobs = run.check_shared_queue(Queue(load_profile("ci")), MINE, overlap=True, log=said.append, me="root")
    assert len(jobs) == 4
    beside = [line for line in said if "may run beside" in line]
    assert beside == [f"job {JOBS['theirs']} of user nobody (study-theirs, RUNNING) may run beside this study's "
                      "points (--overlap-other-users)",
                      f"job {JOBS['theirs_held']} of user nobody (study-theirs, PENDING: JobHeldUser) may run beside "
                      "this study's points (--overlap-other-users)"]


def test_a_stuck_job_of_this_users_other_study_is_said_to_block_it():
    backend = Queue(load_profile("ci"))
    backend.jobs = [QueuedJob("7", "root", "PENDING", "JobHeldUser", "/r/study-old/points/p/main.sbatch"),
                    QueuedJob("8", "root", "PENDING", "", "")]
    said = []
    run.check_shared_queue(backend, "/r/study-new", log=said.append, me="root")
    assert said[0].startswith("job 7 yours (study-old, PENDING: JobHeldUser) cannot start as it is")
    assert "`scontrol release 7`" in said[0] and "`scancel 7`" in said[0]
    assert said[1].startswith("job 8 yours (not a study's job, PENDING) runs before")


def test_a_queue_that_cannot_be_read_is_not_known_and_refuses_nothing():
    backend = Queue(load_profile("ci"))
    backend.jobs = SlurmCommandError("squeue: Unable to contact slurm controller")
    said = []
    assert run.check_shared_queue(backend, MINE, log=said.append, me="root") == []
    assert said == [f"cannot tell whether other studies' jobs ({run.SHARED_NAME}) are queued: squeue: Unable to "
                    "contact slurm controller"]


def test_study_run_refuses_before_anything_exists(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "backend_for", Queue)
    monkeypatch.setattr(run, "_user", lambda: "root")
    spec = StudySpec.from_dict(dict(name="iso", model="ncf", batch_size=512, steps=2, warmup_steps=1, gpus=[1]))
    runs = tmp_path / "runs"
    with pytest.raises(run.StudyError, match=r"of user nobody .* --overlap-other-users"):
        run.run(spec, "ci", runs_dir=str(runs), log=lambda line: None)
    assert not runs.exists()
