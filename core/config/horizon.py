"""How long a search member trains, as a stored search config says (``es.member_steps`` against ``train.steps``).

Why a module of its own: the search's config check, the settings' schema and keys, the status view and the report
read the same two keys; one reading keeps them agreeing. Below meta it is the one reader of train.steps off a raw
config (``inner_steps``: also a member's segment's, core/records.py, for a spec stored before segments); meta's is
the schema's. It imports nothing, so any room may read it.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: how many training steps a search member takes, an es key of conf/config.yaml (null: train.steps;
#: meta/settings/schema.py checks it); train.steps stays the length of the exported run and of the runs after the search
MEMBER_STEPS_KEY = "member_steps"


def inner_steps(inner: Mapping[str, Any]) -> int:
    """train.steps of a member's inner config (or of a stored search config): the segment of a spec stored before
    segments existed, and of a run outside a search, and a stored search's run length."""
    return int((inner.get("train") or {}).get("steps") or 0)


def search_horizon(raw: Mapping[str, Any]) -> tuple[int, int]:
    """(a search member's steps, train.steps) of a stored search config; a config from before es.member_steps, or
    with it null, gives train.steps twice."""
    steps = inner_steps(raw)
    member = (raw.get("es") or {}).get(MEMBER_STEPS_KEY)
    return (steps if member is None else int(member)), steps


def horizon_text(raw: Mapping[str, Any]) -> str:
    """How long a search member trains, for the status view and the report: one sentence ("" at train.steps)."""
    member, steps = search_horizon(raw)
    if member == steps:
        return ""
    return (f"members train es.{MEMBER_STEPS_KEY}={member} of train.steps={steps} steps (the exported run, the "
            f"selection and reporting runs train {steps}); their fitness is pass@1 at step {member}")


def member_train(train: Mapping[str, Any], member_steps: int, steps: int) -> dict[str, Any]:
    """The train node of a search member of ``member_steps`` steps, from a whole run's node of ``steps`` steps (the
    schema's train.steps): the run's schedule shrunk to the member's own horizon (the cosine decays over its steps,
    the warm-up is the same fraction of them). The same node when member_steps is ``steps``."""
    if member_steps == steps:
        return dict(train)
    warmup = int(train.get("lr_warmup_steps") or 0)
    return {**train, "steps": member_steps,
            "lr_warmup_steps": min(member_steps - 1, round(warmup * member_steps / steps)) if warmup else 0}
