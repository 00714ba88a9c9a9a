"""A run stopped and resumed is bitwise the run that never stopped, whole or as es=nres truncations, in any epoch;
a truncation member stopped after saving its checkpoint at ``stop``, before publishing it, publishes it untrained
(issue 59).

The tiny model on the arith task cut to 4 training problems, 2 prompts a step: an epoch is 2 steps, so a 5-step run
resumed after step 1 resumes in epoch 0 and after step 3 in epoch 1. A reward the untrained model varies on moves the
policy from step 1. The tiny preset's numerics are pinned (docs/numerics.md): weights compare with torch.equal.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from safetensors.torch import load_file
from trl.trainer.utils import RepeatSampler

import inner_loop.member.lifecycle as lifecycle
import inner_loop.training.truncation as truncation_module
from core.records import MemberSpec
from inner_loop.grpo.sampler import EpochRepeatSampler
from inner_loop.member.lifecycle import train_in_process
from inner_loop.tasks.arith import ArithTask
from results.store.layout import CHECKPOINT_DIR, RESULT_FILE
from results.store.truncation import END_SCORE, Truncation
from helpers import inner_config, SMALL_UNWARMED

STEPS = 5
WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module", autouse=True)
def varying_reward() -> Iterator[None]:
    """A reward the untrained tiny model varies on, so that its weights move from step 1."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ArithTask, "score", lambda self, problem, completion:
                      sum(c.isdigit() for c in completion) / max(len(completion), 1))
        yield


def _inner(keep: str = "last") -> dict[str, Any]:
    return inner_config("kl", task_keys={"train_size": 4}, model_keys=SMALL_UNWARMED, steps=STEPS, batch_size=8,
                        group_size=4, val_size=4, max_completion_length=4, report_to=[], save_every=1,
                        keep_checkpoints=keep)


def _spec(work_dir: Path, piece: Truncation | None = None, generation: int = 0, keep: str = "last") -> MemberSpec:
    return MemberSpec(run_id="continuation", generation=generation, index=0, seed=5, params=[], inner=_inner(keep),
                      work_dir=str(work_dir), truncation=piece.to_dict() if piece is not None else None)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / WEIGHTS))


def _assert_same_weights(folder: Path, reference: Path) -> None:
    ours, theirs = _weights(folder), _weights(reference)
    assert ours.keys() == theirs.keys()
    differ = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert not differ, f"{folder} differs from {reference} in {differ}"


def _trained_steps(monkeypatch: pytest.MonkeyPatch, kill_after: set[int]) -> list[int]:
    """Count the training steps run from now on (the step each started from); raise KeyboardInterrupt (a kill: no
    record is written) instead of training on from a step in ``kill_after``, once each."""
    real = lifecycle.MirrorGRPOTrainer.training_step
    started: list[int] = []

    def step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.state.global_step in kill_after:
            kill_after.discard(self.state.global_step)
            raise KeyboardInterrupt
        started.append(self.state.global_step)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(lifecycle.MirrorGRPOTrainer, "training_step", step)
    return started


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run's checkpoints folder, one checkpoint a step."""
    work = tmp_path_factory.mktemp("straight")
    record = train_in_process(_spec(work, keep="all"))
    assert record.status == "ok", record.error
    return work / CHECKPOINT_DIR


def test_the_training_sampler_order_is_a_function_of_seed_and_epoch():
    """Epoch e's order is the e-th order TRL's sampler gives an uninterrupted run, whenever and however often it is
    asked for, from a fresh sampler too (a resumed trainer's); another seed gives other orders."""
    trl = RepeatSampler(list(range(7)), mini_repeat_count=2, batch_size=3, repeat_count=2, seed=11)
    uninterrupted = [list(trl) for _ in range(4)]
    ours = EpochRepeatSampler.like(trl)
    for epoch in (2, 2, 0, 3, 1):
        ours.set_epoch(epoch)
        assert list(ours) == uninterrupted[epoch], epoch
    resumed = EpochRepeatSampler.like(trl)
    resumed.set_epoch(3)
    assert list(resumed) == uninterrupted[3]
    other = EpochRepeatSampler(list(range(7)), mini_repeat_count=2, batch_size=3, repeat_count=2, seed=12)
    assert [other.set_epoch(e) or list(other) for e in range(4)] != uninterrupted
    assert len({tuple(order) for order in uninterrupted}) > 1  # the epochs' orders differ: the test can tell them


def test_a_whole_run_resumed_in_epoch_0_and_in_epoch_1_is_bitwise_the_uninterrupted_run(straight, tmp_path,
                                                                                      monkeypatch):
    """Killed after its checkpoints at steps 1 and 3, requeued each time (resuming from its own checkpoint)."""
    work = tmp_path / "resumed"
    _trained_steps(monkeypatch, kill_after={1, 3})
    for stopped_at in (1, 3):
        with pytest.raises(KeyboardInterrupt):
            train_in_process(_spec(work))
        assert (work / CHECKPOINT_DIR / f"checkpoint-{stopped_at}").is_dir()
    record = train_in_process(_spec(work))
    assert record.status == "ok" and record.steps_done == STEPS, record.error
    _assert_same_weights(work / CHECKPOINT_DIR / f"checkpoint-{STEPS}", straight / f"checkpoint-{STEPS}")


def test_truncations_resumed_in_epoch_0_and_in_epoch_1_are_bitwise_the_uninterrupted_run(straight, tmp_path):
    """[0, 1), [1, 3), [3, 5): each boundary is the uninterrupted run at its step."""
    for generation, (start, stop) in enumerate(((0, 1), (1, 3), (3, STEPS))):
        piece = Truncation(particle=0, episode=0, start=start, stop=stop, horizon=STEPS,
                           particle_dir=str(tmp_path / "particle"))
        record = train_in_process(_spec(tmp_path / f"gen{generation}", piece, generation))
        assert record.status == "ok", record.error
        _assert_same_weights(piece.boundary(stop), straight / f"checkpoint-{stop}")


def test_a_member_stopped_before_publishing_its_checkpoint_at_stop_publishes_it_untrained(straight, tmp_path,
                                                                                         monkeypatch):
    """Killed after saving its checkpoint at ``stop``, before publishing it: the requeued member trains nothing and
    publishes that checkpoint, the very files the Trainer wrote (linked, not copied; the member's own name for them
    gone); a retry after it (its record archived, as the runner does) finds the boundary published and agrees."""
    piece = Truncation(particle=0, episode=0, start=0, stop=3, horizon=STEPS, particle_dir=str(tmp_path / "particle"))
    work = tmp_path / "member"
    saved = work / CHECKPOINT_DIR / "checkpoint-3"

    def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(truncation_module, "publish", killed)  # where a truncation publishes
        with pytest.raises(KeyboardInterrupt):
            train_in_process(_spec(work, piece))
    written = os.stat(saved / WEIGHTS).st_ino
    trained = _trained_steps(monkeypatch, kill_after=set())
    record = train_in_process(_spec(work, piece))
    assert record.status == "ok", record.error
    assert trained == [] and record.steps_done == 3
    boundary = piece.boundary(3)
    _assert_same_weights(boundary, straight / "checkpoint-3")
    assert os.stat(boundary / WEIGHTS).st_ino == written and os.stat(boundary / WEIGHTS).st_nlink == 1
    assert not saved.exists()
    os.replace(work / RESULT_FILE, work / "result.attempt0.json")
    retried = train_in_process(_spec(work, piece))
    assert retried.status == "ok" and trained == []
    assert (retried.fitness, retried.diagnostics[END_SCORE]) == (record.fitness, record.diagnostics[END_SCORE])


def test_a_checkpoint_past_stop_is_set_aside_and_the_truncation_trains_to_stop_again(straight, tmp_path, monkeypatch):
    """A member's checkpoint past ``stop`` (what a retry trained before the fix) is not the particle's state at
    ``stop``: it is removed, and the truncation trains [0, stop) again, bitwise the uninterrupted run."""
    piece = Truncation(particle=0, episode=0, start=0, stop=3, horizon=STEPS, particle_dir=str(tmp_path / "particle"))
    work = tmp_path / "member"
    shutil.copytree(straight / "checkpoint-4", work / CHECKPOINT_DIR / "checkpoint-4")
    trained = _trained_steps(monkeypatch, kill_after=set())
    record = train_in_process(_spec(work, piece))
    assert record.status == "ok", record.error
    assert trained == [0, 1, 2] and record.steps_done == 3
    _assert_same_weights(piece.boundary(3), straight / "checkpoint-3")
    assert not (work / CHECKPOINT_DIR / "checkpoint-4").exists()


def test_publishing_links_the_checkpoint_and_a_kill_midway_leaves_the_members_checkpoint(tmp_path, monkeypatch):
    """Plain folders: a kill while the boundary is written leaves no boundary and the member's checkpoint whole (its
    next run publishes it); publishing gives the boundary the member's files themselves (their bytes written once)
    and removes the member's name for them; where a link cannot be made (another filesystem) the files are copied."""
    import errno

    import results.store.truncation as store
    from results.store.truncation import read_boundary

    truncations = truncation_module
    piece = Truncation(particle=0, episode=0, start=0, stop=3, horizon=STEPS, particle_dir=str(tmp_path / "particle"))

    def checkpoint(work: Path) -> Path:
        folder = work / CHECKPOINT_DIR / "checkpoint-3"
        (folder / "sub").mkdir(parents=True)
        (folder / WEIGHTS).write_bytes(b"w" * 100)
        (folder / "sub" / "state.json").write_text("{}")
        return folder

    def kill(folder: Path) -> None:
        raise KeyboardInterrupt

    saved = checkpoint(tmp_path / "member")
    with monkeypatch.context() as patch:
        patch.setattr(store, "fsync_tree", kill)
        with pytest.raises(KeyboardInterrupt):
            truncations.publish(piece, tmp_path / "member", (0.25, 0.5), 0)
    assert read_boundary(piece.boundary(3)) is None  # (the interrupted write's leftovers go with prune_boundaries)
    assert (saved / WEIGHTS).read_bytes() == b"w" * 100 and (saved / "sub" / "state.json").is_file()
    written = os.stat(saved / WEIGHTS).st_ino
    boundary = truncations.publish(piece, tmp_path / "member", (0.25, 0.5), 0)
    assert read_boundary(boundary)["score"] == 0.5 and not saved.exists()
    assert os.stat(boundary / WEIGHTS).st_ino == written and (boundary / "sub" / "state.json").read_text() == "{}"

    def other_filesystem(source: str, target: str) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    saved = checkpoint(tmp_path / "elsewhere")
    monkeypatch.setattr(os, "link", other_filesystem)
    boundary = truncations.publish(piece, tmp_path / "elsewhere", (0.25, 0.75), 1)
    assert read_boundary(boundary)["score"] == 0.75 and (boundary / WEIGHTS).read_bytes() == b"w" * 100
    assert (boundary / "sub" / "state.json").is_file() and not saved.exists()
