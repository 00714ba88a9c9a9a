"""The arguments of every command that reads a run directory (meta.status, meta.export, meta.reevaluate,
results.report, results.compare), taken one way: a directory as a bare path or as ``run_dir=<path>``, an output
folder that is a folder. Why one owner: a user who learnt one command's form must not be refused by the next."""
from __future__ import annotations

from pathlib import Path

RUN_DIR_KEY = "run_dir"


def run_dir_argument(arg: str) -> str:
    """The directory an argument names: ``run_dir=<path>`` or the bare ``<path>``."""
    key, sep, value = arg.partition("=")
    return value if sep and key == RUN_DIR_KEY else arg


def check_output_folder(out: str | Path | None, flag: str = "--out") -> None:
    """ValueError when ``out`` names an existing file: the command writes several files into a folder there."""
    if out is not None and Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"{flag} {out} is an existing file, not a folder: name a folder (created when missing), "
                         "where the command writes its files")
