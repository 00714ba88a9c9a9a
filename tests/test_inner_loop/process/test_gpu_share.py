"""A member's share of the card (issue 38): its memory cap, its vLLM engine's part of the card, one engine start at a
time per GPU, and a record that names the share when the member runs out of memory.

CPU only: the GPU is replaced at its boundary (torch.cuda's device queries and set_per_process_memory_fraction);
the CUDA side of the cap is tests/test_inner_loop/process/test_gpu_share_cuda.py. The lock test runs real processes and waits
on events.
"""
from __future__ import annotations

import fcntl
import logging
import multiprocessing
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import inner_loop.member.lifecycle as member
import inner_loop.models.loading as loading  # build_trainer imports its loaders when it runs
from inner_loop.config import InnerConfig
from inner_loop.generation.backends import HF_GENERATE, VLLM_COLOCATE
from inner_loop.generation.engine_start import LOCK_DIR_ENV, engine_start_lock_path, engine_start_turn
from inner_loop.process.gpu_share import (CAP_KEY, CONTEXT_ALLOWANCE_BYTES, PARTNERS_KEY, apply_memory_share,
                                          engine_start_turn_for, out_of_memory_reason)
from inner_loop.grpo.args import build_grpo_config
from inner_loop.member.lifecycle import train_in_process
from inner_loop.training.setup import validate_inner
from core.keys import MEMBER_GPU_MEMORY_KEY, MEMBER_GPU_SHARERS_KEY, MEMBERS_ON_GPU_ENV
from results.store.member_files import read_result
from helpers import inner_config, NARROW_UNWARMED

H100 = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "memory_bytes": int(79.2 * 2**30), "torch": torch.__version__,
        "cuda": "12.8", "cuda_visible_devices": "0"}
#: the share of a member packed two to an H100, as its record must state it
H100_HALF = ("0.50 of NVIDIA H100 80GB HBM3 (79.2 GiB) = 39.6 GiB "
             "(resources.gpu_memory_fraction / resources.members_per_gpu=2)")


def _inner(trl: dict | None = None, fraction: float | None = 0.5, sharers: int | None = 2) -> dict:
    inner = inner_config("prob_l2", model_keys=NARROW_UNWARMED, steps=2, batch_size=8, group_size=4, save_every=1,
                         val_size=8, max_completion_length=4, trl=dict(trl or {}))
    if fraction is not None:
        inner[MEMBER_GPU_MEMORY_KEY] = fraction
    if sharers is not None:
        inner[MEMBER_GPU_SHARERS_KEY] = sharers
    return inner


def _vllm(utilization: float) -> dict:
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": utilization}


@pytest.fixture
def memory_caps(monkeypatch) -> list[tuple[float, int]]:
    """torch.cuda's device index and memory cap at their boundary: the caps this process asked for, in order."""
    caps: list[tuple[float, int]] = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: caps.append((fraction, device)))
    return caps


# ------------------------------------------------------------------ the share in the config and the record
def test_the_inner_config_reads_the_members_sharing_the_card():
    assert InnerConfig.from_dict(_inner()).members_per_gpu == 2
    assert InnerConfig.from_dict(_inner(sharers=None)).members_per_gpu == 1
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"resources.members_per_gpu=.* must be a count >= 1"):
            InnerConfig.from_dict(_inner(sharers=bad))


#: a member's cap packed two to an H100: half the card less its CUDA context's allowance (outside torch's cap)
H100_HALF_CAP = 0.5 - CONTEXT_ALLOWANCE_BYTES / H100["memory_bytes"]


def test_a_cuda_member_caps_its_allocator_at_its_share_less_its_context_and_records_it(memory_caps):
    """k caps of 1/k each would leave nothing for the k CUDA contexts, which torch's cap does not count: members near
    their caps would exhaust the card, and whichever allocated last would fail 'within its share'."""
    device = apply_memory_share(H100, 0.5, 2, partners=[7])
    assert memory_caps == [(pytest.approx(H100_HALF_CAP), 0)]
    assert 2 * (H100_HALF_CAP * H100["memory_bytes"] + CONTEXT_ALLOWANCE_BYTES) <= H100["memory_bytes"]
    assert device == {**H100, MEMBER_GPU_MEMORY_KEY: 0.5, MEMBER_GPU_SHARERS_KEY: 2, CAP_KEY: pytest.approx(
        H100_HALF_CAP), PARTNERS_KEY: [7]}


def test_a_member_alone_in_its_packed_task_takes_the_whole_card(memory_caps, monkeypatch):
    """The odd member of a generation, or a requeued task's survivor: its task started it alone, so it gets the
    card (and gpu_share.json names no partner, so it is charged the card: meta.status)."""
    monkeypatch.setenv(MEMBERS_ON_GPU_ENV, "1")
    device = apply_memory_share(H100, 0.5, 2)
    assert memory_caps == []  # no cap: the configured fraction (1) whole
    assert device[MEMBER_GPU_MEMORY_KEY] == 1.0 and device[MEMBER_GPU_SHARERS_KEY] == 1
    monkeypatch.setenv(MEMBERS_ON_GPU_ENV, "2")  # of k = 4: halves, not quarters
    device = apply_memory_share(H100, 0.25, 4)
    assert device[MEMBER_GPU_MEMORY_KEY] == 0.5 and memory_caps == [(pytest.approx(H100_HALF_CAP), 0)]


def test_out_of_memory_names_the_cards_whole_use_and_every_member_on_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (int(1.5 * 2**30), H100["memory_bytes"]))
    # this member's hold, a CUDA graph's pool within it (kept through the backward, like a static KV cache)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: int(38.5 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *a, **k: [
        {"segment_pool_id": (0, 0), "total_size": 37 << 30, "allocated_size": 36 << 30},
        {"segment_pool_id": (3, 1), "total_size": 3 << 29, "allocated_size": 1 << 29}])
    device = {**H100, MEMBER_GPU_MEMORY_KEY: 0.5, MEMBER_GPU_SHARERS_KEY: 2, PARTNERS_KEY: [5]}
    reason = out_of_memory_reason(torch.OutOfMemoryError("CUDA out of memory"), device)
    assert reason.startswith(f"out of GPU memory within its share: {H100_HALF} (the card had 77.7 of 79.2 GiB in use, "
                             "this member 38.5 GiB (1.5 in CUDA graph pools); members on it: this one and 5); lower "
                             "train.batch_size"), reason


def test_a_member_with_the_whole_card_or_on_the_cpu_sets_no_cap(memory_caps):
    assert apply_memory_share(H100, 1.0, 1) == {**H100, MEMBER_GPU_MEMORY_KEY: 1.0, MEMBER_GPU_SHARERS_KEY: 1}
    cpu = {"type": "cpu", "name": "some CPU", "memory_bytes": None}
    assert apply_memory_share(cpu, 0.5, 2) == cpu
    assert memory_caps == []


# ------------------------------------------------------------------ out of memory, in the real member path
def test_a_member_out_of_gpu_memory_fails_alone_naming_its_share(tmp_path, monkeypatch, memory_caps):
    """The cap is set before the model loads; the load runs out of memory; the record names the share and the fix
    and keeps the error and where it was raised."""
    monkeypatch.setattr(member, "require_device", lambda inner: dict(H100))  # the node's GPU, at its boundary

    def load_policy(*args, **kwargs):
        assert memory_caps == [(pytest.approx(H100_HALF_CAP), 0)], "the cap must be set before the model loads"
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(loading, "load_policy", load_policy)
    work = tmp_path / "m"
    record = train_in_process({"run_id": "t", "generation": 0, "index": 3, "seed": 0, "params": [],
                           "work_dir": str(work), "inner": _inner()})
    assert record.status == "failed"
    assert record.error.startswith(f"model and trainer setup: out of GPU memory within its share: {H100_HALF}; "
                                   "lower train.batch_size or train.max_completion_length, or set "
                                   "resources.members_per_gpu=1. OutOfMemoryError: CUDA out of memory. Tried to "
                                   "allocate 2.00 GiB [at "), record.error
    assert "in load_policy <- inner_loop/training/setup.py:" in record.error  # the traceback's tail
    assert record.device[MEMBER_GPU_MEMORY_KEY] == 0.5 and record.device[MEMBER_GPU_SHARERS_KEY] == 2
    assert read_result(work) == record


def test_vllm_refusing_to_start_for_memory_names_the_share_and_its_utilization():
    try:
        raise ValueError("No available memory for the cache blocks. Try increasing `gpu_memory_utilization`")
    except ValueError as exc:
        reason = out_of_memory_reason(exc, {**H100, MEMBER_GPU_MEMORY_KEY: 0.5, MEMBER_GPU_SHARERS_KEY: 2})
    assert reason is not None and reason.startswith(f"out of GPU memory within its share: {H100_HALF}; ")
    assert ("; raise train.trl.vllm_gpu_memory_utilization (within the share), or set resources.members_per_gpu=1. "
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` [at "
            "tests/test_inner_loop/process/test_gpu_share.py:") in reason, reason
    busy = ValueError("Free memory on device cuda:0 (10.0/79.2 GiB) on startup is less than desired GPU memory "
                      "utilization (0.15, 11.9 GiB).")
    assert "; lower train.trl.vllm_gpu_memory_utilization, or set" in out_of_memory_reason(busy, {
        **H100, MEMBER_GPU_MEMORY_KEY: 0.5, MEMBER_GPU_SHARERS_KEY: 2})
    alone = {**H100, MEMBER_GPU_MEMORY_KEY: 0.25, MEMBER_GPU_SHARERS_KEY: 1}
    assert "(resources.gpu_memory_fraction); " in out_of_memory_reason(torch.OutOfMemoryError("x"), alone)
    assert "raise resources.gpu_memory_fraction" in out_of_memory_reason(torch.OutOfMemoryError("x"), alone)


def test_other_errors_and_cpu_members_keep_their_own_reason():
    assert out_of_memory_reason(ValueError("train.lr_scheduler: rejected"), H100) is None
    assert out_of_memory_reason(torch.OutOfMemoryError("x"), {"type": "cpu", "name": "a CPU"}) is None
    assert out_of_memory_reason(torch.OutOfMemoryError("x"), {}) is None


# ------------------------------------------------------------------ vLLM's part of a shared card
def test_a_colocated_engine_gets_its_members_part_of_the_configured_utilization(tmp_path):
    shared = build_grpo_config(InnerConfig.from_dict(_inner(_vllm(0.4))), tmp_path, 0, check_only=True)
    assert shared.vllm_gpu_memory_utilization == pytest.approx(0.2)
    alone = build_grpo_config(InnerConfig.from_dict(_inner(_vllm(0.4), fraction=None, sharers=None)), tmp_path, 0,
                              check_only=True)
    assert alone.vllm_gpu_memory_utilization == pytest.approx(0.4)


def test_an_engine_that_cannot_fit_the_share_is_refused_up_front():
    with pytest.raises(ValueError, match=r"train.trl.vllm_gpu_memory_utilization=0.6 \(of the whole GPU\) / "
                                         r"resources.members_per_gpu=2 = 0.3 .* within the member's share of the GPU, "
                                         r"0.25 \(resources.gpu_memory_fraction / resources.members_per_gpu=2\)"):
        validate_inner(_inner(_vllm(0.6), fraction=0.25))
    with pytest.raises(ValueError, match=r"=0.3 \(of the whole GPU\) for vLLM's .* share of the GPU, 0.25 "
                                         r"\(resources.gpu_memory_fraction\)"):
        validate_inner(_inner(_vllm(0.3), fraction=0.25, sharers=None))
    validate_inner(_inner(fraction=0.25))  # without vLLM nothing is scaled or refused


# ------------------------------------------------------------------ one engine start at a time per card
class _SetOnMessage(logging.Handler):
    def __init__(self, text: str, event) -> None:
        super().__init__()
        self.text, self.event = text, event

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def _hold(key: str, directory: str, held, release) -> None:
    with engine_start_turn(key, directory):
        held.set()
        release.wait(60)


def _take(key: str, directory: str, waiting, held) -> None:
    log = logging.getLogger("inner_loop.generation.engine_start")
    log.setLevel(logging.INFO)
    log.addHandler(_SetOnMessage("waiting for its turn", waiting))
    with engine_start_turn(key, directory):
        held.set()


def test_members_of_one_card_start_their_engines_one_at_a_time(tmp_path):
    ctx = multiprocessing.get_context("fork")
    first_held, release, second_waiting, second_held, other_held = (ctx.Event() for _ in range(5))
    first = ctx.Process(target=_hold, args=("GPU-aaaa", str(tmp_path), first_held, release))
    first.start()
    try:
        assert first_held.wait(30)
        second = ctx.Process(target=_take, args=("GPU-aaaa", str(tmp_path), second_waiting, second_held))
        second.start()
        assert second_waiting.wait(30), "the second member of the card did not find it busy"
        assert not second_held.is_set()
        # another card's member does not wait for this one
        other = ctx.Process(target=_take, args=("GPU-bbbb", str(tmp_path), ctx.Event(), other_held))
        other.start()
        assert other_held.wait(30) and not second_held.is_set()
        release.set()
        assert second_held.wait(30)
        for proc in (first, second, other):
            proc.join(30)
            assert proc.exitcode == 0
    finally:
        release.set()
        first.join(30)


def test_a_member_killed_while_starting_its_engine_frees_the_card(tmp_path):
    ctx = multiprocessing.get_context("fork")
    first_held, release, second_waiting, second_held = (ctx.Event() for _ in range(4))
    first = ctx.Process(target=_hold, args=("GPU-aaaa", str(tmp_path), first_held, release))
    first.start()
    assert first_held.wait(30)
    second = ctx.Process(target=_take, args=("GPU-aaaa", str(tmp_path), second_waiting, second_held))
    second.start()
    assert second_waiting.wait(30)
    first.kill()
    assert second_held.wait(30)
    second.join(30)
    first.join(30)
    assert second.exitcode == 0


def test_only_a_colocated_engine_on_a_shared_gpu_takes_a_turn(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(uuid=f"GPU-{index}-uuid"))
    cuda = torch.device("cuda", 0)
    for backend, device, sharers in ((VLLM_COLOCATE, cuda, 1), (HF_GENERATE, cuda, 2),
                                     (VLLM_COLOCATE, torch.device("cpu"), 2)):
        with engine_start_turn_for(backend, device, sharers):
            assert not list(tmp_path.iterdir())
    with engine_start_turn_for(VLLM_COLOCATE, cuda, 2):
        lock = engine_start_lock_path("GPU-0-uuid")
        assert lock.parent == Path(tmp_path) and lock.exists()
        fd = os.open(lock, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):  # held: another open of the file cannot take it
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


def _take_in_private_tmp(key: str, tmp: str, waiting, held) -> None:
    """A member of another job on the same card: its own private temp dir (job_container/tmpfs, TMPDIR)."""
    import tempfile

    os.environ["TMPDIR"] = tmp
    tempfile.tempdir = None  # read TMPDIR again, as a fresh process of that job would
    _take(key, None, waiting, held)


def test_members_of_two_jobs_with_private_temp_dirs_still_take_turns_on_their_card(tmp_path, monkeypatch):
    """launcher.gpu_sharing=shard: the members of one card are tasks of different jobs, each with a private /tmp;
    the lock lives in a node-local folder they share (/run/lock here), not in either's temp dir."""
    monkeypatch.delenv(LOCK_DIR_ENV, raising=False)
    key = f"GPU-test-{os.getpid()}-{tmp_path.name}"
    ctx = multiprocessing.get_context("fork")
    first_held, release, second_waiting, second_held = (ctx.Event() for _ in range(4))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = ctx.Process(target=_hold_in_private_tmp, args=(key, str(tmp_path / "a"), first_held, release))
    first.start()
    try:
        assert first_held.wait(30)
        second = ctx.Process(target=_take_in_private_tmp, args=(key, str(tmp_path / "b"), second_waiting,
                                                                second_held))
        second.start()
        assert second_waiting.wait(30), "the other job's member did not find the card busy"
        assert not second_held.is_set()
        release.set()
        assert second_held.wait(30)
        second.join(30)
        assert second.exitcode == 0
    finally:
        release.set()
        first.join(30)
        engine_start_lock_path(key).unlink(missing_ok=True)
    assert not list((tmp_path / "a").iterdir()) and not list((tmp_path / "b").iterdir())


def _hold_in_private_tmp(key: str, tmp: str, held, release) -> None:
    import tempfile

    os.environ["TMPDIR"] = tmp
    tempfile.tempdir = None
    _hold(key, None, held, release)
