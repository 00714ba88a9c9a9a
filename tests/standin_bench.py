"""A stand-in for bench/bench_member_gpu.py with its command line and --json output, for tests/scripts/test_gpu_pass.py.

Why: the pass's resumption (a command cut at its limit, a second call finishing the rest) is about the pass, not
the bench; a real member takes minutes. Each call appends "<backend> x<members>" to $STANDIN_CALLS at its start,
sleeps $STANDIN_SLEEP seconds (a measurement under way, where a cut lands) and writes the figures below.
The persistent compiled cache's member reports its decode counts (one compile, one CUDA graph recording; one per
step with $STANDIN_RERECORD). Step times: HF generate dynamic 15.0 s alone (the mbpp_qwen3 preset's measured figure),
the compiled caches 15.5 and 16.0 s (slower here, so the pass must pick dynamic to share), two members 17.745 s each
(15.0 x 1.183, the preset's measured slowdown), four 37.5 s; $STANDIN_PERSISTENT_STEP_S sets the persistent compiled
cache's lone step (a faster one is then the cache members share, at the same slowdowns). Each member generates for
80% of its step and holds 12 GiB (11 allocated).

With ``--profile-step`` each member also reports a ``profile`` shaped as the real bench's (inner_loop/grpo/
step_profile.py): every named range of its step, in shares of the step set below, and 16 token steps of the owned loop.

$STANDIN_HANG_AFTER_STEPS=N: each member writes its progress.json in ``--work-dir`` (as a member does at each logged
step) with N steps done, then the bench hangs: N=0 is a member still building or compiling, N>0 one stepping slowly.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from results.store.member_files import MemberProgress, write_progress

ALONE_STEP_S = {"hf_generate": 15.0, "hf_generate_persistent_compiled": 15.5, "hf_generate_static_compiled": 16.0,
                "hf_generate_persistent_merged": 14.0, "hf_generate_owned_loop": 8.0}
SLOWDOWN = {1: 1.0, 2: 1.183, 4: 2.5}
TOKENS_PER_STEP = 64 * 256
GENERATING = 0.8
#: the profiled step's ranges, as shares of the step: (calls, host, own host, device, device busy, host syncs)
PROFILE_SHARES = {"step": (1, 1.0, 0.01, 0.97, 0.7, 20), "training_step": (1, 0.97, 0.01, 0.95, 0.68, 18),
                  "prepare_inputs": (1, 0.84, 0.05, 0.8, 0.6, 17), "generate": (1, 0.74, 0.74, 0.73, 0.55, 17),
                  "rewards": (1, 0.04, 0.04, None, None, 0), "rewards_wait": (1, 0.02, 0.02, None, None, 0),
                  "reference_forward": (1, 0.03, 0.03, 0.03, 0.02, 0), "compute_loss": (1, 0.05, 0.01, 0.04, 0.03, 1),
                  "policy_forward": (1, 0.04, 0.04, 0.04, 0.03, 0), "backward": (1, 0.08, 0.08, 0.08, 0.06, 0),
                  "grad_clip": (1, 0.003, 0.003, 0.002, 0.001, 1), "optimizer": (1, 0.02, 0.02, 0.01, 0.01, 0)}


def profile(step: float) -> dict:
    """A profiled step of ``step`` seconds with the real bench's keys."""
    ranges = {name: {"calls": calls, "host_s": host * step, "own_host_s": own * step,
                     "device_s": None if device is None else device * step,
                     "busy_s": None if busy is None else busy * step, "syncs": syncs}
              for name, (calls, host, own, device, busy, syncs) in PROFILE_SHARES.items()}
    window = {"tokens": 16, "host_ms": 1.9, "host_in_step_ms": 0.2, "host_outside_step_ms": 1.7, "device": "cuda",
              "device_ms": 1.8, "in_graph_ms": 1.4, "eager_ms": 0.05, "idle_ms": 0.35}
    return {"ranges": ranges, "decode_window": window, "sync_events": True, "step": 0, "device": "cuda",
            "wall_s": step * 1.3, "read_s": 2.0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--members", type=int, required=True)
    parser.add_argument("--backends", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--without-alone", action="store_true")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--profile-step", action="store_true")
    opts, _ = parser.parse_known_args()
    with open(os.environ["STANDIN_CALLS"], "a") as calls:
        calls.write(f"{opts.backends} x{opts.members}\n")
    if os.environ.get("STANDIN_HANG_AFTER_STEPS"):
        steps = int(os.environ["STANDIN_HANG_AFTER_STEPS"])
        for index in range(opts.members):
            member = opts.work_dir / f"{opts.backends}-x{opts.members}" / f"member-{index}"
            member.mkdir(parents=True)
            member.with_name(f"member-{index}.log").write_text("")  # as the bench writes its members' output
            if steps:
                write_progress(member, MemberProgress(step=steps, max_steps=opts.steps, started_at=time.time(),
                                                      updated_at=time.time()))
        time.sleep(3600)
    time.sleep(float(os.environ.get("STANDIN_SLEEP", "0.5")))
    alone = dict(ALONE_STEP_S)
    if os.environ.get("STANDIN_PERSISTENT_STEP_S"):
        alone["hf_generate_persistent_compiled"] = float(os.environ["STANDIN_PERSISTENT_STEP_S"])
    step = alone[opts.backends] * SLOWDOWN[opts.members]
    member = {"status": "ok", "step_s": step, "first_step_s": step + 30.0, "tokens_per_s": TOKENS_PER_STEP / step,
              "generate_s": GENERATING * step, "peak_memory_bytes": 11 * 2**30, "peak_gpu_reserved_bytes": 12 * 2**30,
              "mean_completion_length": 256.0, "ran_as": opts.backends}
    if opts.profile_step:
        member["profile"] = profile(step)
    if opts.backends.endswith("persistent_compiled"):  # the member's one cache: compiled once, recorded once...
        calls = opts.steps
        member["decode_counts"] = {"generate_calls": calls, "compiles": 1, "recompiles": 0, "weights_moved": 0,
                                   "cache_kept": True, "buckets": [64, 128, 192, 256], "buckets_used": {"128": calls},
                                   # ... unless $STANDIN_RERECORD: a graph recorded again at every step
                                   "cudagraph_recordings": calls if os.environ.get("STANDIN_RERECORD") else 1}
    if opts.backends.endswith("persistent_merged"):
        member["decode_counts"] = {"generate_calls": opts.steps, "compiles": 1, "recompiles": 0, "weights_moved": 0,
                                   "cache_kept": True, "buckets": [64, 128, 192, 256], "buckets_used": {"128": opts.steps},
                                   "cudagraph_recordings": 1, "merged_bytes": 2**30}
    if opts.backends.endswith("owned_loop"):  # the owned loop: one compile, one capture, a host read per 16 tokens
        member["decode_counts"] = {"generate_calls": opts.steps, "compiles": 1, "recompiles": 0, "recordings": 1,
                                   "replays": 255 * opts.steps, "tokens": 256 * opts.steps, "check_every": 16,
                                   "host_syncs": 17 * opts.steps, "weights_moved": 0}
    summary = {"settings": {"steps": opts.steps}, "model": {"config": {}},
               "runs": {f"{opts.backends}-x{opts.members}": [dict(member, index=i) for i in range(opts.members)]}}
    with open(opts.json, "w") as out:
        json.dump(summary, out)


if __name__ == "__main__":
    main()
