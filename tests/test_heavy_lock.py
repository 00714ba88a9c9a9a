"""tests/heavy_lock.py: two heavy tests given to two pytest-xdist workers at once run one after the other (each
takes every core; side by side they ran three times slower), while a light test runs beside a heavy one."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from time_limits import run_with_progress, scaled

TESTS = Path(__file__).resolve().parent
#: a test that records when it ran, holding its worker for a second
RECORDING = '''import json, os, time
import pytest

{mark}
def test_{name}():
    began = time.time()
    time.sleep(1.5)
    with open(os.environ["SPANS"], "a") as out:
        out.write(json.dumps(["{name}", began, time.time()]) + "\\n")
'''


def _spans(tmp_path: Path, marks: dict[str, str]) -> dict[str, tuple[float, float]]:
    for name, mark in marks.items():
        (tmp_path / f"test_{name}.py").write_text(RECORDING.format(name=name, mark=mark))
    env = {**os.environ, "SPANS": str(tmp_path / "spans.jsonl"), "PYTHONPATH": str(TESTS),
           "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    env.pop("MIRROR_ES_HEAVY_LOCK", None)  # this inner session names its own, in its TMPDIR
    done = run_with_progress([sys.executable, "-m", "pytest", "-q", "-p", "heavy_lock", "-p", "no:cacheprovider",
                              "-n", "2", "--dist", "loadfile", str(tmp_path)], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert not list((tmp_path / "tmp").glob("mirror-es-heavy-*.lock"))  # the session removed the lock it named
    return {name: (a, b) for name, a, b in map(json.loads, (tmp_path / "spans.jsonl").read_text().splitlines())}


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_two_heavy_tests_on_two_workers_never_overlap(tmp_path):
    spans = _spans(tmp_path, {"first": "@pytest.mark.heavy", "second": "@pytest.mark.heavy"})
    assert not _overlap(spans["first"], spans["second"]), spans


def test_a_light_test_runs_beside_a_heavy_one(tmp_path):
    """Each waits, inside its run, for the other to have started: only if the light one is not held back do both
    pass."""
    meet = ("    import pathlib\n    here = pathlib.Path(os.environ['SPANS']).parent\n"
            "    (here / '{me}.started').touch()\n"
            "    end = time.monotonic() + {limit}\n"
            "    while not (here / '{other}.started').exists():\n"
            "        assert time.monotonic() < end, 'the other test never started beside this one'\n"
            "        time.sleep(0.05)\n")
    for me, other, mark in (("heavy", "light", "@pytest.mark.heavy"), ("light", "heavy", "")):
        (tmp_path / f"test_{me}.py").write_text(RECORDING.format(name=me, mark=mark).replace(
            "    time.sleep(1.5)\n", meet.format(me=me, other=other, limit=scaled(60))))
    _spans(tmp_path, {})
