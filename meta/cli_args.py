"""``key=value`` arguments of the small run-dir commands (meta.export, meta.reevaluate), checked up front."""
from __future__ import annotations

from typing import Mapping, Sequence

from meta.config import ConfigError


def key_values(argv: Sequence[str], defaults: Mapping[str, str], allowed: Sequence[str], usage: str) -> dict[str, str]:
    """``defaults`` updated from ``argv``; ConfigError naming an unknown or malformed argument, or a missing run_dir."""
    args = dict(defaults)
    for item in argv:
        key, sep, value = item.partition("=")
        if not sep or key not in allowed:
            raise ConfigError(f"argument {item!r} is not one of {', '.join(k + '=' for k in allowed)}\n{usage}")
        args[key] = value
    if not args.get("run_dir"):
        raise ConfigError(f"run_dir= is required\n{usage}")
    return args
