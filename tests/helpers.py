"""What tests in more than one folder build: one definition each, imported where used (tests/ is on sys.path in every
test session: tests/conftest.py's folder)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from conf_groups import load_group
from time_limits import scaled

#: the save-on-notice member's steps (tests/inner_loop/process/test_save_on_notice.py and its SLURM twin)
NOTICE_STEPS = 24
NOTICE_MODEL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "warmup_max_steps": 200,
               "warmup_band": [0.0, 1.0], "warmup_check_every": 200, "warmup_probe_size": 32, "warmup_lr": 3e-3,
               "warmup_batch_size": 32}


def notice_spec(work_dir: Path) -> dict:
    """A tiny pinned member of NOTICE_STEPS steps that saves no periodic checkpoint before its last step."""
    inner = {"task": load_group("task", "arith"), "model": {**load_group("model", "tiny"), **NOTICE_MODEL},
             "divergence": load_group("divergence", "neural_mirror"), "train": load_group("train", "default")}
    inner["train"].update({"steps": NOTICE_STEPS, "batch_size": 16, "group_size": 4, "save_every": NOTICE_STEPS,
                           "val_size": 32, "max_completion_length": 6})
    return {"run_id": "notice", "generation": 0, "index": 0, "seed": 3, "params": [], "work_dir": str(work_dir),
            "inner": inner}


def same_outcome(record, reference) -> tuple:
    """The numbers a noticed run must share with its uninterrupted reference, side by side."""
    return (record.fitness, record.mean_response_tokens, record.diagnostics.get("reward_mean")), \
        (reference.fitness, reference.mean_response_tokens, reference.diagnostics.get("reward_mean"))


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until ``path`` exists, ``proc`` has ended or ``timeout`` (scaled) has passed; the caller checks which."""
    deadline = time.monotonic() + scaled(timeout)
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
