#!/usr/bin/env bash
# The bundle an air-gapped GPU node lacks (scripts/node_bundle.py): wheels for the node's Python of what its package
# list lacks of the project's pins, and Debian's bubblewrap. Run on a machine with a package registry.
#   scripts/node_bundle.sh --node-packages node-freeze.txt --role job --out .node_bundle
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/project_python.sh
exec "$PY" scripts/node_bundle.py "$@"
