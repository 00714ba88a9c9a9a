"""The centre the search starts from: ``uniform`` (a map whose parameters are U(0, 0.01), the NM-GRPO random init),
``gaussian`` (the search vector N(0, 0.01^2), the authors' ES init) or the path of an init file written by
mirror_maps.save_init.

``uniform`` fixes the map, not the vector: under ``param_transform: softplus`` the centre is the search vector that
softplus maps to those parameters (about log p for p << 1), so the same documented map starts the search whatever
the transform; under ``abs`` and ``none`` vector and parameters coincide."""
from __future__ import annotations

from pathlib import Path

import torch

from core.seeding import generator
from mirror_maps.neural import DEFAULT_PARAM_TRANSFORM, vector_for_parameters
from mirror_maps.neural import VECTOR_LENGTH  # re-exported: the search variable's length

INIT_SCALE = 0.01
NAMED_INITS = ("uniform", "gaussian")


def initial_center(init: str, seed: int, param_transform: str = DEFAULT_PARAM_TRANSFORM) -> torch.Tensor:
    """A float64 vector of 380 numbers; ValueError naming ``init`` if it is neither a known name nor a file.
    ``param_transform``: the search's (divergence.param_transform), which ``uniform`` reads its map through."""
    if init == "uniform":
        params = torch.rand(VECTOR_LENGTH, generator=generator(seed, "init"), dtype=torch.float64) * INIT_SCALE
        return vector_for_parameters(params, param_transform)
    if init == "gaussian":
        return torch.randn(VECTOR_LENGTH, generator=generator(seed, "init"), dtype=torch.float64) * INIT_SCALE
    path = Path(init)
    if path.is_dir():
        raise ValueError(f"init={init!r} is a directory; name an init file in it (meta.export writes one: "
                         "python -m meta.export run_dir=<run> out=<file>.safetensors)")
    if not path.is_file():
        raise ValueError(f"init={init!r} is neither one of {NAMED_INITS} nor an existing init file")
    from mirror_maps import load_init

    try:
        mirror_map, _ = load_init(path)
    except (ValueError, FileNotFoundError) as exc:
        raise ValueError(f"init={init!r}: {exc}") from exc
    return mirror_map.to_vector().to(torch.float64)
