#!/usr/bin/env bash
# One pass over a short GPU allocation (scripts/gpu_pass.py): CUDA, the bundle, the CUDA tests, the acceptance run and
# the decode/sharing benches, in order of value, within --budget-min, each figure appended to --record as it is
# measured (a second call skips what is there). Python: $PYTHON, else .venv/bin/python, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/project_python.sh
exec "$PY" scripts/gpu_pass.py "$@"
