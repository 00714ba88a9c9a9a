"""One owner per metric name: core/keys.py alone spells the keys the trainer logs and the
diagnostic names the result record keeps; every writer and reader imports the constant.

A key spelled twice drifts: a renamed trainer metric leaves a reader (diagnostics, progress.json, the inertness
warning, a benchmark) silently looking up a name nobody logs any more. The source is read with ``ast``: a string
literal equal to one of the keys, or starting with one of the policy-metric prefixes, anywhere outside the owner
fails. Tests are not scanned: they spell the names on purpose, to notice a rename that would break old logs.
"""
from __future__ import annotations

import ast
from pathlib import Path

import core.keys as metric_keys

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("core", "meta", "launch", "inner_loop", "mirror_maps", "results", "bench", "scripts")
OWNER = ROOT / "core" / "keys.py"


def spelled_keys(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, literal) of every string constant in ``source`` that is a metric key or starts with a prefix."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in metric_keys.KEYS or node.value.startswith(metric_keys.POLICY_METRIC_PREFIXES):
                found.append((node.lineno, node.value))
    return sorted(found)


def test_only_the_owner_spells_a_metric_key():
    offenders = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == OWNER:
                continue
            for line, literal in spelled_keys(path.read_text(), str(path)):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {literal!r}")
    assert offenders == [], "import the name from core.keys instead:\n" + "\n".join(offenders)


def test_the_owner_names_each_key_once():
    assert len(set(metric_keys.KEYS)) == len(metric_keys.KEYS)
    constants = {name: value for name, value in vars(metric_keys).items() if name.isupper() and isinstance(value, str)}
    prefixes = set(metric_keys.POLICY_METRIC_PREFIXES)
    assert set(constants.values()) == set(metric_keys.KEYS) | prefixes | set(metric_keys.MEMBER_KEYS)  # KEYS: every key


def test_the_scan_sees_keys_in_subscripts_calls_and_f_strings():
    source = ('metrics["regularizer/grad_share"].append(1)\n'
              'share = diagnostics.get("regularizer_grad_share")\n'
              'name = f"trust_region/{label}_frac"\n'
              'fine = f"{TRUST_REGION_PREFIX}{label}_frac"\n'
              '"""A docstring that mentions regularizer/grad_share is prose, not a key."""\n')
    assert spelled_keys(source) == [(1, "regularizer/grad_share"), (2, "regularizer_grad_share"),
                                    (3, "trust_region/")]
