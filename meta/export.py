"""``python -m meta.export run_dir=... which=center|best_member out=...``: write a mirror-map init file.

The file is in mirror_maps' init format (load it with ``python -m inner_loop.run divergence=neural_mirror
divergence.init=<out>``) and carries provenance: run id, generation, fitness, config hash, which.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

from meta.config import ConfigError, config_hash
from results.store import RunStore

logger = logging.getLogger("meta.export")

WHICH = ("center", "best_member")
USAGE = "usage: python -m meta.export run_dir=<run dir> [which=center|best_member] [out=best_mirror.safetensors]"


def parse_args(argv: Sequence[str]) -> dict[str, str]:
    args = {"which": "best_member", "out": "best_mirror.safetensors"}
    for item in argv:
        key, sep, value = item.partition("=")
        if not sep or key not in ("run_dir", "which", "out"):
            raise ConfigError(f"argument {item!r} is not one of run_dir=, which=, out=\n{USAGE}")
        args[key] = value
    if not args.get("run_dir"):
        raise ConfigError(f"run_dir= is required\n{USAGE}")
    if args["which"] not in WHICH:
        raise ConfigError(f"which={args['which']!r} must be one of {WHICH}")
    return args


def export_init(run_dir: str | Path, which: str, out: str | Path) -> dict[str, Any]:
    """Write the init file; returns its provenance metadata. ConfigError if the run has nothing to export."""
    import torch

    from mirror_maps import NeuralMirrorMap, save_init

    store = RunStore(run_dir)
    if not store.exists():
        raise ConfigError(f"run_dir={run_dir} holds no run (no config.yaml); pass the directory meta.run used")
    raw = yaml.safe_load(store.read_config_text()) or {}
    manifest = store.read_manifest()
    latest = store.latest_state()
    if latest is None:
        raise ConfigError(f"run_dir={run_dir} has no finished generation yet; nothing to export")
    generation, state = latest
    if which == "center":
        vector = state["center"].to(torch.float64)
        provenance = {"generation": generation, "fitness": None, "mean_fitness": state.get("mean_fitness")}
    else:
        best = state.get("best")
        if not best:
            raise ConfigError(f"run_dir={run_dir}: no member has succeeded yet; try which=center")
        vector = torch.tensor(best["params"], dtype=torch.float64)
        provenance = {"generation": best["generation"], "member": best["index"], "fitness": best["fitness"]}
    transform = (raw.get("divergence") or {}).get("param_transform", "abs")
    metadata = {
        "source": "meta.export",
        "which": which,
        "run_id": manifest.get("run_id", state.get("run_id")),
        "run_dir": str(Path(run_dir).resolve()),
        "config_hash": manifest.get("config_hash") or config_hash(raw),
        "es": state.get("es"),
        **provenance,
    }
    save_init(out, NeuralMirrorMap.from_vector(vector, param_transform=transform), metadata)
    logger.info("wrote %s (%s of generation %s, fitness %s)", out, which, provenance["generation"], provenance["fitness"])
    return metadata


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(USAGE + "\n")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        args = parse_args(argv)
        export_init(args["run_dir"], args["which"], args["out"])
    except ConfigError as exc:
        sys.stderr.write(f"export error: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
