"""GPU slots of ``launcher=local``: each member in flight holds its own GPU(s), and gives them back when it ends.
With ``resources.members_per_gpu`` = k a slot takes k members at once.

submitit's LocalExecutor hands every job the same first ``gpus_per_node`` of ``visible_gpus``; on a machine with
several GPUs all members would crowd onto the first one. So the launcher cuts the visible GPUs into slots of
``gpus_per_node`` each and submits a member only into a free slot. A slot is held for as long as the member's job
is alive (whatever way it ends: ok, failed, timed out, cancelled, late), not until its result is read: a member
that wrote its result may still be releasing GPU memory. Which job holds which GPUs is written next to the
submitit files of each array (``GPU_SLOTS_FILE``), so a resumed orchestrator knows the slots of the members it
re-attaches to.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from results.store.atomic import atomic_write_json
from results.store.layout import GPU_SLOTS_FILE

logger = logging.getLogger(__name__)

Slot = tuple[int, ...]


def cut_slots(visible: Sequence[int], per_member: int) -> list[Slot]:
    """The visible GPU indices cut into slots of ``per_member`` each, in order (a remainder too small for a
    member is left unused)."""
    if per_member < 1:
        return []
    gpus = tuple(int(g) for g in visible)
    return [gpus[i:i + per_member] for i in range(0, len(gpus) - per_member + 1, per_member)]


class GpuSlotBook:
    """Which live local job holds which slot; persisted per launcher folder (one array's submitit folder)."""

    def __init__(self, slots: Sequence[Slot], per_slot: int = 1) -> None:
        self.slots = [tuple(slot) for slot in slots]
        self.per_slot = int(per_slot)  # members one slot takes at once (resources.members_per_gpu)
        self.held: dict[str, tuple[Path, Slot]] = {}  # job id -> (its folder, its GPUs)
        self._loaded: set[Path] = set()

    def load(self, folder: Path) -> None:
        """Take in what an earlier process recorded for ``folder`` (once per folder and process). Entries of jobs
        that ended are dropped at the next ``free``; an unreadable file is reported and ignored (its jobs' GPUs
        are then counted as free, which at worst puts two members on one GPU: better than refusing to run)."""
        folder = Path(folder)
        if folder in self._loaded:
            return
        self._loaded.add(folder)
        path = folder / GPU_SLOTS_FILE
        try:
            entries = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            logger.warning("ignoring unreadable GPU slot file %s: %s", path, exc)
            return
        for job_id, gpus in _entries(entries, path).items():
            self.held.setdefault(job_id, (folder, gpus))

    def free(self, alive: Callable[[str], bool]) -> list[Slot]:
        """The places left, in slot order: each slot once per member it can still take (``per_slot`` minus the live
        jobs on it), so members given places in order fill a slot before the next (an antithetic pair shares
        its GPU); jobs that ended give theirs back here."""
        for job_id in [job_id for job_id in self.held if not alive(job_id)]:
            del self.held[job_id]
        places = []
        for slot in self.slots:
            on_it = sum(1 for _, gpus in self.held.values() if set(gpus).intersection(slot))
            places += [slot] * max(0, self.per_slot - on_it)
        return places

    def holders(self, slot: Slot) -> list[str]:
        """The live jobs (as last seen by ``free``) on ``slot``."""
        return [job_id for job_id, (_, gpus) in self.held.items() if set(gpus).intersection(slot)]

    def take(self, folder: Path, job_id: str, slot: Slot) -> None:
        """Record that ``job_id`` holds ``slot``; written at once, so a crash right after loses nothing."""
        folder = Path(folder)
        self.held[str(job_id)] = (folder, tuple(slot))
        self._loaded.add(folder)
        mine = {jid: list(gpus) for jid, (where, gpus) in self.held.items() if where == folder}
        atomic_write_json(folder / GPU_SLOTS_FILE, mine)

    def gpus_of(self, job_id: str) -> Slot | None:
        held = self.held.get(str(job_id))
        return held[1] if held is not None else None


def _entries(data: Any, path: Path) -> dict[str, Slot]:
    """job id -> GPUs from a slot file, skipping (and naming) any entry that is not a list of indices."""
    if not isinstance(data, Mapping):
        logger.warning("ignoring GPU slot file %s: not a JSON object", path)
        return {}
    found: dict[str, Slot] = {}
    for job_id, gpus in data.items():
        if isinstance(gpus, list) and all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
            found[str(job_id)] = tuple(gpus)
        else:
            logger.warning("ignoring entry %r of GPU slot file %s: %r is not a list of GPU indices", job_id, path, gpus)
    return found
