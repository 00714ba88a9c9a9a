"""scripts/node_bundle.py: the wheels an air-gapped GPU node lacks, and the search's refusal of a searcher whose
modules (ray) a node cannot have. What each role's processes really import is checked against the plan in
tests/scripts/test_gpu_check.py, which runs the main job with ray blocked."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import node_bundle  # noqa: E402
from node_bundle import BundleError, Plan, Target, build_bundle, parse_node_packages, wheel_modules  # noqa: E402
from time_limits import run_with_progress

PROBE = ROOT / "tests" / "import_probe"


def blocked_env(**extra: str) -> dict[str, str]:
    """A subprocess environment in which `import ray` fails in every Python process, as on a node without it."""
    return {**os.environ, "PYTHONPATH": f"{PROBE}{os.pathsep}{ROOT}", "MIRROR_ES_BLOCK_IMPORTS": "ray", **extra}


def test_the_node_list_reads_pip_freeze_and_bare_names():
    node = parse_node_packages("# a node\nTorch==2.11.0+cu130\npeft\nhuggingface_hub==1.33.0\n"
                               "mylib @ file:///x.whl\n-e git+https://x#egg=y\nnumpy == 2.5.2 ; python_version>'3'\n")
    assert node == {"torch": "2.11.0", "peft": None, "huggingface-hub": "1.33.0", "mylib": None, "numpy": "2.5.2"}
    with pytest.raises(BundleError, match="line 2"):
        parse_node_packages("torch==2.11.0\nnot a package line!\n")


def test_the_plan_keeps_the_nodes_torch_and_numpy_and_carries_the_projects_transformers():
    node = parse_node_packages((ROOT / "tests" / "fixtures" / "gpu_node_packages.txt").read_text())
    requirements, constraints, relaxed, shadowed = node_bundle._requirements("job", node, node_bundle.project_pins())
    assert "torch==2.11.0" in requirements and "numpy==2.5.2" in requirements  # the node's own, with the reason
    assert "pin 2.13.0, node 2.11.0" in relaxed["torch"]
    assert "transformers==5.23.0" in requirements and "node 5.17.0" in shadowed["transformers"]
    assert not any(r.startswith(("ray", "evotorch")) for r in requirements)
    assert "huggingface-hub==1.33.0" in constraints  # a transitive need resolves to the node's version
    member, _, _, _ = node_bundle._requirements("member", node, node_bundle.project_pins())
    assert not any(r.startswith(("optuna", "cma", "matplotlib")) for r in member)


def test_a_bundle_over_its_limit_is_refused_naming_its_largest_wheels_and_leaves_nothing(tmp_path):
    plan = Plan(role="member", target=Target(), bring={"colorlog": "6.12.0", "termcolor": "3.3.0"}, from_node={})
    out = tmp_path / "bundle"
    with pytest.raises(BundleError, match=r"over --max-mib 0.01; its largest wheels: (colorlog|termcolor)-"):
        build_bundle(plan, out, tmp_path, max_mib=0.01, with_bwrap=False)
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no half-written bundle beside it either
    manifest = build_bundle(plan, out, tmp_path, max_mib=1.0, with_bwrap=True)
    assert sorted(w["file"].split("-")[0] for w in manifest["wheels"]) == ["colorlog", "termcolor"]
    assert {"colorlog", "termcolor"} <= set(manifest["modules"])
    assert json.loads((out / "manifest.json").read_text()) == manifest
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # the sandbox's user (nobody) reaches bin/bwrap
    assert manifest["install"][0].startswith("python3 -m pip install --no-index --no-deps")
    # Debian's bubblewrap, extracted, runs from the bundle's folder
    probe = subprocess.run([str(out / "bin" / "bwrap"), "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent",
                            "true"], capture_output=True, text=True)
    assert (probe.returncode == 0) == ("runs from the bundle's folder" in manifest["bubblewrap"]), probe.stderr
    site = tmp_path / "site"  # the node's first line, as it runs it
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
                           str(site), *(str(p) for p in (out / "wheels").glob("*.whl"))], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    imported = subprocess.run([sys.executable, "-c", "import colorlog, termcolor; print(colorlog.__file__)"],
                              env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True)
    assert imported.stdout.startswith(str(site)), imported.stderr


def test_wheel_modules_are_the_top_level_packages_and_modules(tmp_path):
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in ("pkg/__init__.py", "single.py", "_private.py", "tests/test_x.py", "x-1.0.dist-info/RECORD",
                     "ext.cpython-312-x86_64-linux-gnu.so"):
            archive.writestr(name, "")
    assert wheel_modules(wheel) == ["ext", "pkg", "single"]


def test_without_ray_the_search_refuses_an_evotorch_searcher_by_name_and_plans_with_openai_es():
    refused = run_with_progress([sys.executable, "-m", "meta.run", "dry_run=true"], cwd=ROOT, env=blocked_env())
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "es=pgpe needs evotorch, ray, and ray cannot be imported here" in refused.stderr
    assert "'openai_es_elite'" in refused.stderr and "Traceback" not in refused.stderr
    planned = run_with_progress([sys.executable, "-m", "meta.run", "dry_run=true", "es=openai_es_elite"], cwd=ROOT,
                                env=blocked_env())
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert "DRY RUN" in planned.stdout and "es=openai_es_elite" in planned.stdout
