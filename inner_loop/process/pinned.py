"""Pinned CPU numerics: the same bits from a tiny-model run on every x86-64 CPU with AVX2, Intel or AMD.

Why: sixty RL steps of a tiny model at a high learning rate are chaotic, so a last-bit difference in one matrix
product changes which answers a run ends up giving. Three things pick the bits on a CPU, all per process:
- ATen's vectorised kernels (``ATEN_CPU_CAPABILITY``: default / avx2 / avx512; the vector width changes the order
  of every reduction and the exp/log approximations). Read once, at the first kernel dispatch.
- MKL's code path for the matrix products (``MKL_CBWR``): by default MKL picks its kernels by CPU model and vendor,
  so an Intel Xeon and an AMD EPYC with the same flags multiply differently. ``COMPATIBLE`` is the one branch MKL
  documents as identical on Intel and non-Intel processors. Read at MKL's first call.
- The thread count (a threaded reduction sums in another order), and oneDNN's ISA for the ops that use it.
``model.cpu_numerics: pinned`` (the tiny model's preset) runs the member, and the warm-up it starts from, in a
process started with ``PINNED_ENV``; GPU presets keep ``native`` and are untouched. Measured cost on the tiny
model: docs/numerics.md.

Nothing here imports torch at module level: pinning must happen before torch is loaded.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping


logger = logging.getLogger(__name__)

#: the values of model.cpu_numerics
NUMERICS_MODES = ("native", "pinned")
#: bump when PINNED_ENV changes: part of the warm-up cache key and of the fingerprint
PINNED_VERSION = 1
#: the process environment of a pinned run (each read once, when torch, MKL, OpenMP or oneDNN start)
PINNED_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
#: torch threads of a pinned run
PINNED_THREADS = 1
#: MKL's named constants (mkl_cbwr.h): mkl_serv_cbwr_get(MKL_CBWR_BRANCH) returns the branch in force
_MKL_CBWR_BRANCH = 1
_MKL_BRANCHES = {0: "OFF", 1: "BRANCH_OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_2",
                 8: "AVX", 9: "AVX2", 10: "AVX512_MIC", 11: "AVX512", 12: "AVX512_MIC_E1", 13: "AVX512_E1"}


def _cpuinfo(key: str) -> str:
    """The first ``key : value`` of /proc/cpuinfo (read without torch); '' where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key:
                return value.strip()
    except OSError:
        pass
    return ""


def cpu_name() -> str:
    """This CPU's model name (/proc/cpuinfo), read without torch; 'unknown' where the file does not say."""
    return _cpuinfo("model name") or "unknown"


def cpu_vendor() -> str:
    """This CPU's vendor (/proc/cpuinfo's vendor_id: GenuineIntel, AuthenticAMD), read without torch; 'unknown'."""
    return _cpuinfo("vendor_id") or "unknown"


def cpu_flags() -> set[str]:
    """This CPU's feature flags (/proc/cpuinfo), read without torch; empty where the file is not there."""
    return set(_cpuinfo("flags").split())


def can_pin() -> bool:
    """Pinned numerics need AVX2 and FMA (the kernels they select); every x86-64 CPU since ~2013-2015 has both."""
    flags = cpu_flags()
    return "avx2" in flags and "fma" in flags


def wants_pinned(inner: Mapping[str, Any]) -> bool:
    """Whether a member's resolved inner config asks for pinned numerics (read without building the config)."""
    model = inner.get("model") or {}
    return (model.get("cpu_numerics") or "native") == "pinned"


def started_pinned() -> bool:
    """This process was started with PINNED_ENV (its environment at exec, /proc/self/environ: what torch, MKL and
    OpenMP read), without importing torch to ask."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return False
    initial = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return all(initial.get(key.encode()) == value.encode() for key, value in PINNED_ENV.items())


def pin_this_process() -> None:
    """Set PINNED_ENV in this process before torch is imported; RuntimeError if torch is already loaded (its
    kernels and MKL would keep the settings they started with)."""
    if "torch" in sys.modules:
        raise RuntimeError("pin_this_process() must run before torch is imported")
    os.environ.update(PINNED_ENV)


@dataclass
class NumericsInForce:
    """What decides a CPU run's numbers in this process, as torch and MKL report them."""

    aten_cpu_capability: str
    mkl_cbwr_branch: str
    torch_threads: int
    onednn_max_cpu_isa: str
    cpu_vendor: str
    cpu_model: str
    pinned: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mkl_branch() -> str:
    """MKL's CNR branch in force (asked of the MKL linked into torch); 'unknown' where it cannot be asked."""
    import torch

    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        code = int(lib.mkl_serv_cbwr_get(_MKL_CBWR_BRANCH))
    except (OSError, AttributeError):
        return "unknown"
    return _MKL_BRANCHES.get(code, str(code))


def in_force() -> NumericsInForce:
    """The settings this process computes with (imports torch; the capability is fixed from here on)."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    branch = _mkl_branch()
    threads = torch.get_num_threads()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "")
    pinned = (capability.lower() == PINNED_ENV["ATEN_CPU_CAPABILITY"] and branch == PINNED_ENV["MKL_CBWR"]
              and isa == PINNED_ENV["ONEDNN_MAX_CPU_ISA"])
    return NumericsInForce(capability, branch, threads, isa, cpu_vendor(),
                           cpu_name(), pinned)


def pinned_in_force() -> bool:
    """This process computes as a pinned run does (threads aside, which the run sets itself)."""
    return in_force().pinned


def enter_pinned() -> NumericsInForce:
    """Called by a pinned run once torch is loaded: one thread, and a check that the kernels are the pinned ones."""
    import torch

    torch.set_num_threads(PINNED_THREADS)
    state = in_force()
    if state.torch_threads != PINNED_THREADS:  # vLLM's CPU engine replaces set_num_threads with a no-op
        raise RuntimeError(f"pinned numerics run {PINNED_THREADS} thread, but torch.set_num_threads could not set "
                           f"it here ({state.torch_threads} in use; a vLLM engine built in this process disables it)")
    if not state.pinned:
        raise RuntimeError(f"pinned numerics are not in force in this process ({state.as_dict()}); start it "
                           f"with {PINNED_ENV} before torch is imported")
    return state


def signature() -> str:
    """A short name of this process's numerics, for cache keys: builds under other numerics are other models."""
    state = in_force()
    if state.pinned:
        return f"pinned-{PINNED_VERSION}"
    return f"native-{state.aten_cpu_capability}-mkl{state.mkl_cbwr_branch}-t{state.torch_threads}"


def start_dying_with_parent() -> None:
    """In a child, before exec: SIGKILL when the parent dies, so a killed member leaves no orphan training."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def pinned_child_env() -> dict[str, str]:
    """The environment of a pinned child of this process: this one's, PINNED_ENV, and this checkout importable."""
    env = {**os.environ, **PINNED_ENV}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def read_child_payload() -> dict[str, Any]:
    """The JSON payload a pinned child was given on stdin."""
    return json.loads(sys.stdin.read())
