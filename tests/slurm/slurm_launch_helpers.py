"""Shared pieces of the slurm launcher tests: member specs for the synthetic objective and a runner call."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from launch.runner import MemberArrayRunner, RunnerPolicy
from launch.slurm.launcher import SlurmLauncher
from core.records import MemberSpec, ResultRecord

ENTRY = "meta.synthetic:member"
# Fast polling for tests: a real cluster keeps the 30 s default.
FAST = {"poll_interval_s": 0.5, "query_interval_s": 2.0}


def specs(root: Path, n: int, options: dict[str, Any] | list[dict[str, Any]], generation: int = 0) -> list[MemberSpec]:
    """``n`` member specs; ``options`` for all of them, or one options dict per member."""
    per_member = options if isinstance(options, list) else [options] * n
    return [
        MemberSpec(run_id="slurm-test", generation=generation, index=i, seed=0, params=[0.02] * 4,
                   work_dir=str(root / f"member_{i:03d}"), inner={"options": per_member[i]})
        for i in range(n)
    ]


def run_generation(
    launcher: SlurmLauncher, member_specs: list[MemberSpec], folder: Path, retries: int = 0, timeout_s: float = 600,
    saved: dict[int, dict] | None = None,
) -> tuple[dict[int, ResultRecord], dict[int, dict]]:
    """Run one generation to final records; also returns the jobs map the runner persisted (into ``saved``)."""
    saved = {} if saved is None else saved
    runner = MemberArrayRunner(
        launcher, ENTRY, member_specs, {}, lambda jobs: saved.update(jobs), folder,
        RunnerPolicy(retries=retries, timeout_s=timeout_s, kill_grace_s=30),
    )
    return runner.run(), saved


class Background:
    """Run a generation in a thread so that slow cases (time limits, requeue delays) overlap."""

    def __init__(self, launcher: SlurmLauncher, member_specs: list[MemberSpec], folder: Path, **kwargs: Any) -> None:
        self.result: tuple[dict[int, ResultRecord], dict[int, dict]] | None = None
        self.error: BaseException | None = None
        self.jobs: dict[int, dict] = {}  # filled as the runner saves jobs.json: tests act on live job ids

        def target() -> None:
            try:
                self.result = run_generation(launcher, member_specs, folder, saved=self.jobs, **kwargs)
            except BaseException as exc:  # reported by join()
                self.error = exc

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> tuple[dict[int, ResultRecord], dict[int, dict]]:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"generation did not finish within {timeout:.0f} s")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result
