"""Init files: safetensors round trip under any file name, the earlier torch format still read, atomic write,
and a clear ValueError for every kind of bad file in either format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from safetensors import safe_open

from mirror_maps import LAYOUT_VERSION, NeuralMirrorMap, VECTOR_LENGTH, load_init, save_init
from mirror_maps.init_file import FILE_FORMAT

NAMES = ("best.pt", "best.safetensors", "best")
SUFFIXES = (".pt", ".safetensors", "")
PROVENANCE = {"run_id": "r1", "generation": 3, "fitness": 0.61}


def _legacy_content(**overrides) -> dict:
    """The torch-format dict save_init wrote before the switch to safetensors."""
    content = {
        "format": FILE_FORMAT,
        "layout_version": LAYOUT_VERSION,
        "vector": torch.zeros(VECTOR_LENGTH, dtype=torch.float64),
        "metadata_json": json.dumps({"layout_version": LAYOUT_VERSION, "param_transform": "abs"}),
    }
    content.update(overrides)
    return content


def _safetensors_bytes(tensors: dict | None = None, **header_overrides) -> bytes:
    """A hand-made safetensors init file; a header value of None drops that key."""
    header = {"format": FILE_FORMAT, "layout_version": str(LAYOUT_VERSION), "param_transform": "abs",
              "provenance": "{}"}
    header.update(header_overrides)
    tensors = {"vector": torch.zeros(VECTOR_LENGTH, dtype=torch.float64)} if tensors is None else tensors
    return safetensors.torch.save(tensors, {k: v for k, v in header.items() if v is not None})


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_keeps_vector_transform_and_metadata(tmp_path, name):
    mirror_map = NeuralMirrorMap.random_init(7, param_transform="softplus", dtype=torch.float64)
    path = save_init(tmp_path / "sub" / name, mirror_map, PROVENANCE)
    loaded, metadata = load_init(path)
    assert loaded.to_vector().dtype == torch.float64
    assert torch.equal(loaded.to_vector(), mirror_map.to_vector())
    assert loaded.param_transform == "softplus"
    assert metadata == {**PROVENANCE, "layout_version": 1, "param_transform": "softplus"}
    p, q = torch.rand(5, dtype=torch.float64), torch.rand(5, dtype=torch.float64)
    assert torch.equal(loaded.bregman(p, q), mirror_map.bregman(p, q))
    assert sorted(x.name for x in path.parent.iterdir()) == [name]  # no temp file left behind


def test_float32_map_round_trips_exactly(tmp_path):
    mirror_map = NeuralMirrorMap.random_init(8)
    loaded, _ = load_init(save_init(tmp_path / "m.safetensors", mirror_map, {}))
    assert torch.equal(loaded.to_vector().float(), mirror_map.to_vector())


def test_written_file_is_a_plain_safetensors_file(tmp_path):
    mirror_map = NeuralMirrorMap.random_init(5, param_transform="softplus", dtype=torch.float64)
    path = save_init(tmp_path / "best.pt", mirror_map, PROVENANCE)  # the content, not the name, is safetensors
    with safe_open(str(path), framework="pt") as handle:
        assert list(handle.keys()) == ["vector"]
        vector = handle.get_tensor("vector")
        header = handle.metadata()
    assert vector.dtype == torch.float64 and vector.shape == (VECTOR_LENGTH,)
    assert torch.equal(vector, mirror_map.to_vector())
    assert set(header) == {"format", "layout_version", "param_transform", "provenance"}
    assert header["format"] == FILE_FORMAT and header["layout_version"] == str(LAYOUT_VERSION)
    assert header["param_transform"] == "softplus"
    assert json.loads(header["provenance"]) == PROVENANCE


@pytest.mark.parametrize("name", NAMES)
def test_legacy_torch_file_is_read_under_any_name(tmp_path, name):
    vector = NeuralMirrorMap.random_init(4, param_transform="softplus", dtype=torch.float64).to_vector()
    metadata_json = json.dumps({"layout_version": 1, "param_transform": "softplus", "run_id": "old"})
    path = tmp_path / name
    torch.save(_legacy_content(vector=vector, metadata_json=metadata_json), path)
    loaded, metadata = load_init(path)
    assert torch.equal(loaded.to_vector(), vector) and loaded.param_transform == "softplus"
    assert metadata == {"layout_version": 1, "param_transform": "softplus", "run_id": "old"}


def test_legacy_pickle_container_is_read(tmp_path):
    path = tmp_path / "old.safetensors"
    torch.save(_legacy_content(), path, _use_new_zipfile_serialization=False)  # torch's pre-1.6 container
    loaded, _ = load_init(path)
    assert torch.equal(loaded.to_vector(), torch.zeros(VECTOR_LENGTH, dtype=torch.float64))


def test_save_rejects_reserved_or_unserialisable_metadata(tmp_path):
    mirror_map = NeuralMirrorMap.random_init(0)
    with pytest.raises(ValueError, match="layout_version"):
        save_init(tmp_path / "a.safetensors", mirror_map, {"layout_version": 2})
    with pytest.raises(ValueError, match="param_transform"):
        save_init(tmp_path / "a.safetensors", mirror_map, {"param_transform": "abs"})
    with pytest.raises(ValueError, match="JSON"):
        save_init(tmp_path / "b.safetensors", mirror_map, {"when": object()})
    with pytest.raises(ValueError, match="JSON"):
        save_init(tmp_path / "c.safetensors", mirror_map, {"fitness": float("nan")})
    assert not any(tmp_path.iterdir())


def _vector_with(index: int, value: float) -> torch.Tensor:
    vector = torch.zeros(VECTOR_LENGTH, dtype=torch.float64)
    vector[index] = value
    return vector


def _bad_files(folder: Path, suffix: str) -> dict[str, tuple[Path, str]]:
    """name -> (file, a phrase its error must contain), for each bad case in both formats."""
    valid = save_init(folder / f"valid{suffix}", NeuralMirrorMap.random_init(0), {"note": "x"}).read_bytes()
    legacy_valid = folder / f"legacy_valid{suffix}"
    torch.save(_legacy_content(), legacy_valid)
    raw = {
        "wrong_length": (_safetensors_bytes({"vector": torch.zeros(379, dtype=torch.float64)}), "379"),
        "matrix": (_safetensors_bytes({"vector": torch.zeros(2, VECTOR_LENGTH)}), "shape [2, 380]"),
        "nan": (_safetensors_bytes({"vector": _vector_with(5, float("nan"))}), "NaN"),
        "inf": (_safetensors_bytes({"vector": _vector_with(0, float("inf"))}), "NaN/inf"),
        "int_dtype": (_safetensors_bytes({"vector": torch.zeros(VECTOR_LENGTH, dtype=torch.int64)}), "non-float"),
        "unknown_layout_version": (_safetensors_bytes(layout_version="99"), "layout_version 99"),
        "no_layout_version": (_safetensors_bytes(layout_version=None), "layout_version None"),
        "bad_metadata": (_safetensors_bytes(provenance="{nope"), "metadata JSON"),
        "metadata_not_object": (_safetensors_bytes(provenance="[1, 2]"), "not a JSON object"),
        "bad_transform": (_safetensors_bytes(param_transform="relu"), "param_transform 'relu'"),
        "other_weights": (safetensors.torch.save({"lm_head.weight": torch.zeros(4, 3)}), "not a mirror-map init file"),
        "other_format_tag": (_safetensors_bytes(format="someone-else"), "not a mirror-map init file"),
        "no_vector_tensor": (_safetensors_bytes({"weights": torch.zeros(VECTOR_LENGTH)}), "no 'vector' tensor"),
        "truncated_data": (valid[:-100], "truncated"),
        "truncated_header": (valid[:40], "truncated: its safetensors header is cut short"),
        "corrupt_header": (valid[:9] + b"\xff" + valid[10:], "corrupt safetensors header"),
        "truncated_legacy": (legacy_valid.read_bytes()[:300], "truncated or corrupt torch file"),
        "garbage": (b"\x00garbage" * 50, "neither a safetensors nor a torch file"),
        "empty": (b"", "the file is empty"),
        "short": (b"\x01", "neither a safetensors nor a torch file"),
        "json_text": (b'{"vector": [1, 2, 3]}', "neither a safetensors nor a torch file"),
    }
    legacy = {
        "legacy_wrong_length": (_legacy_content(vector=torch.zeros(379)), "379"),
        "legacy_nan": (_legacy_content(vector=_vector_with(5, float("nan"))), "NaN"),
        "legacy_inf": (_legacy_content(vector=_vector_with(0, float("inf"))), "NaN/inf"),
        "legacy_unknown_layout_version": (_legacy_content(layout_version=99), "layout_version 99"),
        "legacy_not_an_init_dict": ({"state_dict": torch.zeros(3)}, "not a mirror-map init file"),
        "legacy_bare_tensor": (torch.zeros(VECTOR_LENGTH), "not a mirror-map init file"),
        "legacy_bad_metadata": (_legacy_content(metadata_json="{nope"), "metadata JSON"),
        "legacy_bad_transform": (_legacy_content(metadata_json='{"param_transform": "relu"}'), "param_transform 'relu'"),
    }
    cases = {}
    for name, (payload, message) in raw.items():
        (folder / f"{name}{suffix}").write_bytes(payload)
        cases[name] = (folder / f"{name}{suffix}", message)
    for name, (content, message) in legacy.items():
        torch.save(content, folder / f"{name}{suffix}")
        cases[name] = (folder / f"{name}{suffix}", message)
    return cases


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_every_bad_file_raises_value_error_naming_file_and_problem(tmp_path, suffix):
    for name, (path, message) in _bad_files(tmp_path, suffix).items():
        with pytest.raises(ValueError) as caught:
            load_init(path)
        assert str(path) in str(caught.value), name
        assert message in str(caught.value), (name, str(caught.value))


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.safetensors"):
        load_init(tmp_path / "nothing.safetensors")
