"""The preprocessing image's Spark and RAPIDS Accelerator pair (issue 47, item 5): kept in one place
(slurm/sparkrapids.py), the recipe downloads that release and installs install/constraints.txt's
pyspark, which is the pair's; the image's build-time check passes a jar with a shim for the installed pyspark and
stops on one without (jars built here as zips with the parallel-world directories a RAPIDS jar
has); a submission with a --rapids-jar whose release does not support the job's Spark is refused
in one line before anything is planned."""

import os
import re
import subprocess
import sys
import zipfile

import pytest

from jobs.errors import RequestError
from jobs.planning.plan import plan
from jobs.planning.request import JobRequest
from jobs.profiles import load_profile
from slurm import sparkrapids

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("isolated_profile_search_path")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(REPO, "cluster_profiles", "images", "spark-rapids.Dockerfile")
SCRIPT = os.path.join(REPO, "slurm", "sparkrapids.py")


def _jar(path, versions):
    """A jar laid out as a RAPIDS dist jar: one `sparkXYZ/` directory per supported version."""
    with zipfile.ZipFile(path, "w") as jar:
        jar.writestr("com/nvidia/spark/SQLPlugin.class", b"")
        jar.writestr("spark350db143/x.class", b"")                       # Databricks: not Apache Spark
        for v in versions:
            jar.writestr(f"spark{v.replace('.', '')}/com/nvidia/spark/rapids/x.class", b"")
    return str(path)


def test_the_pair_is_supported_and_kept_in_one_place():
    assert sparkrapids.IMAGE_SPARK in sparkrapids.RAPIDS_SPARK[sparkrapids.IMAGE_RAPIDS]
    assert "3.5.9" not in sparkrapids.RAPIDS_SPARK["24.12.1"]                       # the old pin's fault
    with open(os.path.join(REPO, "install", "constraints.txt")) as f:
        pins = dict(line.split("#")[0].strip().split("==") for line in f if "==" in line.split("#")[0])
    assert pins["pyspark"] == sparkrapids.IMAGE_SPARK
    recipe = open(RECIPE).read()
    assert "RAPIDS_VERSION" not in recipe and not re.search(r"\b2[0-9]\.[01][0-9]\.[0-9]\b", recipe)
    assert "slurm/sparkrapids.py print rapids" in recipe
    assert "slurm/sparkrapids.py check-image --jar /opt/rapids/rapids-4-spark.jar" in recipe
    out = subprocess.run([sys.executable, SCRIPT, "print", "rapids"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == sparkrapids.IMAGE_RAPIDS


def test_the_image_check_reads_the_jars_shims(tmp_path):
    """Run as the recipe runs it, against this machine's venv (pyspark at setup.cfg's pin)."""
    good = _jar(tmp_path / "good.jar", sparkrapids.RAPIDS_SPARK[sparkrapids.IMAGE_RAPIDS])
    old = _jar(tmp_path / "old.jar", sparkrapids.RAPIDS_SPARK["24.12.1"])
    venv_python = os.path.join(REPO, ".venv", "bin", "python")
    ok = subprocess.run([venv_python, SCRIPT, "check-image", "--jar", good], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "shims 3.3.0-3.3.4, 3.4.0-3.4.4, 3.5.0-3.5.9" in ok.stdout, ok.stderr
    bad = subprocess.run([venv_python, SCRIPT, "check-image", "--jar", old], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.splitlines() == [
        f"sparkrapids: --rapids-jar {old}: its shims cover Spark 3.2.0-3.2.4, 3.3.0-3.3.4, 3.4.0-3.4.4, "
        "3.5.0-3.5.3, not the image's Spark 3.5.9; use RAPIDS 26.08.0 (slurm/sparkrapids.py, the pair "
        "cluster_profiles/images/ builds)"]
    junk = tmp_path / "junk.jar"
    junk.write_text("not a zip")
    assert "not a readable jar" in subprocess.run([venv_python, SCRIPT, "check-image", "--jar", str(junk)],
                                                  capture_output=True, text=True, timeout=60).stderr


def test_a_jar_for_other_spark_versions_is_refused_at_submission():
    pre = dict(kind="preprocess", dataset="criteo", input="/data/criteo/raw", gpus_per_node=8,
               output="/data/criteo/parquet")
    spark = load_profile("dgxa100-pod-spark")
    old = "/data/jars/rapids-4-spark_2.12-24.12.1.jar"
    with pytest.raises(RequestError) as err:
        plan([JobRequest(engine_args=["--rapids-jar", old], **pre)], spark)
    assert str(err.value) == (f"--rapids-jar {old}: RAPIDS 24.12.1's supported versions cover Spark 3.2.0-3.2.4, "
                              "3.3.0-3.3.4, 3.4.0-3.4.4, 3.5.0-3.5.3, not the image's Spark 3.5.9; use RAPIDS "
                              "26.08.0 (slurm/sparkrapids.py, the pair cluster_profiles/images/ builds)")
    with pytest.raises(RequestError, match=r"^--rapids-jar \S+: a Scala 2.13 build, but Spark 3.5.9 is Scala 2.12"):
        plan([JobRequest(engine_args=["--rapids-jar", "/data/jars/rapids-4-spark_2.13-26.08.0.jar"], **pre)], spark)
    for fine in ("/data/jars/rapids-4-spark_2.12-26.08.0.jar", "/data/jars/rapids-4-spark_2.12-26.08.0-cuda12.jar",
                 "/opt/rapids/rapids-4-spark.jar"):                  # the pair's release; the image's own jar
        plan([JobRequest(engine_args=["--rapids-jar", fine], **pre)], spark)
