"""The base policy: which weights (tiny, SmolLM2, Qwen3, any hub id or path), loaded from where, with which adapter.

Every model this returns is loaded from a directory or hub id: the built ones come from the model cache
(inner_loop/models/cache.py) so concurrent population members share one copy and TRL can reload the reference.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from inner_loop.models.model_config import ModelConfig
from inner_loop.models.registry import model_entry

logger = logging.getLogger(__name__)

#: what a trained model's folder (a single run's final/) holds: a PEFT adapter, or a full transformers model
ADAPTER_CONFIG_FILE = "adapter_config.json"
FULL_MODEL_CONFIG_FILE = "config.json"
LORA_ADAPTER = "lora_adapter"
FULL_MODEL = "full_model"


def resolve_model_dir(cfg: ModelConfig) -> str:
    """A local directory or hub id from which `from_pretrained` loads the base policy (warm-up excluded)."""
    if cfg.name_or_path:
        path = Path(cfg.name_or_path).expanduser()
        if (cfg.name_or_path.startswith((".", "/", "~")) or path.exists()) and not path.is_dir():
            raise ValueError(f"model.name_or_path={cfg.name_or_path!r}: no such model directory")
        return str(path) if path.is_dir() else cfg.name_or_path
    entry = model_entry(cfg.name)
    local = entry.local_dir(cfg) if entry is not None else None
    if local is not None:
        return str(local)
    if entry is not None and entry.hub_id:
        return entry.hub_id
    raise ValueError(f"model.name={cfg.name!r} needs model.name_or_path")


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _load(cfg: ModelConfig, path: str, tokenizer_path: str | None = None):
    """(model, tokenizer) as saved in ``path`` (the tokenizer from ``tokenizer_path`` when given), padded left."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(cfg.dtype))
    except OSError as exc:
        raise ValueError(
            f"could not load model {path!r} ({exc}); hub models need the weights in the local HF cache or network"
        ) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def load_policy(cfg: ModelConfig, path: str, seed: int = 0):
    """(model, tokenizer) from ``path``; with ``cfg.lora_r`` > 0 the model is wrapped in a fresh LoRA adapter whose
    random init is drawn from ``seed`` alone.

    Why the seed: PEFT draws the adapter's A matrices from torch's global generator, which the Trainer seeds only
    later, so they came from whatever ran before in the process: the first member of a process started from
    another adapter than the members after it (the same after step 1, where B = 0 hides A; apart from step 2 on)."""
    model, tokenizer = _load(cfg, path)
    if cfg.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=list(cfg.lora_target_modules),
            task_type="CAUSAL_LM",
        )
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=cuda):  # the global generators are left as they were
            torch.manual_seed(seed)
            model = get_peft_model(model, lora)
    return model, tokenizer


def trained_model_source(cfg: ModelConfig, folder: Path) -> str:
    """``lora_adapter`` or ``full_model``: what a run with ``cfg`` saved in ``folder`` (its final/); ValueError
    when the folder does not hold it. Cheap (two file checks): callers ask it before loading anything."""
    if cfg.lora_r > 0:
        if not (folder / ADAPTER_CONFIG_FILE).is_file():
            raise ValueError(f"{folder} holds no LoRA adapter ({ADAPTER_CONFIG_FILE}) though the run trained one "
                             f"(model.lora_r={cfg.lora_r})")
        return LORA_ADAPTER
    if not (folder / FULL_MODEL_CONFIG_FILE).is_file():
        raise ValueError(f"{folder} holds no model ({FULL_MODEL_CONFIG_FILE})")
    return FULL_MODEL


def _adapter_base(cfg: ModelConfig, folder: Path) -> str:
    """The base model under a saved adapter: the one it was trained on (recorded by PEFT), or, where that folder
    is gone (a cleared model cache), the same weights rebuilt from ``cfg``; a warmed base cannot be rebuilt here
    (its warm-up needs the run's task), so that case is an error rather than a silently different base."""
    recorded = json.loads((folder / ADAPTER_CONFIG_FILE).read_text()).get("base_model_name_or_path")
    if isinstance(recorded, str) and recorded and Path(recorded).is_dir():
        return recorded
    if cfg.warmup_max_steps:
        raise ValueError(f"the warmed base model {recorded!r} under the adapter in {folder} is gone (model cache "
                         "cleared?); rebuild it by training the run's config again")
    return resolve_model_dir(cfg)


def load_trained(cfg: ModelConfig, folder: Path):
    """(model, tokenizer, source) of a trained model saved in ``folder`` (a single run's final/): the LoRA adapter
    on its base model when ``cfg.lora_r`` > 0, else the full model; the tokenizer saved with it."""
    source = trained_model_source(cfg, folder)
    saved_tokenizer = str(folder) if (folder / "tokenizer_config.json").is_file() else None
    if source == FULL_MODEL:
        model, tokenizer = _load(cfg, str(folder), saved_tokenizer)
        return model, tokenizer, source
    from peft import PeftModel

    base = _adapter_base(cfg, folder)
    model, tokenizer = _load(cfg, base, saved_tokenizer)
    logger.info("loading the LoRA adapter in %s on %s", folder, base)
    return PeftModel.from_pretrained(model, str(folder)), tokenizer, source
