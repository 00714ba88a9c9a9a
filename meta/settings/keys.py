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

from meta.settings.early_stop import EarlyStopConfig
from core.config.dotted_keys import parent_of, select_key
from core.config.horizon import MEMBER_STEPS_KEY
from core.config.plain_data import plain

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


def with_added_keys(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` with every ADDED_SEARCH_KEYS key it lacks set to the value that reproduces a run from before the key
    existed (dotted keys inside their node), so that such a run resumes and hashes as it did."""
    out = copy.deepcopy(dict(raw))
    for key, default in ADDED_SEARCH_KEYS.items():
        node, leaf = parent_of(out, key)
        if node is not None:
            node.setdefault(leaf, default)
    _with_schema_defaults(out.get("divergence"))
    return out


def _with_schema_defaults(node: Any) -> None:
    """A divergence node stored before its YAML composed on its config class (conf/divergence/none.yaml had no
    ``form``) with the fields it lacks at the class's defaults: the values it ran with."""
    from inner_loop.loss.divergences import divergences

    entry = divergences().get(node.get("name")) if isinstance(node, dict) else None
    if entry is None or not dataclasses.is_dataclass(entry.config_class):
        return
    for f in dataclasses.fields(entry.config_class):
        if f.default is not dataclasses.MISSING:
            node.setdefault(f.name, f.default)


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
    for key in HOUSEKEEPING_KEYS:
        node, leaf = parent_of(picked, key)
        if node is not None:
            node.pop(leaf, None)
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:16]
