"""Dotted keys (``train.steps``) of plain nested mappings: listed, looked up, and the mapping that holds one.

Why plain data, not OmegaConf.select: a stored config is read as written, so a string that looks like an
interpolation stays a string and a hash over it never changes.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def dotted_keys(tree: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    """Every key of nested mappings ``tree`` as a dotted path (``train.steps``), parents before their children."""
    for key, value in tree.items():
        yield prefix + str(key)
        if isinstance(value, Mapping):
            yield from dotted_keys(value, f"{prefix}{key}.")


def lookup_key(tree: Mapping[str, Any], key: str) -> tuple[bool, bool, Any]:
    """(``key`` exists in ``tree``, it lies under a free-form node: an empty mapping such as ``train.trl: {}``, its
    value)."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping):
            return False, False, None
        if part not in node:
            return False, not node and node is not tree, None
        node = node[part]
    return True, False, node


def select_key(tree: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """The value at dotted ``key`` of plain nested mappings (``default`` where a part is missing). Plain data, not
    OmegaConf.select: a stored config is read as written, so a string that looks like an interpolation stays a
    string and a hash over it never changes."""
    exists, _, value = lookup_key(tree, key)
    return value if exists else default


def parent_of(tree: Mapping[str, Any], key: str) -> tuple[Any, str]:
    """(the mapping that holds dotted ``key``'s last part, or None where a parent is missing; that last part)."""
    *parents, leaf = key.split(".")
    node: Any = tree
    for part in parents:
        node = node.get(part) if isinstance(node, Mapping) else None
    return (node if isinstance(node, Mapping) else None), leaf
