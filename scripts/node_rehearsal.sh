#!/usr/bin/env bash
# A rehearsal of a bare, air-gapped GPU node on this machine (docs/gpus.md "Air-gapped nodes"): a venv of the node's
# Python (3.12 from pyenv) holding torch 2.11.0 (PyPI's build runs on a CPU) and the node's own versions of the packages
# its list names, none of the project's other dependencies; then the node bundle (scripts/node_bundle.sh) installed
# the way the node installs it (pip --no-index --no-deps --target), and scripts/gpu_check.sh --device cpu run there
# with an empty model cache. It downloads a few GB (torch and its CUDA libraries) once; not run in CI.
#
#   scripts/node_rehearsal.sh [--node-packages FILE] [--role job|member] [--dir DIR]
# Defaults: the node list in tests/fixtures/gpu_node_packages.txt, role job, DIR /tmp/mirror-es-node-rehearsal.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
LIST=$ROOT/tests/fixtures/gpu_node_packages.txt
ROLE=job
DIR=${TMPDIR:-/tmp}/mirror-es-node-rehearsal
while [ $# -gt 0 ]; do
    case "$1" in
        --node-packages) LIST=$(realpath "$2"); shift 2 ;;
        --role) ROLE=$2; shift 2 ;;
        --dir) DIR=$2; shift 2 ;;
        *) echo "node_rehearsal: unknown argument $1" >&2; exit 2 ;;
    esac
done
START=$(date +%s)
PY312=$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -1 || true)
PY312=${PY312:-$(command -v python3.12 || true)}
[ -n "$PY312" ] || { echo "node_rehearsal: no Python 3.12 here (pyenv install 3.12)" >&2; exit 2; }
./scripts/setup.sh   # the machine building the bundle: the project's venv, its pip
mkdir -p "$DIR"
BUNDLE=$DIR/bundle SITE=$DIR/site VENV=$DIR/node-venv
# 1. the bundle, as a cluster user builds it on a login node
.venv/bin/python scripts/node_bundle.py --node-packages "$LIST" --role "$ROLE" --out "$BUNDLE"
# 2. the node: its Python with the node's versions of what the bundle counts on it to have
if [ ! -x "$VENV/bin/python" ]; then "$PY312" -m venv "$VENV"; fi
NODE_REQS=$(.venv/bin/python - "$LIST" "$BUNDLE/manifest.json" <<'EOF'
import json, sys
sys.path.insert(0, "scripts")
from node_bundle import parse_node_packages
node = parse_node_packages(open(sys.argv[1]).read())
manifest = json.load(open(sys.argv[2]))
# the packages the bundle leaves to the node, plus the node's own torch stack and those the bundle shadows
names = set(manifest["from_node"]) | set(manifest["shadowed"]) | {"torch", "transformers", "accelerate", "numpy",
                                                                   "safetensors", "tokenizers", "huggingface-hub"}
print(" ".join(f"{n}=={node[n]}" if node.get(n) else n for n in sorted(names) if n in node))
EOF
)
echo "node_rehearsal: the node's packages: $NODE_REQS" >&2
"$VENV/bin/python" -m pip install -q --disable-pip-version-check $NODE_REQS
# none of the project's pins the bundle brings may already be in the node's venv (but the node's own versions of what
# it shadows); what the node's packages need themselves (tzdata for pandas, ...) is the node's
.venv/bin/python - "$BUNDLE/manifest.json" "$VENV" <<'EOF'
import json, subprocess, sys
sys.path.insert(0, "scripts")
from node_bundle import canonical, project_pins
manifest = json.load(open(sys.argv[1]))
listed = subprocess.run([f"{sys.argv[2]}/bin/python", "-m", "pip", "list", "--format=json"], capture_output=True,
                        text=True, check=True).stdout
have = {canonical(p["name"]) for p in json.loads(listed)}
extra = sorted(set(manifest["bring"]) & have & set(project_pins()) - set(manifest["shadowed"]))
if extra:
    sys.exit(f"node_rehearsal: the node venv already has project pins the bundle brings: {extra}")
EOF
# 3. the two lines the node runs
rm -rf "$SITE"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --target "$SITE" \
    "$BUNDLE"/wheels/*.whl
export PYTHONPATH=$ROOT:$SITE PATH=$BUNDLE/bin:$PATH
# 4. the acceptance run there, offline, with an empty model cache
export MIRROR_ES_CACHE=$DIR/cache HF_HOME=$DIR/hf
rm -rf "$MIRROR_ES_CACHE" "$HF_HOME"
rm -f "$DIR/pass.jsonl"
PYTHON=$VENV/bin/python scripts/gpu_pass.sh --device cpu --only bundle --bundle "$BUNDLE" --record "$DIR/pass.jsonl" \
    --budget-min 5 || { [ $? = 3 ] || exit 1; }
PYTHON=$VENV/bin/python scripts/gpu_check.sh --device cpu --work "$DIR/job"
SIZE=$(du -sm "$BUNDLE" | cut -f1)
echo "node_rehearsal: passed in $(( $(date +%s) - START )) s; bundle $SIZE MiB ($(ls "$BUNDLE"/wheels | wc -l) wheels, role $ROLE)"
