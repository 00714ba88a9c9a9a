"""The GPU's compute mode, read before k >= 2 members share one card (``resources.members_per_gpu``).

Why: HPC sites often run their GPUs in EXCLUSIVE_PROCESS mode (one CUDA context per device) without an MPS server.
There the second member process on a card cannot create its context and fails in its trainer's setup, every time,
after its partner has loaded: half of every generation charged ``fitness_on_failure`` for the node's setting. Read
here (``nvidia-smi``, the driver's own tool, no extra package), the pre-flight refuses the node with the reason and
the fix instead (inner_loop/member/preflight.py).

With an MPS server (its control pipe in ``CUDA_MPS_PIPE_DIRECTORY``, default ``/tmp/nvidia-mps``) every client shares
the server's one context, so EXCLUSIVE_PROCESS is fine. ``PROHIBITED`` allows no context at all.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Mapping

from core.keys import MEMBER_GPU_SHARERS_KEY

logger = logging.getLogger(__name__)

#: nvidia-smi's names of the compute modes that allow one process's context per device, or none
EXCLUSIVE_PROCESS = "Exclusive_Process"
PROHIBITED = "Prohibited"
#: where an MPS server keeps its control pipe when CUDA_MPS_PIPE_DIRECTORY is not set
DEFAULT_MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"
QUERY_TIMEOUT_S = 30.0


def gpu_compute_modes() -> list[str]:
    """The compute mode of each GPU this process may use (``CUDA_VISIBLE_DEVICES`` honoured), as nvidia-smi names
    it ("Default", "Exclusive_Process", "Prohibited"); [] where nvidia-smi is absent or fails (then nothing is known,
    and nothing is refused for it)."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return []
    command = [tool, "--query-gpu=compute_mode", "--format=csv,noheader"]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and all(part.strip().isdigit() or part.strip().startswith("GPU-") for part in visible.split(",")):
        command.insert(1, f"--id={visible}")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("could not read the GPUs' compute mode (%s): not checked", exc)
        return []
    if done.returncode != 0:
        logger.warning("nvidia-smi could not read the GPUs' compute mode (%s): not checked",
                       (done.stderr or done.stdout).strip()[-300:])
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def mps_running() -> bool:
    """Whether an MPS control daemon serves this node (its control pipe exists)."""
    pipe_dir = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_MPS_PIPE_DIRECTORY)
    return (pipe_dir / "control").exists()


def sharing_refusal(inner: Mapping[str, Any]) -> str:
    """Why k >= 2 members cannot share this node's GPU (its compute mode allows one context per device, no MPS
    server), naming the key and the fix; "" when they can, or when they do not share."""
    k = inner.get(MEMBER_GPU_SHARERS_KEY) or 1
    if not isinstance(k, int) or k < 2:
        return ""
    modes = gpu_compute_modes()
    blocking = sorted({mode for mode in modes if mode in (EXCLUSIVE_PROCESS, PROHIBITED)})
    if not blocking:
        return ""
    if blocking == [EXCLUSIVE_PROCESS] and mps_running():
        logger.info("pre-flight: the GPU is in %s compute mode, and an MPS server shares it", EXCLUSIVE_PROCESS)
        return ""
    return (f"the GPU's compute mode is {', '.join(blocking)} (nvidia-smi) and no MPS server runs here, so only one "
            f"process can use it, but resources.members_per_gpu={k} puts {k} member processes on it: set "
            "resources.members_per_gpu=1, or run on GPUs in Default compute mode or with MPS (docs/gpus.md)")
