"""The centre the search starts from: ``uniform`` (U(0, 0.01), the NM-GRPO random init), ``gaussian``
(N(0, 0.01^2), the authors' ES init) or the path of an init file written by mirror_maps.save_init."""
from __future__ import annotations

from pathlib import Path

import torch

from meta.seeding import generator
from mirror_maps.neural import VECTOR_LENGTH  # re-exported: the search variable's length

INIT_SCALE = 0.01
NAMED_INITS = ("uniform", "gaussian")


def initial_center(init: str, seed: int) -> torch.Tensor:
    """A float64 vector of 380 numbers; ValueError naming ``init`` if it is neither a known name nor a file."""
    if init == "uniform":
        return torch.rand(VECTOR_LENGTH, generator=generator(seed, "init"), dtype=torch.float64) * INIT_SCALE
    if init == "gaussian":
        return torch.randn(VECTOR_LENGTH, generator=generator(seed, "init"), dtype=torch.float64) * INIT_SCALE
    path = Path(init)
    if not path.is_file():
        raise ValueError(f"init={init!r} is neither one of {NAMED_INITS} nor an existing init file")
    from mirror_maps import load_init

    try:
        mirror_map, _ = load_init(path)
    except (ValueError, FileNotFoundError) as exc:
        raise ValueError(f"init={init!r}: {exc}") from exc
    return mirror_map.to_vector().to(torch.float64)
