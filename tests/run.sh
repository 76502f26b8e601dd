#!/usr/bin/env bash
# README's test command. On a fresh Debian machine (root) it installs what the
# suite needs (tests/install.sh: Slurm, MPI, Java, the pinned Python stack in
# .venv, Horovod built once and cached), then runs pytest. The tests bring a
# local Slurm cluster up themselves (tests/conftest.py) and tear it down.
# Extra arguments go to pytest, e.g. `bash tests/run.sh tests/jobs -x`.
# The tests run side by side on RECSYS_TEST_WORKERS pytest-xdist workers (2; 0 runs them in one
# process), a test file at a time per worker (--dist loadfile keeps a file's module fixtures, such
# as a study run on the cluster, in one worker), the longest files first (tests/file_order.py;
# --no-loadscope-reorder keeps that order instead of xdist's by number of tests); each worker
# starts its own Slurm clusters, Spark session and data. Most cluster tests wait on Slurm: two
# workers share the 2 cores' idle time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/install.sh
workers=${RECSYS_TEST_WORKERS:-2}
if [ "$workers" = 0 ]; then exec .venv/bin/python -m pytest -ra "$@"; fi
exec .venv/bin/python -m pytest -ra -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
