"""One batch of member runs outside the generations (re-evaluation's selection and reporting stages): the same
runner, retries, timeouts and resumable jobs.json as a generation, in its own folder."""
from __future__ import annotations

import logging
from pathlib import Path

from launch.base import Launcher
from launch.factory import runner_policy
from launch.runner import MemberArrayRunner
from meta.settings.schema import SearchSchema
from results.store.layout import JOBS_FILE, LAUNCHER_DIR
from core.records import MemberSpec, ResultRecord
from results.store.run_store import read_jobs_file, write_jobs_file

logger = logging.getLogger(__name__)


def run_phase(cfg: SearchSchema, launcher: Launcher, folder: Path, specs: list[MemberSpec],
              label: str) -> dict[int, ResultRecord]:
    """Run (or resume) ``specs`` whose work dirs are inside ``folder``; the records by member index."""
    folder.mkdir(parents=True, exist_ok=True)
    jobs_path = folder / JOBS_FILE
    runner = MemberArrayRunner(
        launcher=launcher, entrypoint=cfg.inner.entrypoint, specs=specs, jobs=read_jobs_file(jobs_path),
        save_jobs=lambda jobs: write_jobs_file(jobs_path, jobs), launcher_folder=folder / LAUNCHER_DIR,
        policy=runner_policy(cfg.retries, cfg.inner.timeout_s, cfg.launcher_node),
        on_final=lambda spec, record, progress: logger.info(
            "%s run %03d: %s %s (%d/%d)", label, spec.index, record.status,
            f"{record.fitness:.4f}" if record.ok else record.error.strip()[-160:], progress.done, progress.total),
    )
    return runner.run()
