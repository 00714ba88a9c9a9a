"""The callable every SLURM array task runs: ``run_member`` made requeueable (submitit Checkpointable).

On the time-limit signal (or a preemption signal) submitit calls ``checkpoint``, which resubmits this same
call unchanged; the requeued job (same job id) calls ``run_member`` again with the same work dir, and the
inner entry point resumes from the checkpoint it keeps there. Each run adds its running time to the member's
ledger (submitit's handler ends a run with SystemExit, which run_member lets through after closing the ledger),
and a requeued run's alarm gets only what is left of ``inner.timeout_s``; time queued between runs never counts.
After ``max_num_timeout`` requeues submitit raises UncompletedJobError inside the member, which run_member
records as status ``timeout``.
Light on purpose (no torch): it is imported by every array task.
"""
from __future__ import annotations

from typing import Any, Mapping

import submitit
from submitit.core.utils import UncompletedJobError

from launch.member import run_member


class CheckpointableMember(submitit.helpers.Checkpointable):
    """``CheckpointableMember()(entrypoint, spec, timeout_s)`` == ``run_member(...)``, requeued on time limit."""

    def __call__(self, entrypoint: str, spec: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        return run_member(entrypoint, spec, timeout_s, out_of_time=(UncompletedJobError,))
