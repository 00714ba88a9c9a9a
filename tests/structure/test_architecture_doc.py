"""docs/architecture.md names only what exists: every file and folder of its tree, every short name listed beside
a folder (``status/  view.py, rows.py`` is meta/status/view.py and meta/status/rows.py), every relative path in the
text and every dotted name of our packages.

Why a test: the page is the map a reader moves through the code with, and a module that moves or splits leaves its
old name behind there without anything else failing (six such names had piled up before this test).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGES = ("core", "meta", "inner_loop", "launch", "results", "mirror_maps")
#: the column a tree entry's description starts at; a line indented that far continues the entry above it
DESCRIPTION_COLUMN = 22
#: a file of the repository as the page writes it: a path or a bare name with a source or text suffix (run-dir files
#: such as result.json are what a run writes, not the repository's), or a folder: a path ending in ``/``
FILE = re.compile(r"(?<![\w./<>-])((?:[\w-]+/)*[\w-]+\.(?:py|md|sh|yaml|toml)|(?:[\w-]+/)+)(?![\w<>/-])")
#: a dotted name of one of our packages (``core.records``, ``launch.member.load_program``)
DOTTED = re.compile(r"(?<![\w./-])((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)")


def tree_entries(text: str) -> list[tuple[Path, list[str], str]]:
    """(the folder an entry stands in, the names in its first column, its description) per entry of the page's
    tree (its one plain ``` block); indentation gives the folder (two spaces a level), a name ending in ``/`` opens
    one."""
    blocks = re.findall(r"^```\n(.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) == 1, "docs/architecture.md holds one plain ``` block: the repository's tree"
    entries: list[tuple[Path, list[str], str]] = []
    folders: list[Path] = []
    for line in blocks[0].splitlines():
        indent = len(line) - len(line.lstrip())
        if not line.strip():
            continue
        if indent >= DESCRIPTION_COLUMN:
            folder, names, description = entries[-1]
            entries[-1] = (folder, names, f"{description} {line.strip()}")
            continue
        head, *rest = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        del folders[indent // 2:]
        parent = folders[-1] if folders else Path()
        names = [name.strip() for name in head.split(",") if name.strip()]
        entries.append((parent, names, rest[0] if rest else ""))
        if len(names) == 1 and names[0].endswith("/"):
            folders.append(parent / names[0].rstrip("/"))
    return entries


def _resolves(name: str, folder: Path, root: Path) -> bool:
    """A bare file name lies in ``folder``; a path or a folder lies under ``folder`` or one of the folders above it
    (``search/run.py`` beside meta/'s doors, ``core/`` in a description of results/store/)."""
    if not name.endswith("/") and "/" not in name:
        return (root / folder / name).exists()
    return any((root / base / name).exists() for base in (folder, *folder.parents))


def missing_tree_paths(text: str, root: Path = ROOT) -> list[str]:
    """The tree's names, and the files its descriptions name, that are not in the repository."""
    missing = []
    for folder, names, description in tree_entries(text):
        here = folder / names[0].rstrip("/") if len(names) == 1 and names[0].endswith("/") else folder
        missing += [f"{folder / name}" for name in names if not (root / folder / name).exists()]
        missing += [f"{here}: {name}" for name in FILE.findall(description) if not _resolves(name, here, root)]
    return missing


def missing_text_paths(text: str, root: Path = ROOT) -> list[str]:
    """The paths the page's text names outside the tree (``member/notice.py`` is a path under a package) that are
    not in the repository."""
    prose = re.sub(r"^```\n.*?^```", "", text, flags=re.S | re.M)
    return [name for name in FILE.findall(prose)
            if "/" in name.rstrip("/") and not any((root / base / name).exists() for base in ("", *PACKAGES))]


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def missing_dotted_names(text: str, root: Path = ROOT) -> list[str]:
    """Dotted names of our packages (``core.keys``, ``launch.member.load_program``) whose module is not there, or
    whose module does not define the name after it."""
    missing = []
    for dotted in sorted(set(DOTTED.findall(text))):
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            base = root.joinpath(*parts[:n])
            module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
            if module.is_file():
                break
        else:
            missing.append(dotted)
            continue
        if n < len(parts) and parts[n] not in _top_level_names(module):
            missing.append(dotted)
    return missing


def test_every_path_the_architecture_page_names_exists():
    text = PAGE.read_text()
    assert missing_tree_paths(text) + missing_text_paths(text) + missing_dotted_names(text) == []


def test_the_page_is_read_as_a_tree_with_its_folders():
    """The check reads the page as it is laid out: nested folders, short names beside them, files in a folder."""
    entries = tree_entries(PAGE.read_text())
    by_folder = {(str(folder), tuple(names)) for folder, names, _ in entries}
    assert ("meta", ("status/",)) in by_folder and ("meta/search", ("generation/",)) in by_folder
    assert ("core", ("records.py",)) in by_folder and ("results/report", ("search/",)) in by_folder


@pytest.mark.parametrize("page, expected", [
    # a file gone from the tree, a short name beside a folder that is not in it, a relative path in a description
    # resolved from the folders above, a path in the text, a dotted module and a name its module lacks
    ("```\ncore/                 the ground floor\n  gone.py             no longer here\n```\n", ["core/gone.py"]),
    ("```\nmeta/                 the outer loop\n  status/             view.py, lost.py (rows)\n```\n",
     ["meta/status: lost.py"]),
    ("```\nmeta/                 x\n  run.py              door of (search/run.py) and (search/none.py)\n```\n",
     ["meta: search/none.py"]),
    ("```\n```\nsee `member/notice.py` and `process/notice.py`\n", ["member/notice.py"]),
    ("```\n```\n`core.keys`, `core.no_such_module` and `core.member_program.named_by`, `core.records.Nope`\n",
     ["core.no_such_module", "core.records.Nope"]),
])
def test_the_check_finds_what_is_missing(page, expected):
    assert missing_tree_paths(page) + missing_text_paths(page) + missing_dotted_names(page) == expected
