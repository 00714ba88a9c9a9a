"""scripts/gpu_check.sh, the GPU acceptance run, on this machine's CPU: the same path as on a GPU (meta.run with the
mbpp_qwen3 preset on a model of Qwen3-1.7B's architecture, the MBPP fixture, offline; re-evaluation, export, a
single run with the export), at small shapes, the CUDA parts skipped with the reason shown. On a GPU machine the
script is run by hand (docs/gpus.md "Acceptance run"); this test keeps it working between loans."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_the_acceptance_run_trains_every_record_on_the_device_it_names(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--work", str(tmp_path / "job"),
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "CUDA tests" in done.stderr and "skipped: no usable CUDA device" in done.stderr
    summary = json.loads(out.read_text())
    rows = summary["rows"]
    # 1 generation x (2 members + the control), 4 selection runs, 4 reporting runs (the export and the base model
    # on 2 seeds), the single run with the exported init
    assert len(rows) == 3 + 4 + 4 + 1
    assert {r["status"] for r in rows} == {"ok"} and {r["device_type"] for r in rows} == {"cpu"}
    assert all(r["step_s"] for r in rows if r["steps"])
    assert "gpu_check: OK" in done.stdout
