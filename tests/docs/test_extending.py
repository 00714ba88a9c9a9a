"""docs/extending.md's recipes, run as written: each toy entry is one module and one YAML in a temporary folder
outside the repository (its package's entry points in a ``*.dist-info`` beside it, its YAML in a config tree named by
MIRROR_ES_CONFIG_PATH), goes through a dry run and (searcher, divergence, task) a tiny run on the embedded default,
and no file of the repository changes. The recipes share one dry run that names every toy option, and the searcher,
divergence and task one tiny search with all three: a ``meta.run`` costs ~12 CPU-s before it plans anything and a
tiny search ~50, so one each keeps the file's CPU time down while every recipe still goes through both.

The modules, YAMLs and entry points are read from the page's code blocks (each opens with ``# file: <path>``), so the
page cannot drift from what runs.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from time_limits import run_with_progress

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "extending.md"
BLOCK = re.compile(r"^```[a-z]*\n# file: (\S+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
#: the cheapest search that still trains: 2 members (no control member), 1 generation, 2 steps, no warm-up, no
#: selection or reporting stage (the control member trains the same program as the members: the member program's
#: recipe below runs one)
TINY = ["population=2", "generations=1", "control_member=false", "launcher=local", "reevaluate.top_k=0",
        "train.steps=2", "train.val_size=8", "train.batch_size=16", "model.warmup_max_steps=0"]
#: the tiny search's recipes: the toy searcher searches, its members train on the toy task with the toy divergence at
#: an alpha of the command line's
TINY_RECIPES = ["es=toy_best", "task=toy_double", "divergence=toy_power", "divergence.alpha=3"]
#: the shared dry run: every toy option at once (its population: the launcher's plan counts 4 members and the control
#: member; the searcher's early stopping decides at half of 60 steps)
PLAN_RECIPES = ["es=toy_best", "population=4", "train.eval_every=10", "early_stop.enabled=true",
                "early_stop.at_fraction=0.5", "early_stop.noise=0.01", "task=toy_double",
                "reevaluate.transfer=[toy_double]", "launcher=toy_serial", "model=toy_smollm2_360m"]
#: nothing can reach the hub here: the toy model's staging must say so, not wait on the network
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _blocks() -> list[tuple[str, str]]:
    return [(path, body) for path, body in BLOCK.findall(PAGE.read_text())]


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> dict[str, str]:
    """The page's toy package and config tree written under a temporary folder; the environment that finds them."""
    root = tmp_path_factory.mktemp("toy")
    points: dict[str, dict[str, str]] = {}
    for path, body in _blocks():
        if path == "pyproject.toml":
            for group, entries in tomllib.loads(body)["project"]["entry-points"].items():
                points.setdefault(group, {}).update(entries)
            continue
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
    (root / "toy_ext" / "__init__.py").write_text("")
    info = root / "toy_ext-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-ext\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in entries.items()) + "\n"
        for group, entries in points.items()))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["MIRROR_ES_CONFIG_PATH"] = str(root / "toy_conf")
    return {"root": str(root), **env}


def _repository_status() -> str:
    """The repository's files as git lists them (tracked, untracked and ignored-but-listed alike)."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


@pytest.fixture
def unchanged_repository():
    """The repository's files are as they were after the test."""
    before = _repository_status()
    yield
    assert _repository_status() == before, "an extension had to change the repository"


def _run(toy: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``python -m <args>`` from the toy folder (whatever a command writes by default lands there), with the toy's
    environment."""
    env = {k: v for k, v in toy.items() if k != "root"}
    return run_with_progress([sys.executable, "-m", *args], cwd=toy["root"], env=env)


def _run_unchanged(toy: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``_run`` for a module fixture, which runs before any test's ``unchanged_repository``: it checks the same."""
    before = _repository_status()
    done = _run(toy, *args)
    assert _repository_status() == before, "an extension had to change the repository"
    return done


@pytest.fixture(scope="module")
def plan(toy, tmp_path_factory) -> subprocess.CompletedProcess:
    """The dry run of every recipe's option at once, offline; the toy model's weights a local (empty) folder: nothing
    to stage, the plan still sizes it by its declared shape."""
    base = tmp_path_factory.mktemp("plan")
    weights = base / "weights"
    weights.mkdir()
    return _run_unchanged({**toy, **OFFLINE}, "meta.run", f"run_dir={base / 'plan'}", "new=true", "dry_run=true",
                          *PLAN_RECIPES, f"model.name_or_path={weights}")


@pytest.fixture(scope="module")
def tiny_search(toy, tmp_path_factory) -> Path:
    """The run dir of the tiny search of the searcher's, the divergence's and the task's recipes, finished."""
    run_dir = tmp_path_factory.mktemp("tiny") / "search"
    done = _run_unchanged(toy, "meta.run", f"run_dir={run_dir}", "new=true", *TINY_RECIPES, *TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def _logs(run_dir: Path) -> str:
    """Every log the search and its members wrote."""
    return "".join(p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file() and p.suffix in
                   (".err", ".out", ".log"))


def test_each_recipe_is_one_module_and_one_yaml():
    """... and a member program one module alone: ``inner.entrypoint`` names it, no config group does."""
    paths = [p for p, _ in _blocks() if p != "pyproject.toml"]
    modules = sorted(p for p in paths if p.endswith(".py"))
    yamls = sorted(p for p in paths if p.endswith(".yaml"))
    assert modules == ["toy_ext/divergence.py", "toy_ext/launcher.py", "toy_ext/model.py", "toy_ext/program.py",
                       "toy_ext/searcher.py", "toy_ext/task.py"]
    assert [Path(p).parent.name for p in yamls] == ["divergence", "es", "launcher", "model", "task"]


def test_a_searcher(toy, plan, tiny_search, tmp_path, unchanged_repository):
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "es=toy_best" in plan.stdout and "early_stop: decided at step 30" in plan.stdout
    refused = _run(toy, "meta.run", f"run_dir={tmp_path / 'refused'}", "new=true", "dry_run=true", "es=pgpe",
                   "train.eval_every=10", "early_stop.enabled=true", "early_stop.at_fraction=0.5",
                   "early_stop.noise=0.01")
    assert refused.returncode == 2 and "es=toy_best (any settings)" in refused.stderr, refused.stderr[-2000:]
    usage = _run(toy, "meta.run", "--help")
    assert "toy_best" in usage.stdout
    pilot = _run(toy, "meta.pilot", f"run_dir={tmp_path / 'pilot'}", "new=true", "dry_run=true", "es=toy_best")
    assert "radius: es.radius of es=toy_best" in pilot.stdout, pilot.stderr[-2000:]  # the one radius key
    state = yaml.safe_load((tiny_search / "config.yaml").read_text())
    assert state["es"]["name"] == "toy_best" and (tiny_search / "gen_0000").is_dir()


def test_a_divergence(toy, plan, tiny_search, tmp_path, unchanged_repository):
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "power potential (toy)" in plan.stdout  # its baseline row, under its own label
    tune = _run(toy, "meta.tune", f"run_dir={tmp_path / 'tune'}", "new=true", "dry_run=true", "divergence=toy_power")
    assert "divergence.coef: log [0.001, 1]" in tune.stdout, tune.stderr[-2000:]  # its declared tune_range
    refused = _run(toy, "inner_loop.run", "divergence=toy_power", "divergence.form=sampled_is", "task=arith",
                   "model=tiny", f"work_dir={tmp_path / 'refused'}")
    assert refused.returncode == 2 and "supports ['sampled', 'full']" in refused.stderr, refused.stderr[-2000:]
    members = sorted((tiny_search / "gen_0000").glob("member_*"))
    assert members and all(json.loads((m / "result.json").read_text())["status"] == "ok" for m in members)
    # the loss its members trained with, as the trainer logs it: alpha from the command line
    assert "toy_power[sampled](alpha=3) x 0.05" in _logs(tiny_search)


def test_a_divergence_s_own_parameter_reaches_its_potential(toy):
    """``divergence.alpha`` of the toy's YAML (and of the command line) is the potential's alpha, and its terms are
    the power potential's: no file of the repository names the parameter."""
    probe = ("import json, torch\n"
             "from meta.compose import compose\n"
             "from inner_loop.config import divergence_config\n"
             "from inner_loop.loss.regularizers import build_regularizer\n"
             "out = {}\n"
             "for extra in ([], ['divergence.alpha=3']):\n"
             "    cfg = divergence_config(compose(['divergence=toy_power', *extra])['divergence'])\n"
             "    cfg.validate()\n"
             "    reg = build_regularizer(cfg)\n"
             "    p, q = torch.tensor([[0.5]]), torch.tensor([[0.25]])\n"
             "    out[str(extra)] = [reg.potential.alpha, reg.per_token(p.log(), q.log()).item()]\n"
             "print(json.dumps(out))\n")
    env = {k: v for k, v in toy.items() if k != "root"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=toy["root"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert found["[]"] == pytest.approx([2.0, 0.25 ** 2])  # alpha 2: (p - q)^2
    assert found["['divergence.alpha=3']"] == pytest.approx([3.0, 0.5 ** 3 - 0.25 ** 3 - 3 * 0.25 ** 2 * 0.25])


@pytest.mark.parametrize("value,words", [("1", "divergence.alpha must be > 1"), ("abc", "divergence.alpha")])
def test_a_bad_value_of_a_divergence_s_own_parameter_is_refused_before_anything_is_written(toy, tmp_path, value,
                                                                                           words):
    work_dir = tmp_path / "refused"
    refused = _run(toy, "inner_loop.run", "divergence=toy_power", f"divergence.alpha={value}", "task=arith",
                   "model=tiny", f"work_dir={work_dir}")
    assert refused.returncode == 2 and words in refused.stderr, refused.stderr[-2000:]
    assert not work_dir.exists()


def test_a_task(plan, tiny_search):
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "task=toy_double" in plan.stdout
    record = json.loads((tiny_search / "gen_0000" / "member_000" / "result.json").read_text())
    assert record["status"] == "ok" and record["val_size"] == 8, record
    # its declared reward
    assert "reward: 1 when the first integer of the completion is twice the number" in _logs(tiny_search)


def test_a_launcher(toy, plan, tmp_path, unchanged_repository):
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "launcher=toy_serial: 5 members per generation one after another in this process" in plan.stdout
    refused = _run(toy, "meta.run", f"run_dir={tmp_path / 'refused'}", "new=true", "dry_run=true",
                   "launcher=toy_serial", "launcher.gpu_sharing=packed")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "launcher.gpu_sharing='packed' is not a mode of launcher=toy_serial" in refused.stderr


def test_a_model(toy, plan, tmp_path, unchanged_repository):
    offline = {**toy, **OFFLINE}
    staged = _run(offline, "meta.stage", "dry_run=true", "model=toy_smollm2_360m", f"stage.cache_dir={tmp_path / 'hub'}")
    said = staged.stdout + staged.stderr
    assert staged.returncode == 2, said[-3000:]
    assert "missing: model HuggingFaceTB/SmolLM2-360M-Instruct (model.name_or_path)" in said  # its hub id is staged
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "3,276,800" in plan.stdout, plan.stdout[-3000:]  # LoRA r=16 on 4 projections x 32 blocks of its shape
    unknown = _run(offline, "inner_loop.run", "model=toy_smollm2_360m", "model.name=toy_smollm2_999m", "task=arith",
                   f"work_dir={tmp_path / 'refused'}")
    assert unknown.returncode == 2 and "toy_smollm2_360m" in unknown.stderr, unknown.stderr[-2000:]  # listed as known


def test_a_divergence_s_default_coefficient_is_its_entry_s_alone(toy):
    """Composed with no preset setting it, every divergence (the built-in ones and the toy's) trains at its entry's
    default_coef: its YAML falls back to null, not to a number of its own."""
    probe = ("import json\n"
             "from inner_loop.loss.divergences import divergences\n"
             "from meta.compose import compose\n"
             "out = {}\n"
             "for name, entry in divergences().items():\n"
             "    raw = compose([f'divergence={name}', '~coef_by_divergence'])\n"
             "    out[name] = [entry.default_coef, raw['divergence']['coef']]\n"
             "print(json.dumps(out))\n")
    env = {k: v for k, v in toy.items() if k != "root"}
    done = run_with_progress([sys.executable, "-c", probe], env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert "toy_power" in found and "kl" in found
    for name, (default, coef) in found.items():
        assert coef == pytest.approx(default), name
    for path in [*(ROOT / "conf" / "divergence").glob("*.yaml")]:
        body = yaml.safe_load(path.read_text())  # no second default written in a YAML: its schema reads the preset
        assert "coef" not in body and f"{path.stem}_schema" in body["defaults"], path


def test_a_member_program(toy, tmp_path, unchanged_repository):
    """The toy program as ``inner.entrypoint``: its ``validate`` refuses a bad option before anything is written, a
    search trains its members with it, and its ``finalize`` tidies each member once its generation is settled."""
    program = ["launcher=debug", "inner.entrypoint=toy_ext.program:program", "population=2", "generations=1",
               "reevaluate.top_k=0"]
    refused_dir = tmp_path / "refused"
    refused = _run(toy, "meta.run", f"run_dir={refused_dir}", "new=true", *program, "+inner.options={target: far}")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "inner.options.target='far' must be a number" in refused.stderr
    assert not refused_dir.exists()
    run_dir = tmp_path / "search"
    done = _run(toy, "meta.run", f"run_dir={run_dir}", "new=true", *program, "+inner.options={target: 0.1}")
    assert done.returncode == 0, done.stderr[-3000:]
    members = sorted((run_dir / "gen_0000").glob("member_*"))
    assert len(members) == 3  # two members and the control member
    for member in members:
        record = json.loads((member / "result.json").read_text())
        assert record["status"] == "ok" and 0.0 < record["fitness"] <= 1.0, record
        assert not (member / "scratch.txt").exists()  # written by train, removed by finalize
