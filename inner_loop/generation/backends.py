"""Which generation backend a member's settings select, under one name each for records, plans and benches.

TRL picks the backend from three GRPOConfig fields (``use_vllm``, ``vllm_mode``,
``use_transformers_continuous_batching``); the result record names the one that ran, because the seed noise and
the common random numbers of a search assume one backend throughout. HF generate's KV cache (``train.decode_cache``)
is named here too, and recorded beside the backend for the same reason.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HF_GENERATE = "hf_generate"
CONTINUOUS_BATCHING = "transformers_continuous_batching"
VLLM_COLOCATE = "vllm_colocate"
VLLM_SERVER = "vllm_server"
BACKENDS = (HF_GENERATE, CONTINUOUS_BATCHING, VLLM_COLOCATE, VLLM_SERVER)

#: The train.trl fields that choose a backend, each as TRL names it.
_USE_VLLM, _VLLM_MODE, _USE_CB = "use_vllm", "vllm_mode", "use_transformers_continuous_batching"


def generation_backend(trl_fields: Mapping[str, Any]) -> str:
    """The backend TRL generates with, given the GRPOConfig fields (or a ``train.trl`` mapping; absent = TRL's
    defaults: HF generate; vLLM mode colocate, TRL 1.16's default). vLLM wins over continuous batching, as in TRL."""
    if trl_fields.get(_USE_VLLM):
        return VLLM_COLOCATE if trl_fields.get(_VLLM_MODE, "colocate") == "colocate" else VLLM_SERVER
    if trl_fields.get(_USE_CB):
        return CONTINUOUS_BATCHING
    return HF_GENERATE


#: train.decode_cache: the KV cache HF generate decodes with. dynamic: transformers' default, grown token by token
#: (what every run used before the key existed). static: one cache preallocated at prompt + completion length (TRL's
#: ``cache_implementation="static"``); TRL builds its GenerationConfig with ``disable_compile=True``, so the decode
#: step still runs eagerly. persistent_compiled: ONE static cache for the whole run, allocated once and reset between
#: calls, prompts padded to a few bucket lengths, the decode step compiled by the member on every device
#: (inner_loop/generation/decode_step.py), so a run compiles its decode step once and replays it. persistent_merged:
#: the same, decoding on a copy of the weights with LoRA merged in (inner_loop/generation/lora_merge.py). owned_loop:
#: the project's own decode loop over the same cache, LoRA merged, one captured token step with the sampling inside
#: it and no host sync per token (inner_loop/generation/owned_loop.py).
DYNAMIC_CACHE, STATIC_CACHE, PERSISTENT_COMPILED = "dynamic", "static", "persistent_compiled"
PERSISTENT_MERGED, OWNED_LOOP = "persistent_merged", "owned_loop"
DECODE_CACHES = (DYNAMIC_CACHE, STATIC_CACHE, PERSISTENT_COMPILED, PERSISTENT_MERGED, OWNED_LOOP)
#: The values that decode over the member's one static cache (prompt buckets, decode counts in the record).
PERSISTENT_CACHES = (PERSISTENT_COMPILED, PERSISTENT_MERGED, OWNED_LOOP)
#: Refused (:data:`STATIC_COMPILED_REFUSAL`): transformers' own compiled static cache.
STATIC_COMPILED = "static_compiled"
STATIC_COMPILED_REFUSAL = (
    f"train.decode_cache={STATIC_COMPILED!r} is refused: transformers makes a new static cache at every generate "
    "call, so under CUDA graphs (mode reduce-overhead) the compiled decode step is recorded again at every "
    "generation, and where torch counts those recordings toward inductor's re-record limit "
    "(cudagraph_unexpected_rerecord_limit), it runs without CUDA graphs for good once past it. Set "
    f"train.decode_cache={PERSISTENT_COMPILED} (one static cache for the run, its decode step compiled once and "
    "replayed), or dynamic")
#: train.decode_compile_backend (persistent_compiled): inductor generates kernels (the real setting); aot_eager and
#: eager trace the same graphs without code generation (tests; a machine without a C++ compiler).
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")


#: train.decode_windows' largest value: the owned loop compiles its step once per window, and torch.compile's recompile
#: limit is 8 per function
MAX_DECODE_WINDOWS = 8


def cache_implementation(decode_cache: str) -> str | None:
    """TRL's GRPOConfig ``cache_implementation`` for a ``train.decode_cache`` value (None: transformers' dynamic
    cache)."""
    if decode_cache == STATIC_COMPILED:
        raise ValueError(STATIC_COMPILED_REFUSAL)
    if decode_cache not in DECODE_CACHES:
        raise ValueError(f"train.decode_cache={decode_cache!r} is not one of {list(DECODE_CACHES)}")
    return None if decode_cache == DYNAMIC_CACHE else "static"


def decode_cache_refusal(decode_cache: str, trl_fields: Mapping[str, Any]) -> str | None:
    """Why ``decode_cache`` cannot apply with the backend ``trl_fields`` select (None: it can): only HF generate
    decodes with transformers' KV cache; vLLM and continuous batching keep paged caches of their own, and a
    static cache asked for there would be silently ignored while the record claimed it."""
    cache_implementation(decode_cache)  # a value outside DECODE_CACHES: the error naming the key
    backend = generation_backend(trl_fields)
    if decode_cache == OWNED_LOOP and backend == HF_GENERATE:
        found = [f"train.trl.{key}={trl_fields[key]!r}" for key in _UNRECONSTRUCTED
                 if trl_fields.get(key) is not None and trl_fields[key] != (1.0 if key == "repetition_penalty" else 0.0)]
        found += [f"train.trl.generation_kwargs.{key}" for key in (trl_fields.get("generation_kwargs") or {})
                  if key in _SAMPLING_KWARGS + _HF_ONLY_SAMPLING and key not in ("temperature", "top_p", "top_k")]
        if found:
            return (f"train.decode_cache={OWNED_LOOP} samples by train.temperature, train.top_p and train.trl.top_k "
                    f"only, the rule the trainer rebuilds; it would not apply {', '.join(found)}: drop them, or set "
                    f"train.decode_cache={PERSISTENT_COMPILED}")
    if decode_cache == DYNAMIC_CACHE or backend == HF_GENERATE:
        return None
    return (f"train.decode_cache={decode_cache!r} applies to HF generate only, but train.trl selects {backend} "
            f"(which keeps its own paged KV cache): set train.decode_cache={DYNAMIC_CACHE} with it")


#: Sampling settings vLLM applies that the trainer does not reconstruct when it compares its log-probs with vLLM's
#: processed ones (inner_loop/generation/sampling.py reconstructs temperature, top_k and top_p only).
_UNRECONSTRUCTED = ("min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
#: vLLM SamplingParams (train.trl.generation_kwargs) that change the distribution a token is drawn from
#: HF generate's settings that change the distribution and that the owned loop does not apply
_HF_ONLY_SAMPLING = ("typical_p", "epsilon_cutoff", "eta_cutoff", "no_repeat_ngram_size", "bad_words_ids",
                     "suppress_tokens", "begin_suppress_tokens", "min_new_tokens", "min_length", "sequence_bias",
                     "forced_eos_token_id")
_SAMPLING_KWARGS = ("temperature", "top_p", "top_k", *_UNRECONSTRUCTED, "min_tokens", "logit_bias",
                    "allowed_token_ids", "bad_words")


def sampling_refusal(trl_fields: Mapping[str, Any]) -> str | None:
    """Why vLLM and HF generate would train different policies under these ``train.trl`` fields (None: they train
    the same). With vLLM's importance-sampling correction on (TRL's default), the trainer compares its own
    log-probs with the sampler's on the distribution the sampler drew from, which it rebuilds from the temperature,
    top_k and top_p it knows; a setting it does not rebuild would make the ratio measure that setting, and
    sequences outside the mask's bounds would be dropped."""
    if generation_backend(trl_fields) not in (VLLM_COLOCATE, VLLM_SERVER):
        return None
    if trl_fields.get("vllm_importance_sampling_correction", True) is False:
        return None
    found = []
    for key in _UNRECONSTRUCTED:
        value = trl_fields.get(key)
        if value is not None and value != (1.0 if key == "repetition_penalty" else 0.0):
            found.append(f"train.trl.{key}={value!r}")
    kwargs = trl_fields.get("generation_kwargs") or {}
    found += [f"train.trl.generation_kwargs.{key}" for key in _SAMPLING_KWARGS if key in kwargs]
    if not found:
        return None
    return (f"{', '.join(found)} with vLLM generation: vLLM's importance-sampling correction compares the trainer's "
            "log-probs with the sampler's on the distribution it drew from, which the trainer rebuilds from "
            "train.temperature, train.top_p and train.trl.top_k only, so vLLM and HF generate would train different "
            "policies (docs/trl_options.md, Importance sampling). Drop them, or set "
            "train.trl.vllm_importance_sampling_correction=false (vLLM's samples then count as the policy's, as HF "
            "generate's do)")
