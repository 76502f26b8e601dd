"""`recsys-submit tensorboard`, the study spec's `profile_steps` and the report's TensorBoard links
(jobs.runs.tensorboard, jobs.tensorboard_cli, jobs.study): naming every job or study point for
--logdir_spec, from run directories laid out as the engine writes them. No cluster: the fast tier."""
import shlex

import pytest

from jobs import cli
from jobs.runs import tensorboard as tb
from jobs.study.analysis import report as study_report, report_table
from jobs.study.running.record import PointRecord, PointStatus, StudyRecord, StudyStatus
from jobs.study.spec import StudyError, StudySpec, point_args

pytestmark = pytest.mark.fast


def _run_dir(path, jobs=("main-101",), ranks=(0,), traced=()):
    """A run directory as a finished job leaves it: jobs.json, and per job and rank an event file;
    a trace for the ranks in `traced`."""
    path.mkdir(parents=True)
    (path / "jobs.json").write_text("{}")
    for job in jobs:
        for rank in ranks:
            d = path / "logs" / "tensorboard" / job / f"rank{rank}"
            d.mkdir(parents=True)
            (d / "events.out.tfevents.1.host.1.0").write_bytes(b"")
            if rank in traced:
                capture = d / "plugins" / "profile" / "2026_11_27_10_00_00"
                capture.mkdir(parents=True)
                (capture / "node1.xplane.pb").write_bytes(b"")
    return path


def test_run_command_names_every_job_and_prints_the_tunnel(tmp_path, capsys, monkeypatch):
    run = _run_dir(tmp_path / "runs" / "train-dlrm-1", jobs=("main-7", "evaluate-8"))
    monkeypatch.setattr(tb.socket, "getfqdn", lambda: "login1.example.org")
    monkeypatch.setattr(tb.getpass, "getuser", lambda: "ada")
    assert cli.main(["tensorboard", "train-dlrm-1", "--runs-dir", str(tmp_path / "runs"), "--port", "6007"]) == 0
    out = capsys.readouterr().out.splitlines()
    argv = shlex.split(out[1])
    spec = f"evaluate-8:{run}/logs/tensorboard/evaluate-8,main-7:{run}/logs/tensorboard/main-7"
    assert argv == ["tensorboard", "--logdir_spec", spec, "--port", "6007", "--host", "localhost"]
    assert out[-1].startswith("ssh -N -L 6007:localhost:6007 ada@login1.example.org")
    assert not any("--logdir " in line for line in out)          # no trace: no Profile-tab command


@pytest.mark.parametrize("fqdn, hostname, shown", [
    ("login1.example.org", "login1", "login1.example.org"),
    ("localhost", "login1", "login1"),                # issue 48 item 9: was root@localhost
    ("localhost.localdomain", "login1", "login1"),
    ("localhost", "localhost", "LOGIN_NODE")])        # nothing known: a placeholder, never localhost
def test_the_tunnel_names_the_host_a_laptop_can_reach(fqdn, hostname, shown):
    assert tb.this_host(fqdn, hostname) == shown
    assert tb.tunnel_line(6006, user="root", host=tb.this_host(fqdn, hostname)).startswith(
        f"ssh -N -L 6006:localhost:6006 root@{shown}   # then open")


def test_study_command_names_points_by_id_from_their_latest_attempt(tmp_path, capsys):
    runs = tmp_path / "runs"
    old = _run_dir(runs / "p-old", jobs=("main-1",))
    new = _run_dir(runs / "p-new", jobs=("main-2",), ranks=(0, 1), traced=(1,))
    two = _run_dir(runs / "p-two", jobs=("main-3", "main-4"))
    study = runs / "study-s"
    study.mkdir()
    points = [PointRecord(id=pid, nodes=1, gpus_per_node=g, gpus=g, batch_per_gpu=64 // g, global_batch=64,
                          variant={}, variant_label="default", repeat=0, runs=[str(r) for r in attempts])
              for pid, g, attempts in (("g1-n1x1-r0", 1, [old, new]), ("g2-n1x2-r0", 2, [two]),
                                       ("g4-n1x4-r0", 4, []))]
    StudyRecord(name="s", study_dir=str(study), profile="ci", profile_path=None, scheduler="slurm",
                spec={"name": "s"}, created=0.0, points=points).save()
    assert cli.main(["tensorboard", "s", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert shlex.split(out[3]) == ["tensorboard", "--logdir", str(runs), "--port", "6006", "--host", "localhost"]
    argv = shlex.split(out[1])
    assert argv[2].split(",") == [f"g1-n1x1-r0:{new}/logs/tensorboard/main-2",
                                  f"g2-n1x2-r0/main-3:{two}/logs/tensorboard/main-3",
                                  f"g2-n1x2-r0/main-4:{two}/logs/tensorboard/main-4"]
    assert tb.traces(f"{new}/logs/tensorboard/main-2") == {
        1: [f"{new}/logs/tensorboard/main-2/rank1/plugins/profile/2026_11_27_10_00_00/node1.xplane.pb"]}


def test_nothing_to_show_and_bad_names_are_one_line(tmp_path, capsys):
    _run_dir(tmp_path / "runs" / "bare", jobs=())
    assert cli.main(["tensorboard", "bare", "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no event files or traces under" in err
    assert cli.main(["tensorboard", "nope", "--runs-dir", str(tmp_path / "runs")]) == 2
    assert "'nope' is not a run directory" in capsys.readouterr().err
    assert cli.main(["tensorboard", "bare", "--runs-dir", str(tmp_path / "runs"), "--port", "70000"]) == 2
    assert "--port 70000: not a TCP port" in capsys.readouterr().err
    with pytest.raises(Exception, match="cannot name '/a,b' as 'x'"):
        tb.logdir_spec([("x", "/a,b")])


def _spec(**extra):
    return StudySpec.from_dict({"model": "dlrm", "gpus": [1, 2], "warmup_steps": 5, "steps": 10, **extra})


def test_spec_profile_steps_reaches_every_point_and_is_off_by_default():
    assert "--profile-steps" not in point_args(_spec(), 512, {})
    assert "profile_steps" not in _spec().to_dict()            # an older study.yaml stays the same spec
    spec = _spec(profile_steps="8-9")
    args = point_args(spec, 512, {})
    assert args[args.index("--profile-steps") + 1] == "8-9"
    assert StudySpec.from_dict(spec.to_dict()).profile_steps == "8-9"


@pytest.mark.parametrize("value,needle", [
    ("9-8", "is not START-END"), (True, "is not START-END"), ("0-2", "is not START-END"),
    ("14-16", "a point runs 15 benchmark steps"),
])
def test_spec_bad_profile_steps(value, needle):
    with pytest.raises(StudyError, match="profile_steps") as err:
        _spec(profile_steps=value)
    assert needle in str(err.value)
    with pytest.raises(StudyError, match="--profile-steps is set by the study"):
        _spec(engine_args=["--profile-steps", "3-4"])


def test_report_links_events_traces_and_the_slowest_ranks_trace(tmp_path):
    run = _run_dir(tmp_path / "p", jobs=("main-5",), ranks=(0, 1), traced=(0, 1))
    untraced = _run_dir(tmp_path / "q", jobs=("main-6",))
    breakdown = {"version": 1, "steps": 2, "method": "m", "phases": ["compute"],
                 "mean": {"step_ms": 10.0, "compute_ms": 10.0},
                 "slowest_rank": {"rank": 1, "step_ms": 12.0, "compute_ms": 12.0}}
    points, statuses = [], []
    for pid, gpus, run_dir in (("g1-n1x1-r0", 1, untraced), ("g2-n1x2-r0", 2, run)):
        points.append(PointRecord(id=pid, nodes=1, gpus_per_node=gpus, gpus=gpus, batch_per_gpu=64 // gpus,
                                  global_batch=64, variant={}, variant_label="default", repeat=0, runs=[str(run_dir)]))
        summary = {"throughput_samples_per_s": 1000.0 * gpus, "world_size": gpus, "step_breakdown": breakdown}
        statuses.append(PointStatus(id=pid, state="done", job_state="COMPLETED", run_dir=str(run_dir), job_id="1",
                                    attempts=1, summary=summary))
    record = StudyRecord(name="t", study_dir=str(tmp_path), profile="ci", profile_path=None, scheduler="slurm",
                         spec={"name": "t", "model": "dlrm", "scaling": "strong", "warmup_steps": 2, "steps": 5},
                         created=0.0, points=points)
    status = StudyStatus(study_dir=str(tmp_path), points=statuses, counts={"done": 2}, done=True, calls=0,
                         elapsed_s=1.0)
    report = study_report.build(record, status)
    text = report_table.markdown(report)
    assert report["tensorboard"]["command"].startswith("tensorboard --logdir_spec g1-n1x1-r0:")
    assert [p["point"] for p in report["tensorboard"]["points"]] == ["g1-n1x1-r0", "g2-n1x2-r0"]
    assert "## TensorBoard" in text and report["tensorboard"]["command"] in text
    trace = f"{run}/logs/tensorboard/main-5/rank1/plugins/profile/2026_11_27_10_00_00/node1.xplane.pb"
    assert f"- `g2-n1x2-r0`: slowest rank 1 (TensorBoard run `g2-n1x2-r0/rank1`): trace `{trace}`, in the " \
        "Profile tab" in text
    assert report["tensorboard"]["profile_command"] == f"tensorboard --logdir {tmp_path} --port 6006 --host localhost"
    assert "- `g1-n1x1-r0`: slowest rank 1: no trace of it; spec `profile_steps" in text
