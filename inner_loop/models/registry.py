"""The model registry: every policy ``model.name`` may name, and what the rest of the code asks of it.

Why one registry: the typed config checks ``model.name`` against it, the loader asks it for the directory or hub id
to load, staging for the hub repository to fetch before members start, and the dry-run plan for the published shape
it sizes memory and disk from, so a new model is one module (a ``Model`` entry, and its loader where it is built
locally) and one YAML (conf/model/<name>.yaml), with no other file edited (docs/extending.md).

Light on purpose, like the divergence registry: only the standard library, the hub ids and the entry-point reader are
imported here (a loader is named as a ``module:function`` string and imported when a run loads its model), so the
config checks, staging's torch-free first moments and meta's plan read it without torch.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inner_loop.models.hub_ids import QWEN3_1_7B
from core.entry_points import entry_point_objects


@dataclass(frozen=True)
class Model:
    """One model and the properties the rest of the code asks about (docs/extending.md explains each)."""

    name: str
    #: the hub repository it loads when ``model.name_or_path`` is not set; staging pins and fetches it
    hub_id: str | None = None
    #: ``module:function`` that builds (once, in the model cache) a local directory ``from_pretrained`` loads, from
    #: the ModelConfig; None: the hub id or ``model.name_or_path``
    loader: str | None = None
    #: its published config.json's numbers for the dry-run plan's parameter, LoRA and disk figures (the keys of
    #: meta.search.plan.ModelShape: layers, hidden, intermediate, q_heads, kv_heads, head_dim, vocab, tied); None: unknown
    shape: Mapping[str, Any] | None = field(default=None, hash=False)
    #: it names no weights of its own: ``model.name_or_path`` must say which (the ``hub`` entry: any id or folder)
    needs_path: bool = False

    def local_dir(self, cfg: Any) -> Path | None:
        """The directory its loader builds for ``cfg`` (a ModelConfig); None when it has no loader."""
        if self.loader is None:
            return None
        module, _, attr = self.loader.partition(":")
        return Path(getattr(importlib.import_module(module), attr)(cfg))


BUILT_IN = (
    Model("tiny", loader="inner_loop.models.tiny:tiny_model_dir"),  # its shape follows its own config (meta/search/plan.py)
    Model("smollm2_135m", loader="inner_loop.models.smollm2:smollm2_model_dir",
          shape={"layers": 30, "hidden": 576, "intermediate": 1536, "q_heads": 9, "kv_heads": 3, "head_dim": 64,
                 "vocab": 49152, "tied": True}),
    Model("qwen3_1_7b", hub_id=QWEN3_1_7B,
          shape={"layers": 28, "hidden": 2048, "intermediate": 6144, "q_heads": 16, "kv_heads": 8, "head_dim": 128,
                 "vocab": 151936, "tied": True}),
    Model("hub", needs_path=True),
)


def models() -> dict[str, Model]:
    """Every model, built-in ones first, then those installed packages declare under the ``mirror_es.models``
    entry-point group (each a Model whose name is the entry point's)."""
    return {**{m.name: m for m in BUILT_IN},
            **entry_point_objects("models", "an inner_loop.models.registry.Model",
                                  lambda m: m.name if isinstance(m, Model) else None)}


def model_entry(name: str) -> Model | None:
    """The entry ``model.name`` names; None for a name the registry does not know (a model given by
    ``model.name_or_path`` alone may carry any name)."""
    return models().get(name)
