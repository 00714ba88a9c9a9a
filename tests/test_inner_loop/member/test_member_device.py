"""No silent CPU training (issue 37, item 2): a member whose resources ask for a GPU refuses to start without a usable
one, before its model loads, naming the cause; every record names its device. CUDA is simulated by monkeypatching
what torch reports in this process: no test here needs a GPU."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import inner_loop.member.device as device
from inner_loop.process.pinned import cpu_name
from meta.search.config import build_search_config
from meta.compose import compose
from core.records import MEMBER_GPUS_KEY, ResultRecord, device_text
from results.store.member_files import read_result
from test_inner_member import _inner, _spec

H200 = SimpleNamespace(name="NVIDIA H200", total_memory=150_754_820_096)
#: the real probe of TRL's kernels (_gpu_torch replaces it: a simulated GPU cannot run them)
KERNEL_PROBLEM = device.kernel_problem


def _gpu_torch(monkeypatch: pytest.MonkeyPatch, *, cuda: str | None = "12.8", init_error: str | None = None,
               count: int = 1) -> None:
    """Make this process's torch report a CUDA build (or not), a driver that fails (or not), and ``count`` devices."""
    monkeypatch.setattr(torch.version, "cuda", cuda)

    def init() -> None:
        if init_error:
            raise RuntimeError(init_error)

    monkeypatch.setattr(torch.cuda, "init", init)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    usable = bool(cuda) and not init_error and count > 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: usable)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: H200)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 11_808_000_000)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 15_032_385_536)  # 14 GiB
    # a CUDA graph's pool beside the default one
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *args, **kwargs: [
        {"segment_pool_id": (0, 0), "total_size": 2 << 30, "allocated_size": 1 << 30},
        {"segment_pool_id": (1, 0), "total_size": 512 << 20, "allocated_size": 100 << 20}])
    monkeypatch.setattr(device, "kernel_problem", lambda where: "")  # TRL's kernels run on the simulated GPU


@pytest.mark.parametrize("cuda, init_error, count, visible, cause", [
    (None, None, 0, "0", "this torch is a CPU build"),
    ("12.8", "The NVIDIA driver on your system is too old (found version 11040)", 0, "0",
     "the driver said: RuntimeError: The NVIDIA driver on your system is too old (found version 11040)"),
    ("12.8", None, 0, "", "the driver reports no device"),
])
def test_a_gpu_member_without_a_usable_gpu_is_refused_naming_the_cause(monkeypatch, cuda, init_error, count, visible,
                                                                       cause):
    _gpu_torch(monkeypatch, cuda=cuda, init_error=init_error, count=count)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with pytest.raises(device.DeviceUnavailableError) as caught:
        device.require_device({MEMBER_GPUS_KEY: 1})
    text = str(caught.value)
    assert cause in text and f"torch {torch.__version__} built with CUDA {cuda or 'none (a CPU build)'}" in text
    assert f"CUDA_VISIBLE_DEVICES={visible!r}" in text and "refused to train on the CPU" in text
    assert not isinstance(caught.value, Exception)  # passes every `except Exception`: the job ends without a result


def test_the_device_is_described_on_a_gpu_and_on_the_cpu(monkeypatch):
    cpu = device.require_device({})  # a CPU member, on this machine
    assert cpu["type"] == "cpu" and cpu["name"] == cpu_name() and cpu["torch"] == torch.__version__
    assert device_text(device.with_peak_memory(cpu)) == f"cpu ({cpu_name()})"
    _gpu_torch(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    gpu = device.with_peak_memory(device.require_device({MEMBER_GPUS_KEY: 1}))
    assert gpu == {"type": "cuda", "name": "NVIDIA H200", "memory_bytes": H200.total_memory, "torch": torch.__version__,
                   "cuda": "12.8", "cuda_visible_devices": "3", "peak_memory_bytes": 11_808_000_000,
                   # what the allocator held at its peak (the cap counts it; a static cache and the CUDA graph pools
                   # are held through the backward), and the graph pools at the end
                   "peak_reserved_bytes": 15_032_385_536, "graph_pool_bytes": 512 << 20}
    assert device_text(gpu) == "NVIDIA H200 140.4 GiB, peak 11.0 GiB (held 14.0 GiB, 0.5 in CUDA graph pools)"
    again = ResultRecord.from_dict(json.loads(json.dumps(ResultRecord(status="ok", device=gpu).to_dict())))
    assert again.device == gpu and ResultRecord(status="ok", device="garbage").device == {}  # type: ignore[arg-type]


def test_a_gpu_member_on_a_cpu_node_stops_before_its_model_loads_and_writes_no_result(monkeypatch, tmp_path):
    import inner_loop.member.lifecycle as member

    _gpu_torch(monkeypatch, cuda=None, count=0)

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(member, "build_trainer", never)
    inner = {**_inner(), MEMBER_GPUS_KEY: 1}
    with pytest.raises(device.DeviceUnavailableError, match="CPU build"):
        member.train_in_process(_spec(tmp_path / "m", inner))
    assert read_result(tmp_path / "m") is None  # the node's failure: the launcher resubmits, the init is not charged


def test_a_search_whose_resources_ask_for_a_gpu_tells_its_members(tmp_path):
    raw = compose(["experiment=mbpp_qwen3", "launcher=slurm", "inner.entrypoint=meta.synthetic:member"])
    assert build_search_config(raw).member_inner()[MEMBER_GPUS_KEY] == 1
    assert MEMBER_GPUS_KEY not in build_search_config(compose(["inner.entrypoint=meta.synthetic:member"])).member_inner()


def test_a_bad_gpu_count_in_the_inner_config_names_the_key():
    with pytest.raises(ValueError, match="inner gpus='one'"):
        device.gpus_asked({MEMBER_GPUS_KEY: "one"})
    assert device.gpus_asked({}) == 0


def test_a_member_that_fails_after_the_check_names_its_device_in_the_record(monkeypatch, tmp_path):
    import inner_loop.member.lifecycle as member

    def broken(*args, **kwargs):
        raise RuntimeError("the model would not load")

    monkeypatch.setattr(member, "build_trainer", broken)
    record = member.train_in_process(_spec(tmp_path / "m", _inner()))
    assert record.status == "failed" and "the model would not load" in record.error
    assert read_result(tmp_path / "m").device == {**device.describe_device(), "peak_memory_bytes": None,
                                                  "peak_reserved_bytes": None, "graph_pool_bytes": None}
    assert record.device["type"] == "cpu" and record.device["name"] == cpu_name()


def test_the_members_table_and_status_show_the_device_and_peak_memory(tmp_path):
    from meta.search.member_rows import member_row
    from results.report.search.snapshot import _member_row_from_dir
    from results.store.member_files import write_result

    gpu = {"type": "cuda", "name": "NVIDIA H200", "memory_bytes": H200.total_memory, "torch": "2.13.0", "cuda": "12.8",
           "peak_memory_bytes": 11_808_000_000}
    write_result(tmp_path, ResultRecord(status="ok", fitness=0.5, device=gpu))
    row = member_row("gen 0 member 000", tmp_path, None, {}, 0.0)
    assert row.detail == "fitness 0.5000, on NVIDIA H200 140.4 GiB, peak 11.0 GiB"
    table_row = _member_row_from_dir(0, 0, tmp_path, [])
    assert table_row["device"] == "NVIDIA H200 140.4 GiB, peak 11.0 GiB"
    assert table_row["peak_gpu_memory_bytes"] == 11_808_000_000


def test_trls_kernels_run_through_the_probe_as_a_step_calls_them():
    """The probe calls TRL's own functions with the arguments a step passes (on the CPU TRL folds the tiles in torch;
    on CUDA the same calls compile and launch the Triton kernels)."""
    assert device.kernel_problem(torch.device("cpu")) == ""


def test_a_gpu_node_without_a_c_compiler_is_the_nodes_failure_not_the_members(monkeypatch, tmp_path):
    """Triton compiles its launchers at the first launch; without gcc that used to fail every member at its first step,
    charged to the member. Now the member's device check launches the kernels first, and the node is excluded."""
    import inner_loop.member.lifecycle as member
    from results.store.layout import PREFLIGHT_FILE

    _gpu_torch(monkeypatch)
    monkeypatch.setattr(device, "kernel_problem", KERNEL_PROBLEM)  # the real probe, its launch failing as on the node
    launched: list[object] = []

    def no_compiler(hidden, *args):
        launched.append(hidden.device)
        raise RuntimeError("Failed to find C compiler. Please specify via CC environment variable.")

    from trl.kernels import ChunkedLogProbFunction

    monkeypatch.setattr(ChunkedLogProbFunction, "apply", no_compiler)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: self)  # the simulated GPU's tensors
    monkeypatch.setattr(member, "build_trainer", lambda *a, **k: pytest.fail("the model was loaded"))
    inner = {**_inner(), MEMBER_GPUS_KEY: 1}
    with pytest.raises(device.DeviceUnavailableError, match="Triton log-prob kernels.*Failed to find C compiler"):
        member.train_in_process(_spec(tmp_path / "m", inner))
    assert launched  # the kernels were launched before the model loaded
    assert read_result(tmp_path / "m") is None  # nothing charged to the init
    cause = json.loads((tmp_path / "m" / PREFLIGHT_FILE).read_text())["cause"]
    assert "C compiler" in cause  # the node failure the launcher excludes the node for
