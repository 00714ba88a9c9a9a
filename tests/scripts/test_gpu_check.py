"""scripts/gpu_check.sh, the GPU acceptance run, on this machine's CPU: the same path as on a GPU (meta.run with the
mbpp_qwen3 preset on a model of Qwen3-1.7B's architecture, the MBPP fixture, offline; re-evaluation, export, a
single run with the export), at small shapes, the CUDA parts skipped with the reason shown. On a GPU machine it runs
as part of scripts/gpu_pass.sh (docs/gpus.md); this test keeps it working between loans.

It runs as on an air-gapped GPU node: `import ray` and `import vllm` fail in every process (neither is carried there), and every
module each process imports is logged, so that the node bundle's plan (scripts/node_bundle.py) is checked against
what the main job really imports: each module comes from the bundle, the node's own list, or the standard library."""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from importlib import metadata, util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from node_bundle import Target, canonical, parse_node_packages, project_pins, resolve  # noqa: E402
from time_limits import run_with_progress

pytestmark = pytest.mark.slow
PROBE = ROOT / "tests" / "import_probe"
NODE_LIST = ROOT / "tests" / "fixtures" / "gpu_node_packages.txt"
#: our own top-level packages (the repository travels to the node; PYTHONPATH names it)
OWN = {"core", "meta", "inner_loop", "launch", "results", "mirror_maps", "scripts", "tests", "bench", "sitecustomize"}


def imported_distributions(log: Path) -> dict[str, dict[str, frozenset[str]]]:
    """'member' / 'job' -> module -> the distributions that install it (several for a namespace package such as
    google), for the third-party modules those processes imported (modules not installed here were optional imports
    that failed; the standard library and our own packages need nothing)."""
    owners = metadata.packages_distributions()
    out: dict[str, dict[str, frozenset[str]]] = defaultdict(dict)
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        module, argv = entry["module"], " ".join(entry["argv"])
        if module in sys.stdlib_module_names or module in OWN or module.startswith("_"):
            continue
        if util.find_spec(module) is None:
            continue
        dists = frozenset(canonical(d) for d in owners.get(module, [])) or frozenset({canonical(module)})
        role = "member" if "submitit" in argv or "inner_loop" in argv else "job"
        out[role][module] = dists
        out["job"][module] = dists
    return out


def not_needed_on_the_node(dist: str, python: str) -> bool:
    """Whether nothing would make the node install ``dist``: no pin of ours names it, and every installed distribution
    that requires it does so only on Pythons other than the node's (``backports.tarfile; python_version < "3.12"``)
    or not at all (a module here that code tries with a fallback, such as setuptools' vendored jaraco trying
    backports.tarfile): this machine's Python imported it, the node's would go without."""
    from packaging.requirements import InvalidRequirement, Requirement

    if dist in project_pins():
        return False
    environment = {"python_version": python, "python_full_version": f"{python}.0", "extra": ""}
    for installed in metadata.distributions():
        for text in installed.requires or []:
            try:
                requirement = Requirement(text)
            except InvalidRequirement:
                continue
            if canonical(requirement.name) == dist and (requirement.marker is None
                                                         or requirement.marker.evaluate(environment)):
                return False
    return True


def test_the_acceptance_run_trains_every_record_on_the_device_it_names_without_ray(tmp_path):
    out, log = tmp_path / "gpu_check.json", tmp_path / "imports.jsonl"
    # neither ray nor vLLM is on the node (neither is carried: 79 MB and more); vLLM, where this machine has it, tries
    # ray when it is imported, and the members must not need either
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": f"{PROBE}{os.pathsep}{ROOT}",
           "MIRROR_ES_BLOCK_IMPORTS": "ray,vllm", "MIRROR_ES_IMPORT_LOG": str(log)}
    done = run_with_progress([str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--work",
                              str(tmp_path / "job"), "--json", str(out)], cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "CUDA tests" in done.stderr and "skipped: no usable CUDA device" in done.stderr
    summary = json.loads(out.read_text())
    rows = summary["rows"]
    # 1 generation x (2 members + the control), 4 selection runs, 4 reporting runs (the export and the base model
    # on 2 seeds), the single run with the exported init
    assert len(rows) == 3 + 4 + 4 + 1
    assert {r["status"] for r in rows} == {"ok"} and {r["device_type"] for r in rows} == {"cpu"}
    assert all(r["step_s"] for r in rows if r["steps"])
    assert "gpu_check: OK" in done.stdout

    # the node bundle's plans cover what the processes imported (a member process: its role's plan)
    imported = imported_distributions(log)
    assert "evotorch" not in imported["job"]  # es=openai_es_elite: evotorch (which needs ray) is never imported
    assert {"trl", "transformers", "submitit", "torch"} <= set(imported["member"])
    node = parse_node_packages(NODE_LIST.read_text())
    for role in ("member", "job"):
        plan = resolve(role, node, Target(), tmp_path / "built")  # sdists built once for both roles
        # a module is covered when one of the distributions that install it comes with the bundle or the node
        # (what only this machine's Python needs, the node's resolution rightly leaves out)
        missing = sorted(f"{module} ({', '.join(sorted(dists))})" for module, dists in imported[role].items()
                         if not any(d in plan.bring or d in node or not_needed_on_the_node(d, plan.target.python_version)
                                    for d in dists))
        assert not missing, f"the {role} bundle lacks what its processes imported: {missing}"
