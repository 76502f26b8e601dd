"""The login-node install (`pip install recsys-submit`, no extras) in a fresh venv: every console
script it ships either works or says in one line which extra to install (issue 48, item 1), and
where the extra does not install, which Pythons and machines it supports (item 3).

One venv per module (~15 s): the package is built as a wheel from a copy of the source (the
checkout stays untouched) and installed with its base requirements only, as a user would."""
import json
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


def test_the_installed_metadata_says_where_each_extra_installs(base_install):
    """What pip reads (issue 48 item 3): the supported Pythons and Linux as classifiers; each engine
    extra's requirements as ranges, TensorFlow only on CPython 3.9-3.11 x86_64 Linux."""
    res = _run(base_install, "python", "-c", "import importlib.metadata as m, json; d = m.metadata('recsys-submit'); "
               "print(json.dumps({'cls': d.get_all('Classifier'), 'req': d.get_all('Requires-Dist')}))")
    assert res.returncode == 0, res.stderr
    meta = json.loads(res.stdout)
    assert {c for c in meta["cls"] if c.startswith("Programming Language :: Python :: 3.")} == {
        f"Programming Language :: Python :: 3.{m}" for m in (9, 10, 11)}
    assert "Operating System :: POSIX :: Linux" in meta["cls"]
    tf = [r for r in meta["req"] if r.startswith(("tensorflow-cpu", "tensorflow[and-cuda]"))]
    assert len(tf) == 2 and all('platform_machine == "x86_64"' in r and 'python_version < "3.12"' in r
                                and "<2.16" in r for r in tf), tf
    assert not [r for r in meta["req"] if "==" in r.split(";")[0]], "ranges, not pins"


@pytest.mark.parametrize("script, machine, python, words", [
    ("recsys-train", "aarch64", None, ("Linux aarch64 (supported: Python 3.9-3.11 on Linux x86_64)", "NGC")),
    ("recsys-train", "x86_64", (3, 13), ("Python 3.13 (supported: Python 3.9-3.11 on Linux x86_64)", "python3.11")),
    ("recsys-preproc", "x86_64", (3, 12), ("Python 3.12 (supported: Python 3.9-3.11 on Linux x86_64 or aarch64)",
                                           "spark-rapids.Dockerfile")),
])
def test_an_engine_script_on_an_unsupported_host_says_what_is_supported(base_install, script, machine, python,
                                                                          words):
    """The console script's own function, in the base install, on a host stood in for: platform.machine
    and the version tuple the check reads (this box is CPython 3.11 on x86_64)."""
    module, func = {"recsys-train": ("recsys.entry", "train"), "recsys-preproc": ("preproc.entry", "main")}[script]
    stand_in = (f"import platform, sys; platform.machine = lambda: {machine!r}; "
                f"sys.version_info = {tuple(python or sys.version_info[:2]) + (0,)!r}; "
                f"sys.argv = [{script!r}, '--help']; from {module} import {func}; {func}()")
    res = _run(base_install, "python", "-c", stand_in)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and res.stdout == "", res.stderr
    assert lines[0].startswith(f"{script}: error: no [") and all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in res.stderr


def test_python_m_preproc_names_the_extra_too(base_install):
    res = _run(base_install, "python", "-m", "preproc", "--help")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "'recsys-submit[preproc]'" in res.stderr


def test_the_submission_cli_works_on_the_base_install(base_install):
    res = _run(base_install, "recsys-submit", "--help")
    assert res.returncode == 0 and "usage:" in res.stdout, res.stderr
    res = _run(base_install, "python", "-m", "recsys.runtime.tfcompat")
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
        REPO / "jobs" / "study" / "running" / "examples" / "dlrm-strong.yaml"
    dry = cli("study", "run", "dlrm-strong.yaml", "--profile", "dgxa100", "--dry-run", "--runs-dir", str(tmp_path / "runs"))
    assert dry.returncode == 0 and "study dlrm-strong on profile dgxa100: 4 point(s)" in dry.stdout, dry.stderr
    (tmp_path / "dlrm-strong.yaml").write_text("mine\n")
    again = cli("study", "init", "dlrm-strong")
    assert again.returncode == 2 and again.stderr == ("recsys-submit: error: study init: dlrm-strong.yaml exists; "
                                                      "give another --out or remove it\n"), again.stderr
    assert (tmp_path / "dlrm-strong.yaml").read_text() == "mine\n"
    # the other package data of jobs.study, from the installed copy: the spec's schema and NVIDIA's
    # published results (jobs/study/analysis/published_results.yaml)
    schema = cli("study", "schema")
    assert schema.returncode == 0 and json.loads(schema.stdout)["properties"]["model"], schema.stderr
    published = cli("study", "reference", "--list", "--model", "dlrm")
    assert published.returncode == 0 and "dlrm_tf2_2302" in published.stdout and "dgxa100" in published.stdout, \
        published.stderr
    typo = cli("study", "init", "dlrm-strnog")
    assert typo.returncode == 2 and "did you mean 'dlrm-strong'?" in typo.stderr and typo.stderr.count("\n") == 1
