"""Training and evaluation feed the policy the same prompt ids and stop completions on the same eos ids.

The training side is TRL's own code: GRPOTrainer._tokenize_prompts (plain-string prompts go through
`processing_class(text=prompts)`, i.e. WITH the tokenizer's special tokens) and GRPOTrainer.__init__'s eos list.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from tokenizers.processors import TemplateProcessing
from trl import GRPOConfig, GRPOTrainer

from inner_loop.config import ModelConfig
from inner_loop.training.evaluate import _response_lengths, encode_prompts, generate
from inner_loop.models.loading import load_policy
from inner_loop.models.prompts import eos_token_ids, format_prompt
from inner_loop.models.smollm2 import smollm2_model_dir
from inner_loop.models.tiny import build_tiny_model, build_tiny_tokenizer

PROMPT = "What is 2+3?"
# A Qwen3-like template: BOS written by the template itself, and a thinking branch switched by enable_thinking.
THINKING_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}"
    "[nothink]{% else %}[think]{% endif %}{% endif %}"
)


def _trl_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    """The prompt ids TRL 1.16 builds for plain-string prompts, by calling its own method (only
    `processing_class` is read on that path)."""
    ids, _, _ = GRPOTrainer._tokenize_prompts(SimpleNamespace(processing_class=tokenizer), texts)
    return [list(row) for row in ids]


def _eval_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    """The ids evaluation.generate feeds model.generate, padding removed."""
    enc = encode_prompts(tokenizer, texts)
    return [[t for t, m in zip(row, mask) if m] for row, mask in zip(enc["input_ids"].tolist(),
                                                                   enc["attention_mask"].tolist())]


def _bos_adding_thinking_tokenizer():
    """The tiny tokenizer made Llama-like (adds BOS) with a chat template that branches on enable_thinking."""
    tok = build_tiny_tokenizer()
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, tok.bos_token_id)])
    tok.chat_template = THINKING_TEMPLATE
    assert tok("x")["input_ids"][0] == tok.bos_token_id  # the setup really adds a BOS
    return tok


def test_tiny_model_prompt_ids_match_trl():
    tok = build_tiny_tokenizer()
    texts = [format_prompt(tok, p, chat_template=False) for p in (PROMPT, "1+1=")]
    assert _eval_ids(tok, texts) == _trl_ids(tok, texts)


def test_bos_adding_tokenizer_gets_exactly_one_bos_in_both_and_the_kwargs_reach_the_template():
    tok = _bos_adding_thinking_tokenizer()
    text = format_prompt(tok, PROMPT, chat_template=True, chat_template_kwargs={"enable_thinking": False})
    assert text.endswith("<assistant>[nothink]")
    assert _eval_ids(tok, [text]) == _trl_ids(tok, [text])
    # ...and they are the ids of the chat template itself: one BOS, not two, not none.
    direct = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=True, return_dict=True,
                                     add_generation_prompt=True, enable_thinking=False)["input_ids"]
    assert _eval_ids(tok, [text])[0] == list(direct)
    assert _eval_ids(tok, [text])[0].count(tok.bos_token_id) == 1
    default = format_prompt(tok, PROMPT, chat_template=True)
    assert default.endswith("<assistant>[think]")


def test_smollm2_prompt_ids_match_trl():
    path = smollm2_model_dir(ModelConfig(name="smollm2_135m"))
    _, tok = load_policy(ModelConfig(name="smollm2_135m", chat_template=True), str(path))
    text = format_prompt(tok, PROMPT, chat_template=True)
    assert "<|im_start|>assistant" in text
    assert _eval_ids(tok, [text]) == _trl_ids(tok, [text])
    direct = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=True, return_dict=True,
                                     add_generation_prompt=True)["input_ids"]
    assert _eval_ids(tok, [text])[0] == list(direct)


def _tiny_with_two_eos(second: int):
    tok = build_tiny_tokenizer()
    model = build_tiny_model(ModelConfig(), len(tok), tok)
    model.generation_config.eos_token_id = [tok.eos_token_id, second]
    return model, tok


def test_eos_ids_are_trls_and_prompt_ids_match_a_real_grpo_trainer(tmp_path):
    tok = build_tiny_tokenizer()
    second = tok.convert_tokens_to_ids("!")
    model, tok = _tiny_with_two_eos(second)
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=4, report_to=[], use_cpu=True, save_strategy="no")
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=lambda completions, **_: [0.0] * len(
        completions), args=args, train_dataset=Dataset.from_dict({"prompt": [PROMPT, "1+1="]}))
    assert eos_token_ids(model, tok) == trainer.eos_token_ids == [tok.eos_token_id, second]
    assert trainer.generation_config.eos_token_id == eos_token_ids(model, tok)
    texts = [PROMPT, "1+1="]
    assert _eval_ids(tok, texts) == [list(r) for r in trainer._tokenize_prompts(texts)[0]]


def test_response_lengths_stop_at_any_eos_id():
    generated = torch.tensor([[5, 7, 9, 9], [5, 2, 9, 9], [5, 5, 5, 5], [5, 0, 0, 0]])
    assert _response_lengths(generated, [2, 7], pad_id=0) == [2, 2, 4, 1]


def test_generation_stops_on_the_models_second_eos_id():
    tok = build_tiny_tokenizer()
    model = build_tiny_model(ModelConfig(), len(tok), tok)
    # The token greedy decoding emits first becomes the model's second eos id: generation must end right there.
    first = model.generate(**encode_prompts(tok, [PROMPT]), max_new_tokens=1, do_sample=False,
                           pad_token_id=tok.pad_token_id)[0, -1].item()
    if first == tok.eos_token_id:
        pytest.skip("the tiny model's first greedy token is already its eos")
    model.generation_config.eos_token_id = [tok.eos_token_id, first]
    texts, lengths = generate(model, tok, [PROMPT], max_new_tokens=8, batch_size=1, chat_template=False)
    assert lengths == [1]


def test_qwen3_preset_turns_thinking_off_and_kwargs_need_a_chat_template():
    from conf_groups import load_group

    from inner_loop.config import node_config

    preset = load_group("model", "qwen3_1_7b")
    cfg = node_config(ModelConfig, "model", preset)
    cfg.validate()
    assert cfg.chat_template and cfg.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(ValueError, match="model.chat_template_kwargs"):
        ModelConfig(chat_template=False, chat_template_kwargs={"enable_thinking": False}).validate()


def test_evaluation_formats_prompts_with_the_chat_template_kwargs(monkeypatch):
    tok = _bos_adding_thinking_tokenizer()
    model = build_tiny_model(ModelConfig(), len(tok), tok)
    seen = []
    real = encode_prompts

    def spy(tokenizer, texts):
        seen.extend(texts)
        return real(tokenizer, texts)

    monkeypatch.setattr("inner_loop.training.evaluate.encode_prompts", spy)
    generate(model, tok, [PROMPT], max_new_tokens=1, batch_size=1, chat_template=True,
             chat_template_kwargs={"enable_thinking": False})
    assert seen == [format_prompt(tok, PROMPT, True, {"enable_thinking": False})]
    assert seen[0].endswith("[nothink]")


def test_a_member_formats_training_and_validation_prompts_with_the_same_template_arguments(monkeypatch):
    """Qwen3 with thinking off in training and on in validation would score a different prompt than it trained on."""
    from types import SimpleNamespace

    from inner_loop.member import lifecycle as member
    from inner_loop.config import ModelConfig, TrainConfig

    seen = {}
    monkeypatch.setattr(member, "evaluate", lambda *args, **kwargs: seen.update(kwargs))
    model_cfg = ModelConfig(name="hub", name_or_path="x", chat_template=True,
                            chat_template_kwargs={"enable_thinking": False})
    run = SimpleNamespace(cfg=SimpleNamespace(model=model_cfg, train=TrainConfig()), task=None, scored=[])
    trainer = SimpleNamespace(accelerator=SimpleNamespace(unwrap_model=lambda m: m), model=None,
                              processing_class=None)
    member._evaluate(trainer, run)
    assert seen["chat_template"] is True and seen["chat_template_kwargs"] == {"enable_thinking": False}
