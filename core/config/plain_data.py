"""Config mappings as plain data, and the refusal of keys a node does not know (with the known keys nearest a typo).

Why one owner: the inner config, the task configs, the settings' schema and the stores that hash or record a config
all take the same YAML / OmegaConf input. Read here once into dicts and lists, what is typed, hashed or compared does
not depend on the container it arrived in; and every unknown-key error reads the same and names ``<node>.<key>``.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


def plain(value: Any) -> Any:
    """Nested mappings and sequences (OmegaConf's DictConfig and ListConfig included) as dicts with string keys and
    lists, so that what is typed, hashed or compared does not depend on the container it arrived in."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [plain(v) for v in value]
    return value


def refuse_unknown_keys(data: Mapping[str, Any], known: Iterable[str], node: str, *, prefix: str = "",
                        see: str = "") -> None:
    """ValueError listing the keys of ``data`` that ``known`` lacks, as ``<node>.<key>``: a typo must fail, not fall
    back to a default. ``prefix`` opens the message (which task), ``see`` ends it (where the keys are written)."""
    names = sorted(set(known))
    unknown = sorted(set(data) - set(names))
    if unknown:
        near = closest_keys(unknown[0], names)
        hint = f" (did you mean {', '.join(node + '.' + k for k in near)}?)" if near else ""
        raise ValueError(f"{prefix}unknown key(s) {[node + '.' + k for k in unknown]}{hint}; known keys are {names}{see}")


def closest_keys(key: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The known (dotted) keys nearest to a mistyped ``key``: by the whole path, or by the last part alone (``seeds``
    finds ``pilot.seeds``), best first."""
    leaf = key.rsplit(".", 1)[-1]
    scored = []
    for name in set(known):
        whole = difflib.SequenceMatcher(None, key, name).ratio()
        last = difflib.SequenceMatcher(None, leaf, name.rsplit(".", 1)[-1]).ratio()
        score = max(whole, last - 0.05)  # an equal last part ranks below an equal whole path
        if score >= 0.6:
            scored.append((-score, name))
    return [name for _, name in sorted(scored)[:n]]
