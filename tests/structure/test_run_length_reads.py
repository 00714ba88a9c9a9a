"""A run's length (train.steps) is read from a raw config in two places only: the search's schema
(meta/settings/schema.py ``train_steps``, for every room of meta) and core/config/horizon.py ``inner_steps`` (for the
rooms below meta, which may not import the schema, and a member's segment: core/records.py). Everyone else takes a
run's steps from those: the schema's ``full_steps`` and ``member_steps``, or a spec's ``work`` segment.

Why: a length worked out at a dozen sites drifted (a search member's es.member_steps read as train.steps in one of
them). The source is read with ``ast``; tests are not scanned.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("core", "meta", "launch", "inner_loop", "mirror_maps", "results", "bench", "scripts")
OWNERS = {ROOT / "meta" / "settings" / "schema.py", ROOT / "core" / "config" / "horizon.py"}


def _is_train(node: ast.AST) -> bool:
    """``node`` is a train node: ``train``, ``<x>.train``, ``<x>["train"]`` (or a name ending in ``train``)."""
    if isinstance(node, ast.Name):
        return node.id.endswith("train")
    if isinstance(node, ast.Attribute):
        return node.attr.endswith("train")
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "train"
    if isinstance(node, ast.BoolOp):  # (raw.get("train") or {})
        return any(_is_train(value) for value in node.values)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "train"
    return False


def raw_steps_reads(source: str, filename: str = "<source>") -> list[int]:
    """Lines of ``source`` that read train.steps off a raw config: ``<train>["steps"]``, ``<train>.get("steps")``
    or ``select_key(config, "train.steps")``."""
    lines = []
    for node in ast.walk(ast.parse(source, filename)):
        if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant)
                and node.slice.value == "steps" and _is_train(node.value)):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if node.func.attr == "get" and args[:1] == ["steps"] and _is_train(node.func.value):
                lines.append(node.lineno)
        if (isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value == "train.steps"
                                               for a in node.args)):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_only_the_schema_and_the_segment_read_train_steps_off_a_raw_config():
    offenders = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in OWNERS:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line}" for line in raw_steps_reads(path.read_text(), str(path))]
    assert offenders == [], ("take a run's steps from the schema (full_steps, member_steps, train_steps) or a spec's "
                             "segment (spec.work, core.config.horizon.inner_steps):\n" + "\n".join(offenders))


def test_each_owner_reads_it():
    for owner in OWNERS:
        assert raw_steps_reads(owner.read_text(), str(owner)), owner


def test_the_scan_sees_each_way_of_reading_it():
    source = ('a = train["steps"]\n'
              'b = cfg.train.get("steps")\n'
              'c = row.inner["train"].get("steps")\n'
              'd = (raw.get("train") or {}).get("steps") or 0\n'
              'e = select_key(config, "train.steps")\n'
              'f = design["steps"]\n'
              'train["steps"] = 0\n'
              '"""prose about train["steps"]"""\n')
    assert raw_steps_reads(source) == [1, 2, 3, 4, 5]
