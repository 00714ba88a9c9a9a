"""The dry-run plan (``python -m meta.run ... dry_run=true``): what a search would submit and cost, before it does.

A population of 180 multi-hour GPU runs is a large request on a shared cluster; the plan shows it from the
validated config alone, without a scheduler call or a file written: the job arrays per generation, the sbatch
script of one member (rendered by submitit's own sbatch writer), resources per member and in total, GPU-hours
from the preset's time per member (retries' worst case separately), and checkpoint disk and file counts from the
model's trainable parameter count and the checkpoint policy. Numbers that rest on an assumption say so.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from meta.search.config import (averaged_center_nominated, early_stop_step, generation_shape, member_time_text,
                                search_center)
from launch.base import LauncherPlan, PlanContext
from meta.search.resume import run_dir_label
from core.gpu_time import GpuSharing, gpu_time_h
from meta.settings.schema import SearchSchema, train_steps
from core.config.horizon import MEMBER_STEPS_KEY
from results.store.run_store import RunStore

if TYPE_CHECKING:
    from meta.search.after.baselines import ReportRow

#: a member's running-time limit should leave at least this multiple of its expected time (seed spread, slower
#: nodes, a requeue's reload); the plan warns below it
TIMEOUT_HEADROOM = 1.3
#: bytes per parameter of a saved checkpoint: the weights plus Adam's two moments, all in the parameter dtype
#: (torch's Adam keeps its state in the parameter's dtype; PEFT keeps LoRA adapters in float32)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: files in one TRL/transformers checkpoint directory: weights (model.safetensors, config.json,
#: generation_config.json, or for LoRA adapter_model.safetensors, adapter_config.json, README.md), trainer state
#: (optimizer.pt, scheduler.pt, rng_state.pth, trainer_state.json, training_args.bin) and the tokenizer
#: (tokenizer.json, tokenizer_config.json, + chat_template.jinja for chat models). Measured: 10 for the tiny model.
TRAINER_FILES = 5
WEIGHT_FILES = 3
#: files of a member besides its checkpoints: result.json, started.json, its log, and submitit's submitted
#: pickle, result pickle, stdout and stderr
MEMBER_FILES = 7
#: the tiny model's vocabulary: 4 special tokens + 95 printable ASCII characters + newline + tab
TINY_VOCAB = 101


@dataclass(frozen=True)
class ModelShape:
    """The numbers that fix a decoder's parameter count (Llama/Qwen3 layout)."""

    layers: int
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one block, by the module names LoRA targets."""
        q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden, q), "k_proj": (self.hidden, kv), "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden), "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate), "down_proj": (self.intermediate, self.hidden),
        }

    def parameters(self) -> int:
        """All parameters: blocks (projections + two norms), embeddings (x2 if untied), final norm."""
        block = sum(i * o for i, o in self.projections().values()) + 2 * self.hidden
        return self.layers * block + self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def lora_parameters(self, rank: int, targets: list[str]) -> int:
        """LoRA adds A (r x in) and B (out x r) to every targeted projection of every block."""
        shapes = self.projections()
        unknown = [t for t in targets if t not in shapes]
        if unknown:
            raise ValueError(f"model.lora_target_modules {unknown} are not projections of this model")
        return self.layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)


def known_shape(name: str) -> ModelShape | None:
    """The published shape (config.json on the hub) the model registry declares for ``model.name``; None: unknown."""
    from inner_loop.models.registry import model_entry

    entry = model_entry(name)
    return ModelShape(**entry.shape) if entry is not None and entry.shape is not None else None


def model_shape(model: Mapping[str, Any]) -> ModelShape | None:
    """The shape of ``model`` (the config node), or None for a hub model whose shape is not known here."""
    name = str(model.get("name"))
    if name == "tiny":
        hidden, heads = int(model["hidden_size"]), int(model["num_heads"])
        return ModelShape(layers=int(model["num_layers"]), hidden=hidden, intermediate=int(model["intermediate_size"]),
                          q_heads=heads, kv_heads=heads, head_dim=hidden // heads, vocab=TINY_VOCAB, tied=True)
    return known_shape(name)


@dataclass
class DiskPlan:
    """Checkpoint disk of one member under the checkpoint policy."""

    trainable: int
    bytes_per_checkpoint: int
    files_per_checkpoint: int
    policy: str
    written: int  # checkpoints a member writes over its run
    steady: int   # at most this many exist at once, except for a moment while the next one is written
    kept: int     # left behind once the member finished


def disk_plan(inner: Mapping[str, Any], steps: int) -> DiskPlan | None:
    """From the model's shape, LoRA rank, dtype, train.save_every and train.keep_checkpoints (``inner``: a config's
    model and train nodes) for a run of ``steps`` steps (the whole run's, or a search member's own)."""
    model, train = inner["model"], inner["train"]
    shape = model_shape(model)
    if shape is None:
        return None
    rank = int(model.get("lora_r") or 0)
    if rank:
        trainable, param_bytes = shape.lora_parameters(rank, list(model.get("lora_target_modules") or [])), 4
    else:
        trainable, param_bytes = shape.parameters(), DTYPE_BYTES.get(str(model.get("dtype")), 4)
    files = WEIGHT_FILES + TRAINER_FILES + 2 + (1 if model.get("chat_template") else 0)
    save_every = int(train.get("save_every") or 0)
    # every save_every steps, and once more at the last step when it is not a multiple (the Trainer's final save)
    written = math.ceil(steps / save_every) if save_every > 0 else 0
    # Without the key (before train.keep_checkpoints existed) nothing deletes checkpoints: that is "all".
    policy = str(train.get("keep_checkpoints") or "all")
    limit = train.get("save_total_limit")  # the Trainer's rotation while training; not applied with "all"
    steady = written if policy == "all" or limit is None else min(written, int(limit))
    kept = {"none": 0, "last": min(written, 1)}.get(policy, written)
    return DiskPlan(trainable, trainable * param_bytes * 3, files, policy, written, steady, kept)


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:,.2f} GB" if n_bytes < 1e12 else f"{n_bytes / 1e12:,.2f} TB"


def selection_runs(cfg: SearchSchema) -> int:
    """Training runs of the selection stage: (top_k + the final centre + the averaged centre, where the searcher
    keeps one) x seeds."""
    settings = cfg.reevaluate_settings
    centres = 2 if averaged_center_nominated(cfg) else 1
    return (settings.top_k + centres) * settings.seeds if settings.top_k > 0 else 0


def selection_text(cfg: SearchSchema) -> str:
    """The selection stage's candidates and seeds, as the plan names them."""
    averaged = " + averaged centre" if averaged_center_nominated(cfg) else ""
    settings = cfg.reevaluate_settings
    return f"reevaluate: top_k={settings.top_k} + centre{averaged}, x seeds={settings.seeds}"


def reporting_runs(cfg: SearchSchema) -> int:
    """Training runs of the reporting stage: (the exported init + every baseline) x report_seeds."""
    settings = cfg.reevaluate_settings
    return (1 + len(settings.baselines)) * settings.report_seeds if settings.top_k > 0 else 0


def runs_left(cfg: SearchSchema, store: RunStore, resuming: bool) -> tuple[int, int, str]:
    """(selection runs, reporting runs) still to train, and what of them is done already, in words: a resume's plan
    counts only what is left (a stage that wrote its result is done; otherwise its final runs are not retrained)."""
    selection, reporting = selection_runs(cfg), reporting_runs(cfg)
    if not resuming:
        return selection, reporting, ""
    done: list[str] = []
    if selection and store.read_reevaluation() is not None:
        done.append(f"selection done ({selection} runs)")
        selection = 0
    elif selection:
        final, _ = store.reevaluation_progress()
        selection = max(0, selection - final)
        done += [f"{final} selection runs final"] if final else []
    if reporting and store.read_result_table() is not None:
        done.append(f"result table done ({reporting} runs)")
        reporting = 0
    elif reporting:
        final, _ = store.reevaluation_progress(reporting=True)
        reporting = max(0, reporting - final)
        done += [f"{final} reporting runs final"] if final else []
    return selection, reporting, "; ".join(done)


def reporting_lines(cfg: SearchSchema, report_rows: Sequence[ReportRow]) -> list[str]:
    """Every row of the result table with its resolved divergence block and where its coefficient comes from."""
    from meta.search.after.reporting import has_result_table

    settings = cfg.reevaluate_settings
    if not has_result_table(cfg):
        return ["result table: none (reevaluate.top_k=0 or reevaluate.report_seeds=0)"]
    evaluations = ["validation"] + (["test split"] if settings.test else []) + [f"transfer to {t}" for t in
                                                                              settings.transfer]
    lines = [f"result table: {1 + len(settings.baselines)} rows x report_seeds={settings.report_seeds} fresh seeds "
             f"(paired, used for nothing else) = {reporting_runs(cfg)} runs, each scored on "
             f"{', '.join(evaluations)} from the same trained model:"]
    for row in report_rows:
        steps = train_steps(row.inner)
        lines.append(f"  {row.name:<10} {row.label}: divergence {json.dumps(row.divergence, sort_keys=True)} "
                     f"(coef from {row.coef_source}), train.steps={steps}"
                     + (", map: the init chosen by the selection stage" if row.name == "exported" else "")
                     + (f", maps: one per reporting seed ({len(row.params_per_seed)}), drawn as the search's "
                        "generation 0 draws them" if row.params_per_seed else ""))
    return lines


def _plan_context(cfg: SearchSchema, generations: int = 0, first: int = 0, store: RunStore | None = None,
                  run_id: str | None = None) -> PlanContext:
    """What the launcher's part of the plan reads of the search (launch/base.py: PlanContext)."""
    return PlanContext(
        members_per_generation=generation_shape(cfg).jobs, generations=generations, first_generation=first,
        inner_timeout_s=cfg.search_timeout_s, resources=cfg.resources_node,  # the generation's members' limit
        num_threads=int(cfg.train["num_threads"]), sharing=cfg.sharing,
        launcher_dir=store.launcher_dir(first) if store is not None else None, run_id=run_id or "RUNID")


def _launcher_plan(cfg: SearchSchema, context: PlanContext) -> LauncherPlan:
    """The configured launcher's own part of the plan, asked once (launch/factory.py: launcher_plan)."""
    from launch.factory import launcher_plan

    return launcher_plan(cfg.launcher_node, context)


def _first_generation(store: RunStore, resuming: bool) -> int:
    if not resuming:
        return 0
    done = store.state_generations()
    return max(done) + 1 if done else 0


def gpus_per_member(cfg: SearchSchema) -> int:
    """The GPUs one member asks for, as its launcher plans it (resources.gpus, or the launcher's per-task GPUs)."""
    return _launcher_plan(cfg, _plan_context(cfg)).gpus


def training_runs(cfg: SearchSchema, generations: int, selection: int, reporting: int) -> int:
    """The search's training runs: its members (x seeds per member) over ``generations``, then the selection and
    reporting runs."""
    return search_runs(cfg, generations) + selection + reporting


def search_runs(cfg: SearchSchema, generations: int) -> int:
    """The training runs of ``generations`` generations: jobs x seeds per member (an online searcher's:
    truncations)."""
    return generation_shape(cfg).jobs * generations * cfg.seeds_per_member


@dataclass(frozen=True)
class SearchWork:
    """What ``generations`` generations of a search train, planned alike for every searcher: its member runs, their
    steps and their mean time alone on a GPU."""

    runs: int       # member runs (x seeds per member; an online searcher's: truncations of its particles' runs)
    steps: int      # their training steps in all (member-steps)
    alone_h: float  # one run's mean hours alone on its GPU


def search_work(cfg: SearchSchema, generations: int) -> SearchWork:
    """The generations' runs (the shape's jobs), their steps as the searcher plans them (an online searcher's
    truncations: planned_member_steps; whole runs: es.member_steps each) and their hours, priced by the schema
    (SearchSchema.search_alone_h)."""
    from meta.searchers import searcher_class

    es = cfg.searcher_settings
    runs = search_runs(cfg, generations)
    steps, hours = cfg.search_alone_h(runs, searcher_class(str(es.get("name"))).planned_member_steps(
        es, cfg.population, generations))
    return SearchWork(runs, steps, hours / max(1, runs))


def search_gpu_hours(cfg: SearchSchema, sharing: GpuSharing, gpus: int, generations: int, after_runs: int) -> float:
    """GPU-hours of ``generations`` generations of search members and ``after_runs`` selection and reporting runs at
    train.steps (each priced at its own time alone)."""
    work = search_work(cfg, generations)
    return (sharing.gpu_hours(work.runs, work.alone_h, gpus)
            + sharing.gpu_hours(after_runs, cfg.member_alone_min / 60.0, gpus))


def _member_hours(cfg: SearchSchema, sharing: GpuSharing, generations: int, after_runs: int) -> float:
    """Running hours of every member together (beside the members on its GPU): what their CPUs are held for."""
    work = search_work(cfg, generations)
    return work.runs * sharing.member_time(work.alone_h) + after_runs * sharing.member_time(cfg.member_alone_min / 60.0)


def member_steps_key(cfg: SearchSchema) -> str:
    """The key a search member's steps come from, as the plan names it (an online searcher's: its truncation)."""
    if cfg.longest_search_member_steps != cfg.member_steps:
        return ("es.truncation_steps" if cfg.searcher_settings.get("truncation_steps") is not None else
                "its truncation's steps")
    return "train.steps" if cfg.member_steps == cfg.full_steps else f"es.{MEMBER_STEPS_KEY}"


def member_steps_line(cfg: SearchSchema) -> list[str]:
    """The plan's line on es.member_steps when a member trains less than train.steps (none otherwise)."""
    if cfg.member_steps == cfg.full_steps:
        return []
    return [f"member horizon: es.{MEMBER_STEPS_KEY}={cfg.member_steps} of train.steps={cfg.full_steps} "
            f"({cfg.member_steps / max(1, cfg.full_steps):.3g} of a run; its cosine and warm-up over its own steps): "
            f"{round(cfg.search_member_alone_min, 1):g} min per search member; the selection and reporting runs train "
            f"train.steps. Short members rank maps by their early effect (short-horizon bias): meta.pilot's horizon "
            "check says whether they rank them as full runs do"]


@dataclass(frozen=True)
class OnlineSchedule:
    """An online search's truncations as its searcher schedules them when nothing fails or is late (replayed through
    its own ``truncations`` and ``tell``, so the plan never re-derives the schedule): what a truncation costs beyond
    its steps, and how the search's generations fall into episodes (one particle run each)."""

    pieces: int            # truncations of one particle run, from step 0 to the horizon
    together: bool         # every pair trains the same piece in every generation (they restart together)
    truncations: int       # over the generations replayed
    from_step_zero: int    # of them, the first ones of a particle's run: each scores the untouched model first
    reaching: dict[int, int]  # generation -> its truncations that end at the horizon (the runs' real end scores)
    updates: int           # generations whose tell moved the centre (given fitness that carries information)


def online_schedule(cfg: SearchSchema, generations: int, store: RunStore | None = None,
                    first: int = 0) -> OnlineSchedule:
    """Replay generations ``first`` .. ``first + generations - 1`` of the online searcher (from its state after
    generation ``first`` - 1 in ``store``, on a resume) with every member measured and random fitness (so that each
    update the searcher makes shows as a move of its centre), on until particle 0 has trained one whole run."""
    import torch

    from meta.searchers import build_searcher

    population = generation_shape(cfg).population
    searcher = build_searcher(cfg.searcher_settings, search_center(cfg), population, cfg.seed)
    latest = store.latest_state() if store is not None else None
    if latest is not None:
        searcher.load_state_dict(latest[1]["searcher"])
    ok, noise = torch.ones(population, dtype=torch.bool), torch.Generator().manual_seed(cfg.seed)
    end, generation = first + generations, first
    total = zero = run_pieces = updates = 0
    together, run_done = True, False
    reaching: dict[int, int] = {}
    while generation < end or not run_done:
        pieces = searcher.truncations() or []  # one per member; member 0 is particle 0
        horizon = int(pieces[0]["horizon"])
        if generation < end:
            total += len(pieces)
            zero += sum(1 for p in pieces if p["start"] == 0)
            together = together and len({(p["start"], p["stop"]) for p in pieces}) == 1
            if ends := sum(1 for p in pieces if p["stop"] >= p["horizon"]):
                reaching[generation] = ends
        if not run_done and (run_pieces or pieces[0]["start"] == 0):  # particle 0, from its next run's start
            run_pieces += 1
            run_done = pieces[0]["stop"] >= horizon
        center = searcher.center
        searcher.tell(generation, searcher.ask(generation), torch.randn(population, generator=noise,
                                                                        dtype=torch.float64), ok)
        updates += int(generation < end and not torch.equal(center, searcher.center))
        generation += 1
        if generation > end + 2 * horizon:  # a run has at most ``horizon`` pieces
            raise RuntimeError(f"es={cfg.es.name}: particle 0 never ended a run in the plan's replay")
    return OnlineSchedule(run_pieces, together, total, zero, reaching, updates)


def new_search_gpu_hours(cfg: SearchSchema) -> tuple[int, float]:
    """(training runs, GPU-hours) of a new search of ``cfg``, the figures its dry-run plan prints.

    Why: the GPU pass (scripts/gpu_pass.py) turns each measured step time and sharing into what a real search would
    cost, and must count it exactly as the plan does (the arithmetic's one owner: core/gpu_time.py)."""
    after = selection_runs(cfg) + reporting_runs(cfg)
    return (training_runs(cfg, cfg.generations, after, 0),
            search_gpu_hours(cfg, cfg.sharing, gpus_per_member(cfg), cfg.generations, after))


def build_plan(
    cfg: SearchSchema, store: RunStore, resuming: bool, run_id: str | None = None, *,
    report_rows: Sequence[ReportRow],
) -> str:
    """The plan as text: nothing here writes a file or calls a scheduler. ``run_id``: the run's id when
    resuming (a new run gets its id when it starts; the plan shows RUNID in its place). ``report_rows``: the
    result table's rows as composed for this run (meta/search/after/reporting.py plan_rows; none where it has
    no table)."""
    first = _first_generation(store, resuming)
    generations = max(0, cfg.generations - first)
    threads = int(cfg.train["num_threads"])
    alone_min = cfg.search_member_alone_min  # a search member's, at es.member_steps
    sharing = cfg.sharing
    member_min = sharing.member_time(alone_min)  # its expected running time, beside the members on its GPU
    shared_text = (f"{alone_min:g} min alone x slowdown {sharing.slowdown:g} with {sharing.members_per_gpu} members "
                   "per GPU; " if sharing.shared else "")
    lines = [
        f"DRY RUN: nothing is submitted or written. {run_dir_label(cfg.run_dir or '', resuming, 'search')}",
        f"search: population {cfg.population} x "
        + (f"generations {first}..{cfg.generations - 1} ({generations} to run), " if generations else
           f"generations: all {cfg.generations} done (0 to run), ") +
        f"es={cfg.es.name}, retries={cfg.retries}; task={cfg.task.get('name')} "
        f"model={cfg.model.get('name')} train.steps={cfg.full_steps}"
        + (f", es.{MEMBER_STEPS_KEY}={cfg.member_steps}" if cfg.member_steps != cfg.full_steps else ""),
        f"time per member: {round(member_min, 1):g} min expected ({shared_text}"
        f"{member_time_text(cfg.resources_node, cfg.longest_search_member_steps, member_steps_key(cfg))}); "
        f"inner.timeout_s={cfg.inner.timeout_s:g} s ({cfg.inner.timeout_s / 3600:.2f} h) of running time, summed over "
        "requeues" + search_timeout_text(cfg),
        *timeout_headroom_lines(cfg.search_timeout_s, member_min * cfg.seeds_per_member),
    ]
    lines += member_steps_line(cfg)
    part = _launcher_plan(cfg, _plan_context(cfg, generations, first, store, run_id))
    concurrent, gpus, held, cpus, mem, mem_text = (part.concurrent, part.gpus, part.gpus_held, part.cpus, part.mem_gb,
                                                   part.mem_text)
    lines += part.lines
    sharers = int(cfg.resources.members_per_gpu or 1) if held else 1  # members on one GPU at once
    lines += [
        "",
        f"per member: {gpus} GPU, {cpus} CPU (train.num_threads={threads}), memory {mem_text}",
        f"at once: {-(-concurrent // sharers) * held} GPUs, {concurrent * cpus} CPUs"
        + (f", {concurrent * mem:g} GB memory" if mem is not None else ""),
    ]
    member_h = alone_min / 60.0  # alone on its GPU: the sharing's slowdown and split are sharing.gpu_hours's
    shape = generation_shape(cfg)  # the orchestrator's count of a generation (meta/search/generation/generation_shape.py)
    per_generation = shape.jobs
    k = cfg.seeds_per_member
    selection, reporting, done = runs_left(cfg, store, resuming)
    runs = training_runs(cfg, generations, selection, reporting)
    gpu_h = search_gpu_hours(cfg, sharing, gpus, generations, selection + reporting)
    worst_h = gpu_time_h((search_runs(cfg, generations) * cfg.search_timeout_s
                          + (selection + reporting) * cfg.inner.timeout_s) * (cfg.retries + 1) / 3600.0,
                         gpus, sharing.members_per_gpu)
    control = " (population + the control member)" if shape.control else ""
    scope = "what is left of the search" if resuming else "whole search"
    # the members' work is priced alike for every searcher (search_work); an online search's (es=nres) plan describes
    # its truncations, episodes and their information
    lines += (online_lines(cfg, search_work(cfg, generations), generations, selection, reporting, gpus, sharing, scope,
                           online_schedule(cfg, generations, store if resuming else None, first))
              if cfg.searcher_online else [
        f"training runs: {per_generation} per generation{control} x {generations} generations"
        + (f" x seeds_per_member={k} (the same {k} seeds for every member of a generation; a member trains them one "
           "after another)" if k > 1 else "") + " + "
        f"{selection} selection runs ({selection_text(cfg)}) + {reporting} reporting runs (below) = {runs}"
        + (f" left to run (done already: {first} generation(s)" + (f"; {done}" if done else "") + ")"
           if resuming else ""),
        quorum_line(cfg),
        (f"GPU-hours, {scope}: {runs} runs x {sharing.hours_text(member_h, gpus)} = {gpu_h:,.1f} GPU-h"
         if cfg.member_steps == cfg.full_steps else
         f"GPU-hours, {scope}: {search_runs(cfg, generations)} search runs x {sharing.hours_text(member_h, gpus)} "
         f"(es.{MEMBER_STEPS_KEY}={cfg.member_steps}) + {selection + reporting} selection and reporting runs x "
         f"{sharing.hours_text(cfg.member_alone_min / 60.0, gpus)} (train.steps={cfg.full_steps}) = {gpu_h:,.1f} GPU-h"),
        *sharing.plan_lines(per_generation),
        *early_stop_lines(cfg, generations, member_h, gpus, sharing),
        f"GPU-hours, worst case with retries: every member failing at inner.timeout_s and retried "
        f"retries={cfg.retries} time(s) = {worst_h:,.1f} GPU-h",
        f"CPU-hours, {scope}: {_member_hours(cfg, sharing, generations, selection + reporting) * cpus:,.1f} CPU-h",
    ])
    lines += ["", *reporting_lines(cfg, report_rows)]
    lines += ["", *_disk_lines(cfg, concurrent, generations)]
    return "\n".join(lines)


def online_lines(cfg: SearchSchema, work: SearchWork, generations: int, selection: int, reporting: int, gpus: int,
                 sharing: GpuSharing, scope: str, schedule: OnlineSchedule) -> list[str]:
    """An online search's part of the plan: its truncations, their member-steps against a whole-run search's, its
    episodes and the whole-run generations of equal information (``schedule``), the GPU-hours of both searches and
    why they differ, and what a truncation costs besides its steps."""
    horizon = cfg.full_steps
    member_h = cfg.member_alone_min / 60.0
    search_h = sharing.gpu_hours(work.runs, work.alone_h, gpus)
    after_h = sharing.gpu_hours(selection + reporting, member_h, gpus)
    whole_runs = cfg.population * generations + generations  # today's search: every member (and the control) a whole run
    whole_h = sharing.gpu_hours(whole_runs + selection + reporting, member_h, gpus)
    total = search_h + after_h
    return [
        f"es={cfg.es.name}: {cfg.population} particles (antithetic pairs), each a run of train.steps="
        f"{horizon} cut into truncations of {work.steps // max(1, work.runs)} steps (mean); per "
        f"generation every particle trains its next truncation from its own checkpoint; no control member",
        f"member-steps: {cfg.population} x {generations} generations = {work.runs} truncations, "
        f"{work.steps:,} steps = {work.steps / horizon:,.1f} runs of {horizon} steps (a whole-run "
        f"search of the same population and generations trains {whole_runs} runs: "
        f"{whole_runs * horizon:,} steps, {whole_runs * horizon / max(1, work.steps):.1f}x as many)",
        *episode_lines(cfg, schedule, work, generations,
                       (sharing.gpu_hours(work.steps / horizon, member_h, gpus), search_h)),
        quorum_line(cfg),
        f"training runs after the search: {selection} selection runs ({selection_text(cfg)}) + {reporting} reporting "
        f"runs (below), each train.steps={horizon}",
        f"GPU-hours, {scope}: {work.runs} truncations x {sharing.hours_text(work.alone_h, gpus)} "
        f"({_truncation_basis(cfg)}) = {search_h:,.1f} + {selection + reporting} runs x {sharing.hours_text(member_h, gpus)} = "
        f"{after_h:,.1f}; total {total:,.1f} GPU-h",
        *([f"against a whole-run search of the same population and GENERATIONS at the same step time: "
           f"{whole_h:,.1f} GPU-h; this plan is {total / whole_h:.3f} of it because a particle pays for its run once "
           "over the search, not once per generation; but it carries the information of the whole-run generations "
           "of equal information above, not of as many generations: compare searches by those (docs/searchers.md)"]
          if total > 0 else []),  # members without a GPU (resources.gpus=0) cost no GPU-h
        *sharing.plan_lines(generation_shape(cfg).jobs),
        f"CPU-hours, {scope}: "
        f"{(work.runs * sharing.member_time(work.alone_h) + (selection + reporting) * sharing.member_time(member_h)) * int(cfg.train.get('num_threads') or 1):,.1f} CPU-h",
        *truncation_cost_lines(cfg, schedule, scope),
    ]


def _truncation_basis(cfg: SearchSchema) -> str:
    """Where a truncation's hours come from (SearchSchema.search_alone_h), in words."""
    from meta.settings.member_time import short_run_overhead_key

    step_s = cfg.resources.step_time_s
    if step_s is None:
        return "a whole member's time x its share of train.steps (no resources.step_time_s measured)"
    return (f"steps x resources.step_time_s={float(step_s):g} s + resources.{short_run_overhead_key(cfg.resources_node)}"
            f"={cfg.short_run_overhead_min:g} min per truncation (start, model load and compile, boundary checkpoint, "
            "validation)")


def episode_lines(cfg: SearchSchema, schedule: OnlineSchedule, work: SearchWork, generations: int,
                  hours: tuple[float, float] | None = None) -> list[str]:
    """An online search's episodes (one particle run each), the whole-run generations that carry the same
    information, and a warning where the last episode is incomplete. ``hours``: the GPU-hours of those whole-run
    generations and of the online search's truncations, at the same step time."""
    horizon, k, population = cfg.full_steps, schedule.pieces, cfg.population
    whole = work.steps / max(1, population * horizon)
    ends = sorted(schedule.reaching)
    when = (", ".join(str(g) for g in ends) if len(ends) <= 6 else
            f"{len(ends)} of the {generations} generations, from {ends[0]} on") if ends else "none"
    lines = [
        f"episodes: generations={cfg.generations} / {k} pieces (a particle's run of train.steps={horizon} in {k} "
        f"truncations) = {cfg.generations / k:.3g} episodes, one run per particle each; particles end their runs at "
        f"train.steps (an end score there is a real full-run validation pass@1: what selection nominates by and "
        f"meta.status shows as progress) in generation(s) {when}",
        f"equal information: {work.steps:,} member-steps / (population {population} x train.steps="
        f"{horizon}) = {whole:.3g} whole-run generations: whole-run ES with population {population} gets {whole:.3g} "
        f"generations for the same information"
        + (f" ({hours[0]:,.1f} GPU-h at the same step time, against {hours[1]:,.1f} for these truncations, each "
           "paying its own start, checkpoint and validation)" if hours is not None and hours[1] > 0 else "") + "; "
        + f"its centre moves {schedule.updates} times over these {generations} generations (whole-run ES's: "
        f"{whole:.3g})"
        + ((f"; its pairs restart together, so the {k} updates of one episode sum to one whole-run estimate: more "
            "updates, sooner, not more information" if schedule.together else
            "; its pairs are staggered over the run: the same information spread over more updates")
           if schedule.updates > whole else ""),
    ]
    if cfg.generations % k:
        start = cfg.generations // k * k
        late = sum(n for g, n in schedule.reaching.items() if g >= start)
        lines.append(
            f"WARNING: generations={cfg.generations} is not a multiple of the run's {k} pieces: the last episode "
            f"(generations {start}..{cfg.generations - 1}) has {cfg.generations - start} of its {k} truncations"
            + (f", and no particle of it reaches train.steps={horizon} (its runs give no end score, and the centre "
               "has not taken their late pieces into account)" if late == 0 else
               f"; {late} of its truncations reach train.steps={horizon}")
            + f"; use generations={start + k}" + (f" or {start}" if start else ""))
    return lines


def truncation_cost_lines(cfg: SearchSchema, schedule: OnlineSchedule, scope: str) -> list[str]:
    """What an online search's truncations cost besides their steps: the validation of the untouched model at the
    start of every particle run, and the boundary checkpoints written and read (in all, and per generation)."""
    from meta.settings.member_time import short_run_overhead_key

    population = cfg.population
    disk = disk_plan(cfg.inner_config, cfg.full_steps)
    reads = schedule.truncations - schedule.from_step_zero
    validations = (f"validations, {scope}: {schedule.truncations:,} at the truncations' ends + "
                   f"{schedule.from_step_zero:,} at step 0 (the first truncation of a particle's run scores the "
                   f"untouched model before it trains; resources.{short_run_overhead_key(cfg.resources_node)} counts one "
                   "validation per truncation, so these come on top)")
    if disk is None:
        return [validations, f"boundary checkpoints: {schedule.truncations:,} written (one per truncation) and "
                f"{reads:,} read (all but those from step 0); their size is unknown for "
                f"model={cfg.model.get('name')}"]
    ckpt = disk.bytes_per_checkpoint
    return [
        validations,
        f"boundary checkpoint I/O, {scope}: {schedule.truncations:,} written (one per truncation) and {reads:,} read "
        f"(all but those from step 0) x {_gb(ckpt)} = {_gb(schedule.truncations * ckpt)} written, "
        f"{_gb(reads * ckpt)} read",
        f"boundary I/O per generation: {population} particles x {_gb(ckpt)} = {_gb(population * ckpt)} written to "
        "run_dir/particles/ and read back by the next generation (every particle but those starting a new run): the "
        "shared filesystem's load at each generation's start and end",
    ]


def quorum_line(cfg: SearchSchema) -> str:
    """When a generation closes: after all its members, or at its quorum count (the orchestrator's, from the same
    GenerationShape) and the straggler grace."""
    shape = generation_shape(cfg)
    if not shape.closes_early:
        return f"quorum={shape.quorum:g} (every generation waits for all its members)"
    return (f"quorum={shape.quorum:g}: a generation closes {cfg.straggler_grace:g} x its median member time after "
            f"{shape.quorum_count} of {shape.population} members finished; the rest are cancelled as late (the "
            "GPU-hours below are an upper bound)")


def search_timeout_text(cfg: SearchSchema) -> str:
    """The plan's note of a search member's own limit, where it is shorter than the whole run's (an online search's
    later generations' too, where its first generation's truncations are longer)."""
    from meta.searchers import searcher_class  # the registry imports evotorch lazily; the plan asks it here only

    es, limit = cfg.searcher_settings, cfg.inner.timeout_s
    steady = searcher_class(str(es.get("name", ""))).steady_member_steps(es)
    if cfg.search_timeout_s >= limit and (steady is None or cfg.member_timeout_s(steady) >= limit):
        return ""
    text = (f"; a search member's {cfg.search_timeout_s:g} s ({cfg.search_timeout_s / 3600:.2f} h), the limit scaled "
            f"to its {cfg.longest_search_member_steps} steps at resources.step_time_s")
    if steady is not None and steady < cfg.longest_search_member_steps:
        later = cfg.member_timeout_s(steady)
        text += (f" (the first generation's longest truncation: its pairs start spread over the run); each later "
                 f"generation's members and array tasks {later:g} s ({later / 3600:.2f} h), for their {steady} steps")
    return text


def timeout_headroom_lines(timeout_s: float, expected_min: float) -> list[str]:
    """A warning when a member's running-time limit leaves less than TIMEOUT_HEADROOM x its expected time: a
    member slower than expected (seed spread, a slower node, a requeue's reload) would be killed near its end."""
    expected_s = expected_min * 60.0
    if expected_s <= 0 or timeout_s >= TIMEOUT_HEADROOM * expected_s:
        return []
    return [f"WARNING: inner.timeout_s={timeout_s:g} s is {timeout_s / expected_s:.2f}x the expected {expected_s:g} s "
            f"per member, less than {TIMEOUT_HEADROOM:g}x: members slower than expected are killed near the end. "
            f"Raise resources.timeout_factor (or inner.timeout_s) to at least {TIMEOUT_HEADROOM:g}"]


def early_stop_lines(cfg: SearchSchema, generations: int, member_h: float, gpus: int,
                     sharing: GpuSharing) -> list[str]:
    """What early_stop may save: at most the update's ignored members per generation, each stopped at the
    decision step (a member on k seeds decides after its last seed reported, so it saves one run's rest).
    ``member_h``: a member's hours alone on its GPU (``sharing`` adds its slowdown and split)."""
    step = early_stop_step(cfg)
    if step is None:
        return ["early_stop: off (every member trains to its last step)"]
    steps = cfg.member_steps
    capacity = generation_shape(cfg).early_stop_capacity
    rest = 1.0 - step / steps
    saved_runs = generations * capacity * rest
    saved_h = saved_runs * sharing.member_time(member_h)
    return [
        f"early_stop: decided at step {step} of {steps} once {cfg.early_stop.min_reported:g} of the "
        f"population reported; a member is stopped below the median by more than margin {cfg.early_stop.margin:g} x "
        f"noise {cfg.early_stop.noise:g}; at most {capacity} of {cfg.population} per generation (the members the "
        f"update ignores)",
        f"early_stop saves at most {generations} generations x {capacity} members x {rest:.2f} of a run x "
        f"{sharing.hours_text(member_h, gpus)} = {sharing.gpu_hours(saved_runs, member_h, gpus):,.1f} GPU-h "
        f"({saved_h:,.1f} member-h); how many stop "
        "depends on the early scores (docs/early_stop.md has the measured false-cut rates)",
    ]


def _disk_lines(cfg: SearchSchema, concurrent: int, generations: int) -> list[str]:
    # a search member's checkpoints (an online searcher's: its longest truncation's)
    disk = disk_plan(cfg.inner_config, cfg.longest_search_member_steps)
    if disk is None:
        return [f"disk: unknown for model={cfg.model.get('name')} (no parameter count known for it here)"]
    model = cfg.model
    what = (f"LoRA r={model.get('lora_r')} on {', '.join(model.get('lora_target_modules') or [])}"
            if model.get("lora_r") else f"all weights ({model.get('dtype')})")
    ckpt = disk.bytes_per_checkpoint
    pop = generation_shape(cfg).jobs
    policy_text = {
        "none": "none: a member deletes its checkpoints once result.json is written",
        "last": "last: a member keeps its newest checkpoint",
    }.get(disk.policy, "all: every checkpoint is kept" + (
        "" if "keep_checkpoints" in cfg.train else " (train.keep_checkpoints not set: nothing deletes them)"))
    peak_members = concurrent if disk.policy == "none" else pop
    peak_ckpts = peak_members * disk.steady
    member_files = disk.kept * disk.files_per_checkpoint + MEMBER_FILES
    particles = []
    if cfg.searcher_online:
        particles = [f"particles (es={cfg.es.name}): {cfg.population} particles x 1 boundary checkpoint each "
                     f"(the one it stands on; a second while its truncation writes the next) x {_gb(ckpt)} = "
                     f"{_gb(cfg.population * ckpt)} kept through the search, peak {_gb(2 * cfg.population * ckpt)}"]
    return [*particles,
        f"checkpoint: {disk.trainable:,} trainable parameters ({what}) x 3 (weights + Adam's two moments) = "
        f"{_gb(ckpt)} and {disk.files_per_checkpoint} files per checkpoint",
        f"checkpoint policy train.keep_checkpoints={policy_text}; {disk.written} written per member "
        f"({member_steps_key(cfg)}={cfg.longest_search_member_steps} / save_every={cfg.train.get('save_every')})",
        f"disk per member: peak {_gb(disk.steady * ckpt)} ({disk.steady} checkpoint(s); one more for a moment while "
        f"the next is written), left after it finished {_gb(disk.kept * ckpt)}",
        f"disk per generation: peak {_gb(peak_ckpts * ckpt)} ({peak_ckpts} checkpoints, "
        f"{peak_ckpts * disk.files_per_checkpoint:,} files), left after it finished {_gb(pop * disk.kept * ckpt)}",
        f"files per generation once finished: {pop * member_files:,} ({disk.kept} checkpoint(s) x "
        f"{disk.files_per_checkpoint} + {MEMBER_FILES} other files per member)",
        f"whole search, left on disk: {_gb(generations * pop * disk.kept * ckpt)} and "
        f"{generations * pop * member_files:,} files",
    ]
