"""Recoverable SLURM submission without a cluster: sbatch is a fake submitit executor, squeue a fake query.

What must hold (issue 13, item 4): job ids are saved after EACH array chunk, a failing sbatch is retried with
backoff and then ends the run with AbortRun (a message, no traceback) that says it can be resumed, each
chunk carries a name with run, generation and chunk, and a resume after a crash between an sbatch and its
record re-attaches to that chunk (found by name) instead of submitting it twice.
The same on the real local cluster: tests/slurm/test_slurm_submit_recovery.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from submitit.core.utils import FailedJobError, JobPaths

import launch.slurm.launcher as slurm_module
from launch.base import JobRef
from launch.runner import AbortRun, MemberArrayRunner, RunnerPolicy
from launch.slurm.launcher import SlurmLauncher
from launch.slurm.chunks import MARKER_DIR, chunk_job_name, parse_chunk_job_name, read_markers
from launch.slurm.options import SlurmOptions
from results.store.atomic import CorruptFileError
from core.records import MemberSpec

ENTRY = "meta.synthetic:member"


class _Job:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id


class _FakeSbatch:
    """Stands in for submitit's SlurmExecutor: every map_array is one sbatch, failing on chosen calls."""

    def __init__(self, fail_on: set[int] | None = None) -> None:
        self.fail_on = fail_on or set()
        self.calls = 0
        self.parameters: dict[str, Any] = {}
        self.submitted: list[tuple[str, list[int]]] = []  # (job name, member indices) of each queued array

    def update_parameters(self, **kwargs: Any) -> None:
        self.parameters.update(kwargs)

    def map_array(self, fn: Any, entries: list, spec_dicts: list[dict], timeouts: list) -> list[_Job]:
        self.calls += 1
        if self.calls in self.fail_on:
            raise FailedJobError("sbatch: error: Batch job submission failed: Socket timed out on send/recv")
        base = 5000 + self.calls
        self.submitted.append((self.parameters["job_name"], [d["index"] for d in spec_dicts]))
        return [_Job(f"{base}_{k}") for k in range(len(spec_dicts))]


def _specs(root: Path, n: int) -> list[MemberSpec]:
    return [MemberSpec(run_id="abc123", generation=3, index=i, seed=0, params=[0.0], work_dir=str(root / f"m{i}"))
            for i in range(n)]


def _launcher(sbatch: _FakeSbatch, squeue: dict[str, set[str]] | None = None, **options: Any) -> SlurmLauncher:
    launcher = SlurmLauncher(max_array_size=2, submit_backoff_s=0.5, **options)
    launcher._make_executor = lambda folder, timeout_s: sbatch  # type: ignore[method-assign]
    launcher.asked: list[list[str]] = []  # type: ignore[attr-defined]

    def squeue_by_name(names):  # type: ignore[no-untyped-def]
        launcher.asked.append(sorted(names))  # type: ignore[attr-defined]
        return {n: ids for n, ids in (squeue or {}).items() if n in set(names)}

    launcher.queries.squeue_by_name = squeue_by_name  # type: ignore[method-assign]
    launcher.queries.scancel = lambda ids: launcher.cancelled.extend(sorted(ids))  # type: ignore[attr-defined]
    launcher.cancelled = []  # type: ignore[attr-defined]
    return launcher


def _runner(launcher: SlurmLauncher, specs: list[MemberSpec], folder: Path, jobs: dict, saves: list) -> MemberArrayRunner:
    def save(current: dict) -> None:
        saves.append({k: dict(v) for k, v in current.items()})
        jobs.clear()
        jobs.update(current)

    runner = MemberArrayRunner(launcher, ENTRY, specs, dict(jobs), save, folder, RunnerPolicy(retries=0))
    return runner


def test_sbatch_failing_on_the_second_chunk_keeps_the_first_and_ends_with_a_resumable_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(slurm_module.time, "sleep", sleeps.append)
    sbatch = _FakeSbatch(fail_on={2, 3, 4})
    launcher = _launcher(sbatch, submit_attempts=3)
    specs = _specs(tmp_path, 5)
    jobs: dict = {}
    saves: list = []
    runner = _runner(launcher, specs, tmp_path / "submitit", jobs, saves)
    runner.queue = [(s, 0) for s in specs]
    with pytest.raises(AbortRun) as caught:
        runner._submit_queue()
    message = str(caught.value)
    assert "failed 3 time(s)" in message and "launcher.submit_attempts=3" in message, message
    assert "Socket timed out" in message and "resume the run" in message, message
    assert "2 member(s)" in message and "remaining 3" in message, message
    # chunk 1's ids were saved as soon as it was queued, before chunk 2 was even tried
    assert saves and sorted(saves[0]) == [0, 1] and [j["job_id"] for j in saves[0].values()] == ["5001_0", "5001_1"]
    assert sleeps == [0.5, 1.0]  # exponential backoff between the 3 tries
    assert launcher.asked == [[sbatch.submitted[0][0].replace("c000", "c001")]] * 3  # a half-queued array?
    assert [i for i, _ in runner.queue] == specs[2:]


def test_chunks_are_named_after_run_generation_and_chunk(tmp_path: Path) -> None:
    sbatch = _FakeSbatch()
    launcher = _launcher(sbatch, job_name="proj.x")
    refs = launcher.submit(ENTRY, _specs(tmp_path, 5), tmp_path / "submitit", 60)
    assert [r.job_id for r in refs] == ["5001_0", "5001_1", "5002_0", "5002_1", "5003_0"]
    names = [name for name, _ in sbatch.submitted]
    assert names == ["proj.x.abc123.g0003.c000", "proj.x.abc123.g0003.c001", "proj.x.abc123.g0003.c002"]
    assert parse_chunk_job_name(names[1]) == ("proj.x", "abc123", 3, 1)
    markers = read_markers(tmp_path / "submitit")
    assert [(m.name, m.job_id, m.members) for m in markers][1] == (names[1], "5002", [(2, 0, 1), (3, 0, 1)])
    # a second submission in the same generation (a retry) never reuses a chunk number
    launcher.submit(ENTRY, _specs(tmp_path, 1), tmp_path / "submitit", 60)
    assert sbatch.submitted[-1][0].endswith(".g0003.c003")


def test_resume_after_a_crash_between_sbatch_and_its_record_reattaches_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "submitit"
    specs = _specs(tmp_path, 5)
    jobs: dict = {}
    first = _launcher(_FakeSbatch())
    real_write = slurm_module.write_marker

    def crash_after_second_sbatch(where: Path, marker: Any) -> None:  # the process dies right after sbatch
        if marker.chunk == 1 and marker.job_id is not None:
            raise KeyboardInterrupt("killed")
        real_write(where, marker)

    monkeypatch.setattr(slurm_module, "write_marker", crash_after_second_sbatch)
    runner = _runner(first, specs, folder, jobs, [])
    runner.queue = [(s, 0) for s in specs]
    with pytest.raises(KeyboardInterrupt):
        runner._submit_queue()
    monkeypatch.setattr(slurm_module, "write_marker", real_write)
    assert sorted(jobs) == [0, 1]  # chunk 2 (members 2, 3) was queued as array 5002 but never recorded
    marker = read_markers(folder)[1]
    assert marker.job_id is None
    for task in (0, 1):  # submitit placed the pickled calls right after sbatch
        JobPaths(folder, job_id=f"5002_{task}").submitted_pickle.parent.mkdir(parents=True, exist_ok=True)
        JobPaths(folder, job_id=f"5002_{task}").submitted_pickle.write_bytes(b"call")

    sbatch = _FakeSbatch()
    sbatch.calls = 10  # new arrays get ids 5011...
    resumed = _launcher(sbatch, squeue={marker.name: {"5002_0", "5002_1"}})
    runner = _runner(resumed, specs, folder, jobs, [])
    runner.queue = [(s, 0) for s in specs[2:]]  # what reconcile leaves for members without a record
    runner._submit_queue()
    assert resumed.asked == [[marker.name]]  # ONE squeue query, by name
    assert {i: j["job_id"] for i, j in jobs.items()} == {
        0: "5001_0", 1: "5001_1", 2: "5002_0", 3: "5002_1", 4: "5011_0"}
    assert sbatch.submitted == [("mirror-es.abc123.g0003.c002", [4])]  # nothing submitted twice
    assert read_markers(folder)[1].job_id == "5002"  # remembered: the next resume needs no query


def test_a_task_queued_without_its_pickled_call_is_cancelled_and_submitted_again(tmp_path: Path) -> None:
    folder = tmp_path / "submitit"
    specs = _specs(tmp_path, 2)
    jobs: dict = {}
    first = _launcher(_FakeSbatch(fail_on={1}), submit_attempts=1)
    first.queries.squeue_by_name = lambda names: {}  # type: ignore[method-assign]
    runner = _runner(first, specs, folder, jobs, [])
    runner.queue = [(s, 0) for s in specs]
    with pytest.raises(AbortRun):
        runner._submit_queue()
    name = read_markers(folder)[0].name
    # the controller did queue it (answer lost) but submitit never placed the pickles: those tasks would fail
    resumed = _launcher(_FakeSbatch(), squeue={name: {"7000_0", "7000_1"}})
    runner = _runner(resumed, specs, folder, jobs, [])
    runner.queue = [(s, 0) for s in specs]
    runner._submit_queue()
    assert resumed.cancelled == ["7000_0", "7000_1"]
    assert [j["job_id"] for j in jobs.values()] == ["5001_0", "5001_1"]


def test_a_corrupt_marker_is_reported_with_its_path_and_the_fix(tmp_path: Path) -> None:
    folder = tmp_path / "submitit"
    (folder / MARKER_DIR).mkdir(parents=True)
    (folder / MARKER_DIR / "chunk_000.json").write_text('{"chunk": 0, "name": "x"')
    with pytest.raises(CorruptFileError, match="chunk_000.json.*delete the file and resume"):
        read_markers(folder)


@pytest.mark.parametrize("bad", [{"job_name": "a,b"}, {"job_name": "my run"}, {"job_name": "x" * 200},
                                 {"submit_attempts": 0}, {"submit_backoff_s": -1}])
def test_bad_submission_settings_name_the_key(bad: dict) -> None:
    with pytest.raises(ValueError, match=f"launcher.{next(iter(bad))}="):
        SlurmOptions.from_options(bad)


def test_names_stay_parseable_and_within_accounting_length() -> None:
    name = chunk_job_name("x" * 160, "run.with/odd chars", 12345, 999)
    assert len(name) <= 255
    assert parse_chunk_job_name(name) == ("x" * 160, "run-with-odd-chars", 12345, 999)
    longest = chunk_job_name("x" * 160, "r" * 500, 99999, 9999)
    assert len(longest) <= 255 and parse_chunk_job_name(longest) == ("x" * 160, "r" * 64, 99999, 9999)


def test_a_member_that_failed_its_preflight_is_lost_and_resubmitted_without_that_node(tmp_path: Path) -> None:
    """A job that ended FAILED with the member's pre-flight failure in its work dir is the node's fault: lost (the
    runner resubmits it, at most max_lost_resubmits times, the init not charged), and its next array excludes that
    node (with the user's own --exclude kept); other arrays are not restricted; a plain crash stays a failure."""
    import json

    from launch.slurm.queries import TaskState
    from results.store.layout import PREFLIGHT_FILE

    sbatch = _FakeSbatch()
    launcher = _launcher(sbatch)
    first, second = _specs(tmp_path, 2)
    [ref] = launcher.submit(ENTRY, [first], tmp_path / "sub", 60.0)
    assert sbatch.parameters["exclude"] is None
    Path(first.work_dir).mkdir(parents=True)
    (Path(first.work_dir) / PREFLIGHT_FILE).write_text(json.dumps({"host": "gpu17", "cause": "bwrap failed"}))
    launcher._states[ref.job_id] = TaskState(ref.job_id, "FAILED", "1:0")
    assert launcher.ended_status(ref) is None
    [again] = launcher.submit(ENTRY, [first], tmp_path / "sub", 60.0)
    assert sbatch.parameters["exclude"] == "gpu17"
    (Path(first.work_dir) / PREFLIGHT_FILE).write_text(json.dumps({"host": "gpu03", "cause": "no room"}))
    launcher._states[again.job_id] = TaskState(again.job_id, "FAILED", "1:0")
    assert launcher.ended_status(again) is None
    [third] = launcher.submit(ENTRY, [first], tmp_path / "sub", 60.0)
    assert sbatch.parameters["exclude"] == "gpu03,gpu17"
    restarted = _launcher(_FakeSbatch())  # an orchestrator restarted since: it knows the job from jobs.json alone
    reloaded = JobRef.from_dict(third.to_dict())
    restarted._states[reloaded.job_id] = TaskState(reloaded.job_id, "FAILED", "1:0")
    assert restarted.ended_status(reloaded) is None  # still the node's fault, not the init's
    [other] = launcher.submit(ENTRY, [second], tmp_path / "sub", 60.0)
    assert sbatch.parameters["exclude"] is None
    launcher._states[other.job_id] = TaskState(other.job_id, "FAILED", "1:0")  # no pre-flight file: its own crash
    assert launcher.ended_status(other)[0] == "failed"
