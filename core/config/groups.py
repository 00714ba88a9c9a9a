"""The Hydra config trees a composition reads (conf/ and ``MIRROR_ES_CONFIG_PATH``'s folders), their groups and
options, and command-line overrides checked against them before anything runs.

Why one owner: the search, the single run, the tuner and the transfer compose from the same trees; a key or group
choice refused by one of them must be refused by all, with the same message naming the closest known keys.
"""
from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from core.config.dotted_keys import dotted_keys, lookup_key
from core.config.plain_data import closest_keys


#: mappings whose keys are the options of a config group (a preset's coefficient per divergence, which
#: conf/divergence/*.yaml read): ``+coef_by_divergence.kl=0.2`` adds a key there, and only an option's name may
KEYED_BY_GROUP = {"coef_by_divergence": "divergence"}


#: extra config trees searched after conf/, as os.pathsep-separated folders laid out like conf/ (``es/``, ``task/``,
#: ...): where the YAML of an entry kept outside this repository lives (docs/extending.md)
CONFIG_PATH_ENV = "MIRROR_ES_CONFIG_PATH"
_SEARCHPATH = "hydra.searchpath"


def extra_config_dirs() -> list[Path]:
    """The folders ``MIRROR_ES_CONFIG_PATH`` names, in order (empty when unset)."""
    return [Path(item) for item in os.environ.get(CONFIG_PATH_ENV, "").split(os.pathsep) if item.strip()]


def _searchpath_items(value: str) -> list[str]:
    return [item.strip().strip("'\"") for item in value.strip().strip("[]").split(",") if item.strip()]


def with_config_path(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with the ``MIRROR_ES_CONFIG_PATH`` folders added to Hydra's search path (after any that a
    ``hydra.searchpath=[...]`` override gives), for whoever composes; unchanged when the variable is unset."""
    extra = [f"file://{d.resolve()}" for d in extra_config_dirs()]
    if not extra:
        return list(overrides)
    given = [o for o in overrides if o.partition("=")[0].lstrip("+") == _SEARCHPATH]
    items = [i for o in given for i in _searchpath_items(o.partition("=")[2])]
    items += [e for e in extra if e not in items]
    return [*(o for o in overrides if o not in given), f"{_SEARCHPATH}=[{','.join(items)}]"]


def config_roots(conf_dir: Path, overrides: Sequence[str] = ()) -> list[Path]:
    """The config trees a composition reads, first wins: ``conf_dir``, the ``file://`` folders of a
    ``hydra.searchpath=[...]`` override, then ``MIRROR_ES_CONFIG_PATH``'s."""
    roots = [conf_dir]
    for override in with_config_path(overrides):
        key, _, value = override.partition("=")
        if key.lstrip("+") == _SEARCHPATH:
            roots += [Path(item[len("file://"):]) for item in _searchpath_items(value) if item.startswith("file://")]
    return roots


def group_file(conf_dir: Path, group: str, option: str, overrides: Sequence[str] = ()) -> Path | None:
    """The YAML of ``group=option`` in the first config tree that has it (None: no tree has it)."""
    return next((p for p in (root / group / f"{option}.yaml" for root in config_roots(conf_dir, overrides))
                 if p.is_file()), None)


def config_groups(conf_dir: Path, overrides: Sequence[str] = ()) -> dict[str, list[str]]:
    """Each config group of a Hydra config tree (a folder of ``conf_dir``, of a ``file://`` folder that a
    ``hydra.searchpath=[...]`` override adds, or of a ``MIRROR_ES_CONFIG_PATH`` folder) with its options."""
    groups: dict[str, set[str]] = {}
    for root in config_roots(conf_dir, overrides):
        for folder in (d for d in sorted(root.iterdir()) if d.is_dir()) if root.is_dir() else ():
            groups.setdefault(folder.name, set()).update(p.stem for p in folder.glob("*.yaml"))
    return {name: sorted(options) for name, options in groups.items()}


def check_group_choice(override: str, groups: Mapping[str, Sequence[str]], config: str) -> None:
    """ValueError for ``group=option`` naming an option the group lacks (a sweep's ``a,b`` is checked per item), with
    the group's choices; other overrides pass."""
    key, sep, value = override.partition("=")
    group = key.lstrip("+~").split("@", 1)[0]
    if not sep or group not in groups or any(c in value for c in "()[]{}$"):
        return
    for option in value.split(","):
        option = option.strip()
        if option not in groups[group] and option != "null":
            near = difflib.get_close_matches(option, groups[group], n=1)
            hint = f" (did you mean {group}={near[0]}?)" if near else ""
            raise ValueError(f"{group}={option}: no such option of the config group {group!r}{hint}; the choices are "
                             f"{', '.join(groups[group])} (conf/{group}/*.yaml, in conf/{config}.yaml's defaults)")


def checked_overrides(overrides: Sequence[str], tree: Mapping[str, Any], groups: Mapping[str, Sequence[str]],
                      config: str) -> list[str]:
    """Command-line overrides checked against ``tree`` (the config composed with the group choices alone) before
    anything runs: a key the config lacks is refused, with or without ``+``, naming the closest known keys, unless it
    goes under a free-form node (``+train.trl.<field>=...``, ``+inner.options.<key>=...``); a misspelled group choice
    lists the choices. Returned with ``+key`` of an existing key as ``++key`` (set it, as the user meant)."""
    result = []
    known = [k for k in dotted_keys(tree) if not k.startswith("hydra")] + list(groups)
    for override in overrides:
        check_group_choice(override, groups, config)
        key, sep, value = override.partition("=")
        bare = key.lstrip("+~")
        prefix = key[:len(key) - len(bare)]
        if bare.split("@", 1)[0] in groups or bare.startswith("hydra"):
            result.append(override)
            continue
        exists, free_form, current = lookup_key(tree, bare)
        node, _, option = bare.partition(".")
        if not exists and node in KEYED_BY_GROUP and option and "." not in option:
            choices = groups.get(KEYED_BY_GROUP[node], [])
            if option not in choices:
                raise ValueError(f"{override}: {node} takes the options of the config group "
                                 f"{KEYED_BY_GROUP[node]!r} as keys ({', '.join(choices)}), not {option!r}")
            free_form = True
        if not exists and not free_form:
            near = closest_keys(bare, known)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise ValueError(f"{override}: conf/{config}.yaml has no key {bare!r}{hint} (a '+' adds keys only under "
                             "the free-form nodes, e.g. +train.trl.<GRPOConfig field>=...)")
        if sep and exists and (prefix == "+" or (not prefix and isinstance(current, Mapping))):
            override = f"++{bare}={value}"  # Hydra refuses '+' on a key that exists, and a mapping set without '++'
        elif sep and free_form and not prefix:
            override = f"+{bare}={value}"  # a new field of a free-form node: what Hydra calls appending
        result.append(override)
    return result
