"""A single run's trained model in ``<work_dir>/final/``: the one artefact of a member kept whatever
``train.keep_checkpoints`` says (an ES member's outcome is its record; a single run is used afterwards)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from inner_loop.grpo.trainer import MirrorGRPOTrainer
from results.store.layout import FINAL_MODEL_DIR


def save_final_model(trainer: MirrorGRPOTrainer, work_dir: Path) -> Path:
    """Write the trained model (the LoRA adapter when model.lora_r > 0) and tokenizer to ``<work_dir>/final/``.

    Written beside it and renamed into place, so ``final/`` is either absent or whole; it is written before
    result.json, so an ok result of a single run implies its final model is there.
    """
    final, tmp = work_dir / FINAL_MODEL_DIR, work_dir / f".{FINAL_MODEL_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.save_model(str(tmp))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final
