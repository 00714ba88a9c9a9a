"""Which keys define what a search computes: what a resume refuses to change and what the config hash covers.

A key added after runs existed is dropped from the hash where it holds the value that reproduces those runs (the
upgrade's ADDED_SEARCH_KEYS, meta/settings/upgrade.py), so that such a run hashes as it did; what a member keeps on
disk may change on resume (HOUSEKEEPING_KEYS).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

from meta.settings.upgrade import ADDED_SEARCH_KEYS, renamed
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


def config_hash(raw: Mapping[str, Any], keys: Sequence[str] = SEARCH_KEYS) -> str:
    """Hash of the keys that define what a run computes (provenance for exported inits and presets): a search's
    SEARCH_KEYS by default, a tuning study's own (meta/tune/config.py STUDY_KEYS)."""
    raw = renamed(raw)  # a run stored under a former key name hashes as under today's
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
