"""Fixtures shared by the preprocessing tests: one local[2] SparkSession per test session.

Every preproc test module uses ``spark`` (session-scoped, so the JVM starts once,
about 4-8 s). It is built through ``preproc.spark.get_session`` with the settings
``spark_settings`` derives for a 2-core, 4 GiB "node", so the tests exercise the
same code path as the CLI. Pipelines called from tests get the same session back
from ``getOrCreate``.
"""
from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    pytest.importorskip("pyspark", reason="PySpark is not installed (pip install .[preproc])")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime (java on PATH or JAVA_HOME) for PySpark")
    from preproc.spark import ClusterShape, get_session, spark_settings

    scratch = tmp_path_factory.mktemp("spark-local")
    settings = spark_settings(ClusterShape(node_cores=2, node_memory_gb=4, local_dirs=str(scratch),
                                           shuffle_partitions=4, master="local[2]"))
    settings.conf.update({"spark.ui.enabled": "false", "spark.sql.adaptive.enabled": "true",
                          "spark.default.parallelism": "4"})
    session = get_session(settings, "recsys-preproc-tests")
    yield session
    session.stop()
