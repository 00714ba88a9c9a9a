"""Tests that build an inner config by hand read the config groups' files: resolved the way Hydra resolves them
(a divergence's coefficient and a searcher's radius are interpolations that fall back to the file's default)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from inner_loop.loss.divergences import fill_default_coef

CONF = Path(__file__).resolve().parent.parent / "conf"


def load_group(group: str, name: str, root: Path = CONF, resolve: bool = True) -> dict[str, Any]:
    """``conf/<group>/<name>.yaml`` as a plain dict with its interpolations resolved (``resolve``), over the schemas
    its defaults list names in Hydra's ConfigStore (and, for a divergence, its default coefficient filled from the
    registry, as a composition does)."""
    from hydra.core.config_store import ConfigStore

    from meta.settings.schema import register

    register()
    body = OmegaConf.load(root / group / f"{name}.yaml")
    nodes = [ConfigStore.instance().load(f"{group}/{entry}.yaml").node
             for entry in body.pop("defaults", []) if entry != "_self_"]
    node = OmegaConf.to_container(OmegaConf.merge(*nodes, body), resolve=resolve)
    if group == "divergence":
        fill_default_coef({"divergence": node})
    return node  # type: ignore[return-value]


#: the experiment presets, by name
PRESETS = tuple(sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))


def preset_sampling(name: str, root: Path = CONF) -> tuple[float, float, int]:
    """(temperature, top_p, top_k) the experiment preset ``name`` samples with: its train node over the train
    group's default (top_k is TRL's, through train.trl; 0: none)."""
    train = load_group("train", "default", root)
    train.update((OmegaConf.to_container(OmegaConf.load(root / "experiment" / f"{name}.yaml")) or {}).get("train") or {})
    return float(train["temperature"]), float(train["top_p"]), int((train.get("trl") or {}).get("top_k") or 0)
