"""The package layout holds: no import circles, and no import that runs against the layers (docs/architecture.md).

Every import counts: module level, inside functions (the lazy imports that keep torch out of light processes) and
under TYPE_CHECKING, because a circle through a lazy import is still a circle for whoever reads or moves the code.
The graph is read from the source with ``ast``, so nothing is imported or run.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "meta", "inner_loop", "mirror_maps", "launch", "results")

#: Rooms, most specific first; a module belongs to the first room its dotted name starts with.
ROOMS = (
    "inner_loop.sandbox", "inner_loop.loss", "inner_loop.grpo", "inner_loop.trl_settings", "inner_loop.generation",
    "inner_loop.models",
    "inner_loop.tasks", "inner_loop.config", "inner_loop.member", "inner_loop.training", "inner_loop.numerics",
    "inner_loop.process",
    "inner_loop", "results.store", "results.report", "results", "launch",
    "meta.searchers", "meta.search.generation", "meta.search.after", "meta.search", "meta.pilot", "meta.status",
    "meta.tune", "meta.settings", "meta", "mirror_maps", "core",
)
#: The ground floor (core/): every room may import it, and it imports nothing of ours but itself.
GROUND = "core"
#: What the inner loop's stages below the member process may use: its subpackages of one concern each.
_INNER_PARTS = frozenset({"inner_loop.config", "inner_loop.grpo", "inner_loop.trl_settings", "inner_loop.generation",
                          "inner_loop.loss",
                          "inner_loop.models", "inner_loop.tasks", "results.store", "mirror_maps"})
#: What every stage of the outer loop may use besides the rooms below meta: and the settings every command reads.
_OUTER_BELOW = frozenset({"launch", "results.report", "results.store", "mirror_maps", "meta.settings"})
#: What each room may import besides itself. Data flows down: meta -> launch -> results.store; inner_loop is reached
#: from meta only through the configured entry point string, never by an import.
MAY_IMPORT: dict[str, frozenset[str]] = {
    # the commands' doors (run, export, stage, reevaluate, early_cuts, the synthetic member program), the command
    # line every program reads (compose, cli_args) and the settings' schema (meta/settings/)
    "meta": _OUTER_BELOW | {"meta.searchers", "meta.search", "meta.search.generation", "meta.search.after"},
    "meta.searchers": frozenset(),  # plus the seeds, below
    # the settings every command reads (schema, keys, paths, member time, the early_stop node, the upgrade of what a
    # run dir stored): below the search, they read the searchers' radius key, the run store (a run dir's files and
    # its moved modules' table), the launchers' settings classes (the launcher node's schema) and the inner loop's
    # schemas (below), never the search that reads them
    "meta.settings": frozenset({"meta.searchers", "launch", "results.store"}),
    # the search: run, config, plan, lock, resume, staging, seeding, init; one generation below it, the runs after it
    "meta.search": _OUTER_BELOW | {"meta.searchers", "meta.search.generation", "meta.search.after"},
    "meta.search.generation": _OUTER_BELOW | {"meta.searchers"},
    "meta.search.after": _OUTER_BELOW | {"meta.search.generation", "meta.searchers"},
    "meta.pilot": _OUTER_BELOW | {"meta.search", "meta.search.generation", "meta.searchers"},
    "meta.tune": _OUTER_BELOW | {"meta.search"},
    # the status command: the search's view, and the pilot's and the tuning's views by the run dir's kind
    "meta.status": _OUTER_BELOW | {"meta.search", "meta.search.generation", "meta.pilot", "meta.tune"},
    "launch": frozenset({"results.store"}),
    # the doors: python -m inner_loop.run / .evaluate / .fingerprint, and the entry point's old path
    "inner_loop": _INNER_PARTS | {"inner_loop.member", "inner_loop.training", "inner_loop.numerics", "inner_loop.process",
                                  "inner_loop.sandbox"},
    # the member process: its entry, lifecycle, node checks, staging, notices, GPU share and record
    "inner_loop.member": _INNER_PARTS | {"inner_loop.training", "inner_loop.sandbox", "inner_loop.process"},
    # one training run's stages: set-up, warm-up, checkpoints, evaluation, transfer, the final model
    # (and what the process they run in is under: its numerics, its job's end notice, its share of the card)
    "inner_loop.training": _INNER_PARTS | {"inner_loop.process"},
    # the fingerprint runs the embedded default's training path (pinned.py imports nothing, below)
    "inner_loop.numerics": _INNER_PARTS | {"inner_loop.member", "inner_loop.training", "inner_loop.process"},
    # the member process's environment (numerics, notice, card share): below the member and the stages
    "inner_loop.process": frozenset({"inner_loop.generation", "results.store"}),
    "inner_loop.grpo": frozenset({"inner_loop.config", "inner_loop.trl_settings", "inner_loop.loss",
                                  "inner_loop.generation"}),
    # the TRL vocabulary (the GRPOConfig fields our keys set, train.trl's check, what TRL's loss reads): below the
    # config and the trainer, reading the backends' names alone
    "inner_loop.trl_settings": frozenset({"inner_loop.generation"}),
    # how completions are generated (backend names, cache budgets, vLLM's weight push): below the trainer
    "inner_loop.generation": frozenset(),
    "inner_loop.loss": frozenset({"mirror_maps"}),
    "inner_loop.models": frozenset({"results.store"}),  # plus the pinned numerics' modes (model.cpu_numerics), below
    "inner_loop.tasks": frozenset({"inner_loop.sandbox", "results.store"}),
    "inner_loop.config": frozenset(),  # plus the vocabularies below
    "inner_loop.sandbox": frozenset(),  # runs model-written code: it must not depend on anything it could be used to reach
    "results": frozenset({"results.report"}),  # the command doors (results/compare.py)
    "results.report": frozenset({"results.store"}),
    "results.store": frozenset(),  # plus mirror_maps' init files, below
    "mirror_maps": frozenset(),
    GROUND: frozenset(),
}
#: The outer loop's config and command line (meta/search/config.py, compose.py, cli_args.py; the settings of
#: meta/settings/ are a room of their own, in _OUTER_BELOW): every stage reads them.
_META_BASE = frozenset({"meta.search.config", "meta.compose", "meta.cli_args"})
#: What a generation and the runs after the search read of the search beside the base: its config, seeds, the
#: centre's init and the run dir's lock.
_SEARCH_BASE = _META_BASE | {"meta.search.init", "meta.search.lock"}
#: Pinned numerics: the modes, the thread count and the pinned child (inner_loop/process/pinned.py imports nothing
#: of ours), read by the config, the member process and the warm-up.
_PINNED = "inner_loop.process.pinned"
#: Single modules a room may import from a room it otherwise may not: the typed inner config checks its values
#: against the names the loss and TRL define (these modules import neither the config nor anything above it);
#: the loss and the trainer log their metrics under the names the run store owns (metric_keys imports nothing).
MODULE_EXCEPTIONS: dict[str, frozenset[str]] = {
    "inner_loop.config": frozenset({"inner_loop.loss.policy_registry", "inner_loop.loss.policy_terms",
                                    "inner_loop.loss.trust_regions", "inner_loop.trl_settings.trl_overrides",
                                    "inner_loop.trl_settings.trl_contract",
                                    # the numerics modes and the pinned thread count (imports nothing of ours)
                                    _PINNED,
                                    # the backend names and train.decode_cache's values (imports nothing of ours)
                                    "inner_loop.generation.backends",
                                    # the divergence registry: divergence.name and its forms (no torch, nothing above)
                                    "inner_loop.loss.divergences",
                                    # the model registry: model.name (no torch, nothing above)
                                    "inner_loop.models.registry",
                                    # the model node (beside the registry; it imports the registry and pinned.py)
                                    "inner_loop.models.model_config",
                                    # the task registry, whose config classes register_schemas puts in Hydra's
                                    # ConfigStore as the task group's schemas (the tasks' modules import no torch)
                                    "inner_loop.tasks"}),
    # model.cpu_numerics takes the pinned numerics' modes (pinned.py imports nothing of ours)
    "inner_loop.models": frozenset({_PINNED}),
    # the settings' schema registers the train and divergence groups' schemas (inner_loop.config.register_schemas)
    # and the keys name a preset's coefficient by the divergence registry
    "meta.settings": frozenset({"inner_loop.config", "inner_loop.loss.divergences"}),
    # the fingerprint composes the single run's config as python -m inner_loop.run does
    "inner_loop.numerics": frozenset({"inner_loop.run"}),

    # the result table's divergence rows, labels and roles and the tuner's coefficient ranges come from the divergence
    # registry (it imports the standard library and the entry-point reader, never torch or the loss)
    # and the plan's model shapes from the model registry (the standard library, the hub ids and the same reader)
    # and the schemas of the train and divergence groups it composes (inner_loop.config.register_schemas: the
    # typed run config imports the registries, pinned.py and the standard library at module level, never torch)
    "meta": frozenset({"inner_loop.loss.divergences", "inner_loop.models.registry", "inner_loop.config",
                       "meta.pilot.early_cuts"}),  # the door of python -m meta.early_cuts
    "results.store": frozenset({"mirror_maps.init_file"}),
    # the search's config and plan: the divergence registry (coefficients, the length reference) and the model
    # registry (the plan's model shapes); both import the standard library and the entry-point reader alone
    "meta.search": _META_BASE | {"inner_loop.loss.divergences", "inner_loop.models.registry"},
    # a generation reads the search's config, its seeds, the centre's init and the run's lock
    "meta.search.generation": _SEARCH_BASE,
    # the runs after the search read what a generation reads, and stage and lock as the search does
    "meta.search.after": _SEARCH_BASE | {"meta.search.staging", "meta.search.resume",
                                         "inner_loop.loss.divergences"},  # the divergences' baseline rows and labels
    # a pilot writes its run files as meta.run does; its status view prints the rows the search's view prints
    # (meta/search/member_rows.py) (and writes a preset's coefficient under the key the divergence registry names)
    "meta.pilot": _META_BASE | {"inner_loop.loss.divergences"},
    "meta.tune": _META_BASE | {"inner_loop.loss.divergences"},  # coefficient tune ranges
    # the status views read a run dir's config and manifest as every reader does: through their upgrade
    "meta.status": frozenset({"meta.settings.upgrade"}),
}
#: Third-party packages a member process must not load through results.store (they cost seconds and memory in
#: each of 180 light wrappers), and the store modules allowed to use them (the orchestrator's run store).
HEAVY = ("torch", "pandas", "matplotlib")
MEMBER_ENTRIES = ("launch.member", "launch.slurm.member", "inner_loop.member.entry", "inner_loop.member_entry")


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path) -> list[str]:
    """Every dotted name ``path`` imports, wherever the import statement stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            out.extend(f"{base}.{alias.name}" for alias in node.names)
            out.append(base)
    return out


def import_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> project modules it imports, module -> top-level third-party packages it imports)."""
    modules = _modules(root)
    ours: dict[str, set[str]] = {m: set() for m in modules}
    theirs: dict[str, set[str]] = {m: set() for m in modules}
    stdlib = sys.stdlib_module_names
    for name, path in modules.items():
        for target in _imports(name, path):
            top = target.split(".")[0]
            if top in PACKAGES:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    ours[name].add(target)
            elif top and top not in stdlib and top != "__future__":
                theirs[name].add(top)
    return ours, theirs


def find_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def room_of(module: str) -> str:
    return next(room for room in ROOMS if module == room or module.startswith(room + "."))


def wrong_way_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for source, targets in sorted(graph.items()):
        here = room_of(source)
        for target in sorted(targets):
            there = room_of(target)
            if (there == here or (there == GROUND and here != GROUND) or there in MAY_IMPORT[here]
                    or target in MODULE_EXCEPTIONS.get(here, ())):
                continue
            bad.append(f"{source} -> {target} ({here} may not import {there})")
    return bad


def closure(graph: dict[str, set[str]], starts: tuple[str, ...]) -> set[str]:
    seen, todo = set(), list(starts)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def test_the_package_has_no_import_circles():
    ours, _ = import_graph()
    assert find_circles(ours) == []


def test_no_import_runs_against_the_layers():
    ours, _ = import_graph()
    assert wrong_way_imports(ours) == []


def test_every_module_has_a_room_and_every_room_a_rule():
    ours, _ = import_graph()
    assert {room_of(m) for m in ours} <= set(MAY_IMPORT)


def test_the_sandbox_and_the_mirror_maps_import_nothing_else_of_ours():
    ours, _ = import_graph()
    for module, targets in ours.items():
        if room_of(module) in ("inner_loop.sandbox", "mirror_maps"):
            assert {room_of(t) for t in targets} <= {room_of(module)}, module


def test_the_ground_floor_imports_nothing_of_ours_above_it():
    """Every room may import core/: it must import only itself, or a room would reach others through it (what a
    member's wrapper reaches of it stays light: the test below). The key names and the config reading are leaves."""
    ours, theirs = import_graph()
    for module, targets in ours.items():
        if room_of(module) == GROUND:
            assert {room_of(t) for t in targets} <= {GROUND}, (module, targets)
    for leaf in ("core.keys", "core.entry_points", "core.proc_stat", "core.config.horizon", "core.config.plain_data",
                 "core.config.dotted_keys"):
        assert ours[leaf] == set() and theirs[leaf] == set(), leaf
    config = [m for m in ours if m.startswith("core.config.")]
    for module in config:  # the config reading: the standard library and its neighbours in core/config/
        assert ours[module] <= set(config) and theirs[module] == set(), (module, ours[module], theirs[module])


def test_the_leaves_other_rooms_may_import_import_nothing_of_ours():
    """The exceptions above let a room reach single modules of another; each must stay a leaf (or import only
    within its own room), or the exception would let the room reach the rest of that room through it."""
    ours, _ = import_graph()
    for module in (_PINNED, "core.seeding"):  # leaves (the seeds: core/, which imports nothing of ours above it)
        assert ours[module] == set(), (module, ours[module])
    assert {room_of(t) for t in ours["inner_loop.process.notice"]} <= {"results.store", GROUND}
    assert {room_of(t) for t in ours["inner_loop.process.gpu_share"]} <= {"inner_loop.config", "inner_loop.generation",
                                                                         "results.store", GROUND}
    assert {room_of(t) for t in ours["meta.search.member_rows"]} <= {"meta.status", "meta.search", "meta.search.generation",
                                                              *_OUTER_BELOW, GROUND}


#: Folders of inner_loop/ and meta/ over the limit, with their count: one module per task beside the task package's
#: own (the task registry's change owns that folder). A folder may not grow past its count, nor another join.
CROWDED: dict[str, int] = {}


def test_no_package_folder_holds_more_than_ten_modules_beside_its_subpackages():
    """The layout by stage keeps each package folder to what one reader takes in: at most ten modules (the
    package's __init__.py and __main__.py not counted), the rest in subpackages."""
    crowded = {}
    for package in PACKAGES:
        for folder in [ROOT / package, *(p.parent for p in (ROOT / package).rglob("__init__.py"))]:
            modules = [p.name for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
            if len(modules) > 10:
                crowded[str(folder.relative_to(ROOT))] = len(modules)
    assert {name: n for name, n in crowded.items() if n > CROWDED.get(name, 10)} == {}


def test_what_a_member_process_imports_from_the_store_is_light():
    """results.store may use the standard library, PyYAML-free JSON, optuna (study store) and, in the
    orchestrator's run store alone, torch and pandas; none of that heavy set reaches a member's wrapper."""
    ours, theirs = import_graph()
    store = [m for m in ours if room_of(m) == "results.store"]
    allowed = {"results.store.study_store": {"optuna"}, "results.store.run_store": {"torch", "pandas"}}
    for module in store:
        assert theirs[module] <= allowed.get(module, set()), (module, theirs[module])
    reached = closure(ours, MEMBER_ENTRIES)
    heavy_store = {m for m in ours if room_of(m) in ("results.store", GROUND) and theirs[m] & set(HEAVY)}
    assert not reached & heavy_store, sorted(reached & heavy_store)
    launch_side = closure(ours, ("launch.member", "launch.slurm.member"))
    assert not {top for m in launch_side for top in theirs[m]} & set(HEAVY)


@pytest.mark.parametrize("source, expected", [
    # the three circles the layout redesign removed, written the old way round
    ({"a.config": "from a.grpo_args import check\n", "a.grpo_args": "from a.checkpoints import limit\n",
      "a.checkpoints": "def f():\n    from a.config import X\n"}, [["a.checkpoints", "a.config", "a.grpo_args"]]),
    ({"a.base": "if TYPE_CHECKING:\n    from a.cem import CEM\n", "a.cem": "from a.base import Searcher\n"},
     [["a.base", "a.cem"]]),
    ({"a.one": "import a.two\n", "a.two": "x = 1\n"}, []),
])
def test_the_circle_finder_sees_circles_through_lazy_and_type_checking_imports(tmp_path, monkeypatch, source,
                                                                              expected):
    for name, text in source.items():
        path = tmp_path / Path(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGES", ("a",))
    ours, _ = import_graph(tmp_path)
    assert find_circles(ours) == expected


def test_a_wrong_way_import_is_reported():
    graph = {"results.store.layout": {"launch.member"}, "launch.member": {"results.store.layout"},
             "inner_loop.sandbox.pool": {"inner_loop.config"}, "meta.run": {"inner_loop.member"},
             "meta.settings.schema": {"meta.search.generation.early_stop", "meta.searchers.radius"}}
    assert wrong_way_imports(graph) == [
        "inner_loop.sandbox.pool -> inner_loop.config (inner_loop.sandbox may not import inner_loop.config)",
        "meta.run -> inner_loop.member (meta may not import inner_loop.member)",
        "meta.settings.schema -> meta.search.generation.early_stop (meta.settings may not import "
        "meta.search.generation)",
        "results.store.layout -> launch.member (results.store may not import launch)",
    ]


INNER_CONFIG = "inner_loop.config"
#: Inner rooms that still import the config while it imports them: none (the TRL vocabulary the config checks
#: train.trl with lives below both, in inner_loop/trl_settings/). Nothing may join.
TWO_WAY_LEFT: frozenset[str] = frozenset()


def two_way_with_the_inner_config(graph: dict[str, set[str]]) -> set[str]:
    """The inner rooms that the run config reads and that import the config back (any module of each)."""
    read = {room_of(t) for m, targets in graph.items() if room_of(m) == INNER_CONFIG for t in targets}
    back = {room_of(m) for m, targets in graph.items() if any(room_of(t) == INNER_CONFIG for t in targets)}
    return {room for room in read & back if room.startswith("inner_loop.") and room != INNER_CONFIG}


def test_the_inner_config_and_the_vocabularies_it_reads_import_one_way():
    """The config reads the names the loss, the models, the process and generation define (divergences, the model
    registry and node, pinned numerics, backends); none of those rooms reads the config back, so the arrows run one
    way: config -> vocabularies, and the stages above (member, training) read both."""
    ours, _ = import_graph()
    assert two_way_with_the_inner_config(ours) == TWO_WAY_LEFT
    seen = two_way_with_the_inner_config({"inner_loop.config": {"inner_loop.loss.divergences"},
                                          "inner_loop.loss.regularizers": {"inner_loop.config"},
                                          "inner_loop.training.setup": {"inner_loop.config"}})
    assert seen == {"inner_loop.loss"}  # the check can fail


def _package_of(module: str, modules: dict[str, Path]) -> str:
    path = modules.get(module)
    return module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]


def mutual_sibling_packages(graph: dict[str, set[str]], modules: dict[str, Path]) -> list[tuple[str, str]]:
    """Pairs of packages, neither inside the other, each importing the other (through any of their modules)."""
    edges = {(_package_of(a, modules), _package_of(b, modules)) for a, targets in graph.items() for b in targets}
    pairs = {tuple(sorted(edge)) for edge in edges if edge[0] != edge[1] and edge[::-1] in edges}
    return sorted((a, b) for a, b in pairs if not (b.startswith(a + ".") or a.startswith(b + ".")))


def test_no_two_sibling_packages_import_each_other():
    """A package may use its subpackages and they the modules at its door, but two packages side by side (meta.search
    and meta.searchers, inner_loop.member and inner_loop.training) import in one direction only."""
    ours, _ = import_graph()
    assert mutual_sibling_packages(ours, _modules(ROOT)) == []
    seen = mutual_sibling_packages({"a.x.m": {"a.y.n"}, "a.y.n": {"a.x.m"}, "a.z": {"a.x.m"}},
                                   {"a.x.m": Path("m.py"), "a.y.n": Path("n.py"), "a.z": Path("z.py")})
    assert seen == [("a.x", "a.y")]  # the check can fail
