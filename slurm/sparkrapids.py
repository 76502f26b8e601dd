"""The Spark and RAPIDS Accelerator pair of the preprocessing image, in one place (issue 47, item 5).

The RAPIDS Accelerator jar loads only on the Spark versions it has a shim for: 24.12.1 stops at
Spark 3.5.3, so with pyspark 3.5.9 the plugin refuses to load on the first GPU job. The pair here
is what cluster_profiles/images/spark-rapids.Dockerfile builds (it downloads IMAGE_RAPIDS from
this file and installs the [preproc] extra with install/constraints.txt, whose pyspark
tests/jobs/test_image_pairs.py holds equal to IMAGE_SPARK), what the image checks when it is built (`check-image`: the installed pyspark
against the jar's own shim directories) and what a submission checks a `--rapids-jar` against
(jobs.planning.container_paths: a jar whose Spark versions do not include the image's is refused
in one line).

Supported versions per release: the "Supported Spark versions" list of each release's
docs/download.md in NVIDIA/cudf-spark (formerly NVIDIA/spark-rapids): 24.12.x "Apache Spark 3.5.0,
3.5.1, 3.5.2, 3.5.3"; 26.08.0 "Scala 2.12: Spark 3.3.0 through 3.5.9" (its release notes: "Added
support for Apache Spark 3.5.9"); 26.10.0 the same. A jar's own contents are the final word: its
parallel-world directories `spark350/`, `spark359/`, ... name the versions it loads on.

Standard library only (slurm/ is a leaf); runs as a script inside the image:
`python3 slurm/sparkrapids.py print rapids|spark` and `... check-image --jar PATH`.
"""

import argparse
import re
import sys
import zipfile

IMAGE_SPARK = "3.5.9"          # pyspark of the image: install/constraints.txt's pin
IMAGE_RAPIDS = "26.08.0"       # the RAPIDS Accelerator (rapids-4-spark_2.12) the image downloads


def _span(first, last):
    """["3.5.0", ..., "3.5.9"] of two versions that differ in the patch level only."""
    major_minor, a = first.rsplit(".", 1)
    return [f"{major_minor}.{p}" for p in range(int(a), int(last.rsplit(".", 1)[1]) + 1)]


_R2412 = _span("3.2.0", "3.2.4") + _span("3.3.0", "3.3.4") + _span("3.4.0", "3.4.4") + _span("3.5.0", "3.5.3")
_R2608 = _span("3.3.0", "3.3.4") + _span("3.4.0", "3.4.4") + _span("3.5.0", "3.5.9")
# Apache Spark versions of the Scala 2.12 jar of each release (the releases' docs/download.md)
RAPIDS_SPARK = {"24.12.0": _R2412, "24.12.1": _R2412, "24.12.2": _R2412, "26.08.0": _R2608, "26.10.0": _R2608}

_JAR_NAME = re.compile(r"rapids-4-spark_(2\.1[23])-(\d+\.\d+\.\d+)(?:-[\w.-]+)?\.jar$")
_SHIM = re.compile(r"^spark(\d)(\d)(\d)/")


def jar_name(path):
    """(scala, release) of a Maven-named jar (`rapids-4-spark_2.12-26.08.0[-cuda12].jar`), else (None, None)."""
    match = _JAR_NAME.search(str(path))
    return (match.group(1), match.group(2)) if match else (None, None)


def jar_shims(path):
    """The Spark versions a jar has shims for (its `sparkXYZ/` directories; Databricks' left out),
    or None when it cannot be read as a jar."""
    try:
        with zipfile.ZipFile(path) as jar:
            names = jar.namelist()
    except (OSError, zipfile.BadZipFile):
        return None
    found = {".".join(m.groups()) for m in map(_SHIM.match, names) if m}
    return sorted(found, key=lambda v: [int(x) for x in v.split(".")]) or None


def scala_of(spark):
    """The Scala version pip's pyspark is built with: 2.12 for Spark 3, 2.13 from Spark 4."""
    return "2.12" if spark.split(".")[0] == "3" else "2.13"


def refusal(jar, spark, versions=None):
    """One line saying why `jar` cannot run on Spark `spark`, or None when it can or nothing is
    known of it. `versions`: the Spark versions read from the jar itself, else its name's release."""
    scala, release = jar_name(jar)
    if scala and scala != scala_of(spark):
        return (f"--rapids-jar {jar}: a Scala {scala} build, but Spark {spark} is Scala {scala_of(spark)} "
                f"(use rapids-4-spark_{scala_of(spark)}-{IMAGE_RAPIDS}.jar)")
    source = "its shims"
    if versions is None:
        versions, source = RAPIDS_SPARK.get(release), f"RAPIDS {release}'s supported versions"
    if not versions or spark in versions:
        return None
    return (f"--rapids-jar {jar}: {source} cover Spark {_ranges(versions)}, not the image's Spark {spark}; "
            f"use RAPIDS {IMAGE_RAPIDS} (slurm/sparkrapids.py, the pair cluster_profiles/images/ builds)")


def _ranges(versions):
    """"3.5.0-3.5.3" per major.minor, joined."""
    by = {}
    for v in versions:
        by.setdefault(v.rsplit(".", 1)[0], []).append(v)
    return ", ".join(f"{vs[0]}-{vs[-1]}" if len(vs) > 1 else vs[0] for vs in by.values())


def installed_pyspark():
    """The pyspark version of this interpreter's environment (its metadata, without importing
    Spark), or None."""
    from importlib import metadata
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return None


def check_image(jar):
    """One line per fault of the image this runs in: pyspark missing or not the pair's, the jar
    unreadable, or the jar without a shim for the installed Spark. [] when the pair fits."""
    spark, faults = installed_pyspark(), []
    if spark is None:
        return ["pyspark is not installed in this environment"]
    if spark != IMAGE_SPARK:
        faults.append(f"pyspark {spark} installed, but the image's pair is Spark {IMAGE_SPARK} with RAPIDS "
                      f"{IMAGE_RAPIDS} (slurm/sparkrapids.py; install/constraints.txt's pin)")
    shims = jar_shims(jar)
    if shims is None:
        faults.append(f"{jar}: not a readable jar with Spark shims")
    else:
        line = refusal(jar, spark, shims)
        if line:
            faults.append(line)
    return faults


def main(argv=None):
    parser = argparse.ArgumentParser(prog="slurm/sparkrapids.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    show = sub.add_parser("print", help="print one half of the pair")
    show.add_argument("what", choices=["rapids", "spark"])
    check = sub.add_parser("check-image", help="check the installed pyspark against the jar's shims")
    check.add_argument("--jar", required=True)
    args = parser.parse_args(argv)
    if args.cmd == "print":
        print(IMAGE_RAPIDS if args.what == "rapids" else IMAGE_SPARK)
        return 0
    faults = check_image(args.jar)
    for line in faults:
        print(f"sparkrapids: {line}", file=sys.stderr)
    if not faults:
        print(f"pyspark {installed_pyspark()} with RAPIDS jar {args.jar}: shims {_ranges(jar_shims(args.jar))}")
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
