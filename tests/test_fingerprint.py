"""`python -m inner_loop.fingerprint --check`: this machine computes the embedded default's warm-up, a 60-step run's
completions and its final weights bit for bit as one of the machines the repository records did, whatever kernels, MKL path and threads the
caller's environment asks for (the pinning sets them in the run's own process), each from an empty model cache."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import inner_loop.process.pinned as numerics
from inner_loop.numerics.fingerprint import FINGERPRINT_FILE, compare, matched_cpus
from inner_loop.training.warmup import cpu_capabilities
from time_limits import run_with_progress

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not numerics.can_pin(), reason="pinned numerics need a CPU with AVX2 and FMA")]


def _fingerprint(env: dict[str, str]) -> tuple[int, dict, str]:
    done = run_with_progress([sys.executable, "-m", "inner_loop.fingerprint", "--check"], cwd=ROOT,
                             env={**os.environ, **env})
    found = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    return done.returncode, found, done.stderr[-3000:]


def test_the_fingerprint_matches_the_recorded_digests_whatever_kernels_the_caller_asks_for():
    # the caller asks for ATen's lowest kernel level on this CPU (scalar code; the pinned one is avx2), MKL's
    # automatic path and two threads: everything the pinning must override in the run's own process (the whole
    # suite under other settings is docs/numerics.md's check of a machine)
    asked = {"ATEN_CPU_CAPABILITY": cpu_capabilities()[0], "MKL_CBWR": "AUTO", "OMP_NUM_THREADS": "2"}
    code, found, stderr = _fingerprint(asked)
    recorded = json.loads(FINGERPRINT_FILE.read_text())
    assert code == 0, f"{asked}: {stderr}"
    assert compare(found, recorded) == [], asked  # one of the recorded machines' digests, each key equal
    assert matched_cpus(found, recorded), "the recorded set it matched names the CPUs it was seen on"
    assert found["numerics"]["pinned"] and found["numerics"]["torch_threads"] == 1, found["numerics"]
    assert recorded["checked_on"], "the CPUs the digests were checked on are listed"
