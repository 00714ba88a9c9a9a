"""Pinned CPU numerics (inner_loop/process/pinned.py): what a tiny-preset run computes with, whoever starts it.

The settings only take effect in a process that starts with them, so these tests look at fresh processes: the
state torch and MKL report there, and a member asked for from this (unpinned) test process."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conf_groups import load_group
import inner_loop.process.pinned as numerics
from inner_loop.config import InnerConfig, ModelConfig
from inner_loop.training.warmup import cpu_capabilities, warmup_key

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not numerics.can_pin(), reason="pinned numerics need a CPU with AVX2 and FMA")

_REPORT = "import json; from inner_loop.process import pinned as numerics; print(json.dumps(numerics.in_force().as_dict()))"
_PIN_THEN_REPORT = "from inner_loop.process import pinned as numerics; numerics.pin_this_process(); " + _REPORT


def _state(code: str, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_pinned_process_computes_with_the_pinned_kernels_whatever_its_environment_asked_for():
    asked = [{"ATEN_CPU_CAPABILITY": capability, "MKL_CBWR": "AUTO", "OMP_NUM_THREADS": "2"}
             for capability in cpu_capabilities()]
    for env in asked:
        state = _state(_PIN_THEN_REPORT, **env)
        assert state["pinned"] and state["aten_cpu_capability"] == "AVX2", (env, state)
        assert state["mkl_cbwr_branch"] == "COMPATIBLE" and state["onednn_max_cpu_isa"] == "AVX2", (env, state)


def test_an_unpinned_process_is_told_apart_by_what_torch_and_mkl_report():
    state = _state(_REPORT, ATEN_CPU_CAPABILITY="default")
    assert not state["pinned"] and state["aten_cpu_capability"] == "DEFAULT"
    assert state["mkl_cbwr_branch"] != "COMPATIBLE"  # MKL picks its own path unless told
    mkl_only = _state(_REPORT, ATEN_CPU_CAPABILITY="avx2", MKL_CBWR="COMPATIBLE")  # half the settings is not pinned
    assert mkl_only["mkl_cbwr_branch"] == "COMPATIBLE" and not mkl_only["pinned"]


def test_pinning_refuses_a_process_whose_torch_is_already_loaded():
    import torch  # noqa: F401  (this test process has loaded it)

    with pytest.raises(RuntimeError, match="before torch is imported"):
        numerics.pin_this_process()


def _tiny_inner(**train: object) -> dict:
    inner = {"task": load_group("task", "arith"), "model": load_group("model", "tiny"),
             "divergence": load_group("divergence", "kl"), "train": load_group("train", "default")}
    inner["train"].update(train)
    return inner


def test_the_tiny_preset_pins_and_a_threaded_pinned_run_is_refused_naming_both_keys():
    assert InnerConfig.from_dict(_tiny_inner()).model.cpu_numerics == "pinned"
    with pytest.raises(ValueError, match=r"model.cpu_numerics=pinned .* train.num_threads=2"):
        InnerConfig.from_dict(_tiny_inner(num_threads=2))
    inner = _tiny_inner()
    inner["model"]["cpu_numerics"] = "exact"
    with pytest.raises(ValueError, match="model.cpu_numerics"):
        InnerConfig.from_dict(inner)
    for preset in ("qwen3_1_7b", "smollm2_135m"):  # GPU and CPU presets of real models keep their own numerics
        assert load_group("model", preset).get("cpu_numerics", "native") == "native"


def test_a_warmed_model_is_cached_under_the_numerics_it_was_built_with():
    pinned, native = ModelConfig(cpu_numerics="pinned"), ModelConfig(cpu_numerics="native")
    assert warmup_key(pinned, "base", {"name": "arith"}, 8) != warmup_key(native, "base", {"name": "arith"}, 8)


def test_the_member_entry_decides_before_torch_or_vllm_is_loaded():
    """The entry point must not load torch (the pinning would come too late) nor vLLM (TRL imports it whenever it is
    installed: seconds per member process) before it has read the member's config."""
    code = ("import sys, inner_loop.member.entry as entry; entry.keep_vllm_out_unless_used({'train': {}}); "
            "import importlib.util as u; print('torch' in sys.modules, u.find_spec('vllm') is None)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True"]


_JOB_PROCESS = """
import json, sys, importlib.util
from inner_loop.member.entry import train_member
spec = {"run_id": "r", "generation": 0, "index": 0, "seed": 0, "params": [], "work_dir": sys.argv[1],
        "inner": {"model": {"name": "no_such_model"}, "train": {}, "task": {"name": "arith"}, "divergence": {}}}
record = train_member(spec)
print(json.dumps([record.status, "trl" in sys.modules, importlib.util.find_spec("vllm") is None]))
"""


def test_a_job_process_of_a_member_that_does_not_use_vllm_never_imports_it(tmp_path):
    """TRL imports vLLM whenever it is installed (seconds per member process); in a submitit job's own process the
    entry point keeps it out for a member that does not generate with it (here one whose config is refused)."""
    for executor, hidden in (("local", True), ("", False)):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "SUBMITIT_EXECUTOR": executor}
        done = subprocess.run([sys.executable, "-c", _JOB_PROCESS, str(tmp_path / executor)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        status, trl_loaded, vllm_hidden = json.loads(done.stdout.strip().splitlines()[-1])
        assert status == "failed" and trl_loaded, done.stdout[-2000:]
        assert vllm_hidden == (hidden or importlib.util.find_spec("vllm") is None), executor


def test_a_single_run_restarts_itself_pinned_with_the_work_dir_it_resolved(monkeypatch):
    """`python -m inner_loop.run` of a pinned preset execs itself under PINNED_ENV (one torch import, not a second in
    a pinned child), keeping every override but naming the work_dir it resolved (a ``${now:...}`` default would name
    another folder in the new process)."""
    import inner_loop.run as single

    seen = {}

    def execve(path, argv, env):
        seen.update(path=path, argv=argv, env=env)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.setattr(sys, "orig_argv", ["python", "-X", "utf8", "-m", "inner_loop.run", "work_dir=a", "seed=1",
                                           "++work_dir=b", "train.steps=3"])
    with pytest.raises(SystemExit):
        single._restart_pinned("/runs/resolved")
    assert seen["path"] == sys.executable
    assert seen["argv"] == [sys.executable, "-X", "utf8", "-m", "inner_loop.run", "seed=1", "train.steps=3",
                            "work_dir=/runs/resolved"]
    assert all(seen["env"][key] == value for key, value in numerics.PINNED_ENV.items())


def test_a_pinned_single_run_validates_in_its_restarted_process(tmp_path):
    """The restart is real (exec under PINNED_ENV, then Hydra and the checks again): a config error found after it
    still exits 2 naming the key and writes nothing."""
    done = subprocess.run([sys.executable, "-m", "inner_loop.run", "train.batch_size=30", "model.warmup_max_steps=0"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr[-2000:]
    output = done.stdout + done.stderr
    assert "restarting under the pinned numerics" in output and "batch_size" in done.stderr
    assert list(tmp_path.iterdir()) == []
