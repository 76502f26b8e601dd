"""What pip and the README say about where each extra installs, held to one another (issue 48 item 3).

setup.cfg keeps ranges with environment markers, install/constraints.txt the tested exact stack:
every pin lies in its ranges, every installer of the tree uses the file, the markers agree with the
refusal table of recsys/runtime/platforms.py on every Python and machine, and the engine entry points
refuse an unsupported Python or machine in one line (the check run as a pure function here; in a
real base-install venv by tests/jobs/test_entry_points.py)."""
from __future__ import annotations

import configparser
import itertools
import re
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

import preproc.entry
import recsys.entry
from recsys.runtime import devices
from recsys.runtime import platforms
from recsys.runtime import tfcompat

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]
ENGINE_EXTRAS = ("train", "gpu", "preproc", "nvtabular")


def _cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return cfg


def _extras() -> dict:
    """setup.cfg's extras as {extra: [Requirement]} (comment lines dropped)."""
    section = _cfg()["options.extras_require"]
    return {name: [Requirement(line.strip()) for line in section[name].splitlines()
                   if line.strip() and not line.strip().startswith("#")] for name in section}


def _constraints() -> dict:
    pins = {}
    for line in (REPO / "install" / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name] = version
    return pins


def _env(python: tuple, machine: str) -> dict:
    env = default_environment()
    env.update(python_version=f"{python[0]}.{python[1]}", python_full_version=f"{python[0]}.{python[1]}.0",
               sys_platform="linux", platform_system="Linux", platform_machine=machine, extra="")
    return env


def test_the_extras_hold_ranges_and_the_constraints_file_the_tested_versions():
    extras, pins = _extras(), _constraints()
    for extra, reqs in extras.items():
        for req in reqs:
            assert not any(s.operator == "==" for s in req.specifier), f"[{extra}] {req}: a range, not a pin"
            if req.name in pins:
                assert req.specifier.contains(pins[req.name]), f"[{extra}] {req} excludes the tested {pins[req.name]}"
    for extra in ENGINE_EXTRAS:        # the engine extras are tested at one exact stack, all of it
        unpinned = [r.name for r in extras[extra] if r.name not in pins]
        assert not unpinned, f"[{extra}]: no tested version in install/constraints.txt for {unpinned}"
    requested = {r.name for reqs in extras.values() for r in reqs} | {"submitit"}
    assert set(pins) <= requested, f"constraints for nothing setup.cfg asks for: {set(pins) - requested}"


def test_the_tensorflow_release_is_named_once_in_the_constraints_and_matches_its_users():
    pins = _constraints()
    assert pins["tensorflow-cpu"] == pins["tensorflow"] == tfcompat.PINNED
    assert f"tensorflow[and-cuda]=={tfcompat.PINNED}" in devices.GPU_INSTALL
    assert f"TF_VERSION={tfcompat.PINNED}" in (REPO / "install" / "user-env.sh").read_text()


def test_every_installer_of_the_tree_installs_with_the_constraints_file():
    user_env = (REPO / "install" / "user-env.sh").read_text()
    installs = [line for line in user_env.splitlines() if re.search(r'-m pip install -q (-c|-e|")', line)]
    assert installs and all('-c "$constraints"' in line for line in installs), installs
    assert "constraints=$here/install/constraints.txt" in user_env
    assert "install/user-env.sh" in (REPO / "tests" / "install.sh").read_text()   # CI's install goes through it
    recipe = (REPO / "cluster_profiles" / "images" / "spark-rapids.Dockerfile").read_text()
    assert "pip install --no-cache-dir -c /opt/recsys-submit/install/constraints.txt " in recipe
    assert "install" not in (REPO / "cluster_profiles" / "images" / "spark-rapids.Dockerfile.dockerignore").read_text()


@pytest.mark.parametrize("extra", ENGINE_EXTRAS)
def test_the_markers_and_the_refusal_table_agree_on_every_python_and_machine(extra):
    """Where recsys/runtime/platforms.py says the extra installs, all of its requirements apply; elsewhere not
    all do (no TensorFlow on aarch64, nothing on Python 3.12 and 3.13)."""
    reqs = _extras()[extra]
    for python, machine in itertools.product([(3, 9), (3, 10), (3, 11), (3, 12), (3, 13)], ["x86_64", "aarch64"]):
        applies = [r.marker is None or r.marker.evaluate(_env(python, machine)) for r in reqs]
        host = platforms.Host(python, "Linux", machine)
        assert all(applies) == (platforms.outside(extra, host) is None), (extra, python, machine, applies)


def test_the_classifiers_name_the_supported_pythons_and_linux():
    classifiers = _cfg()["metadata"]["classifiers"].split("\n")
    pythons = {c.rsplit(":: ", 1)[1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    s = platforms.EXTRAS["train"]
    assert pythons == {f"3.{m}" for m in range(s.oldest[1], s.newest[1] + 1)}
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert _cfg()["options"]["python_requires"] == f">={s.oldest[0]}.{s.oldest[1]}"


def test_readme_first_screen_says_what_to_install_where():
    """The table is within README's first screen and names each extra's support as the refusals do."""
    head = "\n".join((REPO / "README.md").read_text().splitlines()[:45])
    assert "What to install where" in head
    for extra in ENGINE_EXTRAS:
        assert f"`[{extra}]`" in head and platforms.supported(extra) in head, extra
    for command in ("pip install -c install/constraints.txt '.[train]'", "pip install -c install/constraints.txt '.[gpu]'",
                    "bash install/user-env.sh", "cluster_profiles/images/spark-rapids.Dockerfile"):
        assert command in head, command


def test_refusal_names_what_is_outside_and_what_is_supported():
    line = platforms.refusal("recsys-train", ("train", "gpu"), platforms.Host((3, 13), "Linux", "aarch64"), "do X")
    assert line == ("recsys-train: error: no [train] or [gpu] extra in this install, and neither installs on "
                    "Python 3.13 on Linux aarch64 (supported: Python 3.9-3.11 on Linux x86_64): do X")
    line = platforms.refusal("recsys-preproc", ("preproc",), platforms.Host((3, 12), "Linux", "aarch64"), "do Y")
    assert line == ("recsys-preproc: error: no [preproc] extra in this install, and it does not install on "
                    "Python 3.12 (supported: Python 3.9-3.11 on Linux x86_64 or aarch64): do Y")
    assert platforms.outside("train", platforms.Host((3, 11), "Darwin", "arm64")) == "Darwin arm64"
    assert platforms.refusal("recsys-train", ("train",), platforms.Host((3, 10), "Linux", "x86_64"), "") is None


def test_recsys_train_refuses_only_where_the_engine_is_missing(monkeypatch, capsys):
    aarch64 = platforms.Host((3, 11), "Linux", "aarch64")
    assert recsys.entry.platform_error(aarch64) is None      # this venv has TensorFlow: an image's own runs
    monkeypatch.setattr(recsys.entry, "missing", lambda modules=recsys.entry.NEEDS: "tensorflow")
    assert recsys.entry.platform_error(platforms.Host((3, 11), "Linux", "x86_64")) is None
    monkeypatch.setattr(recsys.entry, "this_host", lambda: aarch64)
    with pytest.raises(SystemExit) as stop:
        recsys.entry.train()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and err.startswith("recsys-train: error: ")
    assert "Linux aarch64 (supported: Python 3.9-3.11 on Linux x86_64)" in err and "NGC TensorFlow container" in err


def test_recsys_preproc_refuses_an_unsupported_python_without_its_extra(monkeypatch, capsys):
    monkeypatch.setattr(preproc.entry, "missing", lambda modules=preproc.entry.NEEDS: "numpy")
    monkeypatch.setattr(preproc.entry, "this_host", lambda: platforms.Host((3, 13), "Linux", "x86_64"))
    with pytest.raises(SystemExit) as stop:
        preproc.entry.main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert "on Python 3.13 (supported: Python 3.9-3.11 on Linux x86_64 or aarch64)" in err and "python3.11" in err
    monkeypatch.setattr(preproc.entry, "this_host", lambda: platforms.Host((3, 11), "Linux", "x86_64"))
    with pytest.raises(SystemExit):
        preproc.entry.main()
    assert "pip install 'recsys-submit[preproc]'" in capsys.readouterr().err     # the extra would install here
