"""The ``early_stop`` node of conf/config.yaml: its keys, defaults and ranges.

Why in the settings, not beside the rule (meta/search/generation/early_stop.py): the settings' schema and keys sit
below the search and read this node, so it lives where they may import it; the rule imports it from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from core.config.typed_nodes import typed_node


class EarlyStopError(ValueError):
    """An early_stop setting that cannot work with this search (reported before anything runs)."""


@dataclass
class EarlyStopConfig:
    """``early_stop.*`` of conf/config.yaml; this dataclass owns the defaults and their meaning (the schema,
    meta/settings/schema.py, registers it as the node; the rule, meta/search/generation/early_stop.py, reads it;
    not frozen, since Hydra sets its fields from overrides)."""

    #: off by default: stopping is exact only when early decisions are right, which the pilot must show first
    enabled: bool = False
    #: the decision step as a fraction of train.steps; round(at_fraction x steps) must be an eval_every step
    at_fraction: float = 0.33
    #: decide only once this fraction of the population has reported at the decision step
    min_reported: float = 0.5
    #: stop when below the median of the reported scores by more than margin x noise
    margin: float = 2.0
    #: standard deviation of an early score across seeds of one init (meta.pilot's `early noise`); required
    noise: float | None = None

    @classmethod
    def from_mapping(cls, node: Mapping[str, Any] | None) -> "EarlyStopConfig":
        """The ``early_stop`` node of a resolved config; EarlyStopError naming the key on a bad value."""
        if node is not None and not isinstance(node, Mapping):
            raise EarlyStopError(f"early_stop={node!r} must be a mapping {{enabled: true, noise: 0.05, ...}}")
        try:
            config = typed_node(cls, node, "early_stop")
        except ValueError as exc:
            raise EarlyStopError(str(exc)) from None
        return config.checked()

    def checked(self) -> "EarlyStopConfig":
        """This config, its values' ranges checked (a search's config has its types read by the schema already);
        EarlyStopError naming the key."""
        if not 0.0 < self.at_fraction < 1.0:
            raise EarlyStopError(f"early_stop.at_fraction={self.at_fraction} must be between 0 and 1 (exclusive)")
        if not 0.0 < self.min_reported <= 1.0:
            raise EarlyStopError(f"early_stop.min_reported={self.min_reported} must be in (0, 1]")
        if self.margin < 0.0:
            raise EarlyStopError(f"early_stop.margin={self.margin} must be >= 0")
        return self
