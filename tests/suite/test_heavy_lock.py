"""tests/heavy_lock.py: the heavy test files (every core each) never run beside each other: within a session one
pytest-xdist worker runs them in turn while another takes the light files, and across sessions they take turns on
one lock. Stand-in files carry the heavy files' names and record when they ran."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from time_limits import run_with_progress, scaled

TESTS = Path(__file__).resolve().parents[1]
HEAVY = ("test_vllm_member.py", "test_meta_e2e.py")
#: a test that records when and on which worker it ran, after ``wait`` (code run inside it)
RECORDING = '''import json, os, pathlib, time

def test_it():
    here = pathlib.Path(os.environ["SPANS"]).parent
    began = time.time()
{wait}
    with open(os.environ["SPANS"], "a") as out:
        out.write(json.dumps([__name__, os.environ.get("PYTEST_XDIST_WORKER"), began, time.time()]) + "\\n")
'''
SLEEP = "    time.sleep(1.5)"
#: wait, inside the test, until the test file ``other`` has started too (it writes <name>.started)
MEET = '''    (here / (__name__ + ".started")).touch()
    end = time.monotonic() + {limit}
    while not (here / "{other}.started").exists():
        assert time.monotonic() < end, "the other test never ran beside this one"
        time.sleep(0.05)'''


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "SPANS": str(tmp_path / "spans.jsonl"), "PYTHONPATH": str(TESTS),
           "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env.pop("MIRROR_ES_HEAVY_LOCK", None)  # an inner session names its own, in its TMPDIR
    return env


def _pytest(folder: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "heavy_lock", "-p", "no:cacheprovider", *args, str(folder)]


def _spans(tmp_path: Path) -> dict[str, tuple[str, float, float]]:
    lines = (tmp_path / "spans.jsonl").read_text().splitlines()
    return {name: (worker, a, b) for name, worker, a, b in map(json.loads, lines)}


def _overlap(a: tuple[str, float, float], b: tuple[str, float, float]) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def test_two_workers_run_the_heavy_files_in_turn_on_one_and_a_light_file_beside_them(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    for name in HEAVY:
        (files / name).write_text(RECORDING.format(wait=SLEEP))
    # the light file runs only if it meets a heavy one: it is not held back behind them
    (files / "test_light.py").write_text(RECORDING.format(wait=MEET.format(limit=scaled(60), other="test_meta_e2e")))
    (files / HEAVY[1]).write_text(RECORDING.format(wait=MEET.format(limit=scaled(60), other="test_light")))
    done = run_with_progress(_pytest(files, "-n", "2", "--dist", "loadfile"), cwd=tmp_path, env=_env(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    spans = _spans(tmp_path)
    first, second = (spans[Path(name).stem] for name in HEAVY)
    assert first[0] == second[0] and not _overlap(first, second), spans  # one worker, in turn
    assert spans["test_light"][0] != first[0]
    assert not list((tmp_path / "tmp").glob("mirror-es-heavy-*.lock"))  # the session removed the lock it named


def test_two_sessions_take_turns_on_the_heavy_lock(tmp_path):
    """scripts/test.sh's two sessions (the main one and the SLURM one) name one lock."""
    env = {**_env(tmp_path), "MIRROR_ES_HEAVY_LOCK": str(tmp_path / "heavy.lock")}
    for index, name in enumerate(HEAVY):
        (tmp_path / f"s{index}").mkdir()
        (tmp_path / f"s{index}" / name).write_text(RECORDING.format(wait=SLEEP))
    sessions = [subprocess.Popen(_pytest(tmp_path / f"s{index}"), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for index in range(2)]
    for session in sessions:
        out, _ = session.communicate(timeout=scaled(120))
        assert session.returncode == 0, out[-2000:]
    spans = _spans(tmp_path)
    assert not _overlap(*(spans[Path(name).stem] for name in HEAVY)), spans
