"""The Criteo stages (dictionary, transform, finalize) chained in one Spark application.

``criteo run`` and the Python API (the tests and the benchmark call ``run``
with a Spark session of their own). The array mode runs the same three stages
as separate jobs, one command-line stage each (preproc.criteo.cli).
"""
from __future__ import annotations

import logging
import shutil

from preproc.criteo import layout

log = logging.getLogger("preproc.criteo")


def run(spark, files, last_day: int, thresholds: list[int], output: str, overwrite: bool = False,
        bad_row_policy: str = "skip", keep_stages: bool = False, rules: layout.Rules = layout.Rules()) -> dict:
    """The whole pipeline in one Spark application (also the API the tests and the benchmark use)."""
    from preproc.criteo.dictionary import build_dictionary
    from preproc.criteo.finalize import finalize
    from preproc.criteo.transform import transform_shard

    import time

    staging = layout.Staging(output)
    try:
        start = time.perf_counter()
        meta = build_dictionary(spark, staging, files, last_day, thresholds, bad_row_policy, rules)
        log.info("run: dictionary stage took %.1f s", time.perf_counter() - start)
        start = time.perf_counter()
        transform_shard(spark, staging, meta, 0, 1, bad_row_policy)
        log.info("run: transform stage took %.1f s", time.perf_counter() - start)
        start = time.perf_counter()
        report = finalize(staging, overwrite, keep_stages)
        log.info("run: finalize stage took %.1f s", time.perf_counter() - start)
    except BaseException:
        if not keep_stages:     # nothing resumes from a failed run's stages: give the space back
            shutil.rmtree(staging.root, ignore_errors=True)
        raise
    return report
