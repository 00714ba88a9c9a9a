"""What a run's staged files are: the pin of each (``StagePin``, what manifest.json keeps under ``staged``) and the
pins' vocabulary, shared by whoever writes them (a member program's ``stage``: inner_loop/member/staging.py) and
whoever reads them (meta/search/staging.py, meta/stage.py); one owner, importing nothing of the project, so that the
outer loop reads the pins without importing the inner loop."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: the manifest's key for the pins of a staged run
MANIFEST_KEY = "staged"
#: an item's ``status``: its snapshot is in the stage cache (pinned: commit, content hash, bytes)
STAGED = "staged"
#: ... not in the stage cache, or no longer holding the pinned bytes (``detail`` says which)
MISSING = "missing"
#: ... an extra evaluation's task that reads nothing from the hub (a transfer task whose data ships with a package
#: or is a local file): nothing to stage, listed so that a dry run names every transfer task
LOCAL = "local"


@dataclass
class StagePin:
    """One hub repository a run needs: where the config names it, and (once found) its pinned local snapshot."""

    kind: str  # "model" or "dataset" ("task" for an evaluation's task that reads nothing from the hub)
    repo_id: str
    #: the dotted inner-config key that names it (list items by index); a staged run's config holds ``path`` there
    key: str
    #: what reads it when that is not the run's own model or task (an extra evaluation: "transfer/gsm8k")
    used_by: str = ""
    status: str = MISSING
    revision: str | None = None  # the commit the snapshot is at
    path: str | None = None
    sha256: str | None = None  # of the snapshot's files (relative names and contents)
    bytes: int | None = None
    detail: str = ""

    def line(self) -> str:
        """One line for the user: what it is, and where it is or why it is missing."""
        name = f"{self.kind} {self.repo_id} ({self.used_by or self.key})"
        if self.status == STAGED:
            return f"staged:  {name} @ {self.revision} -> {self.path}"
        return f"{self.status + ':':<8} {name}: {self.detail}"

    def as_dict(self, offline: bool = False) -> dict[str, Any]:
        """The pin a manifest keeps, plus its ``line`` and whether this host is ``offline`` (cannot fetch it): what
        a member program's ``stage`` returns for each item."""
        return {**asdict(self), "line": self.line(), "offline": offline}
