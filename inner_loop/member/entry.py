"""The inner loop's member program (``inner.entrypoint=inner_loop.member.entry:program``): what meta asks of an
NM-GRPO member (core/member_program.py), and its training under the numerics the run asks for.

A run with ``model.cpu_numerics: pinned`` must compute under the pinned settings (inner_loop/process/pinned.py), which
only take effect in a process that starts with them. Unless this process did (it is such a child, or torch runs
here under the pinned settings already), the member trains in a child process started with them, and its record is
returned here. The process that calls this stays light (this module imports no torch), so a launched member pays one
Python start-up more, not a second torch import. The child also keeps vLLM out when the run does not generate with
it: TRL imports vLLM whenever it is installed, seconds per process.

Runs with native numerics (every GPU preset) train in this process, as before.

In a SLURM array task it also handles the job's end notices (inner_loop/process/notice.py): SIGTERM or the time-limit
USR2 makes the trainer (here or in the pinned child, to which the notice is forwarded) save a checkpoint at the end
of its step before submitit requeues the job or the process exits.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any, ContextManager, Iterable, Mapping

import inner_loop.process.pinned as numerics
import inner_loop.process.pinned_child as pinned_child
import inner_loop.process.notice as notice
from core.member_program import MemberProgram, named_by
from core.records import MemberSpec, ResultRecord
from results.store.member_files import read_result

logger = logging.getLogger(__name__)

#: submitit's SUBMITIT_EXECUTOR in the process of a job it started (a process that exists to run one member)
SLURM_EXECUTOR = "slurm"
JOB_PROCESS_EXECUTORS = ("local", SLURM_EXECUTOR)


def _spec_dict(spec: MemberSpec | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(spec, MemberSpec):
        return spec.to_dict()
    if isinstance(spec, Mapping):
        return dict(spec)
    raise TypeError(f"a member expects a MemberSpec or its dict, got {type(spec).__name__}")


def needs_pinned_child(inner: Mapping[str, Any]) -> bool:
    """Whether a run with this inner config must train in a pinned child process (it asks for pinned numerics,
    the CPU can give them, and this process does not compute with them)."""
    if not numerics.wants_pinned(inner):
        return False
    if not numerics.can_pin():
        logger.warning("model.cpu_numerics=pinned needs a CPU with AVX2 and FMA, which this one lacks: the run "
                       "uses this machine's own numerics and will not match other machines' runs")
        return False
    if numerics.started_pinned():
        return False
    return not ("torch" in sys.modules and numerics.pinned_in_force())


def _train_here_or_pinned(data: dict[str, Any], save_final: bool) -> ResultRecord:
    if needs_pinned_child(data.get("inner") or {}):
        return _train_in_pinned_child(data, save_final)
    from inner_loop.member.lifecycle import train_in_process

    return train_in_process(data, save_final=save_final)


def settle_member_process(inner: Mapping[str, Any]) -> None:
    """A process that exists for this one member: vLLM out unless used, and offline (HF_HUB_OFFLINE,
    HF_DATASETS_OFFLINE) when the member reads nothing from the hub (a staged run: inner_loop/member/staging.py). Never in a
    process that may do other work later (a test session, an in-process debug member, an orchestrator)."""
    from inner_loop.member.staging import hub_references
    from inner_loop.process.offline import go_offline

    keep_vllm_out_unless_used(inner)
    try:
        local = not hub_references(inner)
    except (ValueError, KeyError, TypeError):  # a bad config: the member records that as its failure
        return
    if local:
        go_offline()


def uses_vllm(inner: Mapping[str, Any]) -> bool:
    """The run generates with vLLM (``train.trl.use_vllm``)."""
    return bool(((inner.get("train") or {}).get("trl") or {}).get("use_vllm"))


def keep_vllm_out_unless_used(inner: Mapping[str, Any]) -> None:
    """TRL imports vLLM whenever it is installed, which costs a member process 4-8 s; a member that does not generate
    with vLLM never needs it. Hidden from this process only (``sys.modules["vllm"] = None``: find_spec answers None
    and an import fails): called only in a process that exists for this one member (the pinned child, a job's
    process, `python -m inner_loop.run` for one run), never in one that may use vLLM for something else later (a
    test session, an orchestrator, a sweep)."""
    if not uses_vllm(inner) and "vllm" not in sys.modules:
        sys.modules["vllm"] = None  # type: ignore[assignment]


def _train_in_pinned_child(data: dict[str, Any], save_final: bool) -> ResultRecord:
    work_dir = Path(data["work_dir"])
    logger.info("member %s: training in a pinned child process", work_dir)
    try:
        code, _ = pinned_child.run_pinned_child(__name__, {"spec": data, "save_final": save_final},
                                            started=notice.attach_child,
                                            forkable=not uses_vllm(data.get("inner") or {}))
    finally:
        notice.attach_child(None)
    record = read_result(work_dir)
    if record is None and code != 0:
        from inner_loop.member.preflight import PreflightError, preflight_failure

        failure = preflight_failure(work_dir)
        if failure is not None:  # the child's node failed its pre-flight: the job must end without a result too
            raise PreflightError(failure)
    if record is None:
        raise RuntimeError(f"the pinned member process for {work_dir} exited with status {code} without a result")
    return record


class NMGRPOProgram(MemberProgram):
    """One NM-GRPO training run per member; each hook imports its module when called, so that meta, which loads this
    program to validate and stage, and the job process, which must decide its numerics first, load no torch here."""

    def train(self, spec: MemberSpec | Mapping[str, Any], save_final: bool = False) -> ResultRecord:
        """Train and validate one member under the numerics its config asks for; returns its ResultRecord."""
        data = _spec_dict(spec)
        executor = os.environ.get("SUBMITIT_EXECUTOR")
        if "torch" not in sys.modules and executor in JOB_PROCESS_EXECUTORS:
            settle_member_process(data.get("inner") or {})  # a job's own process, there for this member alone
        if executor == SLURM_EXECUTOR and threading.current_thread() is threading.main_thread():
            notice.install()  # after submitit's handlers, which run once the checkpoint is saved
            return notice.run_handing_on(lambda: _train_here_or_pinned(data, save_final))
        return _train_here_or_pinned(data, save_final)

    def validate(self, inner: Mapping[str, Any]) -> None:
        """The config and data checked without training: inner_loop.training.setup.validate_inner."""
        from inner_loop.training.setup import validate_inner

        validate_inner(inner)

    def finalize(self, spec: MemberSpec | Mapping[str, Any]) -> None:
        """A settled member's checkpoints follow train.keep_checkpoints (inner_loop.training.checkpoints, which
        imports no trainer: the orchestrator calls this for every settled member)."""
        from inner_loop.training.checkpoints import finalize_member

        finalize_member(spec)

    def hosting_here(self, inner: Mapping[str, Any]) -> ContextManager[Any] | None:
        """Members with pinned numerics on this machine: a fork server (inner_loop/process/fork_server.py) that
        imports their stack once, so that each pinned child starts without ~7 CPU-s of imports."""
        if not numerics.wants_pinned(inner):
            return None
        from inner_loop.process.fork_server import serving

        return serving()

    def stage(self, inner: Mapping[str, Any], **options: Any) -> list[dict[str, Any]]:
        """The model's and the tasks' hub repositories in the stage cache: inner_loop.member.staging.stage_inner."""
        from inner_loop.member.staging import stage_inner

        return stage_inner(inner, **options)

    def use_staged(self, inner: Mapping[str, Any], pins: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """``inner`` reading the staged snapshots: inner_loop.member.staging.use_staged."""
        from inner_loop.member.staging import use_staged

        return use_staged(inner, pins)

    def preflight(self, inner: Mapping[str, Any], directory: str | Path, probe_sandbox: bool) -> None:
        """The members' pre-flight (inner_loop/member/preflight.py) on the submitting host, before the first
        submission: ValueError naming this host and the cause."""
        from inner_loop.member.preflight import PreflightError, run_preflight

        try:
            run_preflight(inner, Path(directory), probe_sandbox=probe_sandbox, member=False)
        except PreflightError as exc:
            raise ValueError(str(exc)) from None


program = NMGRPOProgram()


@named_by(program)
def train_member(spec: MemberSpec | Mapping[str, Any], save_final: bool = False) -> ResultRecord:
    """``program.train``, by the name earlier searches stored as ``inner.entrypoint`` (and direct callers use)."""
    return program.train(spec, save_final=save_final)


def _child_main() -> int:
    logging.basicConfig(level=os.environ.get("MIRROR_ES_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    payload = numerics.read_child_payload()
    settle_member_process(payload["spec"].get("inner") or {})
    notice.install()  # a notice forwarded by the job process: save at the end of the step, then stop
    try:
        program.train(payload["spec"], save_final=bool(payload.get("save_final")))  # the record is in its work dir
    except notice.NoticeHonoured:
        return notice.SAVED_ON_NOTICE_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
