"""Init files: round trip, atomic write, and a clear ValueError for every kind of bad file."""

from __future__ import annotations

import json

import pytest
import torch

from mirror_maps import LAYOUT_VERSION, NeuralMirrorMap, VECTOR_LENGTH, load_init, save_init
from mirror_maps.init_file import FILE_FORMAT


def _content(**overrides):
    content = {
        "format": FILE_FORMAT,
        "layout_version": LAYOUT_VERSION,
        "vector": torch.zeros(VECTOR_LENGTH, dtype=torch.float64),
        "metadata_json": json.dumps({"layout_version": LAYOUT_VERSION, "param_transform": "abs"}),
    }
    content.update(overrides)
    return content


def test_round_trip_keeps_vector_transform_and_metadata(tmp_path):
    mirror_map = NeuralMirrorMap.random_init(7, param_transform="softplus", dtype=torch.float64)
    path = save_init(tmp_path / "sub" / "best.pt", mirror_map, {"run_id": "r1", "generation": 3, "fitness": 0.61})
    loaded, metadata = load_init(path)
    assert torch.equal(loaded.to_vector(), mirror_map.to_vector())
    assert loaded.param_transform == "softplus"
    assert metadata == {"run_id": "r1", "generation": 3, "fitness": 0.61, "layout_version": 1, "param_transform": "softplus"}
    p, q = torch.rand(5, dtype=torch.float64), torch.rand(5, dtype=torch.float64)
    assert torch.equal(loaded.bregman(p, q), mirror_map.bregman(p, q))
    assert sorted(x.name for x in path.parent.iterdir()) == ["best.pt"]  # no temp file left behind


def test_float32_map_round_trips_exactly(tmp_path):
    mirror_map = NeuralMirrorMap.random_init(8)
    loaded, _ = load_init(save_init(tmp_path / "m.pt", mirror_map, {}))
    assert torch.equal(loaded.to_vector().float(), mirror_map.to_vector())


def test_save_rejects_reserved_or_unserialisable_metadata(tmp_path):
    mirror_map = NeuralMirrorMap.random_init(0)
    with pytest.raises(ValueError, match="layout_version"):
        save_init(tmp_path / "a.pt", mirror_map, {"layout_version": 2})
    with pytest.raises(ValueError, match="JSON"):
        save_init(tmp_path / "b.pt", mirror_map, {"when": object()})
    assert not any(tmp_path.iterdir())


def _bad_files(tmp_path):
    valid = tmp_path / "valid.pt"
    save_init(valid, NeuralMirrorMap.random_init(0), {"note": "x"})
    data = valid.read_bytes()
    nan_vector = torch.zeros(VECTOR_LENGTH, dtype=torch.float64)
    nan_vector[5] = float("nan")
    inf_vector = torch.zeros(VECTOR_LENGTH, dtype=torch.float64)
    inf_vector[0] = float("inf")
    torch_files = {
        "wrong_length": (_content(vector=torch.zeros(379)), "379"),
        "nan": (_content(vector=nan_vector), "NaN"),
        "inf": (_content(vector=inf_vector), "NaN/inf"),
        "unknown_layout_version": (_content(layout_version=99), "layout_version 99"),
        "not_an_init_file_dict": ({"state_dict": torch.zeros(3)}, "not a mirror-map init file"),
        "bare_tensor": (torch.zeros(VECTOR_LENGTH), "not a mirror-map init file"),
        "bad_metadata": (_content(metadata_json="{nope"), "metadata"),
        "bad_transform": (_content(metadata_json=json.dumps({"param_transform": "relu"})), "param_transform"),
    }
    cases = {}
    for name, (content, message) in torch_files.items():
        path = tmp_path / f"{name}.pt"
        torch.save(content, path)
        cases[name] = (path, message)
    raw_files = {
        "truncated": (data[: len(data) // 2], "not a readable"),
        "garbage": (b"\x00garbage" * 50, "not a readable"),
        "empty": (b"", "not a readable"),
        "json_text": (b'{"vector": [1, 2, 3]}', "not a readable"),
    }
    for name, (payload, message) in raw_files.items():
        path = tmp_path / f"{name}.pt"
        path.write_bytes(payload)
        cases[name] = (path, message)
    return cases


def test_every_bad_file_raises_value_error_naming_file_and_problem(tmp_path):
    for name, (path, message) in _bad_files(tmp_path).items():
        with pytest.raises(ValueError) as caught:
            load_init(path)
        assert str(path) in str(caught.value), name
        assert message in str(caught.value), (name, str(caught.value))


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.pt"):
        load_init(tmp_path / "nothing.pt")
