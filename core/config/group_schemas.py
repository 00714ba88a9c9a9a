"""A config group's schema per registry entry: a field's default and help in one place (``setting``), the ConfigStore
name a group option's YAML names first (``schema_name``), and storing every entry's schema (``store_schemas``), for the
searchers', launchers', models' and tasks' registries alike. Imports nothing (Hydra's store is passed in)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping


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
