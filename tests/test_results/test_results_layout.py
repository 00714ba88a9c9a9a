"""results/store/layout.py is the one place that spells the run dir's and the member dir's layout, and results/ stands
alone: numbered names round-trip, no other module of ours spells a layout name, and results/ imports nothing of
inner_loop, launch or meta (docs/architecture.md: results imports none of them)."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from results.store import layout
from results.store.run_store import RunStore

ROOT = Path(__file__).resolve().parents[2]
#: the packages whose modules must take every layout name from results.store.layout
SCANNED = ("core", "launch", "meta", "results", "inner_loop")
#: layout values that are also ordinary words (a column "state", a log message "final"): a literal equal to one of
#: them (or a jobs.json key "submissions") says nothing about the layout, so the scan leaves them out
ORDINARY_WORDS = {"state", "tables", "best", "final", "report", "submissions"}
#: the start of a numbered name (gen_, member_, chunk_, result.attempt), a name pattern or an f-string part, but
#: not an identifier-like "member_time"
_PREFIXED = re.compile(r"^\^?(?:(?:gen|member|chunk)_(?![a-z])|result\\?\.attempt)")


# ------------------------------------------------------------------ names
@pytest.mark.parametrize("number", [0, 7, 999, 1000, 9999, 10000, 123456])
def test_generation_names_round_trip_also_wider_than_the_padding(number):
    name = layout.generation_dir_name(number)
    assert layout.parse_generation_dir_name(name) == number
    assert layout.parse_state_file_name(layout.state_file_name(number)) == number
    assert layout.state_file_name(number) == name + ".pt"


@pytest.mark.parametrize("number", [0, 17, 99, 999, 1000, 12345])
def test_member_and_chunk_names_round_trip_also_wider_than_the_padding(number):
    assert layout.parse_member_dir_name(layout.member_dir_name(number)) == number
    assert layout.parse_chunk_marker_name(layout.chunk_marker_name(number)) == number


@pytest.mark.parametrize("number", [0, 7, 9999, 10000, 123456])
def test_trial_names_round_trip_and_read_only_their_own_kind(number):
    name = layout.trial_dir_name(number)
    assert layout.parse_trial_dir_name(name) == number
    assert layout.parse_generation_dir_name(name) is None and layout.parse_member_dir_name(name) is None
    assert layout.parse_trial_dir_name(layout.generation_dir_name(number)) is None
    assert layout.trial_dir_name(7) == "trial_0007"


def test_names_keep_their_on_disk_spelling():
    """Existing run dirs must stay readable: the padding and spelling are what earlier versions wrote."""
    assert layout.generation_dir_name(8) == "gen_0008"
    assert layout.state_file_name(7) == "gen_0007.pt"
    assert layout.member_dir_name(17) == "member_017"
    assert layout.archived_result_name(2) == "result.attempt2.json"
    assert layout.chunk_marker_name(3) == "chunk_003.json"
    assert layout.generation_dir_name(12345) == "gen_12345"


@pytest.mark.parametrize("name", ["gen_008", "gen_0008x", "gen_-001", "member_17", "member_017.json",
                                  "gen_0008.pt.sha256", "gen_008.pt", "submitit", "chunk_x.json", "chunk_1.jsonl", ""])
def test_parsers_reject_other_names(name):
    parsed = (layout.parse_generation_dir_name(name), layout.parse_member_dir_name(name),
              layout.parse_state_file_name(name), layout.parse_chunk_marker_name(name))
    assert parsed == (None, None, None, None)


def test_each_parser_reads_only_its_own_kind():
    assert layout.parse_generation_dir_name(layout.state_file_name(8)) is None
    assert layout.parse_state_file_name(layout.generation_dir_name(8)) is None
    assert layout.parse_member_dir_name(layout.generation_dir_name(8)) is None


@pytest.mark.parametrize("bad", [-1, 1.5, "3", None])
def test_a_number_that_would_not_parse_back_is_refused(bad):
    for build in (layout.generation_dir_name, layout.member_dir_name, layout.state_file_name,
                  layout.archived_result_name, layout.chunk_marker_name):
        with pytest.raises(ValueError, match="non-negative integer"):
            build(bad)


def test_numpy_integers_are_numbers():
    np = pytest.importorskip("numpy")
    assert layout.member_dir_name(np.int64(5)) == layout.member_dir_name(5)


def test_the_store_builds_its_paths_from_the_layout(tmp_path):
    store = RunStore(tmp_path)
    assert layout.parse_generation_dir_name(store.generation_dir(12345).name) == 12345
    assert layout.parse_member_dir_name(store.member_dir(3, 1000).name) == 1000
    assert store.member_dir(3, 17).parent == store.generation_dir(3)
    store.state_dir.mkdir()
    for generation in (7, 12345):
        name = layout.state_file_name(generation)
        (store.state_dir / name).write_bytes(b"")
        (store.state_dir / f"{name}.sha256").write_text("")  # checksum sidecars are not states
    (store.state_dir / "gen_7.pt").write_bytes(b"")  # too short: not a name the store writes
    assert store.state_generations() == [7, 12345]


def test_the_layout_module_is_light():
    """Member processes import it: it must not pull in torch or pandas."""
    code = ("import sys, results.store.layout; heavy = {'torch', 'pandas', 'numpy'} & set(sys.modules); "
            "assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_old_import_paths_still_work():
    from inner_loop.tasks import prompt_hash
    from launch.member import LOCK_FILE, STARTED_FILE
    from launch.slurm.launcher import CANCELLED_FILE
    from launch.slurm.chunks import MARKER_DIR
    from results.store import provenance
    from results.store.layout import RESULT_FILE, SPEC_FILE

    assert (LOCK_FILE, STARTED_FILE, CANCELLED_FILE, MARKER_DIR, RESULT_FILE, SPEC_FILE, provenance.RUN_MANIFEST_FILE) \
        == (layout.MEMBER_LOCK_FILE, layout.STARTED_FILE, layout.CANCELLED_FILE, layout.SUBMISSIONS_DIR,
            layout.RESULT_FILE, layout.SPEC_FILE, layout.RUN_MANIFEST_FILE)
    assert prompt_hash is provenance.prompt_hash
    # the value earlier manifests' data hashes were computed with (sha256 of the whitespace-normalised prompt)
    assert prompt_hash("  What is\n 2+2? ") == "52cb6b5e4a038af1756708f98afb718a08c75b87b2f03dbee4dd9c8139c15c5e"


# ------------------------------------------------------------- enforcement
def layout_names() -> set[str]:
    """Every file and directory name results/store/layout.py defines (its public string constants)."""
    return {value for key, value in vars(layout).items()
            if key.isupper() and not key.startswith("_") and isinstance(value, str)} - ORDINARY_WORDS


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _sources(root: Path) -> list[Path]:
    return sorted(path for package in SCANNED for path in (root / package).rglob("*.py"))


def layout_literals(root: Path, names: set[str]) -> list[str]:
    """``file:line: literal`` for each string literal outside results/store/layout.py that spells a layout name: equal
    to one, ending in ``/<name>``, or starting like a numbered name (f-string parts and regexes
    included). Docstrings and prose that merely mention a name are fine."""
    hits = []
    for path in _sources(root):
        if path == root / "results" / "store" / "layout.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
                continue
            text = node.value
            if text in names or any(text.endswith("/" + name) for name in names) or _PREFIXED.match(text):
                hits.append((str(path.relative_to(root)), node.lineno, text))
    return [f"{file}:{line}: {text!r}" for file, line, text in sorted(hits)]


def forbidden_imports(root: Path) -> list[str]:
    """``file:line: module`` for each import of inner_loop, launch or meta anywhere in results/ (functions included,
    and importlib.import_module / __import__ with a literal name)."""
    banned = ("inner_loop", "launch", "meta")
    hits = []
    for path in sorted((root / "results").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""] if node.level == 0 else []
            elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                  and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
                modules = [str(node.args[0].value)]
            else:
                continue
            hits += [(str(path.relative_to(root)), node.lineno, m) for m in modules if m.split(".")[0] in banned]
    return [f"{file}:{line}: {module}" for file, line, module in sorted(hits)]


def test_the_scan_sees_what_it_forbids(tmp_path):
    """The enforcement below can fail: it finds a name, a path ending, an f-string prefix and a regex."""
    assert {"result.json", "started.json", "jobs.json", "population.pt", "manifest.json", ".member.lock",
            "cancelled_by_orchestrator.json", "spec.json", "config.yaml", "LOCK", "submitit",
            "checkpoints"} <= layout_names()
    source = ('"""A docstring may say result.json and gen_0007."""\n'
              'A = "result.json"\nB = f"gen_{g:04d}"\nC = r"^member_(\\d{3,})$"\nD = "x/jobs.json"\n'
              'E = "no result.json yet"\nF = "member_time_min"\nG = "result.attempt{}.json"\n'
              'H = r"^chunk_(\\d+)\\.json$"\n')
    for package in SCANNED:
        (tmp_path / package).mkdir()
    (tmp_path / "launch" / "spelled.py").write_text(source)
    hits = layout_literals(tmp_path, layout_names())
    assert [h.split(":")[1] for h in hits] == ["2", "3", "4", "5", "8", "9"], hits


def test_no_module_but_the_layout_spells_a_layout_name():
    hits = layout_literals(ROOT, layout_names())
    assert not hits, ("layout names spelled outside results/store/layout.py (import them from there):\n"
                      + "\n".join(hits))


def test_results_imports_nothing_of_inner_loop_launch_or_meta():
    hits = forbidden_imports(ROOT)
    assert not hits, "results/ must stand alone (docs/architecture.md):\n" + "\n".join(hits)


def test_the_import_scan_sees_imports_inside_functions(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x.py").write_text(
        "import json\n\ndef f():\n    from inner_loop.tasks.base import prompt_hash\n    import launch.member\n"
        "    return importlib.import_module('meta.run')\n")
    assert [h.split(": ")[1] for h in forbidden_imports(tmp_path)] == [
        "inner_loop.tasks.base", "launch.member", "meta.run"]
