"""``python -m meta.export run_dir=... which=best|center|best_member out=...``: write a mirror-map init file.

The file is in mirror_maps' init format (load it with ``python -m inner_loop.run divergence=neural_mirror
divergence.init=<out>``) and carries provenance: run id, generation, fitness, config hash, which.
``which=best`` (the default) is the selection stage's choice (meta/search/after/reevaluate.py): the candidate with the highest
mean minus one standard error on the selection seeds, with its mean, std and n there; when the reporting stage
ran, the provenance also carries the result table's rows and the exported init's paired differences to every
baseline, measured on other seeds. ``best_member`` is the single highest search fitness (an online search's: the best
end score of a particle's run, never a truncation's change): one noisy run, the maximum of many, so mostly luck; it
is kept for inspection and says so.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Sequence

from meta.search.after.baselines import EXPORTED
from meta.cli_args import key_values, run_command
from meta.search.config import ConfigError, config_hash, param_transform_of
from meta.settings.upgrade import stored_config, stored_manifest
from results.report.search.online import BEST_MEASURES, search_measure
from results.store.run_store import RunStore

logger = logging.getLogger("meta.export")

WHICH = ("best", "center", "best_member")
#: names that say "a torch.save file"; the export writes safetensors, so such a name would misdescribe the file
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".pkl")
USAGE = ("usage: python -m meta.export run_dir=<run dir> (or the bare path) [which=best|center|best_member] "
         "[out=best_mirror.safetensors]")


def parse_args(argv: Sequence[str]) -> dict[str, str]:
    args = key_values(argv, {"which": "best", "out": "best_mirror.safetensors"}, ("run_dir", "which", "out"), USAGE)
    if args["which"] not in WHICH:
        raise ConfigError(f"which={args['which']!r} must be one of {WHICH}")
    out = Path(args["out"])
    if out.is_dir():
        raise ConfigError(f"out={out} is a directory; name the file to write, e.g. out={out / 'best_mirror.safetensors'}")
    if out.suffix in TORCH_SUFFIXES:
        raise ConfigError(f"out={out}: an init file is written in safetensors format, which a {out.suffix} name would "
                          f"hide; name it out={out.with_suffix('.safetensors')} (divergence.init reads it by content)")
    return args


def export_init(run_dir: str | Path, which: str, out: str | Path) -> dict[str, Any]:
    """Write the init file; returns its provenance metadata. ConfigError if the run has nothing to export."""
    import torch

    from mirror_maps import NeuralMirrorMap, save_init

    store = RunStore(run_dir)
    if not store.exists():
        raise ConfigError(f"run_dir={run_dir} holds no run (no config.yaml); pass the directory meta.run used")
    raw = stored_config(store)
    manifest = stored_manifest(store)
    latest = store.latest_state()
    if latest is None:
        raise ConfigError(f"run_dir={run_dir} has no finished generation yet; nothing to export")
    generation, state = latest
    if which == "best":
        vector, provenance = _reevaluated_best(store, run_dir)
    elif which == "center":
        vector = state["center"].to(torch.float64)
        provenance = {"generation": generation, "fitness": None, "mean_fitness": state.get("mean_fitness")}
    else:
        best = state.get("best")
        if not best:
            raise ConfigError(f"run_dir={run_dir}: {search_measure(store).unranked_text}; try which=center")
        vector = torch.tensor(best["params"], dtype=torch.float64)
        measured = best.get(BEST_MEASURES, "single-run search fitness")  # an online search's: a run's end score
        provenance = {"generation": best["generation"], "member": best["index"], "fitness": best["fitness"],
                      "note": f"{measured}, the maximum over all members: not re-evaluated"}
    transform = param_transform_of(raw)
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


def _reevaluated_best(store: RunStore, run_dir: str | Path) -> tuple[Any, dict[str, Any]]:
    """The re-evaluation's chosen init and its numbers (validation mean/std/n; test mean/std/n if measured)."""
    import torch

    from results.store.atomic import CorruptFileError

    try:
        summary = store.read_reevaluation()
    except CorruptFileError as exc:
        raise ConfigError(f"{exc}; run `python -m meta.reevaluate run_dir={run_dir}` to write it again") from None
    if summary is None:
        raise ConfigError(
            f"run_dir={run_dir} has no re-evaluation yet: run `python -m meta.reevaluate run_dir={run_dir}` (it retrains "
            "the top members and the centre with fresh seeds), or export which=center")
    chosen = next(c for c in summary["candidates"] if c["name"] == summary["chosen"])
    provenance = {
        "generation": chosen["generation"], "member": chosen["index"], "candidate": chosen["name"],
        "fitness": chosen["mean"], "selection_mean": chosen["mean"], "selection_std": chosen["std"],
        "selection_n": chosen["n"], "selection_lower_bound": chosen.get("lower_bound"),
        "selection_rule": summary.get("selection_rule"), "search_fitness": chosen["search_fitness"],
        "noise_floor_std": summary.get("noise_floor_std"),
    }
    table = store.read_result_table()
    if table is not None and table.get("exported") == chosen["name"]:
        provenance["result_table"] = {
            "seeds": table["seeds"], "confidence": table["confidence"],
            "rows": [{key: row[key] for key in ("name", "label", "divergence", "coef", "coef_source",
                                                  "response_tokens")}
                     | {metric: {k: v for k, v in summary_.items() if k != "values"}
                        for metric, summary_ in row["metrics"].items()} for row in table["rows"]],
            "exported_minus_baselines": [d for d in table["differences"] if d["row"] == EXPORTED],
        }
        provenance["verdict"] = list(table.get("verdict") or [])
    return torch.tensor(summary["chosen_params"], dtype=torch.float64), provenance


def _export(argv: list[str]) -> int:
    args = parse_args(argv)
    export_init(args["run_dir"], args["which"], args["out"])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(argv, USAGE, _export, "export error")


if __name__ == "__main__":
    sys.exit(main())
