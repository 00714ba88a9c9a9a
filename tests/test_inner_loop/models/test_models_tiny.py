"""The tiny model and its tokenizer are built in code, deterministically, and cached safely under races."""
from __future__ import annotations

import multiprocessing
import string
from pathlib import Path

import pytest
import torch

from inner_loop.config import ModelConfig
from inner_loop.models.cache import build_once
from inner_loop.models.loading import load_policy
from inner_loop.models.tiny import build_tiny_tokenizer, tiny_model_dir


def test_tokenizer_round_trips_printable_ascii_one_token_per_char():
    tok = build_tiny_tokenizer()
    text = "".join(c for c in string.printable if c not in "\r\x0b\x0c")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.unk_token_id not in ids
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == text
    assert len({tok.pad_token_id, tok.eos_token_id, tok.bos_token_id}) == 3


def test_tiny_model_is_deterministic_from_its_seed_and_reloads(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRROR_ES_CACHE", str(tmp_path))
    cfg = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    path = tiny_model_dir(cfg)
    assert path.parent.parent == tmp_path and (path / ".complete").is_file()
    model, tok = load_policy(cfg, str(path))
    rebuilt, _ = load_policy(cfg, str(tiny_model_dir(cfg, root=tmp_path / "other")))
    for a, b in zip(model.state_dict().values(), rebuilt.state_dict().values()):
        torch.testing.assert_close(a, b)
    other = tiny_model_dir(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=1))
    assert other != path
    ids = tok("12+3=", return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert out.shape[1] <= 5 + 3 and torch.equal(out[0, :5], ids["input_ids"][0])


def _racing_builder(final: str, marker_dir: str, who: int) -> None:
    def build(tmp: Path) -> None:
        (tmp / "who").write_text(str(who))
        (Path(marker_dir) / f"built-{who}").write_text("x")

    build_once(Path(final), build)


def test_concurrent_builders_leave_one_complete_directory(tmp_path):
    final = tmp_path / "models" / "thing"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_racing_builder, args=(str(final), str(tmp_path), i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert (final / ".complete").is_file() and (final / "who").read_text() in {"0", "1", "2", "3"}
    leftovers = [p.name for p in final.parent.iterdir() if p.name not in ("thing", ".thing.lock")]
    assert leftovers == []
    # With the lock, exactly one process built; the others found the finished directory.
    assert len(list(tmp_path.glob("built-*"))) == 1


def test_incomplete_directory_from_a_crashed_builder_is_replaced(tmp_path):
    final = tmp_path / "m"
    final.mkdir()
    (final / "half").write_text("partial")
    build_once(final, lambda tmp: (tmp / "weights").write_text("ok"))
    assert (final / "weights").read_text() == "ok" and not (final / "half").exists()


def test_missing_local_model_path_is_a_clear_error():
    from inner_loop.models.loading import resolve_model_dir

    with pytest.raises(ValueError, match="name_or_path"):
        resolve_model_dir(ModelConfig(name="hub", name_or_path="/nonexistent/model"))
