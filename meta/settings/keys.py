"""Which keys define what a search computes: what a resume refuses to change and what the config hash covers.

A key added after runs existed is listed with the value that reproduces those runs, so that such a run resumes and
hashes as it did (ADDED_SEARCH_KEYS); what a member keeps on disk may change on resume (HOUSEKEEPING_KEYS).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from typing import Any, Mapping, Sequence

from meta.search.generation.early_stop import EarlyStopConfig
from core.config_nodes import MEMBER_STEPS_KEY, parent_of, plain, select_key
from meta.searchers.base import SearcherSettings

#: the config nodes of a member's inner run (the groups python -m inner_loop.run takes)
INNER_NODES = ("task", "model", "divergence", "train")
#: keys that change what the search computes; a resume refuses to change them
SEARCH_KEYS = ("population", "seed", "es", "init", "fitness_on_failure", "common_random_numbers", "inner.entrypoint",
               "inner.options", "seeds_per_member", "early_stop", *INNER_NODES)
#: search keys added after runs existed, with the value that reproduces those runs: a run whose config lacks one
#: resumes (and hashes) as if it had this value
ADDED_SEARCH_KEYS = {"seeds_per_member": 1, "early_stop": dataclasses.asdict(EarlyStopConfig()),
                     f"es.{MEMBER_STEPS_KEY}": None,
                     # the learned map's YAML lacked it until its config class became its schema (it has no KL
                     # estimator: the value changes nothing)
                     "divergence.estimator": "k3"}
#: keys inside SEARCH_KEYS that say what a member keeps on disk, not what it computes: a resume may change them
#: (e.g. keep checkpoints from now on), and runs started before they existed resume
HOUSEKEEPING_KEYS = ("train.keep_checkpoints", "train.save_total_limit")
#: the model keys each built-in model's YAML did not write before conf/model/*.yaml composed on ModelConfig
#: (inner_loop/config.py): a search stored earlier lacks them and ran with ModelConfig's defaults, which a resume reads
#: them at and its hash leaves out at those defaults. Stays while searches stored before the model schema may resume.
UNWRITTEN_MODEL_KEYS = {
    "hub": ("gguf_file", "chat_template_kwargs", "seed", "cpu_numerics", "hidden_size", "num_layers", "num_heads",
            "intermediate_size", "max_position_embeddings", "warmup_band", "warmup_signal", "warmup_check_every",
            "warmup_probe_size", "warmup_lr", "warmup_batch_size", "lora_alpha", "lora_dropout", "lora_target_modules"),
    "qwen3_1_7b": ("gguf_file", "seed", "cpu_numerics", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                   "max_position_embeddings", "warmup_band", "warmup_signal", "warmup_check_every", "warmup_probe_size",
                   "warmup_lr", "warmup_batch_size"),
    "smollm2_135m": ("chat_template_kwargs", "seed", "cpu_numerics", "hidden_size", "num_layers", "num_heads",
                     "intermediate_size", "max_position_embeddings", "warmup_band", "warmup_signal",
                     "warmup_check_every", "warmup_probe_size", "warmup_lr", "warmup_batch_size", "lora_alpha",
                     "lora_dropout", "lora_target_modules"),
    "tiny": ("gguf_file", "chat_template_kwargs", "lora_alpha", "lora_dropout", "lora_target_modules"),
}
#: the es keys every searcher has (meta/searchers/base.py SearcherSettings), which a stored node's upgrade leaves alone
_SHARED_SETTINGS = frozenset(f.name for f in dataclasses.fields(SearcherSettings))


def with_added_keys(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` with every ADDED_SEARCH_KEYS key it lacks set to the value that reproduces a run from before the key
    existed (dotted keys inside their node), so that such a run resumes and hashes as it did."""
    out = copy.deepcopy(dict(raw))
    for key, default in ADDED_SEARCH_KEYS.items():
        node, leaf = parent_of(out, key)
        if node is not None:
            node.setdefault(leaf, default)
    _with_schema_defaults(out.get("divergence"), _divergence_class(out.get("divergence")))
    _with_schema_defaults(out.get("es"), _settings_class(out.get("es")), skip=_SHARED_SETTINGS)
    _with_schema_defaults(out.get("model"), _model_class(out.get("model")))
    return out


def _with_schema_defaults(node: Any, schema: type | None, skip: frozenset[str] = frozenset()) -> None:
    """A group's node stored before its YAML composed on its schema (conf/divergence/none.yaml had no ``form``,
    conf/es/pgpe.yaml no ``optimizer_config``) with the fields it lacks at the schema's defaults: the values it ran
    with. ``skip``: fields filled elsewhere (es.radius: a former radius key is read as it; es.member_steps:
    ADDED_SEARCH_KEYS)."""
    from meta.searchers import composed_only

    if not isinstance(node, dict) or schema is None:
        return
    for f in dataclasses.fields(schema):
        if f.name in skip or f.name in node:
            continue
        if f.default_factory is not dataclasses.MISSING or (f.default is not dataclasses.MISSING
                                                             and not composed_only(f.default)):
            node[f.name] = _schema_default(f)


def _divergence_class(node: Any) -> type | None:
    from inner_loop.loss.divergences import divergences

    entry = divergences().get(node.get("name")) if isinstance(node, dict) else None
    return entry.config_class if entry is not None and dataclasses.is_dataclass(entry.config_class) else None


def _model_class(node: Any) -> type | None:
    from inner_loop.config import ModelConfig

    return ModelConfig if isinstance(node, dict) else None


def _schema_default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _unwritten(picked: Mapping[str, Any]) -> dict[tuple[str, str], Any]:
    """The (node, key)s of a picked config that its YAML did not write before the group's schema did, with their
    defaults: an es node's settings marked ``added``, a built-in model's UNWRITTEN_MODEL_KEYS."""
    out: dict[tuple[str, str], Any] = {}
    es, model = picked.get("es"), picked.get("model")
    schema = _settings_class(es)
    for f in dataclasses.fields(schema) if schema is not None else ():
        if f.metadata.get("added"):
            out[("es", f.name)] = _schema_default(f)
    if isinstance(model, dict) and model.get("name") in UNWRITTEN_MODEL_KEYS:
        fields = {f.name: f for f in dataclasses.fields(_model_class(model))}  # type: ignore[arg-type]
        for key in UNWRITTEN_MODEL_KEYS[model["name"]]:
            out[("model", key)] = _schema_default(fields[key])
    return out


def _settings_class(node: Any) -> type | None:
    """The settings class of the searcher an es node names (None: no node, or a name this Python does not know)."""
    from meta.searchers import searchers, settings_class_of

    cls = searchers().get(node.get("name")) if isinstance(node, dict) else None
    return settings_class_of(cls) if cls is not None else None


def config_hash(raw: Mapping[str, Any], keys: Sequence[str] = SEARCH_KEYS) -> str:
    """Hash of the keys that define what a run computes (provenance for exported inits and presets): a search's
    SEARCH_KEYS by default, a tuning study's own (meta/tune/config.py STUDY_KEYS)."""
    from meta.searchers.radius import with_radius_renamed

    raw = with_radius_renamed(raw)  # a run stored under a former radius key hashes as under es.radius
    picked = plain({key: select_key(raw, key) for key in keys})
    for key, default in ADDED_SEARCH_KEYS.items():
        node, leaf = parent_of(picked, key)
        if node is not None and leaf in node and node[leaf] in (None, default):
            del node[leaf]
    for (node, key), default in _unwritten(picked).items():  # at its default, as a run stored before lacks it
        if picked[node].get(key, default) == default:
            picked[node].pop(key, None)
    for key in HOUSEKEEPING_KEYS:
        node, leaf = parent_of(picked, key)
        if node is not None:
            node.pop(leaf, None)
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:16]
