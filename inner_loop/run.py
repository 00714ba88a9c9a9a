"""`python -m inner_loop.run [overrides]`: one GBMPO / NM-GRPO training run from conf/inner.yaml.

    python -m inner_loop.run divergence=neural_mirror divergence.init=best_mirror.safetensors
    python -m inner_loop.run divergence=kl train.steps=100 work_dir=outputs/kl_seed1 seed=1

Re-running with the same work_dir returns the finished result or resumes the partial run. A bad value, a key that
does not exist (with or without ``+``) or a group option that does not exist exits with status 2 and a one-line
message naming the key and the closest known ones (or the group's choices), before anything is trained or written.

``eval_split=test`` scores the finished run on the task's test split instead of validation (final numbers of a
chosen method or init; the record says which split). ES members are always scored on validation.

The trained model (the LoRA adapter when model.lora_r > 0) and tokenizer are kept in ``<work_dir>/final/``
whatever ``train.keep_checkpoints`` says; the checkpoints themselves follow it like an ES member's (default
``none``: deleted once result.json is written; ``train.keep_checkpoints=last`` keeps the newest, with the
optimizer state, to train on from it).
"""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from inner_loop.config import register_schemas
from inner_loop.loss.divergences import fill_default_coef
from inner_loop.member.entry import keep_vllm_out_unless_used, needs_pinned_child, train_member
from inner_loop.process.pinned import PINNED_ENV
from core.config.groups import check_group_choice, checked_overrides, config_groups, with_config_path
from core.config.typed_nodes import composition_error
from core.records import MemberSpec, gpus_entry

logger = logging.getLogger("inner_loop.run")
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
register_schemas()  # conf/train/*.yaml and conf/divergence/*.yaml compose on them (whoever composes conf/inner.yaml)


def spec_from_config(cfg: DictConfig) -> MemberSpec:
    """A single run is a member spec like any other (so both paths share idempotence and resume)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    fill_default_coef(resolved)  # as meta's compose does: the stored spec says the coefficient the run trains with
    inner = {k: resolved[k] for k in ("task", "model", "divergence", "train")}
    inner["options"] = resolved.get("options") or {}
    inner["eval_split"] = resolved.get("eval_split") or "validation"
    inner.update(gpus_entry(resolved.get("resources") or {}))  # a preset's GPU run refuses to fall back to the CPU
    return MemberSpec(run_id="single", generation=0, index=0, seed=int(resolved.get("seed", 0)), params=[],
                      work_dir=str(resolved["work_dir"]), inner=inner)


def _restart_pinned(work_dir: str) -> None:
    """Start this command again in this process (exec) under the pinned settings, with the work_dir it resolved
    (``${now:...}`` would name another folder). A pinned run must compute in a process that started pinned; exec'd,
    the run validates and trains here instead of in a pinned child, and this command pays for torch, TRL and PEFT
    once, not twice (~6 s of a CPU a run)."""
    argv = [a for a in sys.orig_argv[1:] if a.lstrip("+").partition("=")[0] != "work_dir"]
    logger.info("restarting under the pinned numerics (inner_loop/process/pinned.py)")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv, f"work_dir={work_dir}"], {**os.environ, **PINNED_ENV})


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="inner")
def main(cfg: DictConfig) -> None:
    spec = spec_from_config(cfg)
    if HydraConfig.get().mode == RunMode.RUN and "torch" not in sys.modules:
        keep_vllm_out_unless_used(spec.inner)  # a process of its own for this one run (a sweep's next may want vLLM)
        if needs_pinned_child(spec.inner) and any(os.environ.get(k) != v for k, v in PINNED_ENV.items()):
            _restart_pinned(spec.work_dir)  # (asked already, yet not started pinned: no /proc; a pinned child then)
    from inner_loop.training.setup import validate_inner

    try:
        # Config and data errors stop here, before anything is trained or written (inside the member's training the
        # same error would become a `failed` result record, as it must for an unattended ES member).
        validate_inner(spec.inner)
    except ValueError as exc:
        logger.error("configuration error: %s", exc)
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    from inner_loop.member.preflight import PreflightError

    try:
        record = train_member(spec, save_final=True)
    except PreflightError as exc:  # this node cannot run it (inner_loop/member/preflight.py): one line, not a traceback
        logger.error("%s", exc)
        sys.exit(1)
    print(json.dumps(record.to_dict(), indent=2))
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        return  # sys.exit here would end the sweep after its first job; result.json records the outcome
    sys.exit(0 if record.ok else 1)


def checked_command_line(argv: list[str]) -> list[str]:
    """``argv`` with its overrides checked against conf/inner.yaml before Hydra runs (ValueError naming the key and
    the closest known ones, or the value its schema refuses), ``+key`` of an existing key made ``++key``; Hydra's own
    flags pass untouched. A sweep (``-m divergence=kl,prob_l2``) is checked against each group's first option; a
    swept value is checked where its job composes."""
    from hydra import initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [a for a in argv if not a.startswith("-") and ("=" in a or a.startswith("~"))]
    groups = config_groups(Path(CONF_DIR), overrides)
    for override in overrides:
        check_group_choice(override, groups, "inner")
    picked = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+~").split("@", 1)[0] in groups:
            picked.append(f"{key}={value.split(',')[0]}")
        elif key.lstrip("+").startswith("hydra."):
            picked.append(override)
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None, job_name="inner_check"):
        tree = OmegaConf.to_container(_composed(picked), resolve=False)
        assert isinstance(tree, dict)
        normalised = checked_overrides(overrides, tree, groups, "inner")
        values = [o for o in normalised if o not in picked and o.partition("=")[0].lstrip("+~") not in groups
                  and not o.lstrip("+").startswith("hydra.")]
        parsed = OverridesParser.create().parse_overrides(values)
        _composed([*picked, *(o for o, p in zip(values, parsed) if not p.is_sweep_override())])
    checked = iter(normalised)
    return with_config_path([next(checked) if a in overrides else a for a in argv])


def _composed(overrides: list[str]) -> DictConfig:
    """conf/inner.yaml composed with ``overrides``; ValueError naming the key a schema refuses (train.steps=abc: the
    train and divergence groups compose on their dataclasses) and where it was set, in the words of meta's commands."""
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return compose(config_name="inner", overrides=with_config_path(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ValueError(composition_error(exc)) from None


if __name__ == "__main__":
    if not any(a.startswith(("--config", "-c")) for a in sys.argv[1:]):  # another config tree: Hydra's own checks
        try:
            sys.argv[1:] = checked_command_line(sys.argv[1:])
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
    main()
