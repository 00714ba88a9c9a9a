#!/usr/bin/env bash
# The GPU acceptance run (scripts/gpu_check.py): the CUDA tests, then the main job (meta.run -> re-evaluation ->
# export -> a single run with the export) on this machine's GPU, offline, at most ~8 minutes on one H100; every record
# must name the CUDA device. Without CUDA it runs the same path on the CPU at small shapes. Python: $PYTHON, else
# .venv/bin/python, else python3 (a GPU machine without a package registry: docs/gpus.md "Acceptance run").
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/project_python.sh
exec "$PY" scripts/gpu_check.py "$@"
