#!/usr/bin/env bash
# Set up (idempotent) and run the main job: the ES search on the embedded default (tiny model, arith task,
# local launcher). Extra arguments are Hydra overrides, e.g. `scripts/main.sh population=8 generations=3`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m meta.run "$@"
