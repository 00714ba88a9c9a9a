"""The launchers of this machine: ``local`` (one process per member) and ``debug`` (in-process, for tests)."""
from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from launch.base import (DEFAULT_KILL_GRACE_S, JobRef, LauncherPlan, LauncherSettings, PlanContext, SubmissionError,
                         machine_plan)
from launch.local.controllers import controller_running, sigint_deliverable_to_children, stop_controllers
from launch.local.gpu_slots import GpuSlotBook, Slot, cut_slots
from launch.member import load_program, run_member
from launch.submitit_base import MAX_GPUS_PER_MEMBER, SubmititLauncher, check_gpus_per_member
from results.store.gpu_share import read_gpu_share, write_gpu_share
from core.config.group_schemas import setting
from core.gpu_time import MEMBERS_PER_GPU_CHOICES
from core.records import MemberSpec

logger = logging.getLogger(__name__)


class HostedPrograms:
    """What each member program shares among its members on this machine (MemberProgram.hosting_here: the inner
    loop's fork server), from the first submission of its members to the launcher's close."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._asked: set[str] = set()

    def ensure(self, entrypoint: str, specs: Sequence[MemberSpec]) -> None:
        """Enter ``entrypoint``'s hosting, asked once with its first members' config."""
        if entrypoint in self._asked or not specs:
            return
        self._asked.add(entrypoint)
        hosting = load_program(entrypoint).hosting_here(specs[0].inner)
        if hosting is not None:
            self._stack.enter_context(hosting)

    def close(self) -> None:
        self._stack.close()
        self._asked.clear()


@dataclass
class LocalSettings(LauncherSettings):
    """launcher=local's keys (conf/launcher/local.yaml composes on them as launcher/local_schema)."""

    array_parallelism: Optional[int] = setting(None, "members running at once; null: this machine's cores, or with "
                                                     "GPUs one per GPU slot")
    gpus_per_node: Optional[int] = setting(
        None, "GPUs of each member. N >= 1: each member in flight gets its OWN N GPUs from visible_gpus as its "
              "CUDA_VISIBLE_DEVICES; members wait for a free slot, so at most len(visible_gpus) / N run at once (and "
              "at most array_parallelism); a slot comes back when its member's process ends. 0 hides every GPU (CPU "
              "members). null: every member sees exactly the GPUs this process sees (no slots). A member trains on "
              "at most ONE GPU: N > 1, or null while this process sees several GPUs, is refused up front",
        composed="${resources.gpus}")
    visible_gpus: list[int] = setting([], "the GPUs the slots are cut from (empty: the GPUs this process sees: "
                                          "CUDA_VISIBLE_DEVICES, else every device torch sees)")
    members_per_gpu: int = setting(1, "members sharing each GPU slot (resources.members_per_gpu: 1, 2 or 4): with k, "
                                      "every slot takes k members at once, an antithetic pair on the same GPU; each "
                                      "member still runs in its own process", composed="${resources.members_per_gpu}")


class LocalLauncher(SubmititLauncher):
    """Each member runs in its own process on this machine (submitit.LocalExecutor).

    Jobs survive the orchestrator: a restarted orchestrator finds them by the controller's process id.
    The executor's own wall limit is set a grace period past inner.timeout_s, so a member that hangs in C
    code (where the in-process alarm cannot fire) is still killed. With ``gpus_per_node`` >= 1 every member in
    flight holds its own slot of ``visible_gpus`` (launch/local/gpu_slots.py) and members wait for a free one.
    """

    poll_interval_s = 0.2
    #: members of resources.members_per_gpu >= 2 share a GPU slot (launch/local/gpu_slots.py); no other mode
    gpu_sharing = ("slots",)
    runs_here = True
    name = "local"
    settings_class = LocalSettings

    @classmethod
    def plan(cls, name: str, options: Mapping[str, Any], context: PlanContext) -> LauncherPlan:
        """Processes on this machine: as many at once as members_at_once, each in its GPU slot."""
        concurrent = min(context.members_per_generation, cls.members_at_once(options))
        return machine_plan(name, context, f"{concurrent} processes at once", cls._gpu_view(options), concurrent,
                            cls._gpus_held(options))

    @classmethod
    def _gpus_held(cls, options: Mapping[str, Any]) -> int:
        """GPUs a member holds: its slot's (gpus_per_node), or with null every GPU this process sees."""
        per = options.get("gpus_per_node")
        if per is None:
            return len(parent_gpu_indices())
        return int(per) if cls.gpu_slots(options) else 0

    @classmethod
    def _gpu_view(cls, options: Mapping[str, Any]) -> str:
        """What each member's CUDA_VISIBLE_DEVICES will be, and a warning where no member could get a GPU."""
        per = options.get("gpus_per_node")
        if per is None:
            return "this process's GPUs (launcher.gpus_per_node=null: CUDA_VISIBLE_DEVICES passed through, shared)"
        if int(per) == 0:
            return "no GPU (launcher.gpus_per_node=0)"
        slots = cls.gpu_slots(options)
        if not slots:
            return (f"WARNING: no GPU: launcher.gpus_per_node={per} asks for a GPU per member and this process sees "
                    "none (a real run refuses to start; set launcher.visible_gpus or run on the GPU machine)")
        listed = ", ".join(",".join(str(g) for g in slot) for slot in slots)
        k = cls.members_per_gpu(options)
        whose = "their own GPU slot" if k == 1 else f"a GPU slot shared by {k} members (resources.members_per_gpu)"
        return (f"{whose}, CUDA_VISIBLE_DEVICES one of [{listed}] ({len(slots)} slot(s) of "
                f"launcher.gpus_per_node={per}; a member waits for a free place)")

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._book = GpuSlotBook(self.gpu_slots(options), self.members_per_gpu(options)) if self._slot_mode(
            options) else None
        self._members: dict[str, MemberSpec] = {}  # job id -> the member it runs (submitted by this process)
        self._hosted = HostedPrograms()

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        parallel = options.get("array_parallelism")
        if parallel is not None and (isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1):
            raise ValueError(f"launcher.array_parallelism={parallel!r} is invalid: use null (as many members at once "
                             "as this machine has cores) or an integer >= 1")
        gpus = options.get("gpus_per_node")
        if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
            raise ValueError(
                f"launcher.gpus_per_node={gpus!r} is invalid: use null (members see this process's GPUs) "
                "or an integer >= 0"
            )
        visible = options.get("visible_gpus") or []
        if isinstance(visible, (list, tuple)) and len(set(visible)) != len(visible):
            raise ValueError(f"launcher.visible_gpus={list(visible)!r} names a GPU twice: list each GPU index once")
        if not isinstance(visible, (list, tuple)) or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in visible
        ):
            raise ValueError(f"launcher.visible_gpus={visible!r} is invalid: use a list of GPU indices, e.g. [0, 1]")
        sharing = options.get("members_per_gpu", 1)
        if sharing not in MEMBERS_PER_GPU_CHOICES:
            raise ValueError(f"launcher.members_per_gpu={sharing!r} is invalid: use one of {list(MEMBERS_PER_GPU_CHOICES)} "
                             "(resources.members_per_gpu: members sharing one GPU)")
        if gpus and visible and gpus > len(visible):
            raise ValueError(
                f"launcher.gpus_per_node={gpus} is more than the {len(visible)} GPU(s) in launcher.visible_gpus"
            )
        if gpus is not None:
            check_gpus_per_member("launcher.gpus_per_node", gpus)
        else:
            parent_gpu_indices()

    @property
    def max_in_flight(self) -> int | None:
        """Asked every poll round: the slots cut once at start-up, not this process's GPUs looked up again."""
        if self._book is None:
            return self.members_at_once(self.options)
        return _slot_cap(self.options.get("array_parallelism"), len(self._book.slots) * self._book.per_slot)

    @classmethod
    def members_at_once(cls, options: Mapping[str, Any]) -> int:
        """Members in flight at most: launcher.array_parallelism (null: this machine's cores; members beyond it
        would only share the cores while each one's running-time budget counts), and with GPUs per member never
        more than there are GPU slots (null: one member per slot)."""
        parallel = options.get("array_parallelism")
        if cls._slot_mode(options):
            return _slot_cap(parallel, len(cls.gpu_slots(options)) * cls.members_per_gpu(options))
        return int(parallel) if parallel is not None else (os.cpu_count() or 1)

    @staticmethod
    def members_per_gpu(options: Mapping[str, Any]) -> int:
        """Members one GPU slot takes at once (launcher.members_per_gpu, from resources.members_per_gpu)."""
        return int(options.get("members_per_gpu") or 1)

    @staticmethod
    def _slot_mode(options: Mapping[str, Any]) -> bool:
        gpus = options.get("gpus_per_node")
        return gpus is not None and int(gpus) >= 1

    @classmethod
    def gpu_slots(cls, options: Mapping[str, Any]) -> list[Slot]:
        """The GPU slots members are given: launcher.visible_gpus (empty: the GPUs this process sees) cut into
        groups of launcher.gpus_per_node; none when members get no GPU or every GPU this process sees."""
        if not cls._slot_mode(options):
            return []
        visible = tuple(options.get("visible_gpus") or ()) or parent_gpu_indices()
        return cut_slots(visible, int(options["gpus_per_node"]))

    @classmethod
    def check_gpu_slots(cls, options: Mapping[str, Any]) -> None:
        """Before a real run: members that ask for a GPU need at least one slot, else none could ever start."""
        if cls._slot_mode(options) and not cls.gpu_slots(options):
            raise ValueError(
                f"launcher.gpus_per_node={options['gpus_per_node']} (resources.gpus) asks for a GPU per member, but "
                f"this process sees no GPU (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r}, "
                "launcher.visible_gpus empty): run on a GPU machine, name the GPUs with launcher.visible_gpus=[0,1], or "
                "train on the CPU with resources.gpus=0"
            )

    @classmethod
    def check_training_member_gpus(cls, options: Mapping[str, Any]) -> None:
        """A search's up-front check, on top of validate_options: with gpus_per_node null every member is handed
        all of this process's GPUs (the pass-through itself is right for entry points that want it), and a
        training member cannot use more than one."""
        if options.get("gpus_per_node") is None and len(parent_gpu_indices()) > MAX_GPUS_PER_MEMBER:
            raise ValueError(
                f"launcher.gpus_per_node=null passes this process's {len(parent_gpu_indices())} GPUs to every "
                "member, and a member trains on ONE GPU (with more, HF Trainer falls back to DataParallel, which "
                "TRL's GRPO refuses). Set launcher.gpus_per_node=1 and launcher.visible_gpus=[index], or "
                "CUDA_VISIBLE_DEVICES to one GPU"
            )

    check_training_members = check_training_member_gpus
    check_can_start = check_gpu_slots

    def submit(
        self, entrypoint: str, specs: Sequence[MemberSpec], folder: Path, timeout_s: float
    ) -> list[JobRef]:
        """Every spec at once; with GPU slots, SubmissionError (nothing submitted) unless each gets a free slot."""
        self._hosted.ensure(entrypoint, specs)
        if self._book is not None:
            self._book.load(folder)
            free = self._book.free(self._job_alive)
            if len(free) < len(specs):
                raise SubmissionError(f"{len(specs)} member(s) need a GPU slot each and {len(free)} of "
                                      f"{len(self._book.slots)} are free")
            return [ref for part in self.submit_chunks(entrypoint, specs, folder, timeout_s) for ref in part]
        with sigint_deliverable_to_children():  # so that cancel can stop them (launch/local/controllers.py)
            return super().submit(entrypoint, specs, folder, timeout_s)

    def submit_chunks(
        self, entrypoint: str, specs: Sequence[MemberSpec], folder: Path, timeout_s: float,
        submissions: Sequence[int] | None = None,
    ) -> Iterator[list[JobRef]]:
        """With GPU slots: one job per free slot, in the order of ``specs``, each yielded (and its slot recorded)
        as soon as it runs; specs beyond the free slots are not submitted (the runner keeps them queued)."""
        if self._book is None:
            yield self.submit(entrypoint, specs, folder, timeout_s)
            return
        self._hosted.ensure(entrypoint, specs)
        if not self._book.slots:
            raise SubmissionError("no GPU slot on this machine for members that ask for a GPU (launcher.gpus_per_node="
                                  f"{self.options.get('gpus_per_node')}, no GPU visible)")
        folder.mkdir(parents=True, exist_ok=True)
        self._book.load(folder)
        for spec, slot in zip(specs, self._book.free(self._job_alive)):
            executor = self._make_executor(folder, timeout_s, slot)
            with sigint_deliverable_to_children():
                job = executor.submit(run_member, entrypoint, spec.to_dict(), timeout_s)
            job_id = str(job.job_id)
            self._jobs[job_id] = job
            partners = self._book.holders(slot)
            self._book.take(folder, job_id, slot)
            self._members[job_id] = spec
            if self._book.per_slot > 1:
                self._record_share(job_id, spec, slot, partners)
            yield [JobRef(job_id=job_id, folder=str(folder), attempt=spec.attempt, work_dir=spec.work_dir)]

    def _record_share(self, job_id: str, spec: MemberSpec, slot: Slot, partners: Sequence[str]) -> None:
        """gpu_share.json of a member put on a slot beside others, and the others' files widened with it (partners
        started by an earlier orchestrator process are not known by their member and left out)."""
        gpus = ",".join(str(g) for g in slot)
        known = [self._members[j] for j in partners if j in self._members]
        write_gpu_share(spec.work_dir, job_id, gpus, [p.index for p in known], self._book.per_slot)
        for partner_id, partner in zip([j for j in partners if j in self._members], known):
            share = read_gpu_share(partner.work_dir) or {}
            write_gpu_share(partner.work_dir, partner_id, gpus, [*(share.get("shared_with") or []), spec.index],
                            self._book.per_slot)

    def gpus_of(self, ref: JobRef) -> Slot | None:
        """The GPUs a job of this launcher holds (its slot), or None without slots or once it ended."""
        if self._book is None:
            return None
        self._book.load(Path(ref.folder))
        return self._book.gpus_of(ref.job_id)

    def _job_alive(self, job_id: str) -> bool:
        return self.is_alive(JobRef(job_id=job_id, folder=""))

    def _make_executor(self, folder: Path, timeout_s: float, slot: Slot | None = None) -> Any:
        import submitit

        grace = float(self.options.get("kill_grace_s", DEFAULT_KILL_GRACE_S))
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(
            timeout_min=(timeout_s + grace) / 60.0,
            signal_delay_s=max(1, int(grace // 2)),
            **self._gpu_parameters(slot),
        )
        return executor

    def _gpu_parameters(self, slot: Slot | None) -> dict[str, Any]:
        """LocalExecutor sets the member's CUDA_VISIBLE_DEVICES to the first gpus_per_node of visible_gpus: the
        member's own slot when it has one; 0 GPUs hides them all; with gpus_per_node null both are set to what this
        process sees, so the member gets the same devices in the same order."""
        if slot is not None:
            return {"gpus_per_node": len(slot), "visible_gpus": tuple(slot)}
        gpus = self.options.get("gpus_per_node")
        if gpus is not None:
            return {"gpus_per_node": int(gpus), "visible_gpus": tuple(self.options.get("visible_gpus") or ())}
        indices = parent_gpu_indices()
        return {"gpus_per_node": len(indices), "visible_gpus": indices}

    def is_alive(self, ref: JobRef) -> bool:
        job = self._job(ref)
        if job is not None and getattr(job, "_process", None) is not None:
            return job._process.poll() is None
        return controller_running(ref.job_id)

    def failure_reason(self, ref: JobRef) -> str:
        if self._job(ref) is None:
            import submitit

            self._jobs[ref.job_id] = submitit.local.local.LocalJob(folder=ref.folder, job_id=ref.job_id)
        return super().failure_reason(ref)

    def cancel(self, refs: Sequence[JobRef]) -> None:
        """Ours or an earlier orchestrator's: stopped through the controller's pid (launch/local_controllers)."""
        stop_controllers([ref.job_id for ref in refs])

    def close(self) -> None:
        super().close()
        self._hosted.close()


def _slot_cap(parallel: int | None, slots: int) -> int:
    """Members at once with GPU slots: one per slot, and at most launcher.array_parallelism when it is set."""
    return slots if parallel is None else min(int(parallel), slots)


def parent_gpu_indices() -> tuple[int, ...]:
    """The GPUs this process sees, as the indices submitit's LocalExecutor takes: CUDA_VISIBLE_DEVICES as set
    here, or, when it is unset, every device torch can see (a CPU build sees none, and neither would a member).
    ValueError for GPUs named by UUID (GPU-..., MIG-...), which LocalExecutor cannot pass on."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        import torch

        return tuple(range(torch.cuda.device_count()))
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not all(part.isdigit() for part in parts):
        raise ValueError(
            f"CUDA_VISIBLE_DEVICES={value!r} names GPUs by UUID, which launcher=local cannot pass on to its members; "
            "set launcher.gpus_per_node=N and launcher.visible_gpus=[indices] (or CUDA_VISIBLE_DEVICES to indices)"
        )
    return tuple(int(part) for part in parts)


class DebugLauncher(SubmititLauncher):
    """Members run one after another inside the orchestrator (submitit.DebugExecutor): fast tests, pdb-able.

    Nothing survives the orchestrator process, so after a restart every unfinished member is resubmitted.
    """

    poll_interval_s = 0.0
    runs_here = True
    name = "debug"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._pending: list[str] = []
        self._ended: dict[str, str] = {}  # job id -> what ended it without a result (not an Exception: not rerun)
        self._hosted = HostedPrograms()

    def _make_executor(self, folder: Path, timeout_s: float) -> Any:
        import submitit

        return submitit.DebugExecutor(folder=folder)

    def submit(
        self, entrypoint: str, specs: Sequence[MemberSpec], folder: Path, timeout_s: float
    ) -> list[JobRef]:
        self._hosted.ensure(entrypoint, specs)
        refs = super().submit(entrypoint, specs, folder, timeout_s)
        ids = [f"debug-{id(self._jobs[r.job_id])}" for r in refs]
        for ref, new_id in zip(refs, ids):  # DebugJob ids are only unique within this process; say so
            self._jobs[new_id] = self._jobs.pop(ref.job_id)
            ref.job_id = new_id
            self._pending.append(new_id)
        return refs

    def progress(self) -> None:
        """Run the next pending member; ``exception()`` executes it without DebugJob's pdb hook."""
        while self._pending:
            job_id = self._pending.pop(0)
            job = self._jobs.get(job_id)
            if job is None or job.cancelled:
                continue
            try:
                job.exception()
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # e.g. a failed pre-flight: a job that ends without a result, not a crash
                logger.warning("debug job ended without a result: %s", exc)  # of the orchestrator; resubmitted
                self._ended[job_id] = str(exc)
            return

    def is_alive(self, ref: JobRef) -> bool:
        job = self._job(ref)
        return job is not None and not job.cancelled and ref.job_id in self._pending

    def failure_reason(self, ref: JobRef) -> str:
        job = self._job(ref)
        if job is None:
            return "job was lost with the orchestrator process (debug launcher)"
        if ref.job_id in self._ended:  # asking the DebugJob again would run the member again
            return f"job ended without writing a result: {self._ended[ref.job_id]}"
        return super().failure_reason(ref)

    def close(self) -> None:
        super().close()
        self._hosted.close()
