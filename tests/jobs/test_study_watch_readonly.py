"""Following and reading a study (issue 33): `study status --watch` waits for a capped `study run`
that is still submitting, and a user who may only read a study (another Unix user, a read-only
mount) can follow, report and compare it.

- Fast tier: a watch of a study whose points are missing keeps waiting while the study's lock is
  held (the real lock of `study run`), and, with nobody holding it, ends after the start grace
  with one line saying how many points are missing and who submits them.
- Cluster (one study of 3 one-rank NCF points, one at a time, shared by the module): `study run`
  in the background while `study status --watch` follows it; the watch ends only once every point
  is done, and the report has every point. Then, on that finished study, the CLI as `nobody`
  (setpriv; root ignores permissions) on files it can read but not write, and as root on a
  read-only bind mount (EROFS): status, watch, report and compare exit as they would, with one
  warning line saying where the fresh results could not be saved, and no traceback.
"""

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from jobs import cli
from jobs.study.running import record as study_record, run as study_run, watch as study_watch
from jobs.study.running.record import PointRecord, StudyRecord

from study_helpers import TINY_NCF, write_spec
from submit_helpers import REPO, Cli
from tests.waiting import wait_for

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _missing_study(root, n):
    """A study of `n` points none of which was submitted yet (what `study run` records first)."""
    study_dir = os.path.join(str(root), "study-missing")
    os.makedirs(os.path.join(study_dir, "points"))
    points = [PointRecord(id=f"g1-n1x1-r{r}", nodes=1, gpus_per_node=1, gpus=1, batch_per_gpu=512,
                          global_batch=512, variant={}, variant_label="default", repeat=r) for r in range(n)]
    StudyRecord(name="missing", study_dir=study_dir, profile="ci", profile_path=None, scheduler="slurm",
                spec={"name": "missing", "model": "ncf", "scaling": "strong"}, created=time.time(),
                points=points).save()
    return study_dir


@pytest.mark.fast
def test_watch_waits_while_a_study_run_holds_the_lock(tmp_path):
    study = _missing_study(tmp_path, 2)
    holding, release = threading.Event(), threading.Event()

    def submitter():        # the lock `study run` holds while it submits
        with study_run._submitting(study):
            holding.set()
            release.wait(60)

    thread = threading.Thread(target=submitter)
    thread.start()
    try:
        assert holding.wait(30)
        seen = []

        def on_poll(status):
            seen.append(status.submitting)
            if len(seen) == 3:
                release.set()

        status = study_watch.watch(study, on_poll=on_poll, first=0.01, ceiling=0.05, grace=0)
    finally:
        release.set()
        thread.join()
    assert seen[:3] == [True, True, True]           # three polls while held: still watching
    assert status.submitting is False and status.counts["missing"] == 2
    assert "submitting" not in study_record.progress_line(status)
    status.submitting = True
    assert "`study run` submitting" in study_record.progress_line(status)


@pytest.mark.fast
def test_missing_points_nobody_submits_end_the_watch_after_the_grace(tmp_path, monkeypatch, capsys):
    study = _missing_study(tmp_path, 2)
    monkeypatch.setenv("RECSYS_STUDY_START_GRACE_S", "0.5")
    monkeypatch.setenv("RECSYS_POLL_FIRST", "0.05")
    monkeypatch.setenv("RECSYS_POLL_MAX", "0.1")
    start = time.monotonic()
    rc = cli.main(["study", "status", study, "--watch"])
    took = time.monotonic() - start
    err = capsys.readouterr().err.splitlines()
    assert rc == 1 and took >= 0.5
    assert len(err) == 1, err
    assert err[0].startswith(f"recsys-submit: error: study {study}: 2 of 2 point(s) missing and no `study run` "
                             "is submitting them; `recsys-submit study run` with its spec"), err[0]


@pytest.mark.fast
def test_a_named_study_not_created_yet_is_waited_for(tmp_path, monkeypatch, capsys):
    """`study run NAME & study status NAME --watch`: the watch may look before the run has
    written study.json."""
    monkeypatch.setenv("RECSYS_STUDY_START_GRACE_S", "30")
    monkeypatch.setenv("RECSYS_POLL_FIRST", "0.05")
    real, calls = study_watch.find_study, []

    def find_study(study, runs_dir):
        calls.append(study)
        if len(calls) == 2:     # the run writes its study while the watch looks for it
            os.makedirs(os.path.join(runs_dir, "study-late"))
            StudyRecord(name="late", study_dir=os.path.join(runs_dir, "study-late"), profile="ci",
                        profile_path=None, scheduler="slurm", spec={}, created=time.time()).save()
        return real(study, runs_dir)

    monkeypatch.setattr(study_watch, "find_study", find_study)
    assert cli.main(["study", "status", "late", "--watch", "--runs-dir", str(tmp_path)]) == 0
    assert len(calls) == 2 and capsys.readouterr().err == ""
    monkeypatch.setenv("RECSYS_STUDY_START_GRACE_S", "0.3")
    start = time.monotonic()
    assert cli.main(["study", "status", "never", "--watch", "--runs-dir", str(tmp_path)]) == 2
    assert time.monotonic() - start >= 0.3
    assert capsys.readouterr().err.startswith("recsys-submit: error: study: 'never' is not a study directory")


# --- on the cluster ---------------------------------------------------------------------------

NAME = "ncf-watch"
SPEC = dict(name=NAME, model="ncf", batch_size=512, gpus=[1], repeats=3, warmup_steps=1, steps=2,
            time="00:10:00", engine_args=TINY_NCF)


@pytest.fixture(scope="module")
def shared_root():
    """A runs dir other users can reach (pytest's own tmp dirs are private to root)."""
    root = tempfile.mkdtemp(prefix="recsys-watch-")
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def followed(slurm_cluster, shared_root, tmp_path_factory):
    """`study run` (3 points, at most 1 queued) in the background, `study status --watch`
    started once it holds the study's lock, then the report."""
    pytest.importorskip("horovod.tensorflow")
    cli_ = Cli(slurm_cluster.env, os.path.join(shared_root, "runs"))
    spec = write_spec(tmp_path_factory.mktemp("spec") / "ncf.yaml", **SPEC)
    directory = os.path.join(cli_.runs_dir, f"study-{NAME}")
    start = time.monotonic()
    runner = subprocess.Popen([sys.executable, "-m", "jobs.cli", "study", "run", str(spec), "--profile", "ci",
                               "--max-concurrent", "1"], cwd=REPO, env=cli_.env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: (os.path.isfile(os.path.join(directory, "study.json"))
                          and study_watch.lock_held(directory)) or runner.poll() is not None,
                 timeout=120, what="`study run` to hold the study's lock")
        assert runner.poll() is None, runner.communicate()
        watch = cli_("study", "status", directory, "--watch", "--json", timeout=900)
        run_ended_first = runner.poll() is not None
        out, err = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    report = cli_("study", "report", directory, "--plot", timeout=300)
    return {"cli": cli_, "dir": directory, "watch": watch, "run": (runner.returncode, out, err),
            "run_ended_first": run_ended_first, "report": report, "seconds": time.monotonic() - start}


@pytest.mark.slurm
@pytest.mark.horovod
@pytest.mark.slow
def test_watch_follows_a_capped_run_to_its_end(followed):
    rc, out, err = followed["run"]
    assert rc == 0 and "submitted 3 of 3 point(s)" in out, out + err
    assert "waiting for a free slot" in err      # it was capped: one point at a time
    watch = followed["watch"]
    assert watch.returncode == 0, watch.stdout + watch.stderr
    status = json.loads(watch.stdout)
    assert status["counts"]["done"] == 3 and status["counts"]["missing"] == 0, status["counts"]
    assert followed["run_ended_first"]           # the watch outlived the submitting run
    report = followed["report"]
    assert report.returncode == 0, report.stdout + report.stderr
    with open(os.path.join(followed["dir"], "report", "scaling.json")) as handle:
        cell = json.load(handle)["rows"][0]["variants"]["default"]
    assert cell["n"] == 3 and len(cell["throughputs"]) == 3 and cell["throughput"] > 0


def _read_only_for_others(path):
    """chmod -R a+rX,go-w: everyone may read, only the owner (root) may write."""
    for top, dirs, files in os.walk(path):
        for name in [top] + [os.path.join(top, f) for f in files]:
            mode = os.lstat(name).st_mode
            if stat.S_ISLNK(mode):
                continue
            extra = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
            if stat.S_ISDIR(mode) or mode & stat.S_IXUSR:
                extra |= stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
            os.chmod(name, (stat.S_IMODE(mode) | extra) & ~(stat.S_IWGRP | stat.S_IWOTH))


@pytest.fixture(scope="module")
def nobody(followed, shared_root):
    """Run the CLI as `nobody` on the finished study (readable, not writable by it), with a
    home and an output directory it owns."""
    try:
        user = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    _read_only_for_others(followed["dir"])
    for path in (followed["cli"].runs_dir, followed["dir"]):
        os.chmod(path, 0o755)
    home = os.path.join(shared_root, "nobody-home")
    os.mkdir(home)
    os.chown(home, user.pw_uid, user.pw_gid)
    env = dict(followed["cli"].env, HOME=home, MPLCONFIGDIR=os.path.join(home, "mpl"))
    probe = subprocess.run(AS_NOBODY + [sys.executable, "-c", "import jobs.cli, matplotlib, scipy"], cwd=REPO,
                           env=env, capture_output=True, text=True)
    assert probe.returncode == 0, f"the interpreter must be usable by nobody: {probe.stderr}"

    def run(*args, timeout=300):
        return subprocess.run(AS_NOBODY + [sys.executable, "-m", "jobs.cli", *map(str, args)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=timeout)

    return {"run": run, "home": home, "dir": followed["dir"]}


def _one_warning(proc, path, why, others=()):
    """One line says the fresh results could not be saved; the rest of stderr is `others` (the
    report's own warnings, e.g. a noisy cell), and no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    unsaved = [line for line in lines if "fresh results not saved" in line]
    assert len(unsaved) == 1, proc.stderr
    assert unsaved[0].startswith(f"recsys-submit: warning: fresh results not saved (cannot write {path}: {why})"), \
        unsaved[0]
    assert [line for line in lines if line not in unsaved] == [f"recsys-submit: warning: {w}" for w in others]


@pytest.mark.slurm
@pytest.mark.horovod
@pytest.mark.slow
def test_a_user_who_may_only_read_the_study_follows_it(nobody):
    results = os.path.join(nobody["dir"], "results.json")
    before = open(results, "rb").read()
    status = nobody["run"]("study", "status", nobody["dir"])
    assert status.returncode == 0 and "3/3 done" in status.stdout, status.stdout + status.stderr
    _one_warning(status, results, "Permission denied")
    watch = nobody["run"]("study", "status", nobody["dir"], "--watch", "--json")   # the lock probe reads only
    assert watch.returncode == 0 and json.loads(watch.stdout)["counts"]["done"] == 3, watch.stderr
    _one_warning(watch, results, "Permission denied")
    assert open(results, "rb").read() == before


@pytest.mark.slurm
@pytest.mark.horovod
@pytest.mark.slow
def test_a_user_who_may_only_read_the_study_reports_and_compares_it_elsewhere(nobody):
    results = os.path.join(nobody["dir"], "results.json")
    out = os.path.join(nobody["home"], "report")
    report = nobody["run"]("study", "report", nobody["dir"], "--out", out, "--plot")
    assert report.returncode == 0, report.stdout + report.stderr
    written = json.load(open(os.path.join(out, "scaling.json")))
    _one_warning(report, results, "Permission denied", written["warnings"])
    assert open(os.path.join(out, "scaling.png"), "rb").read(8) == PNG_MAGIC
    assert written["rows"][0]["variants"]["default"]["n"] == 3
    out = os.path.join(nobody["home"], "compare")
    compare = nobody["run"]("study", "compare", nobody["dir"], nobody["dir"], "--out", out, "--plot")
    assert compare.returncode == 0, compare.stdout + compare.stderr
    written = json.load(open(os.path.join(out, "compare.json")))
    _one_warning(compare, results, "Permission denied", written["warnings"])  # two studies polled: one line
    assert sorted(os.listdir(out)) == ["compare.csv", "compare.json", "compare.md", "compare.png"]
    # the default output, inside the study: one line, exit 1, nothing half-written
    inside = nobody["run"]("study", "report", nobody["dir"], "--no-plot")
    assert inside.returncode == 1 and "Traceback" not in inside.stderr, inside.stderr
    assert inside.stderr.splitlines()[-1].startswith(
        f"recsys-submit: error: cannot write {os.path.join(nobody['dir'], 'report')}/"), inside.stderr
    assert not [f for f in os.listdir(os.path.join(nobody["dir"], "report")) if ".tmp." in f]


@pytest.mark.slurm
@pytest.mark.horovod
@pytest.mark.slow
def test_a_read_only_mount_of_the_study_is_read_without_a_traceback(followed):
    """Root on a read-only bind mount gets EROFS. One point's status.json is removed first, so
    the poll learns its state afresh and cannot keep it either: still one line."""
    directory = followed["dir"]
    point = json.load(open(os.path.join(directory, "study.json")))["points"][0]["runs"][-1]
    os.remove(os.path.join(point, "status.json"))
    mounted = subprocess.run(["mount", "--bind", directory, directory], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount here (needs root): {mounted.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", directory], check=True)
        status = followed["cli"]("study", "status", directory)
        assert status.returncode == 0 and "3/3 done" in status.stdout, status.stdout + status.stderr
        lines = status.stderr.splitlines()
        assert len(lines) == 1 and "Traceback" not in status.stderr, status.stderr
        assert lines[0].startswith("recsys-submit: warning: fresh results not saved (cannot write ")
        assert "Read-only file system" in lines[0]
        assert not os.path.exists(os.path.join(point, "status.json"))
    finally:
        subprocess.run(["umount", directory], check=True)
