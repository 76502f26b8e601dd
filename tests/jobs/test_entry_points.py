"""The login-node install (`pip install recsys-submit`, no extras) in a fresh venv: every console
script it ships either works or says in one line which extra to install (issue 48, item 1).

One venv per module (~15 s): the package is built as a wheel from a copy of the source (the
checkout stays untouched) and installed with its base requirements only, as a user would."""
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("jobs", "recsys", "preproc", "slurm", "cluster_profiles", "setup.cfg", "pyproject.toml", "README.md")


@pytest.fixture(scope="module")
def base_install(tmp_path_factory) -> Path:
    """The bin/ directory of a venv with only the base install (pyyaml, submitit): no numpy, no TF."""
    root = tmp_path_factory.mktemp("base-install")
    src = root / "src"
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(root / "wheel")],
                   check=True, cwd=root, capture_output=True, timeout=120)
    venv.create(root / "venv", with_pip=False)
    python = root / "venv" / "bin" / "python"
    wheel = next((root / "wheel").glob("recsys_submit-*.whl"))
    subprocess.run([*pip, "--python", str(python), "install", str(wheel)], check=True, capture_output=True,
                   timeout=180)
    probe = subprocess.run([str(python), "-c", "import numpy"], capture_output=True)
    assert probe.returncode != 0, "the base install must not bring numpy"
    return root / "venv" / "bin"


def _run(bin_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / args[0]), *args[1:]], capture_output=True, text=True, timeout=60,
                          cwd=bin_dir)


@pytest.mark.parametrize("script, extra", [("recsys-train", "[train]"), ("recsys-preproc", "[preproc]")])
@pytest.mark.parametrize("flag", ["--help", "--synthetic"])
def test_an_engine_script_without_its_extra_names_it_in_one_line(base_install, script, extra, flag):
    res = _run(base_install, script, flag)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"{script}: error: ") and f"pip install 'recsys-submit{extra}'" in lines[0]
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_python_m_preproc_names_the_extra_too(base_install):
    res = _run(base_install, "python", "-m", "preproc", "--help")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "'recsys-submit[preproc]'" in res.stderr


def test_the_submission_cli_works_on_the_base_install(base_install):
    res = _run(base_install, "recsys-submit", "--help")
    assert res.returncode == 0 and "usage:" in res.stdout, res.stderr
    res = _run(base_install, "python", "-m", "recsys.tfcompat")
    assert res.returncode == 2 and "[train]" in res.stdout + res.stderr


def _submit(bin_dir: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp), "RECSYS_PROFILE_PATH": str(tmp / "profiles")}
    own, engine = (args[:args.index("--")], args[args.index("--"):]) if "--" in args else (args, ())
    return subprocess.run([str(bin_dir / "recsys-submit"), *own, "--runs-dir", str(tmp / "runs"), *engine],
                          capture_output=True, text=True, timeout=60, cwd=tmp, env=env)


@pytest.mark.parametrize("dry", [True, False])
def test_a_tensorflow_job_from_the_base_install_is_refused_before_anything_runs(base_install, tmp_path, dry):
    """The local profile names no `python:` or `container:`: its jobs would run this TF-less Python."""
    res = _submit(base_install, tmp_path, "train", "--profile", "local", "--model", "dlrm",
                  *(["--dry-run"] if dry else []), "--", "--synthetic")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert all(w in lines[0] for w in ("profile local", "no TensorFlow", "'recsys-submit[train]'",
                                       "[gpu]", "`python:`", "`container:`")), lines[0]
    assert not (tmp_path / "runs").exists()


def test_the_base_install_still_runs_the_smoke_payload_and_profiles_naming_python(base_install, tmp_path):
    res = _submit(base_install, tmp_path, "benchmark", "--profile", "local", "--model", "hello", "--dry-run")
    assert res.returncode == 0, res.stderr
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "shared-venv.yaml").write_text(
        "extends: local\ndescription: jobs run a shared venv\npython: /shared/venv/bin/python\n")
    res = _submit(base_install, tmp_path, "train", "--profile", "shared-venv", "--model", "dlrm", "--dry-run",
                  "--", "--synthetic")
    assert res.returncode == 0 and "/shared/venv/bin/python -m recsys.train" in res.stdout, res.stderr


def test_the_documented_study_spec_ships_with_the_package(base_install, tmp_path):
    """README's `study run ... dlrm-strong.yaml` from a pip install (issue 48 item 5): `study init`
    writes the packaged example (the checkout's docs/studies/dlrm-strong.yaml links to it), which a
    dry run on a site profile accepts; an existing file is never replaced."""
    env = {"PATH": f"{base_install}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def cli(*args):
        return subprocess.run([str(base_install / "recsys-submit"), *args], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path, env=env)

    listed = cli("study", "init", "--list")
    assert listed.returncode == 0 and listed.stdout.startswith("dlrm-strong "), listed.stderr
    res = cli("study", "init", "dlrm-strong")
    assert res.returncode == 0 and res.stdout == "wrote dlrm-strong.yaml\n", res.stderr
    written = (tmp_path / "dlrm-strong.yaml").read_text()
    assert written == (REPO / "docs" / "studies" / "dlrm-strong.yaml").read_text()
    assert (REPO / "docs" / "studies" / "dlrm-strong.yaml").resolve() == \
        REPO / "jobs" / "study" / "examples" / "dlrm-strong.yaml"
    dry = cli("study", "run", "dlrm-strong.yaml", "--profile", "dgxa100", "--dry-run", "--runs-dir", str(tmp_path / "runs"))
    assert dry.returncode == 0 and "study dlrm-strong on profile dgxa100: 4 point(s)" in dry.stdout, dry.stderr
    (tmp_path / "dlrm-strong.yaml").write_text("mine\n")
    again = cli("study", "init", "dlrm-strong")
    assert again.returncode == 2 and again.stderr == ("recsys-submit: error: study init: dlrm-strong.yaml exists; "
                                                      "give another --out or remove it\n"), again.stderr
    assert (tmp_path / "dlrm-strong.yaml").read_text() == "mine\n"
    typo = cli("study", "init", "dlrm-strnog")
    assert typo.returncode == 2 and "did you mean 'dlrm-strong'?" in typo.stderr and typo.stderr.count("\n") == 1
