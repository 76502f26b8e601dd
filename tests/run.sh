#!/usr/bin/env bash
# README's test command. On a fresh Debian machine (root) it installs what the
# suite needs (tests/install.sh: Slurm, MPI, Java, the pinned Python stack in
# .venv, Horovod built once and cached), then runs pytest. The tests bring a
# local Slurm cluster up themselves (tests/conftest.py) and tear it down.
# Extra arguments go to pytest, e.g. `bash tests/run.sh tests/jobs -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/install.sh
exec .venv/bin/python -m pytest -ra "$@"
