"""A shared runs directory trusts nobody else's files, and a file system without flock is one line
(issue 43, items 1, 2, 4 and the full disk at the study lock of item 7). No cluster.

- As a second Unix user (`nobody` through setpriv; the suite runs as root, who ignores
  permissions, so the owner's refusals must come from the toolkit's own checks) in a 1777 directory
  under /tmp: a study directory made first by that user, with its run.lock a link to a file of the
  owner's, is refused by the owner's `study run` in one line naming the owner and mode, and the
  file is untouched.
- The owner's own study: a planted lock link is never followed; a frozen code copy changed after
  it was frozen is refused by `study run` in one line naming the file, before anything is
  submitted; the frozen profile (it holds the profile's env values) is 0600 (0640 with the
  profile's runs_group); the studies index is no more readable than the most private study it
  lists; with runs_group, a umask of 077 still gives the group read access.
- flock failing as on Lustre mounted noflock (ENOSYS), NFS without lockd (ENOLCK) and others
  (EOPNOTSUPP): the study run lock, a run's submit lock and the history's lock each give one line
  naming the directory; a full disk at the study lock's write is one line.
"""

import errno
import fcntl
import grp
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import warnings

import pytest

from jobs.errors import ResultsNotSaved, StorageError
from jobs.profiles import load_profile
from jobs.runs import atomic, rundir
from jobs.study.analysis import history
from jobs.study.running import frozen
from jobs.study.running import run as study_run
from jobs.study.running import watch as study_watch
from jobs.study.spec import load_spec

from test_study_compare import BASE, make_study
from tests.tmpfs import fill, small_tmpfs

pytestmark = pytest.mark.fast

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
GROUP = "daemon"        # a group root may give a directory to (runs_group)
SPEC = ("name: shared\nmodel: ncf\nbatch_size: 512\ngpus: [1]\nrepeats: 1\nwarmup_steps: 1\nsteps: 2\n"
        "time: '00:05:00'\nengine_args: ['--factors', '4', '--layers', '16,8,4']\n")


def _cli(*args, runs_dir):
    """`recsys-submit` as root, with Slurm out of reach (nothing here may get as far as Slurm)."""
    env = dict(os.environ, RECSYS_RUNS_DIR=str(runs_dir), SLURM_CONF="/nonexistent/slurm.conf")
    return subprocess.run([sys.executable, "-m", "jobs.cli", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def shared():
    """A 1777 directory under /tmp (pytest's own tmp dirs are private to root), and a way to run a
    command there as `nobody`."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    root = tempfile.mkdtemp(prefix="recsys-shared-")
    os.chmod(root, 0o1777)

    def as_nobody(script):
        proc = subprocess.run(AS_NOBODY + ["sh", "-ec", script], cwd=root, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    yield root, as_nobody
    shutil.rmtree(root, ignore_errors=True)


def _one_line(text):
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def test_another_users_study_dir_with_a_lock_link_is_refused_and_the_target_untouched(shared):
    root, as_nobody = shared
    victim = os.path.join(root, "precious.txt")
    with open(victim, "w") as handle:
        handle.write("the owner's data\n")
    spec = os.path.join(root, "spec.yaml")
    with open(spec, "w") as handle:
        handle.write(SPEC)
    # the other user takes the study's predictable name first, with a lock that is a link
    as_nobody(f"mkdir -m 0755 study-shared && ln -s {victim} study-shared/run.lock")
    proc = _cli("study", "run", spec, "--profile", "ci", "--runs-dir", root, runs_dir=root)
    line = _one_line(proc.stderr)
    assert proc.returncode != 0
    assert os.path.join(root, "study-shared") in line and "belongs to another user" in line
    assert "owner nobody, mode drwxr-xr-x 0755" in line, line
    with open(victim) as handle:
        assert handle.read() == "the owner's data\n"
    assert sorted(os.listdir(os.path.join(root, "study-shared"))) == ["run.lock"]     # nothing made in it


def test_a_planted_lock_link_in_the_owners_study_is_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    study = tmp_path / "study-x"
    rundir.make_private_dir(str(study))
    (study / "run.lock").symlink_to(victim)
    with pytest.raises(StorageError) as caught:
        with study_run._submitting(str(study)):
            pass
    assert "symbolic link" in str(caught.value) and "\n" not in str(caught.value)
    assert victim.read_text() == "precious\n"


def test_a_study_dir_the_group_or_others_may_write_is_refused(tmp_path):
    study = tmp_path / "study-x"
    rundir.make_private_dir(str(study))
    for mode, who in ((0o770, "its group"), (0o757, "others")):
        os.chmod(study, mode)
        with pytest.raises(StorageError, match=f"may be written by {who} .*{mode:04o}"):
            with study_run._submitting(str(study)):
                pass
    os.chmod(study, 0o700)
    with study_run._submitting(str(study)):     # the owner's alone: taken
        assert study_watch.lock_held(str(study))


def test_a_changed_frozen_code_copy_is_refused_naming_the_file(tmp_path):
    runs = tmp_path / "runs"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC)
    spec, profile = load_spec(str(spec_path)), load_profile("ci")
    study_dir = str(runs / "study-shared")
    with study_run._submitting(study_dir):
        record, _ = study_run.open_study(spec, profile, study_dir)
        study_run._frozen_code(record, False, lambda m: None, profile)
        record.save()
    engine = os.path.join(record.code["dir"], "recsys", "__init__.py")
    with open(engine, "a") as handle:       # the copy swapped after it was frozen
        handle.write("import os; os.system('id')\n")
    proc = _cli("study", "run", spec_path, "--profile", "ci", "--runs-dir", runs, runs_dir=runs)
    line = _one_line(proc.stderr)
    assert proc.returncode == 1 and engine in line and "differs from the copy the study recorded" in line, line
    assert os.listdir(os.path.join(study_dir, "points")) == []        # nothing submitted


def test_the_frozen_profile_is_as_private_as_the_run_directory(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("extends: ci\nenv:\n  RECSYS_SECRET: s3cret\n")
    copy = frozen.freeze_profile(str(tmp_path / "study"), load_profile(str(site)))
    path = tmp_path / "study" / copy["file"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    site.write_text(f"extends: ci\ndefaults:\n  runs_group: {GROUP}\nenv:\n  RECSYS_SECRET: s3cret\n")
    copy = frozen.freeze_profile(str(tmp_path / "grouped"), load_profile(str(site)))
    assert stat.S_IMODE(os.stat(tmp_path / "grouped" / copy["file"]).st_mode) == 0o640


def _index_mode(runs):
    info = os.stat(os.path.join(runs, history.INDEX))
    return stat.S_IMODE(info.st_mode), info.st_gid


def test_the_index_is_no_more_readable_than_its_most_private_study(tmp_path, capsys):
    from jobs import cli

    gid = grp.getgrnam(GROUP).gr_gid
    runs = tmp_path / "runs"
    grouped = make_study(runs, "grouped", BASE)
    os.chown(grouped, -1, gid)
    os.chmod(grouped, 0o2750)
    assert cli.main(["study", "report", grouped, "--no-plot"]) == 0
    assert _index_mode(runs) == (0o640, gid)        # its one study: readable by its group
    private = make_study(runs, "private", BASE)
    os.chmod(private, 0o700)
    assert cli.main(["study", "report", private, "--no-plot"]) == 0
    assert _index_mode(runs)[0] == 0o600            # a private study listed: private
    capsys.readouterr()


def test_runs_group_gives_the_group_read_access_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        run = rundir.new_run_dir(str(tmp_path / "runs"), "train-ncf", group=GROUP)
        atomic.write_json(os.path.join(run, "jobs.json"), {"a": 1})
        logs = os.stat(os.path.join(run, "logs"))
        assert stat.S_IMODE(logs.st_mode) & 0o050 == 0o050 and logs.st_gid == grp.getgrnam(GROUP).gr_gid
        assert stat.S_IMODE(os.stat(os.path.join(run, "jobs.json")).st_mode) == 0o640
        study = tmp_path / "runs" / "study-g"           # an existing study of the group's, taken again
        os.umask(0o077)
        with study_run._submitting(str(study), GROUP):
            atomic.write_json(study / "study.json", {})
        os.umask(0o077)
        with study_run._submitting(str(study), GROUP):
            atomic.write_json(study / "results.json", {})
        assert stat.S_IMODE(os.stat(study / "results.json").st_mode) == 0o640
        os.umask(0o077)         # a later command (status) of the owner on the group's run
        atomic.write_json(os.path.join(rundir.find_run(run), "status.json"), {})
        assert stat.S_IMODE(os.stat(os.path.join(run, "status.json")).st_mode) == 0o640
    finally:
        os.umask(old)


NO_FLOCK = [(errno.ENOSYS, "Lustre noflock"), (errno.ENOLCK, "NFS without lockd"), (errno.EOPNOTSUPP, "other")]


@pytest.mark.parametrize("code", [c for c, _ in NO_FLOCK], ids=[w for _, w in NO_FLOCK])
def test_a_file_system_without_flock_is_one_line_naming_the_directory(tmp_path, monkeypatch, code):
    def no_flock(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    study = tmp_path / "study-x"
    with pytest.raises(StorageError) as caught:         # study run
        with study_run._submitting(str(study)):
            pass
    message = str(caught.value)
    assert message.startswith(f"{study}: its file system does not lock files") and "\n" not in message
    assert os.strerror(code) in message and "--runs-dir" in message
    from jobs import submit
    run = rundir.new_run_dir(str(tmp_path / "runs"), "train-ncf")
    with pytest.raises(StorageError, match=f"^{run}: its file system does not lock files"):     # train
        with submit._holding_submit_lock(run):
            pass
    runs = tmp_path / "history"
    os.makedirs(runs)
    with pytest.raises(StorageError, match=f"^{runs}: its file system does not lock files"):    # history
        with history._locked(str(runs)):
            pass


def test_a_full_disk_at_the_study_lock_is_one_line(tmp_path):
    with small_tmpfs(tmp_path / "full", "64k") as mount:
        study = mount / "study-x"
        rundir.make_private_dir(str(study))
        fill(mount)
        with pytest.raises(StorageError) as caught:
            with study_run._submitting(str(study)):
                pass
        message = str(caught.value)
        assert "\n" not in message and "No space left on device" in message and str(study / "run.lock") in message


def test_another_users_index_lock_in_a_shared_runs_dir_is_refused_in_one_line(shared, capsys):
    from jobs import cli

    root, as_nobody = shared
    as_nobody(f"touch {history.LOCK} && chmod 0666 {history.LOCK}")     # a lock it could hold forever
    study = make_study(root, "mine", BASE)
    os.chmod(study, 0o700)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["study", "report", study, "--no-plot"]) == 0
    said = capsys.readouterr().err + "".join(str(w.message) for w in caught
                                             if issubclass(w.category, ResultsNotSaved))
    assert "owner nobody" in said and history.LOCK in said
    assert not os.path.exists(os.path.join(root, history.INDEX))
