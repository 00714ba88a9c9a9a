"""scripts/install_vllm.sh picks vLLM's build from the environment's torch, never from the host's nvidia-smi (issue 37,
item 6): a login node without a GPU must install the CUDA build for a CUDA torch, and a GPU host with a CPU torch the
CPU build. ``--which`` prints the choice and installs nothing."""
from __future__ import annotations

import os
from pathlib import Path
from time_limits import run_with_progress

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install_vllm.sh"


def _which(tmp_path: Path, torch_cuda: str | None = None, **env: str) -> tuple[str, bool]:
    """(the script's choice, whether it ran nvidia-smi); ``torch_cuda``: a stand-in torch built with that CUDA."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    called = tmp_path / "nvidia-smi-called"
    shim = bin_dir / "nvidia-smi"
    shim.write_text(f"#!/bin/sh\ntouch {called}\necho 'GPU 0: NVIDIA H100 (UUID: GPU-0)'\n")  # a GPU host
    shim.chmod(0o755)
    environ = {key: value for key, value in os.environ.items() if key != "MIRROR_ES_VLLM_BUILD"}
    environ.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env)
    if torch_cuda is not None:
        fake = tmp_path / "fake" / "torch"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text("from . import version\n__version__ = '2.13.0+cu128'\n")
        (fake / "version.py").write_text(f"cuda = {torch_cuda!r}\n")
        environ["PYTHONPATH"] = str(tmp_path / "fake")
    done = run_with_progress([str(SCRIPT), "--which"], cwd=ROOT, env=environ)
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip()
    return out, called.exists()


def test_a_cpu_torch_gets_the_cpu_build_even_on_a_gpu_host(tmp_path):
    import torch

    choice, ran_nvidia_smi = _which(tmp_path)
    expected = "cuda" if torch.version.cuda else "cpu"  # this environment's own torch decides
    assert choice.split()[0] == expected and f"torch {torch.__version__}" in choice
    assert not ran_nvidia_smi


def test_a_cuda_torch_gets_the_cuda_build_whatever_the_host_has(tmp_path):
    choice, ran_nvidia_smi = _which(tmp_path, torch_cuda="12.8")
    assert choice == "cuda torch 2.13.0+cu128 is built with CUDA 12.8" and not ran_nvidia_smi


def test_the_override_still_wins(tmp_path):
    assert _which(tmp_path, MIRROR_ES_VLLM_BUILD="cpu")[0] == "cpu MIRROR_ES_VLLM_BUILD=cpu"
