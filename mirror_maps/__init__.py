"""Bregman divergences for GBMPO: KL, ProbL2 and the learned neural mirror map (pure torch).

Imports nothing else of mirror-es, so training code, ES code and outside checks can all depend on it.
"""

from mirror_maps.forms import (
    KL_ESTIMATORS,
    SAMPLED_FORMS,
    full_divergence,
    kl_estimator,
    kl_k1,
    kl_k2,
    kl_k3,
    sampled_divergence,
)
from mirror_maps.init_file import LAYOUT_VERSION, load_init, save_init
from mirror_maps.neural import (
    AUTHORS_INIT_SEED,
    DEFAULT_PARAM_TRANSFORM,
    PARAM_TRANSFORMS,
    VECTOR_LENGTH,
    NeuralMirrorMap,
    vector_for_parameters,
)
from mirror_maps.numerics import PROB_FLOOR
from mirror_maps.potentials import KL, Potential, ProbL2

__all__ = [
    "AUTHORS_INIT_SEED",
    "DEFAULT_PARAM_TRANSFORM",
    "KL",
    "KL_ESTIMATORS",
    "LAYOUT_VERSION",
    "NeuralMirrorMap",
    "PARAM_TRANSFORMS",
    "PROB_FLOOR",
    "Potential",
    "ProbL2",
    "SAMPLED_FORMS",
    "VECTOR_LENGTH",
    "full_divergence",
    "kl_estimator",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "load_init",
    "sampled_divergence",
    "save_init",
    "vector_for_parameters",
]
