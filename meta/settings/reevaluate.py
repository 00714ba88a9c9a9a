"""The ``reevaluate`` node as the runs after a search read it: its rows resolved (``baselines: null`` is every row of
the result table) and its cross-key checks, once, for meta.run, meta.pilot and meta.reevaluate.

Why here and not in the schema: the node's keys, types and ranges are the schema's (meta/settings/schema.py
Reevaluate); what they mean together needs the divergence registry (which rows exist) and the task configs (which
transfer tasks exist), and the search's config (SearchSchema.reevaluate_settings) reads it through this module. It
raises ValueError naming the key; the schema turns it into its ConfigError.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from core.config.groups import group_file
from meta.settings.paths import CONF_DIR

#: the rows of the result table that are not a divergence's own (meta/search/after/baselines.py says what each row
#: is): those around the search's map come before the divergences' rows, the untrained model after them
MAP_BASELINES = ("center", "nm_random", "radius_random")
UNTRAINED_BASELINE = "base"
#: separates a baseline's name from the preset file it takes its settings from (``kl@kl_tuned.yaml``)
PRESET_MARK = "@"


def baselines() -> tuple[str, ...]:
    """Every baseline row of the result table: the map rows, each divergence's row (its registry entry says
    whether it has one), the untrained model; ``reevaluate.baselines: null`` trains them all."""
    from inner_loop.loss.divergences import baseline_rows

    return (*MAP_BASELINES, *baseline_rows(), UNTRAINED_BASELINE)


@dataclass(frozen=True)
class ReevaluateConfig:
    """What happens after a search, in two stages (meta/search/after/reevaluate.py, meta/search/after/reporting.py).
    Selection: the ``top_k`` members by search fitness and the final centre, each retrained on ``seeds`` fresh seeds;
    the export is the one with the highest mean minus one standard error. Reporting: the exported init and every one
    of ``baselines`` retrained on ``report_seeds`` other fresh seeds (shared by all rows, used for nothing else),
    scored on validation, on the test split (``test``) and on each ``transfer`` task's test split, all from the
    same trained model: the result table. Its keys' defaults are the schema's; this is the node resolved."""

    top_k: int
    seeds: int
    report_seeds: int
    baselines: tuple[str, ...]
    transfer: tuple[str, ...]
    test: bool

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> "ReevaluateConfig":
        """The reevaluate node (its keys' types and ranges checked by the schema) resolved, its cross-key checks
        made; ValueError naming the key."""
        top_k, seeds, report_seeds = node["top_k"], node["seeds"], node["report_seeds"]
        if top_k and seeds < 2:
            raise ValueError(f"reevaluate.seeds={seeds} gives no spread to compare inits by; use 2 or more "
                             "(or reevaluate.top_k=0 to skip re-evaluation)")
        if top_k and report_seeds == 1:
            raise ValueError("reevaluate.report_seeds=1 gives no interval; use 2 or more (3+ for a useful one), "
                             "or 0 to skip the result table")
        transfer = _names("reevaluate.transfer", node["transfer"])
        missing = [t for t in transfer if group_file(CONF_DIR, "task", t) is None]
        if missing:
            raise ValueError(f"reevaluate.transfer: {missing[0]!r} is not a task (conf/task/{missing[0]}.yaml)")
        return cls(top_k=top_k, seeds=seeds, report_seeds=report_seeds, baselines=_baselines(node["baselines"]),
                   transfer=transfer, test=node["test"])


def _names(key: str, value: Sequence[str]) -> tuple[str, ...]:
    if len(set(value)) != len(value):
        raise ValueError(f"{key}={list(value)} names a row twice")
    return tuple(value)


def _baselines(value: Sequence[str] | None) -> tuple[str, ...]:
    """reevaluate.baselines: known rows, or ``<row>@<preset file>`` with an existing file (meta/search/after/
    baselines.py reads it); the untrained model has no training settings to take from a preset."""
    key = "reevaluate.baselines"
    known = baselines()
    if value is None:
        return known
    names = _names(key, value)
    for name in names:
        row, mark, path = name.partition(PRESET_MARK)
        if row not in known:
            raise ValueError(f"{key}: {row!r} is not one of {', '.join(known)} (a tuned row: <row>@<file>)")
        if not mark:
            continue
        if row == UNTRAINED_BASELINE:
            raise ValueError(f"{key}: {name!r}: the untrained model (base) trains nothing a preset could set")
        if not Path(path).is_file():
            raise ValueError(f"{key}: {name!r}: no preset file {path} (what meta.tune ... export= writes, or a YAML "
                             "of divergence/train settings)")
    return names
