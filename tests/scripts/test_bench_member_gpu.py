"""bench/bench_member_gpu.py runs end to end on CPU at toy shapes: the model of Qwen3-1.7B's architecture built in
code and cached, members through the real member path as separate processes, HF generate (also with a static KV
cache, train.decode_cache) and continuous batching measured alone, 1 and 2 members sharing the device, every
figure positive and the table printed.

The shapes are tiny (2 layers, hidden 128, head_dim 64, vocabulary 512) so the run fits ~90 s on 2 cores; what
the figures say is plumbing only. vLLM is not run here (the bench itself probes `import vllm` when asked to).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from inner_loop.generation.backends import CONTINUOUS_BATCHING, HF_GENERATE, PERSISTENT_COMPILED, STATIC_CACHE
from inner_loop.models.from_config import ARCHITECTURES, architecture_config
from time_limits import run_with_progress

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "bench_member_gpu.py"
PROBE = ROOT / "tests" / "import_probe"  # logs every module each process imports (MIRROR_ES_IMPORT_LOG)
HF_STATIC = f"{HF_GENERATE}_{STATIC_CACHE}"  # the bench's name for HF generate with train.decode_cache=static
HF_PERSISTENT = f"{HF_GENERATE}_{PERSISTENT_COMPILED}"  # ... and with the run's one cache and compiled decode step
SHAPES = ["--layers", "2", "--hidden", "128", "--heads", "2", "--kv-heads", "1", "--head-dim", "64",
          "--intermediate", "256", "--vocab", "512", "--steps", "2", "--group-size", "2", "--batch-size", "4",
          "--completion-length", "8", "--tokenizer", "tiny", "--dtype", "float32", "--threads", "1"]


def test_the_named_architecture_is_qwen3_1_7b_and_overrides_are_checked():
    config = architecture_config("qwen3_1_7b")
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"], config["intermediate_size"], config["vocab_size"],
            config["tie_word_embeddings"]) == (2048, 28, 16, 8, 128, 6144, 151936, True)
    assert architecture_config("qwen3_1_7b", {"num_hidden_layers": 2})["num_hidden_layers"] == 2
    assert ARCHITECTURES["qwen3_1_7b"]["num_hidden_layers"] == 28  # the table itself is not changed
    with pytest.raises(ValueError, match="no config key"):
        architecture_config("qwen3_1_7b", {"num_layers": 2})
    with pytest.raises(ValueError, match="not one of"):
        architecture_config("qwen3_17b")


def test_the_random_model_is_built_in_bf16_on_the_device_asked_for():
    """Not in float32 on the CPU and then cast and moved: a 1.7B model's float32 init on the CPU took most of a GPU
    pass's first minute. (The meta device stands in for a card here: nothing is allocated.)"""
    from inner_loop.models.from_config import SAVED_DTYPE, build_random_model
    from inner_loop.models.tiny import build_tiny_tokenizer

    config = architecture_config("qwen3_1_7b", {"num_hidden_layers": 2, "hidden_size": 128, "vocab_size": 512,
                                                "intermediate_size": 256})
    model = build_random_model(config, build_tiny_tokenizer(), seed=0, device="meta")
    assert {(p.dtype, p.device.type) for p in model.parameters()} == {(SAVED_DTYPE, "meta")}


def _positive(row: dict, *keys: str) -> None:
    for key in keys:
        assert isinstance(row[key], (int, float)) and row[key] > 0, (key, row)


def test_bench_runs_on_cpu_and_reports_every_figure(tmp_path):
    out = tmp_path / "summary.json"
    proc = run_with_progress([sys.executable, str(BENCH), "--device", "cpu", *SHAPES, "--members", "1,2",
                           "--backends", f"{HF_GENERATE},{HF_STATIC},{HF_PERSISTENT},{CONTINUOUS_BATCHING}",
                           "--share-backends", HF_GENERATE, "--compile-backend", "aot_eager", "--profile-step",
                           "--json", str(out), "--work-dir", str(tmp_path / "work")],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{PROBE}{os.pathsep}{ROOT}",
                                         "MIRROR_ES_IMPORT_LOG": str(tmp_path / "imports.jsonl")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    # a member process that does not generate with vLLM never imports it (TRL would, where it is installed: ~8 CPU-s
    # of every member's start)
    imports = [json.loads(line) for line in (tmp_path / "imports.jsonl").read_text().splitlines()]
    member_processes = {entry["pid"] for entry in imports if "--member-job" in entry["argv"]}
    assert len(member_processes) == 6  # 4 backends alone (the first also the sharing row of 1), 2 sharing
    assert not [entry for entry in imports if entry["pid"] in member_processes and entry["module"] == "vllm"]

    model_dir = Path(summary["model"]["dir"])  # built once, in the session's model cache
    assert model_dir.is_relative_to(Path(os.environ["MIRROR_ES_CACHE"])) and (model_dir / ".complete").is_file()
    config = json.loads((model_dir / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["head_dim"], config["vocab_size"],
            config["tie_word_embeddings"]) == ("qwen3", 2, 64, 512, True)

    single = {row["backend"]: row for row in summary["single"]}
    assert set(single) == {HF_GENERATE, HF_STATIC, HF_PERSISTENT, CONTINUOUS_BATCHING}
    for backend, row in single.items():
        assert row["status"] == "ok" and row["ran_as"] == backend, row
        _positive(row, "step_s", "tokens_per_s", "peak_memory_bytes", "step_ratio", "tokens_ratio", "memory_ratio")
        assert row["peak_memory_kind"] == "peak RSS" and row["steps_timed"] == 1
    assert single[HF_GENERATE]["step_ratio"] == single[HF_GENERATE]["tokens_ratio"] == 1.0
    # each member profiled one step more (left out of its timing): the step's named ranges, on the CPU host only
    for backend, row in single.items():
        ranges = row["profile"]["ranges"]
        assert row["profile"]["step"] == 3 and row["profile"]["device"] == "cpu", backend
        assert {k: ranges[k]["calls"] for k in ("step", "generate", "rewards", "reference_forward", "policy_forward",
                                                "backward", "optimizer")} == dict.fromkeys(
            ("step", "generate", "rewards", "reference_forward", "policy_forward", "backward", "optimizer"), 1), backend
        assert 0 < ranges["generate"]["host_s"] < ranges["step"]["host_s"] and ranges["step"]["device_s"] is None
    counts = single[HF_PERSISTENT]["decode_counts"]  # the compiled variant's record, its first step apart
    assert counts["generate_calls"] == 3 and counts["recompiles"] == 0 and counts["compile_backend"] == "aot_eager"
    assert single[HF_PERSISTENT]["first_step_s"] > 0 and single[HF_GENERATE]["decode_counts"] is None
    # each member timed its generation beside its step, and trained without a checkpoint or the final validation
    for runs in summary["runs"].values():
        assert all(0 < r["generate_s"] < r["step_s"] for r in runs), runs
    members = [m for m in (tmp_path / "work").glob("*/member-*") if m.is_dir()]
    assert members and all((m / "progress.json").is_file() for m in members)
    assert not [p.name for m in members for p in m.rglob("*") if p.name.startswith("checkpoint-") or
                p.name == "result.json"]

    sharing = {(row["backend"], row["members"]): row for row in summary["sharing"]}
    assert set(sharing) == {(HF_GENERATE, 1), (HF_GENERATE, 2)}
    for (_, members), row in sharing.items():
        assert row["ok"] == members and row["errors"] == [], row
        _positive(row, "tokens_per_s_total", "steps_per_s_total", "tokens_per_s_window", "peak_memory_max_bytes",
                  "scaling")
        assert 0.0 <= row["overlap"] <= 1.0
    assert len(summary["runs"][f"{HF_GENERATE}-x2"]) == 2

    table = proc.stdout
    assert "backend (1 member)" in table and "tok/s total" in table and "one profiled step (not timed above)" in table
    assert table.count(HF_GENERATE) >= 3 and CONTINUOUS_BATCHING in table


def test_the_tables_print_the_owned_loops_counts_and_profile(capsys):
    """The owned loop's decode counts are its own (captures, replays, host reads per token; no torch CUDA graph
    trees): the table printed them as the persistent decoder's and failed, after the measurement, on the GPU pass's
    loop lines."""
    from bench.bench_member_gpu import print_tables

    counts = {"loop": "owned_loop", "generate_calls": 4, "compiles": 1, "recompiles": 0, "recordings": 1,
              "replays": 124, "host_syncs": 12, "host_syncs_per_token": 0.094}
    profile = {"ranges": {"step": {"calls": 1, "host_s": 0.5, "own_host_s": 0.01, "device_s": None, "busy_s": None,
                                   "syncs": None}},
               "decode_window": {"tokens": 16, "host_ms": 2.0, "host_in_step_ms": 1.5, "in_graph_ms": 1.5,
                                 "eager_ms": 0.5, "idle_ms": None, "device_ms": None}}
    row = {"backend": "hf_generate_owned_loop", "status": "ok", "step_s": 0.4, "first_step_s": 3.0,
           "tokens_per_s": 600.0, "peak_memory_bytes": 2**30, "peak_memory_kind": "peak RSS", "step_ratio": 0.9,
           "tokens_ratio": 1.1, "memory_ratio": 1.0, "ran_as": "hf_generate_owned_loop", "decode_counts": counts,
           "profile": profile}
    summary = {"settings": {"device": "cpu", "dtype": "float32", "lora_r": 64, "batch_size": 8, "group_size": 4,
                            "completion_length": 32, "steps": 4, "threads": 1, "tokenizer": "tiny"},
               "model": {"architecture": "qwen3_1_7b", "parameters": 4e5, "config": {}, "dir": "-"},
               "single": [row], "sharing": []}
    print_tables(summary)
    out = capsys.readouterr().out
    assert "(4 generations: 1 compiles, 0 recompiles, 1 captures, 124 replays, 0.094 host reads per token)" in out
    assert "16 token steps of the owned loop, per token: 1.500 ms in the captured step, 0.500 ms eager" in out
