"""The training sampler: TRL's ``RepeatSampler`` with each epoch's order a pure function of (seed, epoch).

TRL's sampler seeds one generator when it is built and draws one permutation from it each time it is iterated (once
an epoch); it has no ``set_epoch``. An uninterrupted run's epoch e is therefore the generator's (e+1)-th permutation,
but a run resumed from a checkpoint builds a fresh sampler, whose first permutation is epoch 0's again: a resume in
any epoch past the first trained another run than the one it continued. ``EpochRepeatSampler`` draws epoch e's order
as that same (e+1)-th permutation of a generator seeded with the seed alone, so every run, resumed or not, sees the
order the uninterrupted TRL run saw. transformers' Trainer calls ``set_epoch`` before each epoch through accelerate's
``DataLoaderShard.set_epoch``, which also reaches the sampler under the loader that skips a resumed epoch's trained
batches (``skip_first_batches``: its ``SkipBatchSampler`` wraps the same batch sampler).
"""
from __future__ import annotations

from typing import Iterator

import torch
from trl.trainer.utils import RepeatSampler


class EpochRepeatSampler(RepeatSampler):
    """``RepeatSampler`` (same chunks and repeats) whose order in epoch ``set_epoch(e)`` depends on (seed, e) only."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        if self.shuffle and self.seed is None:
            raise ValueError("EpochRepeatSampler needs a seed: an unseeded order cannot be replayed on resume")
        self.epoch = 0
        #: (epochs drawn, the generator's state after them): the next epoch continues from there instead of
        #: drawing every earlier epoch's permutation again
        self._drawn: tuple[int, torch.Tensor] | None = None

    @classmethod
    def like(cls, sampler: RepeatSampler) -> "EpochRepeatSampler":
        """The same sampler as TRL built it (its dataset, batch, repeats, shuffle and seed), resumable."""
        if not isinstance(sampler, RepeatSampler):  # another TRL version: its order needs looking at again
            raise TypeError(f"TRL's training sampler is a {type(sampler).__name__}, not the RepeatSampler whose "
                            "order inner_loop/grpo/sampler.py makes a function of (seed, epoch)")
        return cls(sampler.data_source, mini_repeat_count=sampler.mini_repeat_count, batch_size=sampler.batch_size,
                   repeat_count=sampler.repeat_count, shuffle=sampler.shuffle, seed=sampler.seed)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration yields (transformers' Trainer sets it before each epoch)."""
        self.epoch = int(epoch)

    def _generator_for(self, epoch: int) -> torch.Generator:
        """A generator whose next permutation is epoch ``epoch``'s: seeded with the seed, ``epoch`` drawn."""
        generator = torch.Generator()
        if self._drawn is not None and self._drawn[0] <= epoch:
            drawn = self._drawn[0]
            generator.set_state(self._drawn[1])
        else:
            drawn = 0
            generator.manual_seed(self.seed)
        for _ in range(epoch - drawn):
            torch.randperm(self.num_samples, generator=generator)
        self._drawn = (epoch, generator.get_state())
        return generator

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            self.generator = self._generator_for(self.epoch)  # the parent draws this epoch's permutation from it
        return super().__iter__()
