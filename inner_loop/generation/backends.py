"""Which generation backend a member's settings select, under one name each for records, plans and benches.

TRL picks the backend from three GRPOConfig fields (``use_vllm``, ``vllm_mode``,
``use_transformers_continuous_batching``); the result record names the one that ran, because the seed noise and
the common random numbers of a search assume one backend throughout.
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
