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
from inner_loop.numerics.fingerprint import DIGEST_KEYS, FINGERPRINT_FILE, compare, matched_cpus, references
from inner_loop.training.warmup import cpu_capabilities
from time_limits import run_with_progress

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not numerics.can_pin(), reason="pinned numerics need a CPU with AVX2 and FMA")]


def _fingerprint(env: dict[str, str], imports: Path) -> tuple[int, dict, str]:
    """The check's exit code, digests and stderr's tail; ``imports`` gets every module its process imported."""
    probe = {"PYTHONPATH": f"{ROOT / 'tests' / 'import_probe'}{os.pathsep}{ROOT}", "MIRROR_ES_IMPORT_LOG": str(imports)}
    done = run_with_progress([sys.executable, "-m", "inner_loop.fingerprint", "--check"], cwd=ROOT,
                             env={**os.environ, **env, **probe})
    found = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    return done.returncode, found, done.stderr[-3000:]


def _recorded_for_this_cpu(recorded: dict) -> bool:
    """A recorded digest set names this CPU (vendor and model name)."""
    here = (numerics.cpu_vendor(), numerics.cpu_name())
    return any((cpu.get("cpu_vendor"), cpu.get("cpu_model")) == here
               for reference in references(recorded) for cpu in reference.get("checked_on", []))


def test_the_fingerprint_matches_the_recorded_digests_whatever_kernels_the_caller_asks_for(tmp_path):
    # the caller asks for ATen's lowest kernel level on this CPU (scalar code; the pinned one is avx2), MKL's
    # automatic path and two threads: everything the pinning must override in the run's own process (the whole
    # suite under other settings is docs/numerics.md's check of a machine)
    asked = {"ATEN_CPU_CAPABILITY": cpu_capabilities()[0], "MKL_CBWR": "AUTO", "OMP_NUM_THREADS": "2"}
    code, found, stderr = _fingerprint(asked, tmp_path / "imports.jsonl")
    recorded = json.loads(FINGERPRINT_FILE.read_text())
    assert code in (0, 1), f"{asked}: {stderr}"
    # its run does not generate with vLLM, so its process never imports it (TRL would, where it is installed)
    imported = {json.loads(line)["module"] for line in (tmp_path / "imports.jsonl").read_text().splitlines()}
    assert "trl" in imported and "vllm" not in imported
    assert found["numerics"]["pinned"] and found["numerics"]["torch_threads"] == 1, found["numerics"]
    assert recorded["checked_on"], "the CPUs the digests were checked on are listed"
    if _recorded_for_this_cpu(recorded) or compare(found, recorded) == []:
        assert code == 0 and compare(found, recorded) == [], f"{asked}: {stderr}"  # its CPU's recorded set, whole
        assert matched_cpus(found, recorded), "the recorded set it matched names the CPUs it was seen on"
        return
    # A CPU no recorded set names (pinned numbers can differ between CPU models: docs/numerics.md): the pinning's
    # own claim still holds here, the same digests whatever the caller asks for (the caller's defaults this time).
    code_again, again, stderr_again = _fingerprint({}, tmp_path / "imports_again.jsonl")
    assert code_again == code, stderr_again
    assert {key: again[key] for key in DIGEST_KEYS} == {key: found[key] for key in DIGEST_KEYS}, asked
