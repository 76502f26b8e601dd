#!/usr/bin/env bash
# The first command of every step that runs in a job's container (jobs/backends/slurm/script.py,
# allocation-cluster.sh): puts this checkout in front of the image's own PYTHONPATH, which a
# value from the host would replace (pyxis --container-env), and keeps the user's ~/.local
# packages, which pyxis' home mount brings in, from shadowing the image's (PYTHONNOUSERSITE);
# then runs the command in the same process.
#
#   container-entry.sh command...
set -eu
checkout=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$checkout${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONNOUSERSITE=1
exec "$@"
