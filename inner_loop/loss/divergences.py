"""The divergence registry: every regularizer toward the reference policy, and what the rest of the code asks of it.

Why one registry: the typed config checks ``divergence.name`` and its form against it, the loss builds the potential
from it, the result table takes its baseline rows, labels and roles from it, and the tuner its coefficient range, so
a new divergence is one module (a ``Divergence`` entry, its potential where it has no mirror_maps one, and its
config class where it has settings of its own: the YAML's extra keys reach the potential) and one
YAML (conf/divergence/<name>.yaml), with no other file edited (docs/extending.md).

Light on purpose: only the standard library, the entry-point reader and the config reading (core/) are imported here (the potentials are named
as ``module:attr`` strings and imported when a run builds its loss), so the config checks and meta's light commands
read the registry without torch. meta reads it too (with the model registry, the modules of inner_loop it may import).
"""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config.plain_data import plain
from core.config.typed_nodes import typed_node
from core.entry_points import entry_point_objects

#: every form a divergence can be computed in (inner_loop/loss/regularizers.py): the sampled token alone, the same
#: divided by its probability (unbiased for the full sum), or the sum over the whole vocabulary
FORMS = ("sampled", "sampled_is", "full")
KL_ESTIMATORS = ("k1", "k2", "k3")
#: the mapping a preset sets each divergence's coefficient in (``coef_by_divergence.<name>``, which the divergence's
#: YAML selects its ``coef`` from): a preset's coefficient never leaks into another divergence's row
COEF_PRESETS = "coef_by_divergence"


def coef_key(name: str) -> str:
    """The dotted key a preset sets the coefficient of divergence ``name`` with."""
    return f"{COEF_PRESETS}.{name}"


@dataclass
class DivergenceConfig:
    """The settings every divergence has: which one, in which form, with which weight. A divergence with settings
    of its own declares a subclass (``Divergence.config_class``) whose extra fields are its own keys; they reach its
    potential's constructor as keyword arguments (``own_settings``). The class is its YAML's schema
    (:func:`register_schemas`): each field here is the one home of its key's type, default and meaning."""

    name: str = "neural_mirror"
    #: sampled (the sampled token alone) | sampled_is (the same divided by its probability: unbiased for full) | full
    #: (the sum over the vocabulary); the divergence's entry says which it supports
    form: str = "sampled"
    #: a KL's per-token estimator in the sampled form (inner_loop/loss/regularizers.py, docs/method.md), on the
    #: sampled token y ~ pi with r = pi_ref(y) / pi(y): k2 = 1/2 (log r)^2, whose expected gradient is the gradient of
    #: KL(pi || pi_ref) (on-policy); k3 = r - 1 - log r (TRL's), whose expected gradient is the gradient of
    #: KL(pi_ref || pi), the reverse direction (mass-covering), though its value is an unbiased estimate of
    #: KL(pi || pi_ref); k1 = -log r is refused with form=sampled (E_pi[grad log pi(y)] = 0: as a loss it does
    #: nothing). tests/test_inner_loop/loss/test_loss_terms.py checks these directions; form=sampled_is of the KL potential
    #: equals k3
    estimator: str = "k3"
    #: None: the registry's ``default_coef`` of the divergence (the one default). Its schema (:func:`schema_node`)
    #: reads ``coef_by_divergence.<name>`` (a preset sets that, never divergence.coef); null there: this default,
    #: filled where the config is composed (fill_default_coef)
    coef: float | None = None
    #: positions per chunk in the full form (null: sized from a memory budget)
    chunk_size: int | None = None
    #: a member whose mean per-step regularizer gradient share (||grad coef*D|| / ||grad policy||) ends below this
    #: is logged with a warning: its regularizer barely moved the policy, so ES would rank noise. null: no check.
    grad_share_floor: float | None = 0.01

    def __post_init__(self) -> None:
        if self.coef is None:
            self.coef = divergence(self.name).default_coef

    def own_settings(self) -> dict[str, Any]:
        """The fields a subclass adds (its divergence's own parameters), by name."""
        shared = {f.name for f in dataclasses.fields(DivergenceConfig)}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in shared}

    def validate(self) -> None:
        """ValueError naming the key for a value the divergence cannot train with; a subclass extends it for its
        own fields (calling this first)."""
        entry = divergence(self.name)
        if self.form not in FORMS:
            raise ValueError(f"divergence.form={self.form!r} is not one of {list(FORMS)}")
        if self.form not in entry.forms:
            raise ValueError(f"divergence.form={self.form!r}: divergence={self.name} supports {list(entry.forms)}")
        if self.estimator not in KL_ESTIMATORS:
            raise ValueError(f"divergence.estimator={self.estimator!r} is not one of {list(KL_ESTIMATORS)}")
        if entry.kl_estimators and self.form == "sampled" and self.estimator == "k1":
            raise ValueError(
                "divergence.estimator=k1 with divergence.form=sampled has zero expected gradient: as a per-token loss "
                "on tokens sampled from the policy, E[grad log pi(y)] = 0, so the regularizer would silently do "
                "nothing. Use divergence.estimator=k2 (gradient of KL(pi || ref)), k3 (gradient of KL(ref || pi)) "
                "or divergence.form=full (exact KL(pi || ref) over the vocabulary)"
            )
        if self.grad_share_floor is not None and not self.grad_share_floor >= 0.0:
            raise ValueError(f"divergence.grad_share_floor must be >= 0 or null (no check), got {self.grad_share_floor}")
        if not self.coef >= 0.0:
            raise ValueError(f"divergence.coef must be >= 0, got {self.coef}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"divergence.chunk_size must be >= 1 or null, got {self.chunk_size}")


@dataclass
class NeuralMirrorConfig(DivergenceConfig):
    """The learned map's own keys: where its map comes from when no ES vector is given, and how a vector's 380
    numbers become map parameters."""

    #: a file from mirror_maps.save_init / meta.export; None: the authors' seeded random map
    init: str | None = None
    #: none | abs | softplus (mirror_maps.neural.PARAM_TRANSFORMS, checked where the map is built)
    param_transform: str = "abs"

    def validate(self) -> None:
        super().validate()
        if self.init is not None and not Path(self.init).is_file():
            raise ValueError(f"divergence.init={self.init!r}: no such file (export one with meta.export)")


@dataclass(frozen=True)
class Divergence:
    """One divergence and the properties the rest of the code asks about (docs/extending.md explains each)."""

    name: str
    #: its row's label in the result table
    label: str
    #: divergence.coef when no preset sets ``coef_by_divergence.<name>``: its schema's fallback is null, filled from
    #: here (fill_default_coef), so this is the one default
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
    #: the row every other row's response length is compared with (the paper reports lengths relative to KL): the
    #: result table's and ``results.compare``'s reference; one divergence at most declares it
    length_reference: bool = False
    #: the dataclass of its YAML's keys (a DivergenceConfig subclass for a divergence with settings of its own)
    config_class: type[DivergenceConfig] = DivergenceConfig

    @property
    def regularizes(self) -> bool:
        """Whether it adds a term at all (a potential or a learned map)."""
        return self.potential is not None or self.learned_map

    def build_potential(self, settings: Mapping[str, Any] | None = None) -> Any:
        """A fresh potential (a mirror_maps.Potential) built with the divergence's own ``settings`` (its config
        class's extra fields) as keyword arguments; None for a divergence without one."""
        if self.potential is None:
            return None
        module, _, attr = self.potential.partition(":")
        return getattr(importlib.import_module(module), attr)(**dict(settings or {}))


BUILT_IN = (
    Divergence("none", label="Dr. GRPO (no regularizer)", default_coef=0.0, compared=False, tune_range=None),
    Divergence("kl", label="KL", default_coef=0.04, potential="mirror_maps.potentials:KL", kl_estimators=True,
               length_reference=True),
    Divergence("prob_l2", label="ProbL2", default_coef=0.1, potential="mirror_maps.potentials:ProbL2"),
    Divergence("neural_mirror", label="NM-GRPO", default_coef=1.0e-4, learned_map=True, baseline=False,
               config_class=NeuralMirrorConfig),
)


def schema_name(name: str) -> str:
    """The ConfigStore name of divergence ``name``'s schema in the divergence group: its YAML names it first in its
    defaults list (``defaults: [<name>_schema, _self_]``)."""
    return f"{name}_schema"


def schema_node(entry: "Divergence") -> Any:
    """The schema of divergence ``entry``'s YAML: its config class with ``name`` set and ``coef`` read from the
    preset's ``coef_by_divergence.<name>`` (null: the entry's default_coef, filled where the config is composed)."""
    from omegaconf import OmegaConf

    node = OmegaConf.structured(entry.config_class)
    node.name = entry.name
    node.coef = f"${{oc.select:{coef_key(entry.name)},null}}"
    return node


#: the entries whose schema this process has put in Hydra's ConfigStore (each compose calls register_schemas)
_REGISTERED: dict[str, "Divergence"] = {}


def register_schemas() -> None:
    """Every registered divergence's schema in Hydra's ConfigStore, as ``divergence/<name>_schema`` (idempotent;
    an entry already stored is not built again)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    stored = store.repo.get("divergence", {})
    for name, entry in divergences().items():
        if _REGISTERED.get(name) == entry and f"{schema_name(name)}.yaml" in stored:
            continue
        if not (isinstance(entry.config_class, type) and issubclass(entry.config_class, DivergenceConfig)):
            continue  # refused, naming the entry, where its config is read (divergence_config, below)
        store.store(group="divergence", name=schema_name(name), node=schema_node(entry))
        _REGISTERED[name] = entry


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


def fill_default_coef(config: MutableMapping[str, Any]) -> None:
    """Set ``divergence.coef`` of a composed config to its divergence's ``default_coef`` where the YAML left it null
    (no preset sets ``coef_by_divergence.<name>``, no command line sets ``divergence.coef``): the one place a default
    coefficient enters a composed config (meta's compose, inner_loop.run's spec). An unknown name is left for the
    config check to report."""
    node = config.get("divergence")
    if isinstance(node, MutableMapping) and node.get("coef") is None and node.get("name") in divergences():
        node["coef"] = divergence(str(node["name"])).default_coef


def length_reference() -> str | None:
    """The divergence the response lengths are compared with (its entry declares ``length_reference``); None when
    none does. ValueError when several do: the comparison would depend on the registry's order."""
    names = [name for name, entry in divergences().items() if entry.length_reference]
    if len(names) > 1:
        raise ValueError(f"divergences {names} all declare length_reference; one divergence at most may")
    return names[0] if names else None


def unregularized() -> str:
    """The divergence that adds no term (the untrained model's row is composed with it)."""
    return next(name for name, entry in divergences().items() if not entry.regularizes)


def baseline_rows() -> tuple[str, ...]:
    """The divergences the result table may train a row of: the regularizers in registry order, then the host without
    one (the paper's table: KL, ProbL2, then Dr. GRPO alone)."""
    rows = [(name, entry) for name, entry in divergences().items() if entry.baseline]
    return tuple(name for name, entry in sorted(rows, key=lambda row: not row[1].regularizes))


def divergence_config(data: Mapping[str, Any] | DivergenceConfig | None) -> DivergenceConfig:
    """The ``divergence`` node as the config class its entry declares (unknown keys and wrong types refused, naming
    ``divergence.<key>``; not yet ``validate``d). A DivergenceConfig of another class (one pickled before the learned
    map's keys moved to its own class, or built in code with the shared fields only) is read field by field."""
    if isinstance(data, DivergenceConfig):
        known = _field_names(_divergence_class(vars(data)))
        data = {key: value for key, value in vars(data).items() if key in known}
    values = plain(data or {})
    cls = _divergence_class(values)
    for key in sorted(set(values) - _field_names(cls)):
        owners = [name for name, entry in divergences().items() if key in _field_names(entry.config_class)]
        if owners:
            raise ValueError(f"divergence.{key} only applies to divergence={'|'.join(owners)} (its own setting); "
                             f"remove it or switch")
    return typed_node(cls, values, "divergence")


def _divergence_class(values: Mapping[str, Any]) -> type[DivergenceConfig]:
    name = str(values.get("name", DivergenceConfig.name))
    cls = divergence(name).config_class
    if not (isinstance(cls, type) and issubclass(cls, DivergenceConfig)):
        raise ValueError(f"divergence={name}: its entry's config_class {cls!r} is not a DivergenceConfig subclass "
                         "(inner_loop.loss.divergences.DivergenceConfig; docs/extending.md)")
    return cls


def _field_names(cls: type[DivergenceConfig]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}
