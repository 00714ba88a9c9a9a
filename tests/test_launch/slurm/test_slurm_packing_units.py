"""Packed SLURM arrays without a cluster (resources.members_per_gpu, issue 38): what an array task asks for, which
members a task runs, how a resume finds a packed chunk, and how a cancel of one member spares its partner.
The same on the real local cluster: tests/slurm/test_slurm_packed.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from submitit.core.utils import JobPaths

from launch.base import JobRef
from launch.slurm.launcher import SlurmLauncher
from launch.slurm.options import SlurmOptions
from launch.slurm.packed import cancel_requested
from core.records import MemberSpec, ResultRecord
from results.store.member_files import write_final_result

ENTRY = "meta.synthetic:member"


class _Job:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id


class _FakeSbatch:
    """submitit's SlurmExecutor as the launcher uses it: each map_array is one sbatch of one array."""

    def __init__(self) -> None:
        self.parameters: dict[str, Any] = {}
        self.arrays: list[tuple[str, list[list[int]]]] = []  # (callable's class, member indices of each task)

    def update_parameters(self, **kwargs: Any) -> None:
        self.parameters.update(kwargs)

    def map_array(self, fn: Any, entries: list, calls: list, timeouts: list) -> list[_Job]:
        tasks = [[d["index"] for d in call] if isinstance(call, list) else [call["index"]] for call in calls]
        self.arrays.append((type(fn).__name__, tasks))
        return [_Job(f"{7000 + len(self.arrays)}_{k}") for k in range(len(calls))]


def _specs(root: Path, n: int) -> list[MemberSpec]:
    return [MemberSpec(run_id="pack", generation=0, index=i, seed=0, params=[0.0], work_dir=str(root / f"m{i}"))
            for i in range(n)]


def _launcher(sbatch: _FakeSbatch, **options: Any) -> SlurmLauncher:
    launcher = SlurmLauncher(max_array_size=2, members_per_gpu=2, gpus_per_node=1, **options)
    launcher._make_executor = lambda folder, timeout_s: sbatch  # type: ignore[method-assign]
    launcher.cancelled = []  # type: ignore[attr-defined]
    launcher.queries.scancel = lambda ids: launcher.cancelled.extend(sorted(ids))  # type: ignore[attr-defined]
    return launcher


def test_a_packed_task_asks_for_one_gpu_and_k_members_cpus_and_memory_and_shards_ask_for_their_part() -> None:
    packed = SlurmOptions.from_options({"members_per_gpu": 2, "gpus_per_node": 1, "cpus_per_task": 4, "mem_gb": 32})
    params = packed.sbatch_parameters(3600)
    assert (params["gpus_per_node"], params["cpus_per_task"], params["mem"]) == (1, 8, f"{64 * 1024}M")
    shard = SlurmOptions.from_options({"members_per_gpu": 2, "gpus_per_node": 1, "cpus_per_task": 4, "mem_gb": 32,
                                       "gpu_sharing": "shard", "shards_per_gpu": 8})
    params = shard.sbatch_parameters(3600)
    assert shard.members_per_task == 1 and "gpus_per_node" not in params
    assert params["additional_parameters"]["gres"] == "shard:4" and params["cpus_per_task"] == 4
    for bad, key in (({"members_per_gpu": 3}, "members_per_gpu=3"),
                     ({"members_per_gpu": 2, "gpu_sharing": "mps"}, "gpu_sharing='mps'"),
                     ({"members_per_gpu": 2, "gpus_per_node": 1, "gpu_sharing": "shard"}, "shards_per_gpu=None"),
                     ({"members_per_gpu": 2, "gpus_per_node": 1, "gpu_sharing": "shard", "shards_per_gpu": 3},
                      "shards_per_gpu=3")):
        with pytest.raises(ValueError, match=key.replace("(", r"\(")):
            SlurmOptions.from_options(bad)


def test_pairs_share_a_task_and_a_resumed_launcher_finds_a_packed_chunk_by_its_marker(tmp_path: Path) -> None:
    folder = tmp_path / "submitit"
    specs = _specs(tmp_path, 5)
    sbatch = _FakeSbatch()
    refs = [r for part in _launcher(sbatch).submit_chunks(ENTRY, specs, folder, 600) for r in part]
    # max_array_size=2 tasks per array: (0, 1), (2, 3) in the first array, (4) in the second
    assert sbatch.arrays == [("PackedMembers", [[0, 1], [2, 3]]), ("PackedMembers", [[4]])]
    assert [r.job_id for r in refs] == ["7001_0", "7001_0", "7001_1", "7001_1", "7002_0"]
    assert refs[2].packed_with == [specs[3].work_dir] and refs[4].packed_with == []
    for task in ("7001_0", "7001_1"):  # submitit placed the pickled calls right after sbatch
        JobPaths(folder, job_id=task).submitted_pickle.parent.mkdir(parents=True, exist_ok=True)
        JobPaths(folder, job_id=task).submitted_pickle.write_bytes(b"call")
    found = _launcher(_FakeSbatch()).recover([(s, 0) for s in specs[:4]], folder)
    assert {i: (r.job_id, r.packed_with) for i, r in found.items()} == {
        i: (refs[i].job_id, refs[i].packed_with) for i in range(4)}
    assert JobRef.from_dict(refs[1].to_dict()) == refs[1]


def test_a_member_is_cancelled_alone_while_its_partner_runs_and_the_task_once_none_is_left(tmp_path: Path) -> None:
    specs = _specs(tmp_path, 4)
    launcher = _launcher(_FakeSbatch())
    refs = [r for part in launcher.submit_chunks(ENTRY, specs, tmp_path / "submitit", 600) for r in part]
    launcher.cancel([refs[0]])  # member 1 still runs: a request for member 0 alone, no scancel
    assert launcher.cancelled == []  # type: ignore[attr-defined]
    assert cancel_requested(specs[0].work_dir, refs[0].job_id) and not cancel_requested(specs[1].work_dir, "7001_0")
    write_final_result(specs[3].work_dir, ResultRecord(status="ok", fitness=0.5))
    launcher.cancel([refs[2]])  # its partner has its result: the whole task goes
    launcher.cancel([refs[0], refs[1]])  # both of a task at once (an abort): the whole task
    assert launcher.cancelled == ["7001_1", "7001_0"]  # type: ignore[attr-defined]
