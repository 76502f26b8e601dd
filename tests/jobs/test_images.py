"""The preprocessing image recipe (cluster_profiles/images/spark-rapids.Dockerfile, issue 34 item 7).

No docker daemon runs on the test machines (`docker info`: cannot connect), so the image itself is
not built here. What is checked: the recipe installs setup.cfg's [preproc] extra at install/constraints.txt's
versions (Spark 3.5), puts the RAPIDS jar where the dgxa100-pod-spark profile and docs/dgx.md say, its CPU
twin is the same recipe on plain Ubuntu, and its own self-check line (what the profile declares the
image holds) passes against this machine's venv and Java."""

import configparser
import os
import re
import shutil
import subprocess

import pytest

from jobs.profiles import load_profile

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("isolated_profile_search_path")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(REPO, "cluster_profiles", "images", "spark-rapids.Dockerfile")
JAR = "/opt/rapids/rapids-4-spark.jar"


def _constraints():
    """install/constraints.txt as {name: version}."""
    with open(os.path.join(REPO, "install", "constraints.txt")) as f:
        return dict(line.split("#")[0].strip().split("==") for line in f if "==" in line.split("#")[0])


def _instructions():
    """The recipe's instructions, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", open(RECIPE).read())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_recipe_pins_come_from_setup_cfg():
    steps = _instructions()
    assert steps[0] == "ARG BASE=nvcr.io/nvidia/cuda:12.2.2-runtime-ubuntu22.04" and steps[1] == "FROM ${BASE}"
    pip = [s for s in steps if "pip install" in s]
    assert len(pip) == 1 and '"/opt/recsys-submit[preproc]"' in pip[0] and "==" not in pip[0]
    # setup.cfg's ranges at the tested versions, as every installer of the tree installs them
    assert "-c /opt/recsys-submit/install/constraints.txt " in pip[0]
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    assert any(line.startswith("pyspark>=3.5,<3.6") for line in cfg["options.extras_require"]["preproc"].splitlines())
    pins = _constraints()
    assert pins["pyspark"].startswith("3.5."), pins       # "Spark 3.5" as the profile and docs say
    assert any("openjdk-17-jre-headless" in s for s in steps)
    # the jar is where the profile's image declares RAPIDS and where docs/dgx.md's example points
    assert any(f"-o {JAR}" in s for s in steps)
    assert f"--rapids-jar {JAR}" in open(os.path.join(REPO, "docs", "dgx.md")).read()
    assert load_profile("dgxa100-pod-spark").container.provides == ["spark", "rapids"]


def test_cpu_twin_is_the_same_recipe_on_ubuntu():
    text = open(RECIPE).read()
    assert "--build-arg BASE=ubuntu:22.04" in text      # the documented twin: only the base differs
    assert [s for s in _instructions() if s.startswith("FROM")] == ["FROM ${BASE}"]


@pytest.mark.skipif(shutil.which("java") is None, reason="no Java runtime here")
def test_the_recipes_self_check_passes_here():
    """The recipe's last step, run against this machine's venv (the jar check is the image's own)."""
    last = _instructions()[-1]
    assert last.startswith("RUN ") and last.endswith(f"test -s {JAR}")
    check = last[len("RUN "):].rsplit(" && test -s", 1)[0]
    env = dict(os.environ, PATH=os.path.join(REPO, ".venv", "bin") + os.pathsep + os.environ["PATH"])
    out = subprocess.run(["bash", "-c", check], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.search(r"^pyspark 3\.5\.\d+$", out.stdout, re.M) and "openjdk version \"17" in out.stderr
