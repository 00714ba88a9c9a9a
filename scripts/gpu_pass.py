"""One pass over a short GPU allocation: every GPU question this project has, in order of value, within a budget.

Why: GPU time reaches this project as a node for ~15 minutes at a time (at most 10 per command), air-gapped, with the
project's packages brought as a bundle of wheels (scripts/node_bundle.sh). A pass must spend such an allocation on
what matters most first, stop cleanly at its budget, and keep every figure the moment it is measured, so that a
command cut at its limit loses only the check in flight and a second call finishes the rest. In order:

1. ``cuda``: CUDA usable (the card, its memory, torch and CUDA versions);
2. ``bundle``: every module of the node bundle's role imports (``--bundle DIR``; skipped without one);
3. ``cuda_tests``: the CUDA tests;
4. ``acceptance``: the acceptance run (scripts/gpu_check.py: meta.run with two members sharing the GPU,
   re-evaluation, export, a single run): 4.8 minutes on one H100;
5. ``bench:*``: bench/bench_member_gpu.py at the mbpp_qwen3 preset's real shapes (Qwen3-1.7B's architecture at full
   depth, random weights, the preset's batch and lengths): ``train.decode_cache`` persistent_compiled (the figure
   that decides the presets), then dynamic (its baseline), one member alone (compile time reported apart: the first
   step's excess), then 2 members sharing the GPU with the faster cache, then 4 if time is left.
   ``static_compiled`` is not measured: transformers makes its cache anew at every call, so its CUDA graphs are
   recorded at every step (docs/gpus.md, "Decoding");
6. ``loop:*``: the project's own decode loop (owned_loop) alone, the LoRA merge alone (persistent_merged), two
   members on the loop; the loop's lone member profiles one step more (PROFILED): per named range of the step its
   host and device seconds and host syncs, and 16 of its token steps split into the captured step, eager work and
   the device's idle time.

``--only`` runs the checks it names in the order it names them. Each bench setting has a budget (ALONE_MINUTES and
SHARING_MINUTES, the minutes it needs on one H100): it is not started with less left, and is stopped at
BENCH_LIMIT_MARGIN times it. A setting stopped before any member logged its first step was still building the model
or compiling: that is recorded as cut, not failed, and a second call measures it again (with inductor's cache on the
machine then warm). Each setting's member logs (with ``TORCH_LOGS=graph_breaks,recompiles,cudagraphs``) stay in
``--work``, by default beside the record.

Each check's outcome is appended to ``--record`` (JSON lines, fsync'd) as it ends. A later call with the same record
skips every check already measured on the same machine (card and host; passed or failed) and reruns those cut or
never reached. The
pass ends with a summary: pass or fail per check; s/step, completion tokens/s and peak GiB per member for each bench
setting; and the GPU-hours of ``experiment=mbpp_qwen3 population=180 generations=15`` that each setting implies,
counted as the search's dry-run plan counts them (meta/search/plan.py, core/gpu_time.py); and the presets'
decode cache that follows on this card (a compiled cache where its lone member steps >= 1.5x faster than the dynamic
cache's, with the step time to set).

    scripts/gpu_pass.sh --budget-min 9 --only bench:persistent_compiled,bench:dynamic,bench:faster:x2 \
        --record $OUT/gpu_pass.jsonl          # the deciding figures, one call (docs/gpus.md)

Exit status: 0 every check passed; 1 a check failed; 3 the budget ran out before every check ran (call again).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inner_loop.generation.backends import (  # noqa: E402
    DYNAMIC_CACHE, HF_GENERATE, OWNED_LOOP, PERSISTENT_COMPILED, PERSISTENT_MERGED)
from inner_loop.generation.decode_step import decode_counts_problem  # noqa: E402
from inner_loop.process.gpu_share import CONTEXT_ALLOWANCE_BYTES  # noqa: E402
from bench.bench_full_form import GPU_PASS_MINUTES, gpu_pass_check  # noqa: E402

logger = logging.getLogger("gpu_pass")

PASSED, FAILED, CUT = "pass", "fail", "cut"
#: outcomes a later call keeps (a cut or never-reached check runs again)
FINAL = (PASSED, FAILED)
EXIT_FAILED, EXIT_INCOMPLETE = 1, 3
#: seconds kept back from the budget for the summary
SUMMARY_RESERVE_S = 15.0
#: the decode caches measured one member alone, in this order of value: the member's one static cache with its decode
#: step compiled once (the figure that decides the presets), then the baseline; the faster is used for sharing.
#: transformers' own compiled static cache (static_compiled) is left out: remade at every call, its CUDA graphs are
#: recorded at every step
#: Then the project's own decode loop (owned_loop) and, alone, the LoRA merge it decodes on (persistent_merged:
#: persistent_compiled with only the merge changed, so the merge's share of the loop's gain is its own figure)
CACHES = (PERSISTENT_COMPILED, DYNAMIC_CACHE)
#: the checks of the owned loop (keys ``loop:...``, after the others, so ``--only bench`` is the decision's pass)
LOOP_CACHES = (OWNED_LOOP, PERSISTENT_MERGED)
#: members sharing the card on the owned loop, whichever cache was faster alone
LOOP_SHARING = 2
#: sharing counts after one member alone, in order of value
SHARING = (2, 4)
#: optimizer steps per bench member with the dynamic cache: the first (set-up) untimed, then two timed ones (its
#: steps cannot recompile or record anything again; on the H100 three were 25.8, 24.1 and 23.9 s)
BENCH_STEPS = 3
#: ... with a compiled cache: the first (the compile) untimed, then 5 timed, so that a cost paid at every step (a
#: recompile, a CUDA graph recorded again) shows in the s/step as well as in the member's decode counts
COMPILED_BENCH_STEPS = 6
#: minutes each bench setting needs on one H100 at the preset's shapes (one member alone, by cache; k members sharing
#: the card, by k): the least budget it is started with (the lines of docs/gpus.md's one call add up to 8.25 of its
#: 9). From the H100 pass of 2026-11-27 (docs/benchmarks.md): a member's process start, imports, model load and
#: trainer ~45 s, its first step 44 s, then 24.6 s a step with the dynamic cache (45 + 44 + 2 x 24.6 = 138 s);
#: persistent_compiled: the model built first on a fresh machine (~30 s in bf16 on the card), the same start, the
#: compile in its first step (<= 120 s aimed), 5 steps at the issue's expected ~5 s (45 + 30 + 120 + 25 = 220 s); two
#: members sharing the card with the faster cache: both start at once, compile from inductor's warm cache, and step
#: a little slower
#: owned_loop and persistent_merged: persistent_compiled's 2.43 min on the H200 (docs/benchmarks.md), its first step's
#: compile the same size (one whole-step graph; the merged weights change no shape), rounded up; not yet run on a card.
#: owned_loop's line also profiles one step more (PROFILED, +0.25: one step at ~5 s, slower under the profile, and
#: the profile's reading); persistent_merged comes second in its call, so the model is built already (-0.25)
ALONE_MINUTES = {PERSISTENT_COMPILED: 3.5, DYNAMIC_CACHE: 2.25, OWNED_LOOP: 3.25, PERSISTENT_MERGED: 2.75}
#: two members on the owned loop: as two on the faster cache (both compile from inductor's warm cache)
LOOP_SHARING_MINUTES = 2.5
#: the checks whose members profile one step more (bench --profile-step): the owned loop alone, so one call gives its
#: step's named ranges (inner_loop/grpo/step_profile.py) and 16 of its token steps (in graph, eager, idle)
PROFILED = (f"loop:{OWNED_LOOP}:x1",)
SHARING_MINUTES = {2: 2.5, 4: 3.0}
#: a bench setting is stopped at this many times the minutes it needs (a finding: it ran past what it needs)
BENCH_LIMIT_MARGIN = 1.3
#: what a bench's member processes log beside their own output: each graph break, recompile and CUDA graph event,
#: with inductor's reason (kept with the setting's logs)
BENCH_TORCH_LOGS = "graph_breaks,recompiles,cudagraphs"
#: the search whose GPU-hours each setting implies (the README's search)
SEARCH = ["experiment=mbpp_qwen3", "population=180", "generations=15"]
#: issue 38's rule for a preset's members_per_gpu: k members must give at least this much of one member's tokens/s...
SHARING_MIN_SCALING = 1.5
#: ... and their peak memory together fit within this share of the card (room to spare)
SHARING_MAX_MEMORY_SHARE = 0.75
#: the rule for a preset's train.decode_cache: a compiled cache becomes the default on a card where its lone member
#: steps at least this much faster than the dynamic cache's (each step's compile apart: the first step is untimed)
DECODE_CACHE_MIN_SPEEDUP = 1.5
#: the presets whose train.decode_cache and resources.step_time_s the bench's shapes (mbpp_qwen3's) decide
DECODE_CACHE_PRESET = "conf/experiment/mbpp_qwen3.yaml"
#: --device cpu: small shapes (the pass's plumbing, not a measurement)
CPU_BENCH_SHAPES = ["--layers", "2", "--hidden", "128", "--heads", "2", "--kv-heads", "1", "--head-dim", "64",
                    "--intermediate", "256", "--vocab", "512", "--group-size", "2", "--batch-size", "4",
                    "--completion-length", "8", "--dtype", "float32", "--threads", "1"]


# ------------------------------------------------------------------ the record
def read_record(path: Path) -> list[dict[str, Any]]:
    """The outcomes so far; a torn last line (a command killed mid-write) is ignored."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("%s: an unreadable line skipped (a write cut short): %.80s", path, line)
    return out


def append_record(path: Path, entry: dict[str, Any]) -> None:
    """One outcome, appended and fsync'd at once: what a cut command has measured stays measured."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(entry) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def final_outcomes(entries: list[dict[str, Any]], card: str | None, host: str) -> dict[str, dict[str, Any]]:
    """check -> its last final outcome measured on this machine (``card`` on ``host``): timings of another machine,
    even with the same card, are not compared with this one's."""
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if entry.get("status") in FINAL and entry.get("card") == card and entry.get("host") == host:
            out[entry["check"]] = entry
    return out


# ------------------------------------------------------------------ running a command within the budget
@dataclass
class Pass:
    """The pass's settings and state: where it records, its deadline, its device and card."""

    opts: argparse.Namespace
    deadline: float
    device: str
    card: str | None
    work: Path

    def left_s(self) -> float:
        return self.deadline - time.monotonic() - SUMMARY_RESERVE_S

    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **extra}
        if self.device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env


class Cut(Exception):
    """The budget ran out while a check's command ran; it was stopped (a later call runs it again)."""


class TooLong(Exception):
    """A check's command ran past the longest a check of its kind should take: a finding, recorded as a failure."""


def run_command(ctx: Pass, args: list[str], log: Path, most_min: float | None = None,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``args`` (output to ``log``) until it ends, the budget ends (Cut) or ``most_min`` minutes pass (TooLong);
    either way its whole process group (members, sandbox workers) is stopped."""
    budget_s = max(1.0, ctx.left_s())
    limit_s = min(budget_s, most_min * 60.0) if most_min else budget_s
    with log.open("w") as handle:
        proc = subprocess.Popen(args, cwd=ROOT, env=env or ctx.env(), stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            if limit_s < budget_s:
                raise TooLong(f"{log.stem} ran past {most_min:g} min and was stopped: "
                              f"{_tail(log.read_text(errors='replace'))}") from None
            raise Cut(f"stopped at the budget after {log.name}") from None
        except BaseException:
            _stop_group(proc)
            raise
    return subprocess.CompletedProcess(args, proc.returncode, log.read_text(errors="replace"), "")


def _stop_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(text: str, lines: int = 8) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])[-1500:]


# ------------------------------------------------------------------ the checks
@dataclass(frozen=True)
class Check:
    key: str
    title: str
    #: the budget (minutes) below which the check is not started: it could not finish
    least_min: float
    run: Callable[[Pass, dict[str, dict[str, Any]]], dict[str, Any]]


def cuda_check(ctx: Pass, done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    import torch

    figures = {"torch": torch.__version__, "cuda": torch.version.cuda,
               "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if ctx.device != "cuda" or not torch.cuda.is_available():
        return {"status": FAILED, "figures": figures, "detail": "no usable CUDA device"}
    props = torch.cuda.get_device_properties(0)
    x = torch.randn(1024, 1024, device="cuda")
    figures.update(card=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                   capability=f"{props.major}.{props.minor}", matmul_ok=bool(torch.isfinite(x @ x).all()))
    return {"status": PASSED if figures["matmul_ok"] else FAILED, "figures": figures,
            "detail": f"{props.name}, {figures['memory_gib']} GiB, torch {torch.__version__}, CUDA {torch.version.cuda}"}


def bundle_check(ctx: Pass, done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from scripts.node_bundle import MANIFEST

    manifest = json.loads((ctx.opts.bundle / MANIFEST).read_text())
    modules = manifest["modules"]
    probe = ("import importlib, json, sys\nbad = {}\nfor m in sys.argv[1:]:\n    try:\n        importlib.import_module(m)"
             "\n    except Exception as exc:\n        bad[m] = f'{type(exc).__name__}: {exc}'\nprint(json.dumps(bad))")
    done_ = run_command(ctx, [sys.executable, "-c", probe, *modules], ctx.work / "bundle.log")
    lines = done_.stdout.strip().splitlines()
    try:
        bad = json.loads(lines[-1]) if lines else {"?": "no output"}
    except json.JSONDecodeError:
        bad = {"?": _tail(done_.stdout)}
    figures = {"role": manifest["role"], "modules": len(modules), "wheels": len(manifest["wheels"]),
               "bundle_mib": manifest["size_mib"], "not_importable": bad}
    detail = (f"{len(modules)} modules of role {manifest['role']} import" if not bad else
              f"{len(bad)} of {len(modules)} modules do not import: " + "; ".join(f"{k}: {v}" for k, v in bad.items()))
    return {"status": FAILED if bad else PASSED, "figures": figures, "detail": detail[:1500]}


def cuda_tests_check(ctx: Pass, done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from scripts.gpu_check import CUDA_TESTS

    result = run_command(ctx, [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CUDA_TESTS],
                         ctx.work / "cuda_tests.log", most_min=3.0)
    summary = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    return {"status": PASSED if result.returncode == 0 else FAILED, "figures": {"summary": summary},
            "detail": summary if result.returncode == 0 else _tail(result.stdout, 20)}


#: the acceptance run's minutes: 4.8 measured on an H100 and on an H200 with the dynamic cache in the search's
#: members; since the preset decodes with the compiled cache, each of its ~11 member processes also compiles its
#: decode step (from inductor's warm cache after the first), so it is stopped later than that, not at 6
ACCEPTANCE_NEEDS_MIN = 5.0
ACCEPTANCE_STOP_MIN = 8.0


def acceptance_check(ctx: Pass, done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out = ctx.work / "acceptance.json"
    result = run_command(ctx, [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", ctx.device,
                               "--skip-cuda-tests", "--work", str(ctx.work / "acceptance"), "--json", str(out)],
                         ctx.work / "acceptance.log", most_min=ACCEPTANCE_STOP_MIN)
    summary = json.loads(out.read_text()) if out.is_file() else {}
    rows = summary.get("rows", [])
    figures = {"records": len(rows), "ok": sum(r["status"] == "ok" for r in rows),
               "timings_s": {k: round(v, 1) for k, v in summary.get("timings", {}).items()},
               "shared": sum(bool(r.get("shared")) for r in rows),
               "step_s": [r.get("step_s") for r in rows], "peak_gpu_gib": [round(r.get("peak_gpu_gib") or 0, 2)
                                                                          for r in rows]}
    ok = result.returncode == 0
    return {"status": PASSED if ok else FAILED, "figures": figures,
            "detail": (f"{figures['ok']}/{len(rows)} records ok, {figures['shared']} shared the GPU" if ok
                       else _tail(result.stdout, 25))}


def profile_lines(profile: dict[str, Any]) -> list[str]:
    """The bench's lines for a profiled step (bench/bench_member_gpu.py)."""
    from bench.bench_member_gpu import profile_lines as lines

    return lines(profile)


def bench_backend(cache: str) -> str:
    """The bench's name for HF generate with ``cache`` (bench/bench_member_gpu.py's naming)."""
    from bench.bench_member_gpu import measured_name

    return measured_name(HF_GENERATE, cache)


def bench_steps(opts: argparse.Namespace, cache: str) -> int:
    """Optimizer steps of one bench member with ``cache`` (a compiled cache: at least 8 timed ones)."""
    return opts.bench_steps if cache == DYNAMIC_CACHE else max(opts.bench_steps, opts.compiled_bench_steps)


def steps_logged(work: Path) -> list[int]:
    """Steps each member of a bench setting has logged so far (its progress.json; 0 before its first step ended)."""
    from results.store.member_files import read_progress

    members = sorted(m for m in work.glob("*/member-*") if m.is_dir())  # (member-N.log beside each)
    return [(read_progress(m).step if read_progress(m) is not None else 0) for m in members]


def run_bench(ctx: Pass, cache: str, members: int, key: str, need_min: float) -> dict[str, Any]:
    """One bench setting: ``members`` members with ``cache`` at the preset's real shapes (small ones on the CPU),
    stopped at BENCH_LIMIT_MARGIN x the ``need_min`` minutes it needs: a cut where no member had ended its first step
    yet (a model build or a cold compile, which a second call finds warm), a failure where they were stepping
    (slower than it needs)."""
    label = key.replace(":", "_")
    out, work = ctx.work / f"{label}.json", ctx.work / label
    if work.exists():  # an earlier call's, cut: its logs are kept beside this one's
        work.rename(work.with_name(f"{label}.cut-{_dt.datetime.now():%H%M%S}"))
    backend = bench_backend(cache)
    limit_min = need_min * BENCH_LIMIT_MARGIN
    args = [sys.executable, str(ctx.opts.bench), "--device", ctx.device, "--members", str(members), "--backends",
            backend, "--steps", str(bench_steps(ctx.opts, cache)), "--tokenizer", "tiny", "--json", str(out),
            "--work-dir", str(work), "--member-timeout", str(int(max(60.0, min(ctx.left_s(), limit_min * 60.0))))]
    if members > 1:
        args.append("--without-alone")
    if ctx.device == "cpu":
        args += CPU_BENCH_SHAPES
    if ctx.opts.no_isolation:
        args.append("--no-isolation")
    if key in PROFILED:
        args.append("--profile-step")
    logs = {"bench": str(ctx.work / f"{label}.log"), "members": str(work)}
    try:
        result = run_command(ctx, args, ctx.work / f"{label}.log", most_min=limit_min,
                             env=ctx.env(TORCH_LOGS=os.environ.get("TORCH_LOGS", BENCH_TORCH_LOGS)))
    except TooLong as exc:
        logged = steps_logged(work)
        if not logged or min(logged) == 0:
            raise Cut(f"stopped at its limit ({limit_min:g} min) before its first step ended (steps logged: "
                      f"{logged}): the model's build or a cold compile; a second call measures it again, with "
                      f"inductor's cache warm (logs: {work})") from None
        return {"status": FAILED, "figures": {"cache": cache, "members": members, "steps_logged": logged,
                                              "logs": logs},
                "detail": f"ran past {limit_min:g} min after {logged} steps: slower than it needs. {exc}"[:1500]}
    if result.returncode != 0 or not out.is_file():
        return {"status": FAILED, "figures": {"cache": cache, "members": members, "logs": logs},
                "detail": f"the bench failed (exit {result.returncode}): {_tail(result.stdout, 20)}"}
    summary = json.loads(out.read_text())
    runs = summary["runs"].get(f"{backend}-x{members}", [])
    ok = [r for r in runs if r.get("status") == "ok"]
    sharing = next((r for r in summary.get("sharing", []) if r.get("members") == members), {})
    figures: dict[str, Any] = {"cache": cache, "members": members, "backend": backend, "ok": len(ok),
                               "steps": bench_steps(ctx.opts, cache), "logs": logs,
                               "settings": summary.get("settings"), "model": summary.get("model", {}).get("config"),
                               "errors": [str(r.get("error"))[-500:] for r in runs if r.get("status") != "ok"]}
    if ok:
        step = sum(r["step_s"] for r in ok) / len(ok)
        first = sum(r.get("first_step_s") or r["step_s"] for r in ok) / len(ok)
        generating = [r["generate_s"] for r in ok if r.get("generate_s") is not None]
        figures.update(step_s=step, first_step_s=first, setup_s=max(0.0, first - step),
                       generate_s=sum(generating) / len(generating) if generating else None,
                       tokens_per_s=sum(r["tokens_per_s"] for r in ok),
                       tokens_per_s_member=sum(r["tokens_per_s"] for r in ok) / len(ok),
                       peak_gib_member=max(r["peak_memory_bytes"] for r in ok) / 2**30,
                       held_gib_member=max(held_bytes(r) for r in ok) / 2**30,
                       peak_gib_total=sum(r["peak_memory_bytes"] for r in ok) / 2**30,
                       held_gib_total=card_held_bytes(ok, sharing.get("device_peak_bytes")) / 2**30,
                       mean_completion_length=ok[0].get("mean_completion_length"),
                       ran_as=sorted({str(r.get("ran_as")) for r in ok}))
        if key in PROFILED:  # its one profiled step (after the timed ones): where a step's time goes
            figures["profile"] = ok[0].get("profile")
    status = PASSED if len(ok) == members else FAILED
    detail = (f"{figures.get('step_s', 0):.2f} s/step ({_generation_text(figures)}), "
              f"{figures.get('tokens_per_s', 0):.0f} completion tok/s, "
              f"{figures.get('held_gib_member', 0):.1f} GiB held per member" if status == PASSED
              else f"{len(ok)}/{members} members ok: {'; '.join(figures['errors'])[:1200]}")
    if status == PASSED and key in PROFILED and not figures.get("profile"):
        detail += f"; its profiled step gave no profile (see the member's log in {work})"
    # a compiled decode step must have replayed, not recompiled or recorded its CUDA graph again at every step
    problems = [decode_counts_problem({"generation": {"decode_cache": cache, "decode_counts": r.get("decode_counts")}})
                for r in ok]
    figures["decode_counts"] = [r.get("decode_counts") for r in ok]
    if any(problems):
        status, detail = FAILED, f"{detail}; decoding: {next(p for p in problems if p)}"
    return {"status": status, "figures": figures, "detail": detail}


def _generation_text(figures: dict[str, Any]) -> str:
    generate = figures.get("generate_s")
    if generate is None:
        return "generation not timed"
    return f"{generate:.2f} s generating, {figures['step_s'] - generate:.2f} s the rest"


def held_bytes(run: dict[str, Any]) -> int:
    """What one bench member held on the card: its allocator's peak hold (a static KV cache and the CUDA graph pools
    are held through the backward; the cap counts them) and, beside it, its CUDA context (CONTEXT_ALLOWANCE_BYTES,
    which no torch counter sees); its peak allocation where the hold was not measured (the CPU, older benches)."""
    reserved = run.get("peak_gpu_reserved_bytes")
    if reserved is None:
        return int(run["peak_memory_bytes"])
    return int(reserved) + CONTEXT_ALLOWANCE_BYTES


def card_held_bytes(runs: list[dict[str, Any]], device_peak: float | None) -> float:
    """What k members held on the card together: their holds summed, or the device's own peak (nvidia-smi, every
    process on it) where that is higher."""
    return max(sum(held_bytes(r) for r in runs), device_peak or 0.0)


def alone_key(cache: str) -> str:
    return f"bench:{cache}:x1"


def sharing_key(members: int) -> str:
    return f"bench:faster:x{members}"


def loop_sharing_key(members: int) -> str:
    return f"loop:{OWNED_LOOP}:x{members}"


def lone_key(cache: str) -> str:
    """The check of one member alone with ``cache`` (bench:... for CACHES, loop:... for LOOP_CACHES)."""
    return f"loop:{cache}:x1" if cache in LOOP_CACHES else alone_key(cache)


def alone_figures(done: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """cache -> the figures of its lone member, for each cache whose lone setting passed."""
    return {c: done[lone_key(c)]["figures"] for c in (*CACHES, *LOOP_CACHES)
            if lone_key(c) in done and done[lone_key(c)]["status"] == PASSED}


def faster_cache(done: dict[str, dict[str, Any]]) -> str | None:
    """The decode cache whose lone member stepped fastest (None: none was measured)."""
    alone = {c: f for c, f in alone_figures(done).items() if c in CACHES}
    return min(alone, key=lambda c: alone[c]["step_s"]) if alone else None


def alone_check(cache: str, need_min: float) -> Callable[[Pass, dict[str, dict[str, Any]]], dict[str, Any]]:
    return lambda ctx, done: run_bench(ctx, cache, 1, alone_key(cache), need_min)


def sharing_check(members: int, need_min: float) -> Callable[[Pass, dict[str, dict[str, Any]]], dict[str, Any]]:
    def run(ctx: Pass, done: dict[str, dict[str, Any]]) -> dict[str, Any]:
        cache = faster_cache(done)
        if cache is None:
            return {"status": FAILED, "figures": {"members": members},
                    "detail": "no lone member was measured: nothing to share with"}
        return run_bench(ctx, cache, members, sharing_key(members), need_min)
    return run


def bench_minutes(opts: argparse.Namespace) -> dict[str, float]:
    """Minutes each bench setting needs, by check key: ALONE_MINUTES and SHARING_MINUTES (one H100), with
    ``--bench-minutes`` (another card's) over them."""
    return {**{lone_key(c): ALONE_MINUTES[c] for c in (*CACHES, *LOOP_CACHES)},
            **{sharing_key(k): SHARING_MINUTES[k] for k in SHARING},
            loop_sharing_key(LOOP_SHARING): LOOP_SHARING_MINUTES, **opts.bench_minutes}


def _minutes_arg(text: str) -> dict[str, float]:
    try:
        return {key.strip(): float(value) for key, value in (item.split("=") for item in text.split(",") if item)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KEY=MINUTES,... (e.g. bench:dynamic:x1=4), got {text!r}") from None


def checks(opts: argparse.Namespace) -> list[Check]:
    """Every check of the pass, in order of value (the minutes each needs on one H100, from its first run); with
    ``--only``, the checks it names (a key, or a prefix such as ``bench``) in the order it names them."""
    out = [Check("cuda", "CUDA usable", 0.2, cuda_check)]
    if opts.bundle is not None:
        out.append(Check("bundle", "the bundle importable", 0.5, bundle_check))
    out += [Check("cuda_tests", "the CUDA tests", 1.0, cuda_tests_check),
            Check("acceptance", "the acceptance run", ACCEPTANCE_NEEDS_MIN, acceptance_check)]
    minutes = bench_minutes(opts)
    out += [Check(alone_key(c), f"bench: 1 member, decode_cache={c}", minutes[alone_key(c)],
                  alone_check(c, minutes[alone_key(c)])) for c in CACHES]
    out += [Check(sharing_key(k), f"bench: {k} members sharing the GPU, the faster cache", minutes[sharing_key(k)],
                  sharing_check(k, minutes[sharing_key(k)])) for k in SHARING]
    out += [Check(lone_key(c), f"loop: 1 member, decode_cache={c}", minutes[lone_key(c)],
                  lambda ctx, done, c=c: run_bench(ctx, c, 1, lone_key(c), minutes[lone_key(c)])) for c in LOOP_CACHES]
    loop_key = loop_sharing_key(LOOP_SHARING)
    out.append(Check(loop_key, f"bench: {LOOP_SHARING} members sharing the GPU on the owned loop", minutes[loop_key],
                     lambda ctx, done: run_bench(ctx, OWNED_LOOP, LOOP_SHARING, loop_key, minutes[loop_key])))
    out.append(Check("full_form", "a full-form step at mbpp_qwen3's shape: time, peak memory", GPU_PASS_MINUTES,
                     lambda ctx, done: gpu_pass_check(ctx, sys.modules[__name__])))
    if not opts.only:
        return out
    ordered: list[Check] = []
    for wanted in (k.strip() for k in opts.only.split(",") if k.strip()):
        ordered += [c for c in out if (c.key == wanted or c.key.startswith(wanted + ":")) and c not in ordered]
    return ordered


# ------------------------------------------------------------------ GPU-hours of a real search
def search_gpu_hours(step_s: float, members: int, slowdown: float) -> tuple[int, float]:
    """(runs, GPU-hours) of SEARCH had its members this step time alone and this sharing: the plan's own count.

    The config is read through its schema alone (its types and cross-key checks): the counts need nothing more, and
    build_search_config's member checks (a TRL config built, trl and peft imported: ~6 CPU-s a summary) would check
    only that this fixed search is valid."""
    from meta.compose import compose
    from meta.search.plan import new_search_gpu_hours
    from meta.settings.schema import SearchSchema, typed_config
    from scripts.gpu_check import DATA

    overrides = [*SEARCH, "es=openai_es_elite",  # the runs do not depend on the searcher; this one needs no ray
                 f"task.train_file={DATA / 'train.jsonl'}", f"task.validation_file={DATA / 'validation.jsonl'}",
                 f"task.test_file={DATA / 'test.jsonl'}", f"resources.step_time_s={step_s}",
                 f"resources.members_per_gpu={members}"]
    if members > 1:
        overrides.append(f"resources.shared_slowdown={{{members}: {max(1.0, slowdown)}}}")
    raw = compose(overrides)
    raw["run_dir"] = str(Path(tempfile.gettempdir()) / "gpu_pass-plan")
    return new_search_gpu_hours(typed_config(SearchSchema, raw))


def setting_rows(done: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per measured bench setting, with the GPU-hours of a real search that follow from it."""
    rows = []
    alone = alone_figures(done)
    for key, entry in done.items():
        if not key.startswith(("bench:", "loop:")) or entry["status"] != PASSED:
            continue
        fig = entry["figures"]
        base = alone.get(fig["cache"])
        if base is None:
            continue
        slowdown = fig["step_s"] / base["step_s"]
        row = {"setting": f"{fig['cache']} x{fig['members']}", **{k: fig.get(k) for k in (
            "step_s", "setup_s", "generate_s", "tokens_per_s", "tokens_per_s_member", "peak_gib_member",
            "peak_gib_total")},
            # what the members held (records before issue 53 measured their peak allocation only)
            "held_gib_member": fig.get("held_gib_member", fig.get("peak_gib_member")),
            "held_gib_total": fig.get("held_gib_total", fig.get("peak_gib_total")),
            "members": fig["members"], "slowdown": slowdown, "scaling": fig["tokens_per_s"] / base["tokens_per_s"]}
        try:
            row["runs"], row["gpu_hours"] = search_gpu_hours(base["step_s"], fig["members"], slowdown)
        except Exception as exc:  # the summary must print even where the config cannot be composed here
            row["runs"], row["gpu_hours"], row["gpu_hours_error"] = None, None, f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows


def decode_cache_decision(done: dict[str, dict[str, Any]], card: str | None) -> list[str]:
    """The presets' ``train.decode_cache`` from the lone members' step times on this card: each compiled cache
    against the dynamic one, by DECODE_CACHE_MIN_SPEEDUP, with the lines to set where it meets the rule (empty: the
    dynamic cache and no compiled one were measured)."""
    base = alone_figures(done).get(DYNAMIC_CACHE)
    if base is None:
        return []
    card = card or "this machine's CPU (not a measurement)"
    lines, winners = [], []
    for cache in (c for c in (*CACHES, *LOOP_CACHES) if c != DYNAMIC_CACHE):
        entry = done.get(lone_key(cache))
        if entry is None:
            continue
        fig = entry.get("figures") or {}
        if entry["status"] != PASSED:  # its s/step, where it ran, is still shown: a failed count is not a slow step
            measured = (f", {base['step_s'] / fig['step_s']:.2f}x the dynamic cache's step ({fig['step_s']:.2f} s/step)"
                        if fig.get("step_s") else "")
            lines.append(f"decode_cache={cache}: failed on {card}{measured}: not a candidate "
                         f"({str(entry.get('detail'))[:300]})")
            continue
        speedup = base["step_s"] / fig["step_s"]
        meets = speedup >= DECODE_CACHE_MIN_SPEEDUP
        lines.append(f"decode_cache={cache}: {speedup:.2f}x the dynamic cache's step on {card} "
                     f"({base['step_s']:.2f} -> {fig['step_s']:.2f} s/step over {fig.get('steps', '?')} steps, first "
                     f"step {fig.get('first_step_s', 0):.1f} s; {fig.get('tokens_per_s', 0):.0f} vs "
                     f"{base.get('tokens_per_s', 0):.0f} completion tok/s; {_held(fig):.1f} vs {_held(base):.1f} GiB "
                     f"held): {'meets' if meets else 'does not meet'} the rule (>= {DECODE_CACHE_MIN_SPEEDUP}x)")
        if meets:
            winners.append((fig["step_s"], cache))
    if winners:
        step_s, cache = min(winners)
        lines.append(f"-> {DECODE_CACHE_PRESET}: train.decode_cache: {cache}; resources.step_time_s: {step_s:.1f} "
                     f"(step_time_source: this pass, {card})")
    elif lines:
        lines.append(f"-> {DECODE_CACHE_PRESET}: keep train.decode_cache: dynamic on {card}")
    return lines


def _held(fig: dict[str, Any]) -> float:
    return fig.get("held_gib_member", fig.get("peak_gib_member")) or 0.0


def sharing_verdict(row: dict[str, Any], card_gib: float) -> str:
    """Issue 38's rule for ``members_per_gpu`` on one setting row: k members give >= SHARING_MIN_SCALING x one
    member's tokens/s, and what they held together (each one's allocator hold, a static KV cache and the CUDA graph
    pools among it, plus its CUDA context; or the card's own peak where higher) fits SHARING_MAX_MEMORY_SHARE of it."""
    held = row["held_gib_total"]
    fits = held <= SHARING_MAX_MEMORY_SHARE * card_gib
    verdict = "meets" if row["scaling"] >= SHARING_MIN_SCALING and fits else "does not meet"
    return (f"{row['setting']}: {verdict} the rule for members_per_gpu={row['members']} (>= {SHARING_MIN_SCALING}x "
            f"one member's tokens/s: {row['scaling']:.2f}x; held together <= {SHARING_MAX_MEMORY_SHARE:.0%} of "
            f"{card_gib:.0f} GiB: {held:.1f} GiB)")


def print_summary(check_list: list[Check], done: dict[str, dict[str, Any]], cut: dict[str, str],
                  card: str | None, card_gib: float | None) -> None:
    print(f"\n== GPU pass on {card or 'no GPU'} ==")
    for check in check_list:
        entry = done.get(check.key)
        status = entry["status"] if entry else (CUT if check.key in cut else "not run")
        detail = entry.get("detail", "") if entry else cut.get(check.key, "the budget ran out before it")
        print(f"{status:8s} {check.key:24s} {check.title}: {detail}")
    rows = setting_rows(done)
    if not rows:
        return
    print(f"\n{'setting':24s} {'s/step':>7s} {'set-up s':>8s} {'tok/s':>8s} {'tok/s/member':>12s} "
          f"{'GiB/member':>10s} {'vs 1':>6s} {'slowdown':>8s} {'GPU-h, 180 x 15':>16s} {'gen. s':>7s}")
    for r in rows:
        gpu_h = f"{r['gpu_hours']:,.0f}" if r["gpu_hours"] is not None else "n/a"
        generate = f"{r['generate_s']:7.2f}" if r.get("generate_s") is not None else f"{'-':>7s}"
        print(f"{r['setting']:24s} {r['step_s']:7.2f} {r['setup_s'] or 0:8.1f} {r['tokens_per_s']:8.0f} "
              f"{r['tokens_per_s_member']:12.0f} {r['held_gib_member']:10.1f} {r['scaling']:5.2f}x "
              f"{r['slowdown']:8.3f} {gpu_h:>16s} {generate}")
        if r.get("gpu_hours_error"):
            print(f"    GPU-hours not computed: {r['gpu_hours_error'][:300]}")
    print(f"(GPU-hours: `python -m meta.run {' '.join(SEARCH)} dry_run=true` with resources.step_time_s = the lone "
          "member's s/step of that cache and, for k members, resources.members_per_gpu=k and shared_slowdown; "
          "GiB/member: what a member held, its CUDA context included; gen. s: the step's generation, the rest of the "
          "step beside it is what a faster decode cannot save)")
    for r in rows:
        if r["members"] > 1 and card_gib:
            print(sharing_verdict(r, card_gib))
    for line in decode_cache_decision(done, card):
        print(line)
    for check in check_list:
        profile = (done.get(check.key) or {}).get("figures", {}).get("profile")
        if profile:
            print(f"\n{check.key}: one step profiled after the timed ones ({profile.get('device')}, "
                  f"{profile.get('wall_s', 0):.2f} s under the profiler)")
            for line in profile_lines(profile):
                print(line)


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-min", type=float, default=8.0, help="stop starting checks past this (minutes)")
    parser.add_argument("--record", type=Path, default=Path("gpu_pass.jsonl"),
                        help="JSON-lines record: appended as each check ends, read to skip what was measured")
    parser.add_argument("--bundle", type=Path, default=None, help="the node bundle's folder (its manifest.json)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: cuda where usable; cpu runs the pass's plumbing at small shapes")
    parser.add_argument("--only", default=None, help="comma-separated check keys or prefixes (e.g. bench)")
    parser.add_argument("--bench", type=Path, default=ROOT / "bench" / "bench_member_gpu.py",
                        help="the sharing bench (a script with bench_member_gpu.py's command line and --json)")
    parser.add_argument("--bench-steps", type=int, default=BENCH_STEPS,
                        help="optimizer steps per bench member (the first untimed)")
    parser.add_argument("--compiled-bench-steps", type=int, default=COMPILED_BENCH_STEPS,
                        help="optimizer steps per bench member with a compiled decode cache (at least --bench-steps)")
    parser.add_argument("--bench-minutes", type=_minutes_arg, default={},
                        help="minutes a bench setting needs on this card, over the H100's (e.g. "
                             "bench:persistent_compiled:x1=5): it is not started with less left and is stopped at "
                             f"{BENCH_LIMIT_MARGIN}x them")
    parser.add_argument("--no-isolation", action="store_true",
                        help="bench members without bubblewrap (the acceptance run keeps the preset's isolation)")
    parser.add_argument("--work", type=Path, default=None,
                        help="logs and outputs of the checks, kept (default: beside the record, <record>.logs/)")
    opts = parser.parse_args(argv)
    unknown = sorted(set(opts.bench_minutes) - set(bench_minutes(argparse.Namespace(bench_minutes={}))))
    if unknown:  # exit 2 before anything runs
        parser.error(f"--bench-minutes names no bench setting: {unknown} (the settings: "
                     f"{sorted(bench_minutes(argparse.Namespace(bench_minutes={})))})")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    started = time.monotonic()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gpu_pass: %(message)s")
    import torch

    device = opts.device if opts.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    card = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else None
    card_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if card else None
    work = opts.work or opts.record.with_name(opts.record.name + ".logs")  # beside the record, kept with it
    work.mkdir(parents=True, exist_ok=True)
    ctx = Pass(opts, started + opts.budget_min * 60.0, device, card, work)
    done = final_outcomes(read_record(opts.record), card, platform.node())
    check_list = checks(opts)
    cut: dict[str, str] = {}
    logger.info("device %s (%s), budget %.1f min, record %s (%d check(s) measured already); logs in %s", device,
                card or "-", opts.budget_min, opts.record, sum(c.key in done for c in check_list), work)
    logger.info("plan: %s", ", ".join(f"{c.key} ({c.least_min:g} min)" for c in check_list if c.key not in done))
    for check in check_list:
        if check.key in done:
            logger.info("%s: measured already (%s): %s", check.key, done[check.key]["status"],
                        done[check.key].get("detail", ""))
            continue
        if ctx.left_s() < check.least_min * 60.0:
            logger.info("%s: not started: %.1f min left of the budget, it needs %.1f", check.key,
                        max(0.0, ctx.left_s()) / 60.0, check.least_min)
            continue
        logger.info("%s: %s ...", check.key, check.title)
        began = time.monotonic()
        try:
            outcome = check.run(ctx, done)
        except Cut as exc:
            cut[check.key] = str(exc)
            append_record(opts.record, {"check": check.key, "status": CUT, "card": card, "detail": str(exc),
                                        "seconds": round(time.monotonic() - began, 1)})
            logger.info("%s: cut: %s", check.key, exc)
            continue
        except TooLong as exc:
            outcome = {"status": FAILED, "figures": {}, "detail": str(exc)[:1500]}
        except Exception as exc:  # one check's crash is its failure, not the pass's end
            outcome = {"status": FAILED, "figures": {}, "detail": f"{type(exc).__name__}: {exc}"[:1500]}
        entry = {"check": check.key, "card": card, "host": platform.node(), **outcome,
                 "seconds": round(time.monotonic() - began, 1),
                 "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        append_record(opts.record, entry)
        done[check.key] = entry
        logger.info("%s: %s in %.0f s: %s", check.key, entry["status"], entry["seconds"], entry.get("detail", ""))
    print_summary(check_list, done, cut, card, card_gib)
    print(f"pass: {time.monotonic() - started:.0f} s this call")
    if any(done.get(c.key, {}).get("status") == FAILED for c in check_list):
        return EXIT_FAILED
    if any(c.key not in done for c in check_list):
        return EXIT_INCOMPLETE
    return 0


if __name__ == "__main__":
    sys.exit(main())
