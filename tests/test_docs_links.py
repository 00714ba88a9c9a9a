"""The project's docs stand alone: every docs/<page>.md a file names exists, and nothing points a user at notes
outside the repository."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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
