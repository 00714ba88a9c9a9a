#!/usr/bin/env bash
# Set up (idempotent) with vLLM (scripts/install_vllm.sh), start the local one-node SLURM cluster for tests/slurm,
# run the whole test suite, stop the cluster. Extra arguments go to pytest. Where the cluster cannot be started (no
# root, no apt), the SLURM tests skip with the reason shown in pytest's summary. MIRROR_ES_WITHOUT_VLLM=1 runs the
# suite without installing vLLM (its tests then skip, and fail only if vLLM is required).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ -z "${MIRROR_ES_WITHOUT_VLLM:-}" ]; then
    ./scripts/install_vllm.sh
    export MIRROR_ES_REQUIRE_VLLM=1   # installed: a vLLM test that cannot import it fails, never skips
fi
if scripts/local_slurm/up.sh; then
    trap 'scripts/local_slurm/down.sh >/dev/null 2>&1 || true' EXIT
    export MIRROR_ES_REQUIRE_SLURM=1   # the cluster is up: a SLURM test that cannot reach it fails, never skips
else
    echo "test: the local SLURM cluster could not start; tests/slurm will skip" >&2
fi
# One process, one test after another (MIRROR_ES_TEST_WORKERS=0, the default). MIRROR_ES_TEST_WORKERS=N (or auto)
# spreads the test files over N pytest-xdist workers, every SLURM test in one of them (tests/conftest.py). On this
# project's 2-core CI machine that saved 5 of 38 minutes and made a SLURM node-failure test miss its deadline under
# the load, so CI stays serial.
.venv/bin/python -m pytest -q -n "${MIRROR_ES_TEST_WORKERS:-0}" --dist loadgroup "$@"
