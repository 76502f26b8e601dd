# The preprocessing image of the dgxa100-pod-spark profile: Spark 3.5 (pyspark, as
# install/constraints.txt pins it), Java 17, the RAPIDS Accelerator jar of the release slurm/sparkrapids.py
# pairs with it, and this toolkit, on Ubuntu 22.04.
#
#   GPU image (the default base: the CUDA 12.2 runtime the RAPIDS jar's cudf needs):
#     docker build -f cluster_profiles/images/spark-rapids.Dockerfile -t recsys-spark:3.5 .
#     enroot import -o /lustre/images/recsys-spark-3.5.sqsh dockerd://recsys-spark:3.5
#   CPU twin (the same recipe on plain Ubuntu: Spark without GPUs, for a laptop or CI):
#     docker build -f cluster_profiles/images/spark-rapids.Dockerfile --build-arg BASE=ubuntu:22.04 -t recsys-spark:3.5-cpu .
#
# Run from the checkout (the build context is the toolkit). The image declares what it holds in
# the profile (container.provides: [spark, rapids]); the last step checks it.
ARG BASE=nvcr.io/nvidia/cuda:12.2.2-runtime-ubuntu22.04
FROM ${BASE}

# Java 17: Spark 3.5 runs on 8/11/17; 17 is what the test machines run pyspark 3.5.9 on.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      openjdk-17-jre-headless python3 python3-venv python3-pip procps curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# The toolkit and its [preproc] extra (pyspark, numpy, pandas, pyarrow at install/constraints.txt's
# versions, the tested stack), in a venv that is first on PATH: `python` in the profile and in the
# job scripts is this one.
COPY . /opt/recsys-submit
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir -c /opt/recsys-submit/install/constraints.txt "/opt/recsys-submit[preproc]"

# The RAPIDS Accelerator for Spark: the Scala 2.12 build (pyspark 3.5 is Scala 2.12), from Maven Central,
# at the release slurm/sparkrapids.py pairs with the image's pyspark (the one place of the pair).
RUN v="$(python3 /opt/recsys-submit/slurm/sparkrapids.py print rapids)" && mkdir -p /opt/rapids \
 && curl -fsSL -o /opt/rapids/rapids-4-spark.jar \
      "https://repo1.maven.org/maven2/com/nvidia/rapids-4-spark_2.12/${v}/rapids-4-spark_2.12-${v}.jar"
ENV PATH=/opt/venv/bin:$PATH \
    JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    PYSPARK_PYTHON=/opt/venv/bin/python

# The pair fits: the installed pyspark is the pair's and the jar has a shim for it (else one line, and the build stops).
RUN python /opt/recsys-submit/slurm/sparkrapids.py check-image --jar /opt/rapids/rapids-4-spark.jar

# What the profile says the image holds, checked when it is built (tests/jobs/test_images.py runs
# the same line against the test machine's venv).
RUN python -c "import pyspark, preproc; print('pyspark', pyspark.__version__)" && java -version \
 && python -m preproc --help > /dev/null && recsys-preproc --help > /dev/null && test -s /opt/rapids/rapids-4-spark.jar
