#!/usr/bin/env bash
# Set up (idempotent) with vLLM (scripts/install_vllm.sh), start the local one-node SLURM cluster for tests/slurm,
# run the whole test suite, stop the cluster. Extra arguments go to pytest. Where the cluster cannot be started (no
# root, no apt), the SLURM tests skip with the reason shown in pytest's summary. MIRROR_ES_WITHOUT_VLLM=1 runs the
# suite without installing vLLM (its tests then skip, and fail only if vLLM is required).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${MIRROR_ES_WITHOUT_VLLM:-}" ]; then
    ./scripts/install_vllm.sh   # the set-up and vLLM in one pip pass
    export MIRROR_ES_REQUIRE_VLLM=1   # installed: a vLLM test that cannot import it fails, never skips
else
    ./scripts/setup.sh
fi
if scripts/local_slurm/up.sh; then
    trap 'scripts/local_slurm/down.sh >/dev/null 2>&1 || true' EXIT
    export MIRROR_ES_REQUIRE_SLURM=1   # the cluster is up: a SLURM test that cannot reach it fails, never skips
else
    echo "test: the local SLURM cluster could not start; tests/slurm will skip" >&2
fi
# The SLURM tests (tests/slurm, one after another: they share one cluster whose nodes some of them take down) run in
# a pytest session of their own beside the rest, which MIRROR_ES_TEST_WORKERS pytest-xdist workers share file by file
# (default 2; 0: one process). Most SLURM tests wait on the scheduler, so the two sessions overlap well on 2 cores.
# Arguments that name tests (an existing file or folder, with or without ::test) run in one session, as given.
# Threads that wait for work sleep instead of spinning: the sessions' processes share two cores, where a spinning
# OpenMP thread burns the time another process needs (measured: the loss tests in-process, 15.9/14.9 -> 13.8/13.2
# user CPU-s; numerics are unchanged, the thread counts are the same).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
WORKERS=${MIRROR_ES_TEST_WORKERS:-2}
PYTEST=(.venv/bin/python -m pytest -q)
# (in collection order, which tests/conftest.py starts with the longest files: LONGEST_FIRST)
if [ "$WORKERS" != 0 ]; then SPREAD=(-n "$WORKERS" --dist loadfile --no-loadscope-reorder); else SPREAD=(); fi
for arg in "$@"; do
    if [ -e "${arg%%::*}" ]; then "${PYTEST[@]}" "${SPREAD[@]}" "$@"; exit $?; fi
done
# The heavy test files (each takes every core: a whole job, a vLLM engine) run one at a time across both sessions:
# one worker runs them in turn, and they lock one file (tests/heavy_lock.py). Time limits follow progress, not the clock (tests/time_limits.py).
export MIRROR_ES_HEAVY_LOCK
MIRROR_ES_HEAVY_LOCK=$(mktemp "${TMPDIR:-/tmp}/mirror-es-heavy.XXXXXX.lock")
# (each session in pytest's own numbered temp dir: the SLURM tests recognise an interrupted session's jobs by it)
SLURM_LOG=$(mktemp "${TMPDIR:-/tmp}/mirror-es-slurm-tests.XXXXXX.log")
# One empty model cache for both sessions (tests/conftest.py): the tiny model's warm-up is built once, not per session.
export MIRROR_ES_SUITE_CACHE
MIRROR_ES_SUITE_CACHE=$(mktemp -d "${TMPDIR:-/tmp}/mirror-es-suite-cache.XXXXXX")
"${PYTEST[@]}" "$@" tests/slurm >"$SLURM_LOG" 2>&1 &
SLURM_PID=$!
set +e
"${PYTEST[@]}" "${SPREAD[@]}" --ignore=tests/slurm "$@"
MAIN=$?
wait "$SLURM_PID"
SLURM=$?
set -e
echo "=================================== tests/slurm (its own session, run alongside) ==================================="
cat "$SLURM_LOG"
rm -f "$MIRROR_ES_HEAVY_LOCK"
rm -rf "$MIRROR_ES_SUITE_CACHE"
[ "$SLURM" = 5 ] && SLURM=0   # 5: no test collected
[ "$MAIN" = 0 ] && [ "$SLURM" = 0 ]
