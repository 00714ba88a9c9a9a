"""What a run writes follows the user's umask: under 0022 a colleague in the group can read a search's results, under
0077 nobody else can. (The atomic temp-file + rename writers used to leave mkstemp's owner-only 0600.)"""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Iterator

import pytest

from mirror_maps.init_file import load_init, save_init
from mirror_maps.neural import NeuralMirrorMap
from results.store.atomic import atomic_create_bytes, atomic_write_json


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]
            if not p.is_symlink()}


def _expected(path: Path, mask: int) -> int:
    return (0o777 if path.is_dir() else 0o666) & ~mask


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_the_atomic_writers_and_init_files_follow_the_umask(tmp_path, mask):
    with umask(mask):
        written = [atomic_write_json(tmp_path / "a.json", {"x": 1}),
                   save_init(tmp_path / "i.safetensors", NeuralMirrorMap.random_init(0))]
        assert atomic_create_bytes(tmp_path / "c.bin", b"x")
        written.append(tmp_path / "c.bin")
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask, path
    assert load_init(tmp_path / "i.safetensors")[1]["layout_version"]


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_a_finished_search_its_report_and_its_export_follow_the_umask(tmp_path, mask, monkeypatch):
    from meta.search.after.export import main as export_main
    from meta.search.run import main as run_main
    from results.report.search.report import main as report_main

    run_dir = tmp_path / "search"
    monkeypatch.chdir(tmp_path)
    with umask(mask):
        assert run_main([f"run_dir={run_dir}", "new=true", "launcher=debug", "inner.entrypoint=meta.synthetic:member",
                         "population=2", "generations=1", "reevaluate.top_k=1", "reevaluate.seeds=2",
                         "reevaluate.report_seeds=2"]) == 0
        assert report_main([str(run_dir)]) == 0
        assert export_main([f"run_dir={run_dir}", f"out={tmp_path / 'best.safetensors'}"]) == 0
    modes = _modes(tmp_path)
    wrong = {name: oct(mode) for name, mode in modes.items()
             if name != "." and mode != _expected(tmp_path / name, mask)
             and not (tmp_path / name).name == "LOCK"}
    assert not wrong, f"under umask {mask:04o}: {wrong}"
    assert any(name.endswith(".parquet") for name in modes) and any(name.endswith(".png") for name in modes)
    assert "best.safetensors" in modes and "search/manifest.json" in modes and "search/config.yaml" in modes


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_a_staged_model_cache_entry_follows_the_umask(tmp_path, mask):
    """The cache every member of a run reads (mkdtemp made it owner-only)."""
    from inner_loop.models.cache import build_once

    with umask(mask):
        final = build_once(tmp_path / "entry", lambda d: (d / "weights.bin").write_bytes(b"w"))
    assert stat.S_IMODE(final.stat().st_mode) == 0o777 & ~mask
    assert stat.S_IMODE((final / "weights.bin").stat().st_mode) == 0o666 & ~mask
