"""Which keys define what a search computes: what a resume refuses to change and what the config hash covers.

A key added after runs existed is dropped from the hash where it holds the value that reproduces those runs (the
upgrade's ADDED_SEARCH_KEYS, meta/settings/upgrade.py), so that such a run hashes as it did; what a member keeps on
disk may change on resume (HOUSEKEEPING_KEYS).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Mapping, Sequence

from meta.settings.upgrade import ADDED_SEARCH_KEYS, model_schema, renamed, schema_default, searcher_schema
from core.config.dotted_keys import parent_of, select_key
from core.config.plain_data import plain

#: the config nodes of a member's inner run (the groups python -m inner_loop.run takes)
INNER_NODES = ("task", "model", "divergence", "train")
#: keys that change what the search computes; a resume refuses to change them
SEARCH_KEYS = ("population", "seed", "es", "init", "fitness_on_failure", "common_random_numbers", "inner.entrypoint",
               "inner.options", "seeds_per_member", "early_stop", *INNER_NODES)
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


def _unwritten(picked: Mapping[str, Any]) -> dict[tuple[str, str], Any]:
    """The (node, key)s of a picked config that its YAML did not write before the group's schema did, with their
    defaults: an es node's settings marked ``added``, a built-in model's UNWRITTEN_MODEL_KEYS."""
    out: dict[tuple[str, str], Any] = {}
    es, model = picked.get("es"), picked.get("model")
    schema = searcher_schema(es)
    for f in dataclasses.fields(schema) if schema is not None else ():
        if f.metadata.get("added"):
            out[("es", f.name)] = schema_default(f)
    if isinstance(model, dict) and model.get("name") in UNWRITTEN_MODEL_KEYS:
        fields = {f.name: f for f in dataclasses.fields(model_schema(model))}  # type: ignore[arg-type]
        for key in UNWRITTEN_MODEL_KEYS[model["name"]]:
            out[("model", key)] = schema_default(fields[key])
    return out


def config_hash(raw: Mapping[str, Any], keys: Sequence[str] = SEARCH_KEYS) -> str:
    """Hash of the keys that define what a run computes (provenance for exported inits and presets): a search's
    SEARCH_KEYS by default, a tuning study's own (meta/tune/config.py STUDY_KEYS)."""
    raw = renamed(raw)  # a run stored under a former key name hashes as under today's
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
