"""The one owner of what sharing a GPU costs: how many members share one (``resources.members_per_gpu``), how much
slower each runs (``resources.shared_slowdown``, measured), and the GPU time that follows.

Why one place: the search, tuning and pilot plans, the pilot's recommendation, ``inner.timeout_s`` and the status
views all count time and GPU-hours; with k members on one card a member runs slower (its time x slowdown(k)) while
the card is split k ways (its GPU time / k). Where no slowdown for k was measured, k itself is assumed (the worst
case: sharing gains nothing) and the plans say which measurement is missing. In results.store (imports nothing of
ours) so that the launchers, the reports and meta may all read it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

#: the members one GPU may hold: the counts the sharing bench measures, and they divide a node's GPUs' tasks evenly
MEMBERS_PER_GPU_CHOICES = (1, 2, 4)
#: what measures a member's slowdown when k members share a GPU (docs/benchmarks.md)
SLOWDOWN_BENCH = "python bench/bench_member_gpu.py --device cuda --members 1,2,4"


@dataclass(frozen=True)
class GpuSharing:
    """k members per GPU and each one's running time shared over alone (``source`` None: not measured, k assumed)."""

    members_per_gpu: int
    slowdown: float
    source: str | None
    #: False for CPU members packed k per SLURM task: each has its own CPUs, so nothing is shared or slowed
    on_gpu: bool = True

    @property
    def shared(self) -> bool:
        return self.members_per_gpu >= 2 and self.on_gpu

    def member_time(self, alone: float) -> float:
        """A member's expected running time (any unit) when it shares its GPU: its time alone x slowdown(k)."""
        return alone * self.slowdown

    def gpu_hours(self, runs: float, alone_h: float, gpus: int) -> float:
        """GPU time of ``runs`` members taking ``alone_h`` each alone: runs x alone_h x slowdown(k) / k x gpus."""
        return gpu_time_h(runs * self.member_time(alone_h), gpus, self.members_per_gpu)

    def hours_text(self, alone_h: float, gpus: int) -> str:
        """The factors of gpu_hours after the runs, as the plans print them ('6.87 h x 1 GPU' when alone)."""
        if not self.shared:
            return f"{alone_h:.2f} h x {gpus} GPU"
        return (f"{alone_h:.2f} h x slowdown {self.slowdown:g} / {self.members_per_gpu} members per GPU x {gpus} "
                "GPU")

    def plan_lines(self, members: int, per: str = "generation") -> list[str]:
        """What the plans print beside the GPU-hours: the sharing factor and its source, or the missing measurement;
        ``members``: how many run together ``per`` (a generation, the pilot's array, the trials in flight)."""
        if not self.shared:
            return []
        k = self.members_per_gpu
        tasks = -(-members // k)
        line = (f"GPU sharing: resources.members_per_gpu={k}: tasks per {per} = ceil(members / {k}) = "
                f"ceil({members} / {k}) = {tasks}; each member holds 1/{k} of its GPU and runs x{self.slowdown:g} "
                "slower")
        if self.source is not None:
            return [f"{line} (resources.shared_slowdown[{k}], measured: {self.source})"]
        return [f"{line} (assumed: not measured)",
                f"WARNING: no measured slowdown for {k} members per GPU (resources.shared_slowdown has no {k}): "
                f"assumed x{k}, the worst case (sharing saves no GPU time). Measure it on the target GPU with "
                f"`{SLOWDOWN_BENCH}` and set resources.shared_slowdown and resources.shared_slowdown_source"]


def gpu_time_h(running_h: float, gpus: int | float, members_per_gpu: int) -> float:
    """GPU time of members' running time: each of the k members on one GPU holds 1/k of it."""
    return running_h * gpus / members_per_gpu


def members_per_gpu(resources: Mapping[str, Any]) -> int:
    """``resources.members_per_gpu`` (absent, as in runs made before it existed: 1), checked: ValueError naming the
    key and the reason."""
    k = resources.get("members_per_gpu", 1)
    if k is None:
        k = 1
    if isinstance(k, bool) or not isinstance(k, int) or k not in MEMBERS_PER_GPU_CHOICES:
        raise ValueError(f"resources.members_per_gpu={k!r} must be 1, 2 or 4 (members sharing one GPU; the counts "
                         f"`{SLOWDOWN_BENCH}` measures)")
    gpus = resources.get("gpus")
    if k >= 2 and gpus not in (0, 1, None):
        raise ValueError(f"resources.members_per_gpu={k} needs resources.gpus=1 (got {gpus!r}): k members share one "
                         "GPU (CPU members, resources.gpus=0, are packed k per SLURM task, each with its own CPUs)")
    return k


def _measured_slowdowns(resources: Mapping[str, Any]) -> dict[int, float]:
    table = resources.get("shared_slowdown") or {}
    if not isinstance(table, Mapping):
        raise ValueError(f"resources.shared_slowdown={table!r} must map members per GPU to a measured slowdown "
                         "({2: 1.183})")
    out: dict[int, float] = {}
    for key, value in table.items():
        k = int(key) if isinstance(key, int) and not isinstance(key, bool) or str(key).isdigit() else None
        if k not in MEMBERS_PER_GPU_CHOICES or k == 1:
            raise ValueError(f"resources.shared_slowdown has the key {key!r}: keys are members per GPU, 2 or 4")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1.0:
            raise ValueError(f"resources.shared_slowdown[{k}]={value!r} must be a number >= 1: a member's running "
                             f"time when {k} share one GPU over its time alone (sharing never makes one faster)")
        out[k] = float(value)
    return out


def gpu_sharing(resources: Mapping[str, Any]) -> GpuSharing:
    """The sharing of a config's resources, every key checked (ValueError naming it); k = 1: no slowdown."""
    k = members_per_gpu(resources)
    measured = _measured_slowdowns(resources)
    source = resources.get("shared_slowdown_source")
    if source is not None and not isinstance(source, str):
        raise ValueError(f"resources.shared_slowdown_source={source!r} must be text: where and how the slowdowns "
                         "were measured")
    if k == 1:
        return GpuSharing(1, 1.0, "alone on its GPU")
    if not resources.get("gpus"):
        return GpuSharing(k, 1.0, "CPU members, each with its own CPUs", on_gpu=False)
    if k not in measured:
        return GpuSharing(k, float(k), None)
    return GpuSharing(k, measured[k], source or "no source given (resources.shared_slowdown_source)")
