"""Prompt text and completion ends: what the policy sees and where its completions stop.

Shared by training (inner_loop/training/setup.py) and evaluation (inner_loop/training/evaluate.py), so validation scores the
same prompts and endings the policy trained on.
"""
from __future__ import annotations

from typing import Any, Mapping


def format_prompt(tokenizer, prompt: str, chat_template: bool,
                  chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The exact text the policy sees, shared by training and evaluation so both score the same thing.

    TRL tokenizes plain-string prompts with the tokenizer's special tokens (`processing_class(text=...)`), and so
    does evaluation (`encode_prompts`). A chat template that writes the BOS itself would then get a second BOS
    from a tokenizer that adds one, so that leading BOS is dropped from the text here: the ids fed to the model
    are then those of ``apply_chat_template(tokenize=True)``.
    """
    if not chat_template:
        return prompt
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True,
        **dict(chat_template_kwargs or {}),
    )
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        text = text[len(bos):]
    return text


def _adds_bos(tokenizer) -> bool:
    """Whether tokenizing with special tokens puts the BOS first (Llama-style `add_bos_token`)."""
    ids = tokenizer("x", add_special_tokens=True)["input_ids"]
    return tokenizer.bos_token_id is not None and bool(ids) and ids[0] == tokenizer.bos_token_id


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion, as TRL's GRPOTrainer computes it (trl/trainer/grpo_trainer.py, __init__):
    the model's generation_config eos ids (Qwen3: <|im_end|> and <|endoftext|>) with the tokenizer's eos first
    when missing. Evaluation stops on this same set so its completions end where training's do."""
    declared = model.generation_config.eos_token_id
    ids = [] if declared is None else [declared] if isinstance(declared, int) else list(declared)
    if tokenizer.eos_token_id not in ids:
        ids = [tokenizer.eos_token_id, *ids]
    return ids
