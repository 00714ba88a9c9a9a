"""The divergence term toward the reference policy, built from the config through the mirror_maps library.

One object answers "what is D_t for this batch" for every divergence and form, so the trainer's loss code has
no per-divergence branches and a run's log can say exactly which form it used.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from inner_loop.loss.divergences import DivergenceConfig, divergence, divergence_config
from mirror_maps import (
    AUTHORS_INIT_SEED,
    VECTOR_LENGTH,
    NeuralMirrorMap,
    Potential,
    full_divergence,
    kl_estimator,
    load_init,
    sampled_divergence,
)
from mirror_maps.tiled import FullForm, default_workspace_bytes, tiled_full_form
from core.keys import GRAD_SHARE_DIAGNOSTIC  # what the floor check reads: the mean per-step share

logger = logging.getLogger(__name__)

#: Seed of the neural mirror map when neither ES parameters nor an init file are given (the authors' seed).
DEFAULT_MAP_SEED = AUTHORS_INIT_SEED


@dataclass
class Regularizer:
    """D_t per completion token. ``potential`` is None for `none`; `kl` in the sampled form uses ``estimator``.

    Which divergence a sampled-token term pushes down is decided by its expected GRADIENT under y ~ pi (the
    sampling itself is not differentiated), not by the expected value. With r = pi_ref(y) / pi(y):
    k1 = -log r: E[grad] = E[grad log pi] = 0 (refused by DivergenceConfig.validate); k2 = 1/2 (log r)^2:
    E[-log r * grad log pi] = grad KL(pi || pi_ref); k3 = r - 1 - log r: E[(1 - r) grad log pi] =
    -sum_y pi_ref grad log pi = grad KL(pi_ref || pi), the reverse direction, although its value estimates
    KL(pi || pi_ref). `sampled_is` of the KL potential equals k3 per token. The full form is exact.
    """

    name: str
    form: str
    coef: float
    potential: Potential | None = None
    estimator: str = "k3"
    chunk_size: int | None = None
    #: the sampled form is a per-token KL estimator (``estimator``): the divergence declares it (kl_estimators)
    kl_estimators: bool = False
    #: the divergence's own settings its potential was built with (its config class's extra fields)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        """Whether a reference forward is needed at all."""
        return self.potential is not None

    @property
    def needs_full_vocabulary(self) -> bool:
        """The full form: the whole next-token distributions of both models (from their hidden states, in tiles)."""
        return self.active and self.form == "full"

    def describe(self) -> str:
        if not self.active:
            return "none"
        detail = f"/{self.estimator}" if self.kl_estimators and self.form == "sampled" else ""
        settings = ", ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
                             for key, value in self.settings.items())
        return f"{self.name}[{self.form}{detail}]{f'({settings})' if settings else ''} x {self.coef:g}"

    def full_per_token(self, logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
        """(B, T) full-vocabulary divergence from (B, T, V) logits of the policy and the reference."""
        return full_divergence(self.potential, logits, ref_logits, chunk_size=self.chunk_size)

    def full_from_hidden(self, hidden: torch.Tensor, head: torch.nn.Module, ref_hidden: torch.Tensor,
                         ref_head: torch.nn.Module, targets: torch.Tensor, *, temperature: float,
                         compute_dtype: torch.dtype, rows: int | None = None, workspace_bytes: int | None = None,
                         with_norms: bool = False) -> FullForm:
        """(B, T) log p(y_t) and full-vocabulary divergence from (B, T, H) final hidden states and the LM heads of the
        policy and the reference, in vocabulary tiles (mirror_maps.tiled): what training uses, since it never makes
        the (B, T, V) logits. Tile positions: ``divergence.chunk_size``, else ``rows``, else from the budget (at most
        ``workspace_bytes``, the caller's memory budget, and the library's own cap)."""
        budget = workspace_bytes
        if budget is not None:
            positions, vocab = targets.numel(), head.weight.shape[0]
            budget = min(budget, default_workspace_bytes(positions, vocab, hidden.device))
        return tiled_full_form(self.potential, hidden, head.weight, ref_hidden, ref_head.weight, targets,
                               bias=head.bias, ref_bias=ref_head.bias, temperature=temperature,
                               compute_dtype=compute_dtype, rows=self.chunk_size or rows, workspace_bytes=budget,
                               with_norms=with_norms)

    def per_token(
        self,
        logps: torch.Tensor,
        ref_logps: torch.Tensor,
        logits: torch.Tensor | None = None,
        ref_logits: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """(B, T) divergence; None when inactive. The full form needs (B, T, V) logits of both policies."""
        if not self.active:
            return None
        if self.form == "full":
            if logits is None or ref_logits is None:
                raise ValueError("the full form needs the policy's and the reference's logits")
            return self.full_per_token(logits, ref_logits)
        if self.kl_estimators and self.form == "sampled":
            # The standard per-token KL estimators (TRL/verl use k3); sampled_is of the KL potential equals k3 too.
            return kl_estimator(logps, ref_logps, self.estimator)
        return sampled_divergence(self.potential, logps, ref_logps, form=self.form)


def load_init_map(path: str | Path) -> NeuralMirrorMap:
    """The map stored in an init file written by ``mirror_maps.save_init`` (shape checked on load), with the
    parameter transform it was saved with: the file, not the current config, says how its numbers are read."""
    try:
        mirror_map, _metadata = load_init(path)
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise ValueError(
            f"divergence.init={str(path)!r} is not a valid mirror-map init file ({exc}); a neural mirror map needs "
            f"a [{VECTOR_LENGTH}] vector written by mirror_maps.save_init or meta.export"
        ) from exc
    return mirror_map


def build_potential(cfg: DivergenceConfig, params: Sequence[float] | None = None) -> Potential | None:
    """The potential of the divergence ``cfg`` names (its registry entry), built with its own settings; for a
    learned map: ES ``params`` > ``cfg.init`` file > seeded random init."""
    cfg = divergence_config(cfg)  # the entry's own config class, whatever class ``cfg`` was built or pickled as
    entry = divergence(cfg.name)
    if not entry.learned_map:
        return entry.build_potential(cfg.own_settings())
    if params is not None and len(params) > 0:
        vector = torch.tensor([float(x) for x in params], dtype=torch.float32)
        if vector.numel() != VECTOR_LENGTH:
            raise ValueError(f"member params have {vector.numel()} numbers; a neural mirror map needs {VECTOR_LENGTH}")
        return NeuralMirrorMap.from_vector(vector, param_transform=cfg.param_transform)
    if cfg.init is not None:
        return load_init_map(cfg.init)
    logger.info("neural mirror map: no params or init file given; random init with seed %d", DEFAULT_MAP_SEED)
    return NeuralMirrorMap.random_init(DEFAULT_MAP_SEED, param_transform=cfg.param_transform)


def build_regularizer(cfg: DivergenceConfig, params: Sequence[float] | None = None) -> Regularizer:
    """A ready Regularizer for a validated divergence config (and optional ES parameters)."""
    cfg = divergence_config(cfg)
    entry = divergence(cfg.name)
    return Regularizer(
        name=cfg.name,
        form=cfg.form,
        coef=cfg.coef,
        potential=build_potential(cfg, params),
        estimator=cfg.estimator,
        chunk_size=cfg.chunk_size,
        kl_estimators=entry.kl_estimators,
        settings={} if entry.learned_map else cfg.own_settings(),
    )


def warn_if_inert(diagnostics: Mapping[str, float], floor: float | None, member: str) -> bool:
    """Log a warning naming ``member`` when its mean regularizer gradient share is below ``floor``; True if so.

    Why a warning and not a failure: the member's run is valid GRPO, only its regularizer barely mattered; the
    user needs to know (ES over mirror maps ranks noise when every member's map is inert), not to lose the run.
    """
    share = diagnostics.get(GRAD_SHARE_DIAGNOSTIC)
    if floor is None or share is None or not math.isfinite(share) or share >= floor:
        return False
    logger.warning("member %s: the regularizer's gradient is %.3g of the policy term's (mean over steps), below "
                   "divergence.grad_share_floor=%g: it barely changed the updates; raise divergence.coef (the share "
                   "scales with it) or set divergence.grad_share_floor=null to silence this", member, share, floor)
    return True
