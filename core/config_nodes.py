"""Config mappings as plain data, and config nodes as typed dataclasses: the one owner of both readings.

Why one owner: the inner config (inner_loop/config.py), the task configs (inner_loop/tasks/) and the stores that
hash or record a config all take the same YAML / OmegaConf input. Two readers with their own type rules would
accept a value in one node and refuse it in another, with differently worded errors; here one rule per annotation
decides, and every error names the key as the user writes it (``<node>.<key>``).

Why in results.store: it is the lowest room that every reader may import (meta and the stores may not import
inner_loop), and it needs nothing but the standard library. OmegaConf containers are read as the mappings and
sequences they are; the Hydra entry points resolve interpolations themselves (``OmegaConf.to_container``).
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


#: how many training steps a search member takes, an es key of conf/config.yaml (null: train.steps; meta/search/config.py
#: checks it); train.steps stays the length of the exported run and of the runs after the search
MEMBER_STEPS_KEY = "member_steps"


def search_horizon(raw: Mapping[str, Any]) -> tuple[int, int]:
    """(a search member's steps, train.steps) of a stored search config; a config from before es.member_steps, or
    with it null, gives train.steps twice."""
    steps = int((raw.get("train") or {}).get("steps") or 0)
    member = (raw.get("es") or {}).get(MEMBER_STEPS_KEY)
    return (steps if member is None else int(member)), steps


def horizon_text(raw: Mapping[str, Any]) -> str:
    """How long a search member trains, for the status view and the report: one sentence ("" at train.steps)."""
    member, steps = search_horizon(raw)
    if member == steps:
        return ""
    return (f"members train es.{MEMBER_STEPS_KEY}={member} of train.steps={steps} steps (the exported run, the "
            f"selection and reporting runs train {steps}); their fitness is pass@1 at step {member}")


def setting(default: Any, help: str, **metadata: Any) -> Any:  # noqa: A002 - the word the schemas' readers use
    """A field of a config group's schema (a searcher's or a launcher's settings): its default (a mapping or list: a
    fresh copy per instance) and its help, the one home of both; ``metadata``: more facts its readers ask."""
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help, **metadata})
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


def schema_name(option: str) -> str:
    """The ConfigStore name of a group option's schema, which its YAML names first in its defaults list
    (``defaults: [<option>_schema, _self_]``)."""
    return f"{option}_schema"


def store_schemas(store: Any, group: str, entries: Mapping[str, Any], node_of: Any, stored: dict[str, Any]) -> None:
    """Put the schema of each registry entry (``node_of(entry)``) in ``store`` (Hydra's ConfigStore, passed in: this
    module imports nothing) as ``<group>/<name>_schema``; ``stored`` remembers what this process stored, so that an
    entry already there is not built again (every compose registers)."""
    present = store.repo.get(group, {})
    for name, entry in entries.items():
        if stored.get(name) is entry and f"{schema_name(name)}.yaml" in present:
            continue
        store.store(group=group, name=schema_name(name), node=node_of(entry))
        stored[name] = entry


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


def _dotted_keys(tree: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    for key, value in tree.items():
        yield prefix + str(key)
        if isinstance(value, Mapping):
            yield from _dotted_keys(value, f"{prefix}{key}.")


def _lookup(tree: Mapping[str, Any], key: str) -> tuple[bool, bool, Any]:
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
    exists, _, value = _lookup(tree, key)
    return value if exists else default


def parent_of(tree: Mapping[str, Any], key: str) -> tuple[Any, str]:
    """(the mapping that holds dotted ``key``'s last part, or None where a parent is missing; that last part)."""
    *parents, leaf = key.split(".")
    node: Any = tree
    for part in parents:
        node = node.get(part) if isinstance(node, Mapping) else None
    return (node if isinstance(node, Mapping) else None), leaf


#: mappings whose keys are the options of a config group (a preset's coefficient per divergence, which
#: conf/divergence/*.yaml read): ``+coef_by_divergence.kl=0.2`` adds a key there, and only an option's name may
KEYED_BY_GROUP = {"coef_by_divergence": "divergence"}


#: extra config trees searched after conf/, as os.pathsep-separated folders laid out like conf/ (``es/``, ``task/``,
#: ...): where the YAML of an entry kept outside this repository lives (docs/extending.md)
CONFIG_PATH_ENV = "MIRROR_ES_CONFIG_PATH"
_SEARCHPATH = "hydra.searchpath"


def extra_config_dirs() -> list[Path]:
    """The folders ``MIRROR_ES_CONFIG_PATH`` names, in order (empty when unset)."""
    import os

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
    known = [k for k in _dotted_keys(tree) if not k.startswith("hydra")] + list(groups)
    for override in overrides:
        check_group_choice(override, groups, config)
        key, sep, value = override.partition("=")
        bare = key.lstrip("+~")
        prefix = key[:len(key) - len(bare)]
        if bare.split("@", 1)[0] in groups or bare.startswith("hydra"):
            result.append(override)
            continue
        exists, free_form, current = _lookup(tree, bare)
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


#: where the schema of a composed key lives, by its first part: the groups' own (inner_loop.config, meta.searchers and
#: launch.factory register_schemas put them in Hydra's ConfigStore), else the root's
SCHEMA_HOMES = {"": "meta/settings/schema.py", "train": "inner_loop/config.py TrainConfig",
                "divergence": "inner_loop/loss/divergences.py, the divergence's config class",
                "es": "meta/searchers/, the searcher's settings class",
                "launcher": "launch/, the launcher's settings class",
                "model": "inner_loop/config.py ModelConfig",
                "task": "inner_loop/tasks/, the task's config class"}


def schema_error(exc: BaseException, node: str = "", given: str = "") -> str:
    """An OmegaConf error (a wrong type, a key the schema lacks) as one line naming the key (under ``node``), or what
    the user wrote (``given``: the override)."""
    key = getattr(exc, "full_key", None) or ""
    key = f"{node}.{key}" if node and key else key
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not key:
        return f"{given}: {text}" if given else text
    home = SCHEMA_HOMES.get(key.split(".", 1)[0], SCHEMA_HOMES[""])
    schema = getattr(exc, "object_type", None)
    near = closest_keys(key.rsplit(".", 1)[-1], [f.name for f in dataclasses.fields(schema)]) \
        if text.startswith("Key ") and dataclasses.is_dataclass(schema) else []
    hint = f" (did you mean {', '.join(key.rsplit('.', 1)[0] + '.' + k for k in near)}?)" if "." in key and near else ""
    return f"{given or key}: {text}{hint} (the type and default of {key}: {home})"


def composition_error(exc: BaseException) -> str:
    """A Hydra composition error as one line: with the key a schema refused and where it was set (an override, or
    the config file that set it: ``train.stepz in experiment/mine``) when OmegaConf names one, else its first line."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    cause: BaseException | None = exc
    while cause is not None and not getattr(cause, "full_key", None):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return first
    given = first.removeprefix("Error merging override ").strip()
    if given.startswith("In '"):  # a config file of the composition set it
        given = f"{getattr(cause, 'full_key')} in {given.split(chr(39))[1]}"
    return schema_error(cause, given=given)


def _without_none(hint: Any) -> tuple[Any, bool]:
    """(the annotation with ``None`` taken out, whether ``None`` was allowed)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        rest = tuple(a for a in args if a is not type(None))
        if len(rest) == 1:
            return rest[0], len(rest) < len(args)
        raise TypeError(f"{hint}: a union of several types has no reading rule in core/config_nodes.py")
    return hint, False


def typed_value(where: str, value: Any, hint: Any, *, prefix: str = "") -> Any:
    """``value`` (plain data) checked and converted for a field annotated ``hint``; ValueError naming ``where``.

    One rule per annotation, for every config node: numbers written as strings (YAML 1.1 reads ``1e-3`` as one)
    are read as numbers, a list of strings must hold strings, a free-form mapping is kept intact.
    """
    hint, optional = _without_none(hint)
    if hint is Any:  # any value, null included
        return value
    if value is None:
        if optional:
            return None
        raise ValueError(f"{prefix}{where} must not be null")
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is dict or origin is dict:
        entries = args[1] if len(args) == 2 else Any
        if entries is Any:
            if not isinstance(value, Mapping):
                raise ValueError(f"{prefix}{where} must be a mapping, got {value!r}")
            return dict(value)
        if entries is float:
            if not isinstance(value, Mapping) or not all(isinstance(v, (int, float)) for v in value.values()):
                raise ValueError(f"{prefix}{where} must be a mapping of names to numbers, got {value!r}")
            return {str(k): float(v) for k, v in value.items()}
    elif hint is list or origin is list:
        if args and args[0] is str:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{prefix}{where} must be a list of strings, got {value!r}")
        elif not isinstance(value, list):
            raise ValueError(f"{prefix}{where} must be a list, got {value!r}")
        return list(value)
    elif hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{prefix}{where} must be true or false, got {value!r}")
        return value
    elif hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{prefix}{where} must be an integer, got {value!r}")
        return value
    elif hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{prefix}{where} must be a number, got {value!r}")
        return float(value)
    elif hint is str:
        if not isinstance(value, (str, Path)):
            raise ValueError(f"{prefix}{where} must be a string, got {value!r}")
        return str(value)
    raise TypeError(f"{where}: the annotation {hint} has no reading rule in core/config_nodes.py")


def typed_node(cls: type[T], data: Mapping[str, Any] | None, node: str, *, prefix: str = "", see: str = "") -> T:
    """Dataclass ``cls`` from the config node ``data`` (None: all defaults), unknown keys and wrong types refused
    with messages naming ``<node>.<key>`` (``prefix`` and ``see`` as in :func:`refuse_unknown_keys`)."""
    values = plain(data or {})
    refuse_unknown_keys(values, (f.name for f in dataclasses.fields(cls)), node,  # type: ignore[arg-type]
                        prefix=prefix, see=see)
    hints = typing.get_type_hints(cls)
    return cls(**{k: typed_value(f"{node}.{k}", v, hints[k], prefix=prefix) for k, v in values.items()})
