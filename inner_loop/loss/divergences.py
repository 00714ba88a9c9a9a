"""The divergence registry: every regularizer toward the reference policy, and what the rest of the code asks of it.

Why one registry: the typed config checks ``divergence.name`` and its form against it, the loss builds the potential
from it, the result table takes its baseline rows, labels and roles from it, and the tuner its coefficient range, so
a new divergence is one module (a ``Divergence`` entry, and its potential where it has no mirror_maps one) and one
YAML (conf/divergence/<name>.yaml), with no other file edited (docs/extending.md).

Light on purpose: only the standard library and the entry-point reader are imported here (the potentials are named
as ``module:attr`` strings and imported when a run builds its loss), so the config checks and meta's light commands
read the registry without torch. meta reads it too (the one module of inner_loop it may import).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from results.store.entry_points import entry_point_objects

#: every form a divergence can be computed in (inner_loop/loss/regularizers.py): the sampled token alone, the same
#: divided by its probability (unbiased for the full sum), or the sum over the whole vocabulary
FORMS = ("sampled", "sampled_is", "full")


@dataclass(frozen=True)
class Divergence:
    """One divergence and the properties the rest of the code asks about (docs/extending.md explains each)."""

    name: str
    #: its row's label in the result table
    label: str
    #: divergence.coef when no preset sets ``coef_by_divergence.<name>``; its YAML's fallback must equal it (a test)
    default_coef: float
    #: ``module:attr`` of a mirror_maps.Potential subclass built with no arguments; None: no regularizer (no
    #: reference forward at all)
    potential: str | None = None
    #: the forms it supports (divergence.form is checked against them)
    forms: tuple[str, ...] = FORMS
    #: a learned map built from the member's ES vector, else ``divergence.init``: the divergence a search searches
    learned_map: bool = False
    #: its sampled form is a per-token KL estimator chosen by ``divergence.estimator`` (k1, k2, k3)
    kl_estimators: bool = False
    #: the result table trains a row with it, composed from its own YAML (``reevaluate.baselines`` may name it)
    baseline: bool = True
    #: the verdict below the table compares the exported init against that row
    compared: bool = True
    #: [low, high] of divergence.coef (log scale) in meta.tune's default space; None: the space's own range
    tune_range: tuple[float, float] | None = (1.0e-4, 1.0)

    @property
    def regularizes(self) -> bool:
        """Whether it adds a term at all (a potential or a learned map)."""
        return self.potential is not None or self.learned_map

    def build_potential(self) -> Any:
        """A fresh potential (a mirror_maps.Potential); None for a divergence without one."""
        if self.potential is None:
            return None
        module, _, attr = self.potential.partition(":")
        return getattr(importlib.import_module(module), attr)()


BUILT_IN = (
    Divergence("none", label="Dr. GRPO (no regularizer)", default_coef=0.0, compared=False, tune_range=None),
    Divergence("kl", label="KL", default_coef=0.04, potential="mirror_maps.potentials:KL", kl_estimators=True),
    Divergence("prob_l2", label="ProbL2", default_coef=0.1, potential="mirror_maps.potentials:ProbL2"),
    Divergence("neural_mirror", label="NM-GRPO", default_coef=1.0e-4, learned_map=True, baseline=False),
)


def divergences() -> dict[str, Divergence]:
    """Every divergence, built-in ones first, then those installed packages declare under the
    ``mirror_es.divergences`` entry-point group (each a Divergence whose name is the entry point's)."""
    return {**{d.name: d for d in BUILT_IN},
            **entry_point_objects("divergences", "an inner_loop.loss.divergences.Divergence",
                                  lambda d: d.name if isinstance(d, Divergence) else None)}


def divergence(name: str) -> Divergence:
    """The entry ``divergence.name`` names; ValueError naming the key and the known divergences otherwise."""
    known = divergences()
    if name not in known:
        raise ValueError(f"divergence.name={name!r} is not one of {list(known)} (conf/divergence/*.yaml)")
    return known[name]


def unregularized() -> str:
    """The divergence that adds no term (the untrained model's row is composed with it)."""
    return next(name for name, entry in divergences().items() if not entry.regularizes)


def baseline_rows() -> tuple[str, ...]:
    """The divergences the result table may train a row of: the regularizers in registry order, then the host without
    one (the paper's table: KL, ProbL2, then Dr. GRPO alone)."""
    rows = [(name, entry) for name, entry in divergences().items() if entry.baseline]
    return tuple(name for name, entry in sorted(rows, key=lambda row: not row[1].regularizes))
