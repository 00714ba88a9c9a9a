# Sourced by the scripts that run the project's Python on a machine that may have no .venv (a GPU node with the node
# bundle on PYTHONPATH): sets PY to $PYTHON, else .venv/bin/python, else python3. Run from the repository's root.
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
