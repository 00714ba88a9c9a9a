"""Tests that build an inner config by hand read the config groups' files: resolved the way Hydra resolves them
(a divergence's coefficient and a searcher's radius are interpolations that fall back to the file's default)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parent.parent / "conf"


def load_group(group: str, name: str, root: Path = CONF) -> dict[str, Any]:
    """``conf/<group>/<name>.yaml`` as a plain dict with its interpolations resolved."""
    return OmegaConf.to_container(OmegaConf.load(root / group / f"{name}.yaml"), resolve=True)  # type: ignore[return-value]
