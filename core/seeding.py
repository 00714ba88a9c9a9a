"""Seeds derived from (run seed, generation, purpose): every random draw of a run is reproducible on resume."""
from __future__ import annotations

import contextlib
import hashlib
from typing import Iterator

import torch


def derive_seed(seed: int, *keys: object) -> int:
    """A 63-bit seed from the run seed and any labels (generation, member index, purpose)."""
    text = "/".join(str(k) for k in (seed, *keys))
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") >> 1


#: training seeds are 31-bit: torch, numpy and HF accept them everywhere
TRAINING_SEED_RANGE = 2**31


def member_seed(seed: int, *keys: object) -> int:
    """The training seed of one run (a member, a selection or reporting run, a trial's run, a pilot run), derived
    like every other draw from the run seed and labels."""
    return derive_seed(seed, *keys) % TRAINING_SEED_RANGE


def generator(seed: int, *keys: object) -> torch.Generator:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(derive_seed(seed, *keys))
    return gen


@contextlib.contextmanager
def seeded_global_torch(seed: int, *keys: object) -> Iterator[None]:
    """Seed torch's GLOBAL RNG for the block and restore it after (evotorch's functional ask draws from it)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, *keys))
        yield


@contextlib.contextmanager
def seeded_global_numpy(seed: int, *keys: object) -> Iterator[None]:
    """Same for numpy's global RNG (the cma package samples from it)."""
    import numpy as np

    saved = np.random.get_state()
    np.random.seed(derive_seed(seed, *keys) % (2**32))
    try:
        yield
    finally:
        np.random.set_state(saved)
