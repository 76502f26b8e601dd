"""The install without root (install/user-env.sh): what it refuses in one line before creating
anything, its plan as a user who is not root, and (opt-in, minutes) the whole install as that user.

The refusals run the script with stand-ins for `uname` and the interpreter, and with a PATH
without `mpicc`, as a site's login shell would have before `module load`. The whole install
(``RECSYS_TEST_USER_INSTALL=1``) creates a venv as user ``nobody``, installs the pinned stack from
PyPI and builds Horovod against this machine's MPI: docs/dgx.md has its measured run."""
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "install" / "user-env.sh"
TOOLS = ("bash", "dirname", "readlink", "uname", "id", "cksum", "cut", "sed", "head", "grep", "python3",
         "printf", "cat", "mkdir", "env", "nvidia-smi")


def _bin(tmp_path, skip=(), extra=None):
    """A PATH of this machine's tools, minus ``skip``, plus stand-in scripts ``extra`` {name: text}."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for tool in TOOLS:
        # a real interpreter, not a pyenv shim (which needs more tools), and one every user can run
        found = "/usr/bin/python3" if tool == "python3" and os.path.exists("/usr/bin/python3") else shutil.which(tool)
        if found and tool not in skip and not (d / tool).exists():
            (d / tool).symlink_to(found)
    for name, text in (extra or {}).items():
        path = d / name
        if path.exists() or path.is_symlink():
            path.unlink()
        path.write_text("#!/bin/sh\n" + text)
        path.chmod(0o755)
    return str(d)


def _run(args, path, tmp_path, user=None):
    env = {"PATH": path, "HOME": str(tmp_path), "RECSYS_HOROVOD_GPU": "0"}
    cmd = ["bash", str(SCRIPT), *args]
    if user:
        cmd = [shutil.which("runuser"), "-u", user, "--", *cmd]
    return subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=60)


def _refused(res, *words):
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("install/user-env.sh: ") and all(w in lines[0] for w in words), lines[0]


@pytest.mark.fast
def test_aarch64_is_refused_in_one_line_before_anything_is_created(tmp_path):
    venv = tmp_path / "venv"
    res = _run(["--venv", str(venv), "--plan"], _bin(tmp_path, extra={"uname": "echo aarch64\n"}), tmp_path)
    _refused(res, "aarch64", "x86_64 only", "NGC")
    assert not venv.exists()


@pytest.mark.fast
def test_python_312_is_refused_with_what_to_do(tmp_path):
    venv = tmp_path / "venv"
    path = _bin(tmp_path, extra={"python3.12": 'echo 3.12\n'})
    res = _run(["--venv", str(venv), "--python", "python3.12"], path, tmp_path)
    _refused(res, "Python 3.12", "3.9-3.11", "--python python3.11", "DGX OS 7")
    assert not venv.exists()


@pytest.mark.fast
def test_no_mpi_loaded_is_refused_naming_the_module(tmp_path):
    venv = tmp_path / "venv"
    res = _run(["--venv", str(venv)], _bin(tmp_path, skip=("mpicc",)), tmp_path)
    _refused(res, "no mpicc on PATH", "module load")
    assert not venv.exists()


@pytest.mark.fast
def test_bad_arguments_are_one_line(tmp_path):
    path = _bin(tmp_path)
    _refused(_run(["--bogus"], path, tmp_path), "unknown argument '--bogus'")
    _refused(_run(["--extras", "train;rm -rf /"], path, tmp_path), "--extras", "names separated by commas")
    _refused(_run(["--venv"], path, tmp_path), "--venv needs a directory")


def _nobody_ok():
    return os.geteuid() == 0 and shutil.which("runuser") and shutil.which("mpicc")


@pytest.fixture
def open_dir():
    """A directory user nobody can reach (pytest's tmp_path sits under a root-only directory)."""
    path = Path(tempfile.mkdtemp(prefix="recsys-user-install-", dir="/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.fast
@pytest.mark.skipif(not _nobody_ok(), reason="needs root (to act as nobody), runuser and mpicc")
def test_plan_as_a_user_without_root(open_dir):
    """The plan a site's user sees: their name, the venv, the CPU build, the MPI it builds against;
    and a venv where that user may not write is refused in one line."""
    tmp_path = open_dir
    path = os.pathsep.join([_bin(tmp_path), os.path.dirname(shutil.which("mpicc"))])
    venv = tmp_path / "nobody-venv"
    res = _run(["--venv", str(venv), "--extras", "preproc", "--plan"], path, tmp_path, user="nobody")
    assert res.returncode == 0, res.stderr
    plan = dict(line.split(":", 1) for line in res.stdout.splitlines())
    assert plan["user"].strip() == "nobody" and plan["venv"].strip() == str(venv)
    # the CPU build here: no GPU listed; the exact versions from the constraints file (issue 48 item 3)
    assert plan["extras"].strip() == f"train,preproc (versions: {REPO / 'install' / 'constraints.txt'})"
    assert plan["mpicc"].strip() == os.path.realpath(shutil.which("mpicc"))
    assert "HOROVOD_WITH_MPI=1" in plan["horovod"] and not venv.exists()
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o755)
    res = _run(["--venv", str(locked / "venv"), "--plan"], path, tmp_path, user="nobody")
    _refused(res, "not writable by nobody")


@pytest.mark.skipif(os.environ.get("RECSYS_TEST_USER_INSTALL") != "1" or not _nobody_ok(),
                    reason="the whole install as nobody takes minutes (downloads TensorFlow, builds Horovod): "
                           "RECSYS_TEST_USER_INSTALL=1")
def test_whole_install_as_a_user_without_root(open_dir):
    """As nobody, in nobody's own copy of the checkout: a venv, the [train] stack from PyPI, Horovod
    built against this machine's MPI; then two Horovod ranks under mpirun agree on an allreduce."""
    home = open_dir
    checkout = home / "checkout"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (REPO / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, checkout / name)
    subprocess.run(["chown", "-R", "nobody", str(checkout)], check=True)
    venv = home / "venv"
    path = os.pathsep.join([os.path.dirname(shutil.which("mpicc")), "/usr/local/bin", "/usr/bin", "/bin"])
    env = {"PATH": path, "HOME": str(home), "RECSYS_HOROVOD_GPU": "0"}
    # runuser sets HOME to nobody's (/nonexistent): the install's caches go to the home made here
    res = subprocess.run([shutil.which("runuser"), "-u", "nobody", "--", "env", f"HOME={home}", "bash",
                          str(checkout / "install" / "user-env.sh"), "--venv", str(venv)],
                         env=env, text=True, capture_output=True, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert pwd.getpwuid(venv.stat().st_uid).pw_name == "nobody"
    code = ("import horovod.tensorflow as hvd, tensorflow as tf; hvd.init(); "
            "print(hvd.rank(), float(hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)))")
    res = subprocess.run([shutil.which("runuser"), "-u", "nobody", "--", "mpirun", "-np", "2", "--oversubscribe",
                          str(venv / "bin" / "python"), "-c", code], env=env, text=True, capture_output=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(res.stdout.split("\n")[:2]) == ["0 3.0", "1 3.0"], res.stdout


@pytest.mark.fast
@pytest.mark.skipif(not _nobody_ok(), reason="needs root (to act as nobody), runuser and mpicc")
def test_a_home_the_user_may_not_write_is_refused_before_the_venv(open_dir):
    """runuser gives nobody HOME=/nonexistent: the Horovod wheel cache cannot be made there, which
    is one line naming RECSYS_WHEEL_CACHE, before any venv exists."""
    tools = [os.path.dirname(shutil.which(t)) for t in ("mpicc", "g++") if shutil.which(t)]
    path = os.pathsep.join([_bin(open_dir), *tools])
    venv = open_dir / "venv"
    res = _run(["--venv", str(venv)], path, open_dir, user="nobody")
    _refused(res, "cannot create the Horovod wheel cache /nonexistent/", "RECSYS_WHEEL_CACHE")
    assert not venv.exists()
