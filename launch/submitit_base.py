"""What every submitit-backed launcher shares: one ``map_array`` per generation, failure text, cancel.

Outcomes are never classified from submitit's job ``state`` (local jobs say FINISHED after failing): the runner
reads result files, and these classes only say whether a job is still alive and, for a dead job without a
result, what ``exception()`` reports. The backends (``launch/local``, ``launch/slurm``) subclass
SubmititLauncher with their own ``_make_executor`` and ``is_alive``.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

from launch.base import JobRef, Launcher
from launch.member import run_member
from core.records import MemberSpec

logger = logging.getLogger(__name__)

#: GPUs one member may use. A member is one plain process: with more than one GPU visible, HF Trainer wraps
#: the policy in nn.DataParallel (no distributed launch), which TRL's GRPO does not support, so every member
#: would crash after its set-up. Running members as multi-process DDP jobs is not built.
MAX_GPUS_PER_MEMBER = 1


def check_gpus_per_member(key: str, gpus: int) -> None:
    """ValueError, naming `key` and the fix, for a member that would be given more GPUs than it can use."""
    if gpus > MAX_GPUS_PER_MEMBER:
        raise ValueError(
            f"{key}={gpus}: a member trains on ONE GPU (with more visible, HF Trainer falls back to DataParallel, "
            "which TRL's GRPO refuses, and every member would crash; multi-GPU DDP members are not supported). "
            f"Set {key}=1 (conf/launcher/local.yaml and slurm.yaml take launcher.gpus_per_node from resources.gpus) "
            "and run more members at once instead (one member per GPU); LoRA fits a 1.7B model on one GPU"
        )


class SubmititLauncher(Launcher):
    """Common submission path; subclasses build the executor and answer liveness."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._jobs: dict[str, Any] = {}

    def _make_executor(self, folder: Path, timeout_s: float) -> Any:
        raise NotImplementedError

    def submit(
        self, entrypoint: str, specs: Sequence[MemberSpec], folder: Path, timeout_s: float
    ) -> list[JobRef]:
        if not specs:
            return []
        folder.mkdir(parents=True, exist_ok=True)
        executor = self._make_executor(folder, timeout_s)
        spec_dicts = [s.to_dict() for s in specs]
        jobs = executor.map_array(run_member, [entrypoint] * len(specs), spec_dicts, [timeout_s] * len(specs))
        refs = []
        for spec, job in zip(specs, jobs):
            self._jobs[str(job.job_id)] = job
            refs.append(JobRef(job_id=str(job.job_id), folder=str(folder), attempt=spec.attempt))
        return refs

    def failure_reason(self, ref: JobRef) -> str:
        job = self._job(ref)
        if job is None:
            return "job ended without writing a result"
        try:
            exc = job.exception()
        except Exception as err:  # UncompletedJobError and friends carry the job's stderr tail
            return f"job ended without writing a result: {str(err)[-2000:]}"
        if exc is None:
            return "job ended without writing a result (submitit reports success)"
        return f"job ended without writing a result: {str(exc)[-2000:]}"

    def cancel(self, refs: Sequence[JobRef]) -> None:
        for ref in refs:
            job = self._job(ref)
            if job is None:
                continue
            try:
                job.cancel(check=False)
            except Exception as exc:
                logger.warning("could not cancel job %s: %s", ref.job_id, exc)

    def _job(self, ref: JobRef) -> Any | None:
        return self._jobs.get(ref.job_id)

    def close(self) -> None:
        """Drop the job handles while the interpreter is whole: submitit's jobs tidy up in ``__del__``, which fails
        noisily ("Exception ignored in LocalJob.__del__") when it only runs at interpreter exit."""
        self._jobs.clear()
