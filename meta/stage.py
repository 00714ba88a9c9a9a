"""``python -m meta.stage [the overrides of meta.run]``: fetch what the search's members read from the hub (model
with tokenizer and chat template, the task's dataset, the transfer tasks' datasets) into the stage cache, before any
job exists.

Why a command of its own: on a cluster the login node usually has network and the compute nodes do not; staging
there once, then submitting, lets 180 members read one local copy offline. ``meta.run`` stages the same way before
its first submission (nothing is fetched twice), and pins what it staged in the run's manifest under ``staged``
(commit, content hash, bytes per repository); members get the staged local paths in their config and run with the
hub and datasets offline. A dry run only looks: one line per item, and exit status 2 when something is missing
while offline (HF_HUB_OFFLINE=1), before anything is written.
The work is meta/search/staging.py's (the same as meta.run's); this is the door.
"""
from __future__ import annotations

import logging
import sys
from typing import Sequence

from core.stage_pins import MANIFEST_KEY, STAGED

logger = logging.getLogger("meta.stage")

USAGE = """usage: python -m meta.stage [key=value ...]   (the same overrides as python -m meta.run)

Fetch the model (weights, tokenizer, chat template) and the datasets the search's members read from the hub (the
task's, and the transfer tasks' of reevaluate.transfer) into the stage cache (stage.cache_dir; null:
$MIRROR_ES_CACHE/hub), so that meta.run and its members need no network.
stage.revisions={repo_id: revision} pins a revision (default main); dry_run=true only reports what is staged."""


def stage_command(argv: Sequence[str]) -> int:
    """Stage (or, with dry_run=true, only check) what ``meta.run <argv>`` would need; writes no run directory."""
    from meta.search.run import prepare

    cfg, _raw, _store, manifest, _resuming = prepare(argv)
    items = (manifest.get(MANIFEST_KEY) or {}).get("items")
    if items is None:
        sys.stdout.write("nothing to stage: the member program reads nothing from the hub\n")
        return 0
    # The pins are this command's output (for pipes and files), as the plan is a dry run's.
    rows = [f"{item['status']:<8} {item['kind']:<8} {item['repo_id']} @ {item['revision'] or '-'}  "
            f"{item['path'] if item['status'] == STAGED else item['detail']}" for item in items]
    sys.stdout.write("\n".join(rows or ["nothing to stage: the model and the data are built here or local files"])
                     + "\n")
    sys.stdout.flush()
    if items and not cfg.dry_run:
        logger.info("start the search with: python -m meta.run %s", " ".join(argv))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from meta.cli_args import run_command

    return run_command(argv, USAGE, stage_command, "stage error")


if __name__ == "__main__":
    sys.exit(main())
