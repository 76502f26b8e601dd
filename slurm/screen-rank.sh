#!/usr/bin/env bash
# The node screen's test hook (jobs/study/running/screen.py, docs/studies.md "Pod workflow"): a rank of
# `recsys-submit study screen` runs behind this wrapper only while RECSYS_TEST_SLOW_NODE is set
# at submission. Not for production use: it makes a slow node on purpose, so that a test can
# check that the screen flags it.
#
# - On the node it names (SLURMD_NODENAME), the rank gets a CPU quota from its first logged step
#   on: it is stopped and continued in turn (SIGSTOP/SIGCONT), running RECSYS_TEST_SLOW_RUN_MS of
#   every RECSYS_TEST_SLOW_PERIOD_MS (default 10 of 80 ms: an eighth of the CPU time it would
#   get), so its timed steps are slowed and its start-up is not.
# - With RECSYS_TEST_SYNC_COUNT=N (the screen sets it to its node count), every rank is held
#   (SIGSTOP) after its first logged step until the ranks of all N nodes have reached theirs
#   (a file per node in the screen's sync/ directory, at most RECSYS_TEST_SYNC_S = 120 s), so
#   the emulated nodes, which share one host's cores, step at the same time and not one after
#   another's start-up. The rank's warm-up steps must outlast the 20 ms the hook polls at.
#
#   screen-rank.sh -- cmd args...
set -uo pipefail

[[ ${1:-} == -- ]] && shift
(($#)) || { echo "screen-rank.sh: no command to run" >&2; exit 2; }
node=${SLURMD_NODENAME:-}
slow=0
[[ -n ${RECSYS_TEST_SLOW_NODE:-} && $node == "$RECSYS_TEST_SLOW_NODE" ]] && slow=1
sync_count=${RECSYS_TEST_SYNC_COUNT:-0}
[[ $sync_count =~ ^[0-9]+$ ]] || { echo "screen-rank.sh: RECSYS_TEST_SYNC_COUNT: not a count: '$sync_count'" >&2; exit 2; }
if [[ -z ${RECSYS_TEST_SLOW_NODE:-} ]] || ((slow == 0 && sync_count == 0)); then
    exec "$@"
fi

run_ms=${RECSYS_TEST_SLOW_RUN_MS:-10}
period_ms=${RECSYS_TEST_SLOW_PERIOD_MS:-80}
[[ $run_ms =~ ^[0-9]+$ && $period_ms =~ ^[0-9]+$ ]] && ((run_ms > 0 && run_ms < period_ms && period_ms < 1000)) \
    || { echo "screen-rank.sh: RECSYS_TEST_SLOW_RUN_MS must be between 0 and RECSYS_TEST_SLOW_PERIOD_MS (< 1000)" >&2; exit 2; }
run_s=$(printf '0.%03d' "$run_ms")
stop_s=$(printf '0.%03d' "$((period_ms - run_ms))")
engine_log="${RECSYS_RUN_DIR:-.}/logs/${RECSYS_JOB_KEY:-main}-${RECSYS_JOB_TAG:-local}.engine.jsonl"
sync_dir="${RECSYS_RUN_DIR:-.}/../../sync"      # the screen's dir: <screen>/nodes/<slot> is the run dir
sync_s=${RECSYS_TEST_SYNC_S:-120}
((slow)) && echo "screen-rank.sh: test hook: $node slowed on purpose after its first step" \
                 "(runs ${run_ms} of every ${period_ms} ms)" >&2

"$@" &
rank=$!
(
    trap 'kill -CONT "$rank" 2>/dev/null' EXIT      # never leave the rank stopped
    until grep -qs '"first_step"' "$engine_log"; do
        kill -0 "$rank" 2>/dev/null || exit 0
        sleep 0.02
    done
    if ((sync_count > 0)); then
        kill -STOP "$rank" 2>/dev/null || exit 0
        mkdir -p "$sync_dir" && : > "$sync_dir/$node"
        deadline=$((SECONDS + sync_s))
        while (($(find "$sync_dir" -maxdepth 1 -type f | wc -l) < sync_count && SECONDS < deadline)); do
            sleep 0.02
        done
        kill -CONT "$rank" 2>/dev/null || exit 0
    fi
    ((slow)) || exit 0
    while kill -STOP "$rank" 2>/dev/null; do
        sleep "$stop_s"
        kill -CONT "$rank" 2>/dev/null || exit 0
        sleep "$run_s"
    done
) &
quota=$!
trap 'kill "$quota" 2>/dev/null; kill -CONT "$rank" 2>/dev/null; kill -TERM "$rank" 2>/dev/null' TERM INT
wait "$rank"
rc=$?
kill "$quota" 2>/dev/null
wait "$quota" 2>/dev/null
kill -CONT "$rank" 2>/dev/null
exit "$rc"
