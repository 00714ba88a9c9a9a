"""The launcher interface: turn member specs into jobs, and tell whether a job can still produce a result.

A launcher knows nothing about evolution strategies or LLMs. The runner (launch/runner.py) reads outcomes
from the members' result files and asks the launcher only three things: submit these specs as one array, is
this job (possibly submitted by a previous orchestrator process) still alive, and why did a dead job leave no
result. A new backend (SLURM) is one subclass plus a conf/launcher/<name>.yaml naming it in ``cls``.
"""
from __future__ import annotations

import abc
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping, Optional, Sequence

from core.config.group_schemas import setting
from core.gpu_time import GpuSharing
from core.records import MemberSpec


@dataclass
class JobRef:
    """What is persisted in jobs.json for one member so that a restarted orchestrator can re-attach."""

    job_id: str
    folder: str
    attempt: int = 0
    submissions: int = 1
    #: the member's work dir (where a launcher looks for what its job left: a failed pre-flight, a member's log)
    work_dir: str = ""
    #: the work dirs of the other members run by the same job (a packed task: resources.members_per_gpu >= 2)
    packed_with: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.packed_with:  # jobs.json of unpacked runs stays as it was
            del data["packed_with"]
        if not self.work_dir:
            del data["work_dir"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobRef":
        return cls(
            job_id=str(data["job_id"]),
            folder=str(data["folder"]),
            attempt=int(data.get("attempt", 0)),
            submissions=int(data.get("submissions", 1)),
            work_dir=str(data.get("work_dir") or ""),
            packed_with=[str(d) for d in data.get("packed_with") or []],
        )


def machine_plan(name: str, context: PlanContext, how: str, view: str, concurrent: int, held: int) -> LauncherPlan:
    """The plan of a launcher that runs members on this machine: resources.gpus and mem_gb per member, one CPU per
    training thread; ``how`` they run, what GPUs they ``view``, how many at once, how many GPUs each holds."""
    mem = context.resources.get("mem_gb")
    return LauncherPlan(
        lines=("", f"launcher={name}: each member on this machine, {how}; members see {view}"),
        concurrent=concurrent, gpus=int(context.resources.get("gpus") or 0), gpus_held=held,
        cpus=context.num_threads, mem_gb=mem,
        mem_text=f"{mem:g} GB (resources.mem_gb; not enforced on this machine)" if mem is not None else "not limited")


class SubmissionError(RuntimeError):
    """The backend could not submit (after its own retries). Jobs of earlier chunks were already handed
    to the runner, so the run can stop cleanly and a resume re-attaches to them."""


#: defaults of the launcher keys every backend reads (LauncherSettings; the runner's policy falls back on them)
#: a member still running this long after inner.timeout_s is killed or cancelled
DEFAULT_KILL_GRACE_S = 30.0
#: resubmissions of a member whose job vanished without a result
DEFAULT_MAX_LOST_RESUBMITS = 3


@dataclass
class LauncherSettings:
    """The launcher node: the keys every launcher has. A launcher with keys of its own declares a subclass
    (``Launcher.settings_class``), registered in Hydra's ConfigStore as ``launcher/<name>_schema`` (launch/factory.py
    register_schemas), which its YAML (conf/launcher/<name>.yaml) names first in its defaults and then sets only what
    differs, so each field is the one home of its key's type, default and help. A field whose metadata has
    ``composed`` (``"${resources.gpus}"``) reads that key where conf/ is composed: the launcher follows the member's
    resources unless its YAML says otherwise; its default serves a node built in code."""

    name: str = setting("", "the launcher (the launcher group's option: conf/launcher/<name>.yaml)")
    cls: str = setting("", "module:Class of its launch.base.Launcher subclass")
    kill_grace_s: float = setting(DEFAULT_KILL_GRACE_S, "a member is killed (cancelled) this long after "
                                                        "inner.timeout_s if it did not stop itself")
    max_lost_resubmits: int = setting(DEFAULT_MAX_LOST_RESUBMITS, "resubmissions of a job that vanished without a "
                                                                  "result")
    result_grace_s: float = setting(0.0, "a job that ended with no result.json in sight is looked at again this long "
                                         "after before it counts as lost or failed (0 on this machine's filesystem; "
                                         "~60-90 on NFS, where another node's new file can stay invisible ~60 s)")
    gpu_sharing: Optional[str] = setting(None, "how members of resources.members_per_gpu >= 2 share a GPU: one of "
                                               "the launcher class's gpu_sharing modes; null: its own way")


@dataclass(frozen=True)
class PlanContext:
    """What a launcher's part of a dry-run plan reads of the search, given in one go by meta/search/plan.py."""

    #: members of one generation (the population, plus the control member when there is one)
    members_per_generation: int
    #: generations left to run, and the first of them
    generations: int
    first_generation: int
    #: a member's running-time limit (inner.timeout_s)
    inner_timeout_s: float
    #: the ``resources`` node (gpus, mem_gb, step_time_s, ...)
    resources: Mapping[str, Any]
    #: train.num_threads: a member's CPU threads where the launcher does not set its CPUs itself
    num_threads: int
    #: how members share a GPU (resources.members_per_gpu) and how much slower each runs then
    sharing: GpuSharing
    #: where the first generation's launcher files would go, and the run's id (RUNID for a new run); None: the
    #: plan is asked for its figures only (no script to show)
    launcher_dir: Path | None = None
    run_id: str = "RUNID"


@dataclass(frozen=True)
class LauncherPlan:
    """A launcher's own part of a dry-run plan: its section's lines and the figures the plan's totals use."""

    #: its section (arrays or slots, packing, members at once, time limit, a script), printed as given
    lines: tuple[str, ...]
    #: members of one generation running at once
    concurrent: int
    #: GPUs one member asks for (what GPU-hours count)
    gpus: int
    #: GPUs one member holds on its machine (what "at once" counts; 0 when it gets none)
    gpus_held: int
    #: CPUs one member holds
    cpus: int
    #: memory one member holds in GB (None: not limited), and how the plan says it
    mem_gb: float | None
    mem_text: str


class Launcher(abc.ABC):
    """Submits member arrays; subclasses wrap one submitit executor type (or anything else). A launcher class
    declares what the rest of the code asks about it (docs/extending.md): its GPU-sharing modes and its part of
    the dry-run plan (``plan``)."""

    #: seconds between polls of result files; debug runs members in-process and needs no sleep
    poll_interval_s: float = 0.5
    #: the values ``launcher.gpu_sharing`` may take: how members of resources.members_per_gpu >= 2 share a GPU
    #: under it (none: it offers no choice; a node that sets one anyway is refused)
    gpu_sharing: ClassVar[tuple[str, ...]] = ()
    #: its members run on the host that submits them, so that host's pre-flight (the sandbox probe) speaks for them
    runs_here: ClassVar[bool] = False
    #: what ``job_namespace`` names, in words, for the message that refuses a resume elsewhere
    namespace_kind: ClassVar[str] = "host"
    #: the launcher group's option whose schema is its settings class (registered launchers: launch/factory.py)
    name: ClassVar[str] = ""
    #: the dataclass of its launcher node (LauncherSettings, or a subclass with keys of its own)
    settings_class: ClassVar[type[LauncherSettings]] = LauncherSettings

    @classmethod
    def parallel_slots(cls, options: Mapping[str, Any]) -> int | None:
        """Members of one array its scheduler runs at once where it caps them itself (an ETA counts on that many);
        None: as many as there are members (this side holds the rest back: ``max_in_flight``)."""
        return None

    @classmethod
    def pending_reasons(cls, options: Mapping[str, Any], job_ids: Sequence[str]) -> dict[str, str]:
        """Why each of these queued jobs waits, as its scheduler says it (the status views show it); {} where it
        has nothing to say or cannot be asked."""
        return {}

    @classmethod
    def plan(cls, name: str, options: Mapping[str, Any], context: PlanContext) -> LauncherPlan:
        """Its part of the dry-run plan, from its options (the launcher node less name and cls): here, members
        one after another on this machine, each with resources.gpus. Override to say how it places members."""
        return machine_plan(name, context, "one after another in this process", "this process's GPUs", 1,
                            int(context.resources.get("gpus") or 0))

    def __init__(self, **options: Any) -> None:
        self.options = dict(options)

    @property
    def max_in_flight(self) -> int | None:
        """How many members of one array may be submitted and unfinished at once (None: all). The runner holds the
        rest back and submits them as slots free up; a scheduler with its own array throttle answers None."""
        return None

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """Reject bad launcher settings (ValueError naming the key) before the run writes or submits anything."""

    @classmethod
    def check_training_members(cls, options: Mapping[str, Any]) -> None:
        """A search's up-front check, beyond validate_options, that its options suit members that train (ValueError
        naming the key); ``options`` is the whole launcher node. None here."""

    @classmethod
    def check_can_start(cls, options: Mapping[str, Any]) -> None:
        """Before a real run submits (not a dry run, which may plan another machine): ValueError when no member
        could start here; ``options`` is the whole launcher node. None here."""

    @classmethod
    def job_namespace(cls, options: Mapping[str, Any]) -> str:
        """Where this launcher's job ids mean something; a run records it and a resume elsewhere is refused (a
        job id looked up somewhere else would be someone else's job). Local process ids: this host's name."""
        return platform.node()

    @abc.abstractmethod
    def submit(
        self, entrypoint: str, specs: Sequence[MemberSpec], folder: Path, timeout_s: float
    ) -> list[JobRef]:
        """Submit ``specs`` as ONE array job; returns one JobRef per spec, in order."""

    def submit_chunks(
        self, entrypoint: str, specs: Sequence[MemberSpec], folder: Path, timeout_s: float,
        submissions: Sequence[int] | None = None,
    ) -> Iterator[list[JobRef]]:
        """Submit ``specs`` and yield the JobRefs of each submitted chunk (in the order of ``specs``) as soon
        as that chunk is in the queue, so the caller records job ids before the next chunk can fail.
        ``submissions``: how often each spec's attempt was submitted before (a backend may persist it to
        recover a chunk whose ids were never recorded). A backend that submits everything at once yields once."""
        yield self.submit(entrypoint, specs, folder, timeout_s)

    def recover(self, queued: Sequence[tuple[MemberSpec, int]], folder: Path) -> dict[int, JobRef]:
        """Jobs that an earlier process submitted for ``queued`` (spec, submissions recorded so far) but never
        recorded (it died between submitting and writing jobs.json), by member index, to re-attach to instead
        of submitting twice. Backends whose jobs die with the orchestrator find none."""
        return {}

    @abc.abstractmethod
    def is_alive(self, ref: JobRef) -> bool:
        """True while the job is queued or running; False once it ended or cannot be found."""

    def alive(self, refs: Sequence[JobRef]) -> set[str]:
        """Job ids among ``refs`` still queued or running; a cluster backend answers with one batched query."""
        return {ref.job_id for ref in refs if self.is_alive(ref)}

    def waiting(self, refs: Sequence[JobRef]) -> dict[str, str]:
        """Job ids among ``refs`` that sit in a scheduler queue for a reason that means they may never start
        (a node down for good, a partition down, a constraint no node has), each with the scheduler's
        reason; the runner gives up on one that waits like that longer than its max_pending_s. Jobs merely
        waiting their turn (priority, resources, QOS limits) are left out: they are never given up on.
        Answered from what the last liveness check learned (no extra query); backends without a queue
        never wait."""
        return {}

    def ended_status(self, ref: JobRef) -> tuple[str, str] | None:
        """(status, reason) when the backend knows how a job without a result ended (scancel, time limit, out of
        memory); None means it was lost (node failure, vanished process) and the member is resubmitted."""
        return None

    def failure_reason(self, ref: JobRef) -> str:
        """Why a job that ended produced no result file (the backend's exception text where available)."""
        return "job ended without writing a result"

    def cancel(self, refs: Sequence[JobRef]) -> None:
        """Best-effort cancellation (abort, or a member past its wall limit)."""

    def progress(self) -> None:
        """Called once per poll round; in-process launchers run pending members here."""

    def close(self) -> None:
        """Release resources at the end of a run."""
