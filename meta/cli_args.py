"""The command line of the meta.* commands: one entry-point contract (help, logging, exit 2 on bad input) and the
``key=value`` arguments of the small run-dir commands (meta.export, meta.reevaluate), checked up front."""
from __future__ import annotations

import logging
import os
import sys
from typing import Callable, Mapping, Sequence

from meta.search.config import ConfigError
from results.report.arguments import RUN_DIR_KEY
from core.config.plain_data import closest_keys

LOG_LEVEL_ENV = "MIRROR_ES_LOG_LEVEL"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def run_command(argv: Sequence[str] | None, usage: str, body: Callable[[list[str]], int], error_label: str) -> int:
    """Exit code of ``body(argv)``: -h/--help prints ``usage`` (0); a ConfigError is one line on stderr, exit 2.

    Logging goes to stderr at $MIRROR_ES_LOG_LEVEL (INFO by default) so every command logs the same way.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        sys.stdout.write(usage + "\n")
        return 0
    logging.basicConfig(level=os.environ.get(LOG_LEVEL_ENV, "INFO"), format=LOG_FORMAT)
    # evotorch warns at import that logging is already configured (by the line above): noise, not news.
    logging.getLogger("evotorch").addFilter(lambda record: "already configured" not in record.getMessage())
    try:
        return body(args)
    except ConfigError as exc:
        sys.stderr.write(f"{error_label}: {exc}\n")
        return 2


def key_values(argv: Sequence[str], defaults: Mapping[str, str], allowed: Sequence[str], usage: str) -> dict[str, str]:
    """``defaults`` updated from ``argv``; ConfigError naming an unknown or malformed argument, or a missing run_dir.
    A bare path is the run_dir, as in every command that reads a run directory (results/report/arguments.py)."""
    args = dict(defaults)
    for item in argv:
        key, sep, value = item.partition("=")
        if not sep and RUN_DIR_KEY in allowed and not args.get(RUN_DIR_KEY):
            key, sep, value = RUN_DIR_KEY, "=", item
        if not sep or key not in allowed:
            near = closest_keys(key, allowed)
            hint = f" (did you mean {near[0]}=?)" if near and sep else ""
            raise ConfigError(f"argument {item!r} is not one of {', '.join(k + '=' for k in allowed)}{hint}\n{usage}")
        args[key] = value
    if not args.get("run_dir"):
        raise ConfigError(f"run_dir= is required\n{usage}")
    return args
