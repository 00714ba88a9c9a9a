"""`python -m inner_loop.fingerprint [--check] [--write] [--keep-cache]`: does this machine compute as ours do?

Runs the embedded default's training path from an empty model cache under the pinned numerics
(inner_loop/process/pinned.py) and prints three digests with the settings in force:
- ``warmup_weights``: the tiny model's format warm-up, the model every member starts from;
- ``completions``: every completion sampled by a fixed 60-step NM-GRPO run (tiny_arith, seed 0, the preset's
  starting map), in order;
- ``final_weights``: that run's trained weights.
Two machines whose digests agree give the same numbers for every tiny-preset run: the embedded default's table,
its tests' outcomes. ``--check`` compares them with the digests recorded in the repository (FINGERPRINT_FILE,
exit 1 on a difference), ``--write`` records this machine's. docs/numerics.md says how to compare two machines.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import inner_loop.process.pinned as numerics

logger = logging.getLogger("inner_loop.fingerprint")

#: the digests this repository's machines produced (and what they ran on)
FINGERPRINT_FILE = Path(__file__).resolve().parent / "fingerprint.json"
#: the digests compared; the rest of the file describes the run
#: the file's key for further digest sets, each with the CPUs it was seen on (``--add``)
OTHER_REFERENCES = "other_references"
DIGEST_KEYS = ("warmup_weights", "completions", "final_weights")
#: the fixed run: the embedded default's preset at its own steps and seed
RUN_OVERRIDES = ("experiment=tiny_arith", "seed=0", "train.steps=60", "train.eval_every=null")


def weights_digest(model_dir: str | Path) -> str:
    """sha256 over a saved model's tensors (name, dtype, shape, bytes, in name order): the weights, not the file."""
    from safetensors.torch import load_file

    digest = hashlib.sha256()
    tensors = load_file(str(Path(model_dir) / "model.safetensors"))
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def _inner_spec(work_dir: Path) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from inner_loop.run import CONF_DIR, spec_from_config

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("inner", overrides=[*RUN_OVERRIDES, f"work_dir={work_dir}"])
    OmegaConf.resolve(cfg)
    return spec_from_config(cfg).to_dict()


def fingerprint(work_root: Path) -> dict[str, Any]:
    """Train the fixed run under ``work_root`` (model cache included) and return its digests and settings.

    Must run in a process pinned before torch was imported (``main`` does that)."""
    os.environ["MIRROR_ES_CACHE"] = str(work_root / "cache")
    from inner_loop.member.entry import keep_vllm_out_unless_used

    spec = _inner_spec(work_root / "run")
    keep_vllm_out_unless_used(spec["inner"])  # this process exists for this one run, as a member's own does
    from inner_loop.member.lifecycle import train_in_process
    from inner_loop.models.loading import resolve_model_dir
    from inner_loop.training.setup import prepare
    from inner_loop.training.warmup import read_warmup_outcome, warmed_model_dir

    run = prepare(spec["inner"], seed=spec["seed"])
    state = numerics.enter_pinned()
    tcfg = run.cfg.train
    warm = warmed_model_dir(run.cfg.model, resolve_model_dir(run.cfg.model), run.task, run.cfg.task,
                            probe_max_new_tokens=tcfg.val_max_new_tokens or tcfg.max_completion_length)
    record = train_in_process(spec, save_final=True)
    if not record.ok:
        raise RuntimeError(f"the fingerprint run failed: {record.error}")
    outcome = read_warmup_outcome(warm)
    return {
        "warmup_weights": weights_digest(warm),
        "completions": (record.generation or {}).get("completions_sha256"),
        "final_weights": weights_digest(Path(spec["work_dir"]) / "final"),
        "run": {"overrides": list(RUN_OVERRIDES), "warmup_steps": outcome.steps if outcome else None,
                "warmup_probe_pass_at_1": outcome.probe_pass_at_1 if outcome else None,
                "validation_pass_at_1": record.fitness, "steps": record.steps_done},
        "numerics": state.as_dict(),
        "pinned_env": dict(numerics.PINNED_ENV),
        "torch": __import__("torch").__version__,
    }


def references(expected: dict[str, Any]) -> list[dict[str, Any]]:
    """The recorded digest sets: the file's own, then each of ``other_references`` (machines whose pinned numbers
    were found to differ from the first's, recorded with their CPU so that the difference is known, not hidden)."""
    return [expected, *expected.get(OTHER_REFERENCES, [])]


def compare(found: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """The digests that differ from the nearest recorded set, one line each (empty: this machine computes as one of
    the recorded machines did)."""
    best: list[str] | None = None
    for reference in references(expected):
        lines = [f"{key}: this machine {found.get(key)}, recorded {reference.get(key)}"
                 for key in DIGEST_KEYS if found.get(key) != reference.get(key)]
        if best is None or len(lines) < len(best):
            best = lines
    return best or []


def matched_cpus(found: dict[str, Any], expected: dict[str, Any]) -> list[dict[str, Any]]:
    """The CPUs of the recorded set this machine's digests equal (empty: none)."""
    for reference in references(expected):
        if all(found.get(key) == reference.get(key) for key in DIGEST_KEYS):
            return list(reference.get("checked_on", []))
    return []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inner_loop.fingerprint", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help=f"compare with {FINGERPRINT_FILE.name}; exit 1 if any "
                        "digest differs")
    parser.add_argument("--write", action="store_true", help=f"record this machine's digests in "
                        f"{FINGERPRINT_FILE.name} (keeping the list of CPUs it was checked on)")
    parser.add_argument("--add", action="store_true", help=f"record this machine's digests in {FINGERPRINT_FILE.name} "
                        "as another reference (a CPU whose pinned numbers differ from the recorded ones), keeping them")
    parser.add_argument("--keep-cache", metavar="DIR", help="work in DIR (kept) instead of a temporary directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("MIRROR_ES_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not numerics.can_pin():
        sys.stderr.write("fingerprint: this CPU lacks AVX2/FMA, which pinned numerics need\n")
        return 2
    if "torch" in sys.modules:
        raise RuntimeError("inner_loop.fingerprint must start before torch is imported")
    numerics.pin_this_process()
    with contextlib.redirect_stdout(sys.stderr):  # the trainer's progress lines; stdout is the digests' JSON
        if args.keep_cache:
            found = fingerprint(Path(args.keep_cache))
        else:
            with tempfile.TemporaryDirectory(prefix="mirror-es-fingerprint-") as tmp:
                found = fingerprint(Path(tmp))
    sys.stdout.write(json.dumps(found, indent=1) + "\n")
    expected = json.loads(FINGERPRINT_FILE.read_text()) if FINGERPRINT_FILE.is_file() else {}
    if args.write:  # the CPUs recorded before stay listed only where they computed these very digests
        same = all(found.get(key) == expected.get(key) for key in DIGEST_KEYS)
        checked_on = expected.get("checked_on", []) if same else []
        cpu = {k: found["numerics"][k] for k in ("cpu_vendor", "cpu_model")}
        cpu["flags"] = sorted(f for f in numerics.cpu_flags() if f.startswith(("avx", "amx", "fma")))
        if cpu not in checked_on:
            checked_on.append(cpu)
        FINGERPRINT_FILE.write_text(json.dumps({**{k: found[k] for k in DIGEST_KEYS}, "run": found["run"],
                                                "torch": found["torch"], "pinned_env": found["pinned_env"],
                                                "checked_on": checked_on}, indent=1) + "\n")
    if args.add and compare(found, expected):
        cpu = {k: found["numerics"][k] for k in ("cpu_vendor", "cpu_model")}
        cpu["flags"] = sorted(f for f in numerics.cpu_flags() if f.startswith(("avx", "amx", "fma")))
        expected.setdefault(OTHER_REFERENCES, []).append({**{k: found[k] for k in DIGEST_KEYS}, "run": found["run"],
                                                          "torch": found["torch"], "checked_on": [cpu]})
        FINGERPRINT_FILE.write_text(json.dumps(expected, indent=1) + "\n")
    if args.check:
        differences = compare(found, expected)
        if differences:
            sys.stderr.write("fingerprint: DIFFERENT from the recorded digests:\n  " + "\n  ".join(differences) + "\n")
            return 1
        cpus = ", ".join(f"{c.get('cpu_vendor')} {c.get('cpu_model')}" for c in matched_cpus(found, expected))
        sys.stderr.write(f"fingerprint: matches the recorded digests (seen on {cpus or 'an unnamed CPU'})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
