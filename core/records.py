"""The contract between the outer loop (meta), the launchers and the inner loop: member spec and result record.

Both are plain dataclasses that round-trip through JSON, so a member can be described in a file, run on any
node, and its outcome read back by an orchestrator that may have restarted in between. Where they are written and
read (a member's ``result.json``) is the run store's: results/store/member_files.py.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from core.config.horizon import inner_steps
from core.gpu_time import members_per_gpu
from core.keys import MEMBER_GPU_MEMORY_KEY, MEMBER_GPU_SHARERS_KEY, MEMBER_GPUS_KEY  # re-exported

#: the record's ``device`` keys for a GPU member's memory (inner_loop/member/device.py writes them): torch's peak
#: allocation; the most its allocator held from the driver (what the member's cap counts, and what a static KV cache
#: and CUDA graph pools held through the backward add to); what the CUDA graphs' private pools held at the end
PEAK_ALLOCATED_KEY, PEAK_RESERVED_KEY, GRAPH_POOL_KEY = "peak_memory_bytes", "peak_reserved_bytes", "graph_pool_bytes"

#: late: cancelled unfinished when its ES generation closed at the quorum (no measurement, never retried);
#: pruned: stopped by a tuner's pruner (never retried); stopped_early: stopped at an ES generation's early decision
#: step, below the reported median beyond noise (meta/search/generation/early_stop.py; ranked at the bottom, never retried)
STOPPED_EARLY = "stopped_early"
#: node_failed: every node the member was sent to failed its pre-flight or could not give it its GPU (the job ended
#: without a result each time, up to launcher.max_lost_resubmits resubmits): the node's failure, not the init's, so
#: the member has no measurement and is left out of the update, like a late one
NODE_FAILED = "node_failed"
STATUSES = ("ok", "failed", "timeout", "cancelled", "late", "pruned", STOPPED_EARLY, NODE_FAILED)
#: outcomes without a measurement of the member's init: left out of the searcher's update (never charged
#: fitness_on_failure)
UNMEASURED_STATUSES = ("late", NODE_FAILED)
#: the inner-config key of a member trained on several seeds (``seeds_per_member``): the seeds, one run each in
#: its own sub-directory (launch/seed_group.py); the member's fitness is their mean
MEMBER_SEEDS_KEY = "member_seeds"
#: outcomes the orchestrator decided on purpose: final at once, never retried
DECIDED_STATUSES = ("cancelled", "late", "pruned", STOPPED_EARLY)


def gpus_entry(resources: Mapping[str, Any]) -> dict[str, Any]:
    """What a member's inner config carries of its resources: nothing for a CPU member (its config stays as it was),
    else {MEMBER_GPUS_KEY: n} (the member refuses to train without a usable GPU) and, where set, its share of the
    GPU's memory (MEMBER_GPU_MEMORY_KEY). With k = resources.members_per_gpu >= 2 members on one GPU, its share is
    (gpu_memory_fraction or 1) / k and MEMBER_GPU_SHARERS_KEY says k, so that each sizes its caches for its part."""
    gpus = resources.get("gpus")
    if not (isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 1):
        return {}
    fraction = resources.get(MEMBER_GPU_MEMORY_KEY)
    k = members_per_gpu(resources)
    if k >= 2:
        return {MEMBER_GPUS_KEY: gpus, MEMBER_GPU_MEMORY_KEY: (fraction or 1.0) / k, MEMBER_GPU_SHARERS_KEY: k}
    return {MEMBER_GPUS_KEY: gpus, **({MEMBER_GPU_MEMORY_KEY: fraction} if fraction is not None else {})}


@dataclass(frozen=True)
class Segment:
    """The steps a member trains, as one value: steps [start, stop) of a run whose schedule (learning-rate warm-up and
    decay) spans ``horizon`` steps, continuing from the checkpoint folder ``resume_from`` where start > 0.

    Why a value: how long a member trains used to be worked out again by every reader (plan, lifecycle, status)
    from train.steps, es.member_steps and the searcher's state. The generation builds it once, the member spec and
    the generation's stored state carry it, and every reader reads it:

    - a whole run of train.steps: ``Segment.whole(steps)`` = (0, steps, steps);
    - a search member of es.member_steps m: (0, m, m), its schedule shrunk to m steps;
    - an es=nres truncation: (start, stop, train.steps, the particle's boundary checkpoint at start).
    """

    start: int
    stop: int
    horizon: int
    resume_from: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.stop <= self.horizon or (self.start == self.stop and self.horizon):
            raise ValueError(f"a member's segment must satisfy 0 <= start < stop <= horizon (or be the empty run "
                             f"0, 0, 0), got start={self.start} stop={self.stop} horizon={self.horizon}")

    @classmethod
    def whole(cls, steps: int) -> "Segment":
        """A run of its own from step 0, ``steps`` long (0: the untrained model, a base-model row)."""
        return cls(0, int(steps), int(steps))

    @property
    def steps(self) -> int:
        """The steps this member trains."""
        return self.stop - self.start

    @property
    def whole_run(self) -> bool:
        """Whether the member trains a run of its own from step 0 to its schedule's end."""
        return self.start == 0 and self.stop == self.horizon

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Segment":
        resume = data.get("resume_from")
        return cls(int(data["start"]), int(data["stop"]), int(data["horizon"]),
                   None if resume is None else str(resume))


@dataclass
class MemberSpec:
    """Everything one population member needs to train and evaluate, independent of the orchestrator."""

    run_id: str
    generation: int
    index: int
    seed: int
    params: list[float]
    work_dir: str
    inner: dict[str, Any] = field(default_factory=dict)
    attempt: int = 0
    #: es=nres: the piece of its particle's run this member trains (results/store/truncation.py: Truncation's
    #: dict); None: a whole run of train.steps. A class-level default, so specs pickled before it existed load.
    truncation: dict[str, Any] | None = None
    #: the steps it trains (``Segment``); None in a spec built before segments existed or outside a search (a whole
    #: run of its inner train.steps: ``work``). A class-level default, so specs pickled before it existed load.
    segment: Segment | None = None

    @property
    def work(self) -> Segment:
        """The segment this member trains: the one the generation gave it; for a spec without one, what such a
        spec always meant (a truncation's own steps, else a whole run of its inner train.steps)."""
        if self.segment is not None:
            return self.segment
        piece = self.truncation
        if piece is not None and "start" in piece:  # es=nres before segments: the piece named its own steps
            return Segment(int(piece["start"]), int(piece["stop"]), int(piece["horizon"]))
        return Segment.whole(inner_steps(self.inner))

    def to_dict(self) -> dict[str, Any]:
        """A plain, independent copy. Not ``asdict``: it deep-copies the 380 params one float at a time
        (0.4 ms per spec, 30x this), paid on every submission of a population."""
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["params"] = list(self.params)
        data["inner"] = copy.deepcopy(self.inner)
        data["truncation"] = dict(self.truncation) if self.truncation is not None else None
        data["segment"] = self.segment.to_dict() if self.segment is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MemberSpec":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        missing = [k for k in ("run_id", "generation", "index", "seed", "params", "work_dir") if k not in known]
        if missing:
            raise ValueError(f"member spec is missing keys {missing}")
        known["params"] = [float(x) for x in known["params"]]
        if isinstance(known.get("segment"), Mapping):
            known["segment"] = Segment.from_dict(known["segment"])
        return cls(**known)


@dataclass
class ResultRecord:
    """A member's outcome. ``fitness`` is validation pass@1 and is always finite; failures carry a status."""

    status: str
    fitness: float = 0.0
    val_size: int = 0
    mean_response_tokens: float = 0.0
    diagnostics: dict[str, float] = field(default_factory=dict)
    wall_time_s: float = 0.0
    steps_done: int = 0
    error: str = ""
    #: Peak bytes of the member's work dir (checkpoints included); None: not measured (older records, records
    #: written by the launcher for a member that never reported, synthetic objectives).
    disk_peak_bytes: int | None = None
    #: the split ``fitness`` was measured on: validation (every ES member), or test (a single run's final numbers)
    eval_split: str = "validation"
    #: the inner config's extra_evaluations, scored after the fitness on the same model: per name ("test",
    #: "transfer/<task>") {task, split, pass_at_1, size, mean_response_tokens}; empty for ES members and older records
    evaluations: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: how the member generated its completions: {"backend", "completions_sha256", "from_step"}
    #: (inner_loop/generation/backends.py names the backends); empty for older records and synthetic objectives
    generation: dict[str, Any] = field(default_factory=dict)
    #: the device the member trained on (inner_loop/member/device.py): type (cuda / cpu), name, memory_bytes, torch, cuda
    #: (torch's CUDA version), peak_memory_bytes (torch's peak GPU allocation), peak_reserved_bytes (the most its
    #: allocator held: a static KV cache and CUDA graph pools held through the backward count there), graph_pool_bytes;
    #: empty where not recorded (older records, records the launcher wrote, synthetic objectives)
    device: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.eval_split not in ("validation", "test"):
            raise ValueError(f"result eval_split {self.eval_split!r} is not 'validation' or 'test'")
        if self.status not in STATUSES:
            raise ValueError(f"result status {self.status!r} is not one of {STATUSES}")
        peak = self.disk_peak_bytes
        # A diagnostic like the others: a value that is not a byte count is dropped, never a reason to lose a result.
        valid = isinstance(peak, (int, float)) and not isinstance(peak, bool) and math.isfinite(peak) and peak >= 0
        self.disk_peak_bytes = int(peak) if valid else None
        if not isinstance(self.fitness, (int, float)) or not math.isfinite(float(self.fitness)):
            # A non-finite fitness must never reach a searcher: it becomes a failure with the reason kept.
            self.error = (self.error + "; " if self.error else "") + f"non-finite fitness {self.fitness!r}"
            self.status = "failed" if self.status == "ok" else self.status
            self.fitness = 0.0
        self.fitness = float(self.fitness)
        self.diagnostics = {
            k: float(v) for k, v in self.diagnostics.items() if isinstance(v, (int, float)) and math.isfinite(v)
        }
        if not isinstance(self.evaluations, Mapping) or not all(
                isinstance(k, str) and isinstance(v, Mapping) for k, v in self.evaluations.items()):
            raise ValueError(f"result evaluations must map names to mappings, got {self.evaluations!r}")
        self.evaluations = {name: dict(entry) for name, entry in self.evaluations.items()}
        self.device = dict(self.device) if isinstance(self.device, Mapping) else {}  # a diagnostic: never fatal

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ResultRecord":
        if "status" not in data:
            raise ValueError("result record has no 'status'")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    @classmethod
    def coerce(cls, value: Any) -> "ResultRecord":
        """Accept a ResultRecord, a dataclass with the same fields, or a dict (what ``inner.entrypoint`` returns)."""
        if isinstance(value, ResultRecord):
            return value
        if isinstance(value, Mapping):
            return cls.from_dict(value)
        if hasattr(value, "__dataclass_fields__"):
            return cls.from_dict(asdict(value))
        raise TypeError(f"member entry point returned {type(value).__name__}, expected a record or dict")


def device_text(device: Mapping[str, Any] | None) -> str:
    """A record's device in one cell (members table, meta.status): 'NVIDIA H200 139.8 GiB, peak 11.0 GiB', or
    'cpu (<CPU name>)'; '' when the record names none."""
    if not device:
        return ""
    if device.get("type") != "cuda":
        return f"cpu ({device.get('name') or 'unknown'})"
    text = f"{device.get('name') or 'unknown GPU'} {_gib(device.get('memory_bytes'))}"
    peak = device.get(PEAK_ALLOCATED_KEY)
    text += f", peak {_gib(peak)}" if peak is not None else ""
    held, pools = device.get(PEAK_RESERVED_KEY), device.get(GRAPH_POOL_KEY)
    if held is not None:  # absent from records before issue 53
        text += f" (held {_gib(held)}" + (f", {pools / 2**30:.1f} in CUDA graph pools" if pools else "") + ")"
    return text


def _gib(value: Any) -> str:
    return f"{value / 2**30:.1f} GiB" if isinstance(value, (int, float)) and not isinstance(value, bool) else "?"
