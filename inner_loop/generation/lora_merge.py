"""LoRA merged into a decoding copy of the weights for the length of a generation (``train.decode_cache=
persistent_merged`` and ``owned_loop``).

Why: decoding through PEFT's unmerged LoRA runs, per adapted linear and token step, the base GEMM plus two small
adapter GEMMs, a dropout and casts to and from the fp32 adapters: for Qwen3 with all seven projections adapted,
~390 small kernels a step on top of the base model's, all launch-bound. Merged weights decode with one GEMM each.

How, and why not PEFT's ``merge_adapter``/``unmerge_adapter``: merging into the bf16 base weights in place and
subtracting after does not give the base weights back (bf16 rounding at both ends), so the frozen weights the
regulariser measures from would drift a little at every step. Here each adapted base weight instead gets one
decoding copy, allocated once and refreshed in place before every generation as ``W + B @ A * scaling`` (computed
in fp32, stored in the weight's dtype). For the generation the base layer's weight points at that copy and the
layer reports itself merged (its forward then runs the base layer alone); afterwards both are put back exactly.
The copy's address never changes, so a compiled step or CUDA graph that read it keeps replaying.

Memory cost: one copy of every adapted base weight, in its own dtype, held for the run (``merged_bytes`` in the
record): for Qwen3-1.7B in bf16 with the seven projections adapted about 2 x 1.4e9 = 2.8 GB; with q/k/v/o only
about 0.9 GB. The fp32 delta is transient, one layer at a time.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterator

import torch

logger = logging.getLogger(__name__)


def lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """PEFT's LoRA linear layers of ``model`` that have an active, unmerged adapter (none: not a LoRA model)."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # pragma: no cover - peft is a dependency
        return []
    return [m for m in model.modules() if isinstance(m, LoraLinear) and not m.merged and not m.disable_adapters
            and any(a in m.lora_A for a in m.active_adapters)]


class MergedLora:
    """The decoding copies of one model's adapted weights; :meth:`merged` swaps them in around a generation."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.layers = lora_layers(model)
        self._copies: list[torch.Tensor] = [torch.empty_like(m.base_layer.weight) for m in self.layers]
        self.merges = 0
        if self.layers:
            logger.info("decode: LoRA merged for decoding in %d layers (a decoding copy of %.1f MiB)",
                        len(self.layers), self.merged_bytes() / 2**20)

    def merged_bytes(self) -> int:
        """What the decoding copies hold (the memory this costs, for the run)."""
        return sum(t.numel() * t.element_size() for t in self._copies)

    def copy_ptrs(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for t in self._copies)

    @torch.no_grad()
    def refresh(self) -> None:
        """Each copy set to its base weight plus the active adapters' deltas (fp32 sum, one rounding)."""
        for layer, copy in zip(self.layers, self._copies):
            merged = layer.base_layer.weight.float()
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    merged = merged + layer.get_delta_weight(adapter).float()
            copy.copy_(merged)

    @contextmanager
    def merged(self) -> Iterator[None]:
        """The model decodes on the merged copies for the block; its own weights and adapters are back after (also
        on an error), bit for bit."""
        if not self.layers:
            yield
            return
        self.refresh()
        saved: list[tuple[Any, torch.Tensor, list[str]]] = []
        try:
            for layer, copy in zip(self.layers, self._copies):
                weight = layer.base_layer.weight
                saved.append((layer, weight.data, list(layer.merged_adapters)))
                weight.data = copy
                layer.merged_adapters = [a for a in layer.active_adapters if a in layer.lora_A]
            self.merges += 1
            yield
        finally:
            for layer, data, merged_adapters in saved:
                layer.base_layer.weight.data = data
                layer.merged_adapters = merged_adapters
