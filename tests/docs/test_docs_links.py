"""The project's docs stand alone: every docs/<page>.md a file names exists, and nothing points a user at notes
outside the repository."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC_LINK = re.compile(r"docs/([A-Za-z0-9_\-]+\.md)")
OUTSIDE = re.compile(r"\b(SPEC|DESIGN)\.md\b|\.\./shared/")


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / n for n in names if n.endswith((".py", ".md", ".yaml", ".sh", ".toml")) and (ROOT / n).is_file()]


def test_every_docs_page_a_file_names_exists():
    missing = [f"{path.relative_to(ROOT)}: docs/{page}" for path in _tracked_text_files()
               for page in DOC_LINK.findall(path.read_text(errors="replace")) if not (ROOT / "docs" / page).is_file()]
    assert not missing, "\n".join(missing)


def test_nothing_points_outside_the_repository():
    this = Path(__file__).resolve()
    hits = [f"{path.relative_to(ROOT)}:{n}" for path in _tracked_text_files() if path.resolve() != this
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not hits, "\n".join(hits)


#: a path into one of the repository's folders, as the docs write them (not after `=`: `export=conf/experiment/x.yaml`
#: names a file the command is about to write)
REPO_PATH = re.compile(r"(?<![\w/=.<-])(?:bench|conf|docs|inner_loop|launch|meta|mirror_maps|results|scripts|tests)/"
                       r"[\w./-]*\w")


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "conf").rglob("*.yaml"))]


def test_every_repository_path_the_docs_name_exists():
    missing = [f"{path.relative_to(ROOT)}:{n}: {match.group(0)}" for path in _doc_files()
               for n, line in enumerate(path.read_text().splitlines(), 1) for match in REPO_PATH.finditer(line)
               if not (ROOT / match.group(0)).exists()]
    assert not missing, "\n".join(missing)


def _tree_names(page: Path) -> set[str]:
    """Every file and folder name in the page's ```text trees (the first column of each entry line)."""
    names: set[str] = set()
    in_tree = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_tree = not in_tree and line.strip() == "```text"
            continue
        if in_tree and len(line) - len(line.lstrip()) < 30:  # deeper: a description's continuation line
            entry = re.sub(r"\(\+ [^)]*\)", "", re.split(r"\s{2,}", line.strip())[0])
            names.update(part for part in re.split(r"[,/\s]+", entry) if part)
    return names


def test_the_run_directory_page_names_every_file_and_folder_of_the_layout():
    """results/store/layout.py alone names the files of a run; docs/run_directory.md shows each of them."""
    from results.store import layout

    names = _tree_names(ROOT / "docs" / "run_directory.md")
    constants = {key: value for key, value in vars(layout).items()
                 if key.isupper() and not key.startswith("_") and isinstance(value, str)}
    assert len(constants) > 30
    missing = [f"{key} = {value!r}" for key, value in constants.items()
               if not (any(n.startswith(value) for n in names) if value.endswith("_") else value in names)]
    assert not missing, "docs/run_directory.md does not show: " + ", ".join(missing)
