"""Typed, validated inner-loop configuration (the `model`, `divergence` and `train` nodes; `task` stays a mapping).

A population member runs unattended on some cluster node, so every mistake a user can make in these nodes must
fail here, before any model is loaded, with a message naming the key and the fix. The task node is validated
by the task package itself (``inner_loop.tasks``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from core.config.group_schemas import store_schemas
from core.config.plain_data import plain, refuse_unknown_keys
from core.config.typed_nodes import one_of, typed_node
from core.keys import MEMBER_GPU_MEMORY_KEY, MEMBER_GPU_SHARERS_KEY
# DivergenceConfig and ModelConfig are read here as they were before their homes moved (pickled jobs and callers name
# inner_loop.config); the vocabularies below import no config, so the arrows run one way: config -> loss, models, ...
from inner_loop.loss.divergences import DivergenceConfig as DivergenceConfig, divergence_config as divergence_config
from inner_loop.models.model_config import ModelConfig as ModelConfig
from inner_loop.models.registry import models
from inner_loop.process.pinned import PINNED_THREADS

T = TypeVar("T")

AGGREGATIONS = ("dr_grpo", "grpo", "bnpo")
#: train.keep_checkpoints: what of a member's checkpoints survives once its result.json is final.
KEEP_CHECKPOINTS = ("none", "last", "all")
#: eval_split: the split a run is scored on. ES members never set it (validation); `test` is for a single run's
#: final numbers, never for selecting anything.
EVAL_SPLITS = ("validation", "test")


def node_config(cls: type[T], node: str, data: Mapping[str, Any] | None) -> T:
    """One node (``model``, ``divergence``, ``train``) as its dataclass, unknown keys and wrong types refused, read
    by the one reading every config node and task config shares (core/config/typed_nodes.py). Public so that a
    finished run's stored node can be read without parsing the whole inner config: that must not depend on the
    files its training needed (a ``divergence.init`` that has moved since)."""
    return typed_node(cls, data, node)


@dataclass
class TrainConfig:
    """``train.*``: GRPO host settings, checkpointing and validation; defaults sized so one tiny-model member trains
    and validates in well under a minute on 2 CPU cores. The schema of the train group: registered in Hydra's
    ConfigStore as ``train/schema`` (:func:`register_schemas`), which conf/train/*.yaml name first in their defaults
    lists, so each field here is the one home of its key's type, default and meaning."""

    #: ~25 s on one thread; arith: the reward rises ~+0.03..0.14 over a run
    #: (tests/test_inner_loop/member/test_inner_learning.py; 0: no RL step, the untouched model is scored)
    steps: int = 60
    #: Adam; 1e-3 lowers the tiny model's reward within ~10 steps, 3e-5 barely moves it
    learning_rate: float = 3e-4
    lr_scheduler: str = "constant"
    lr_warmup_steps: int = 0
    weight_decay: float = 0.0
    #: completions per step (a multiple of group_size); 32 prompts: 4 prompts/step make each update chase a few
    #: answers and pull the tiny model toward constant outputs
    batch_size: int = 256
    #: samples per prompt (G)
    group_size: int = 8
    #: optimisation passes per generation batch
    num_iterations: int = 1
    max_completion_length: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    #: HF generate's KV cache (inner_loop/generation/backends.py): dynamic (transformers' default) | static
    #: (preallocated; TRL's cache_implementation=static, decode step eager) | persistent_compiled (one static cache
    #: for the run, reset in place, prompts padded to buckets, the decode step compiled once and replayed, on every
    #: device; transformers' own static_compiled is refused) | persistent_merged (the same on LoRA merged into a
    #: decoding copy of the weights) | owned_loop (the project's own decode loop: LoRA merged, one captured token step
    #: with sampling inside, no host sync per token; temperature/top_p/top_k only). HF generate only (refused with vLLM
    #: or continuous batching); recorded in the result's generation. Off until bench/bench_member_gpu.py measures it faster on the
    #: card (docs/trl_options.md)
    decode_cache: str = "dynamic"
    #: persistent_compiled: how many prompt lengths (buckets) prompts are left-padded to, sized from the training
    #: prompts' token lengths (quantiles, rounded up to 8); the longest bucket + max_completion_length sizes the cache
    decode_buckets: int = 4
    #: owned_loop: the attention windows its token step is compiled (on CUDA captured) for, even steps up to the whole
    #: cache; each step reads the smallest window holding the filled positions, not the whole cache (1: the whole
    #: cache; at most 8). Off until the GPU pass measures it faster on the card
    decode_windows: int = 1
    #: persistent_compiled: torch.compile's backend for the decode step: inductor | aot_eager | eager (the last two
    #: trace the same graphs without generating code)
    decode_compile_backend: str = "inductor"
    #: clip | gspo | kl3_clip | dppo_tv | dppo_kl | spo | drpo (docs/method.md §4)
    policy_loss: str = "clip"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    #: host-specific sizes for later policy terms (e.g. {delta: 0.15}); reach the term as PolicyParams.extra
    policy_extra: dict[str, float] = field(default_factory=dict)
    #: dr_grpo | grpo | bnpo
    aggregation: str = "dr_grpo"
    #: Dr. GRPO: advantage = reward - group mean, no std scaling
    scale_rewards: bool = False
    grad_clip: float = 1.0
    #: TRL checkpoint interval (steps), for resume after preemption
    save_every: int = 20
    #: none | last | all: what survives once the member's result.json is written. none (ES members): checkpoints only
    #: serve resuming an unfinished member and are deleted right after an ok result (a failed member keeps its
    #: newest, which a retry resumes from); last: keep the newest (weights + optimizer, to train on); all: keep every
    #: one. python -m inner_loop.run always also writes the trained model to <work_dir>/final/
    keep_checkpoints: str = "none"
    #: checkpoints the Trainer keeps while training (null: all; ignored with keep_checkpoints=all). 1 is enough to
    #: resume after preemption: the Trainer writes checkpoint N+k completely (trainer_state.json last) before it
    #: deletes N, and a checkpoint killed mid-save is skipped on resume, so a complete one always exists; disk peaks
    #: at 2 during a save. 2 keeps a spare against a node crash that leaves the newest complete-looking but with
    #: unflushed data (the Trainer does not fsync; delete the bad one by hand to fall back)
    save_total_limit: int | None = 1
    #: torch threads per member, so a local population does not oversubscribe the cores
    num_threads: int = 1
    #: validation problems (null: all)
    val_size: int | None = 200
    val_batch_size: int = 64
    #: null: max_completion_length
    val_max_new_tokens: int | None = None
    pass_k: list[int] = field(default_factory=list)
    pass_k_samples: int = 0
    #: intermediate validation pass@1 every this many steps (null: none), for meta.tune's pruner: greedy, on the first
    #: ``eval_subset`` problems of the validation split (the same problems at every step, a subset of the final
    #: validation), one line each in <work_dir>/intermediate.jsonl
    eval_every: int | None = None
    eval_subset: int = 64
    logging_steps: int = 1
    #: where TRL's metrics go (transformers' report_to names): tensorboard (<work_dir>/tensorboard_logs/), wandb
    #: (installed by you), [] none
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    #: full form: batch rows per vocabulary tile (mirror_maps/tiled.py) and per chunk of the vLLM ratio's no-grad
    #: logits (null: sized from the member's full-form budget: 512 MiB on the CPU, a quarter of what its GPU budget
    #: leaves on CUDA)
    full_form_rows: int | None = None
    #: any other field of TRL's GRPOConfig (trl pinned in pyproject.toml), passed through. On the command line one
    #: field: +train.trl.gradient_accumulation_steps=4 (train.batch_size stays the completions per optimizer step),
    #: several: (the ++ is Hydra's, needed here) '++train.trl={use_vllm: true, vllm_mode: colocate,
    #: vllm_gpu_memory_utilization: 0.3}'. Checked before anything is submitted (inner_loop/trl_settings/trl_overrides.py): an
    #: unknown field, a wrong type or a value GRPOConfig rejects exits 2 naming train.trl.<key>; fields set by the
    #: keys above (steps, batch_size, learning_rate, lr_scheduler, seed, ...) are refused there. TRL's report_to comes
    #: from report_to above. See docs/trl_options.md
    trl: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        from inner_loop.loss.policy_registry import POLICY_TERMS, validate_policy_extra

        if self.steps < 0:
            raise ValueError(f"train.steps must be >= 0 (0: no RL step, the untouched model is scored), got "
                             f"{self.steps}")
        if self.group_size < 2:
            raise ValueError(f"train.group_size must be >= 2 (advantages are group-relative), got {self.group_size}")
        if self.batch_size < 1 or self.batch_size % self.group_size:
            raise ValueError(
                f"train.batch_size ({self.batch_size}) must be a positive multiple of train.group_size "
                f"({self.group_size}): every prompt is sampled group_size times in one batch"
            )
        one_of("train.policy_loss", self.policy_loss, tuple(POLICY_TERMS))
        validate_policy_extra(self.policy_loss, self.policy_extra)
        one_of("train.aggregation", self.aggregation, AGGREGATIONS)
        if self.keep_checkpoints not in KEEP_CHECKPOINTS:
            raise ValueError(
                f"train.keep_checkpoints={self.keep_checkpoints!r} is not one of {list(KEEP_CHECKPOINTS)} "
                "(none: delete a member's checkpoints once its result is written; last: keep the newest; all: keep "
                "every one)"
            )
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise ValueError(f"train.save_total_limit must be >= 1 or null (no rotation), got {self.save_total_limit}"
                             "; 1 is enough to resume after preemption")
        for key in ("learning_rate", "temperature", "top_p", "epsilon_low", "epsilon_high", "grad_clip"):
            if not getattr(self, key) > 0:
                raise ValueError(f"train.{key} must be > 0, got {getattr(self, key)}")
        for key in ("num_iterations", "max_completion_length", "save_every", "num_threads",
                    "val_batch_size", "logging_steps"):
            if getattr(self, key) < 1:
                raise ValueError(f"train.{key} must be >= 1, got {getattr(self, key)}")
        if self.full_form_rows is not None and self.full_form_rows < 1:
            raise ValueError(f"train.full_form_rows must be >= 1 or null (sized from memory), got {self.full_form_rows}")
        if self.val_size is not None and self.val_size < 1:
            raise ValueError(f"train.val_size must be >= 1 or null (all), got {self.val_size}")
        if self.eval_every is not None and self.eval_every < 1:
            raise ValueError(f"train.eval_every must be >= 1 or null (no intermediate validation), got {self.eval_every}")
        if self.eval_subset < 1:
            raise ValueError(f"train.eval_subset must be >= 1, got {self.eval_subset}")
        if any(k < 1 for k in self.pass_k) or (self.pass_k and self.pass_k_samples < max(self.pass_k)):
            raise ValueError("train.pass_k needs values >= 1 and train.pass_k_samples >= max(train.pass_k)")
        from inner_loop.trl_settings.trl_overrides import check_report_to, check_trl_overrides

        self.report_to = check_report_to(self.report_to)

        self.trl = check_trl_overrides(self.trl, batch_size=self.batch_size)
        from inner_loop.generation.backends import decode_cache_refusal

        refusal = decode_cache_refusal(self.decode_cache, self.trl)  # after train.trl's own check: its fields are sound
        if refusal:
            raise ValueError(refusal)
        from inner_loop.generation.backends import COMPILE_BACKENDS, sampling_refusal

        refusal = sampling_refusal(self.trl)
        if refusal:
            raise ValueError(refusal)

        if self.decode_buckets < 1:
            raise ValueError(f"train.decode_buckets must be >= 1, got {self.decode_buckets}")
        from inner_loop.generation.backends import MAX_DECODE_WINDOWS, OWNED_LOOP

        if not 1 <= self.decode_windows <= MAX_DECODE_WINDOWS:
            raise ValueError(f"train.decode_windows must be in [1, {MAX_DECODE_WINDOWS}], got {self.decode_windows}")
        if self.decode_windows > 1 and self.decode_cache != OWNED_LOOP:
            raise ValueError(f"train.decode_windows={self.decode_windows} applies to train.decode_cache={OWNED_LOOP} "
                             f"only (this run decodes with {self.decode_cache})")
        one_of("train.decode_compile_backend", self.decode_compile_backend, COMPILE_BACKENDS)


#: extra_evaluations[i].name of the run's own task's test split; a transfer task's is TRANSFER_PREFIX + its name
OWN_TEST_EVALUATION = "test"
TRANSFER_PREFIX = "transfer/"


@dataclass
class ExtraEvaluation:
    """One more score of the trained model, after its fitness: greedy pass@1 on the TEST split of ``task`` (a task
    node like conf/task/*.yaml; None: the run's own task). Why in the run: the model is in memory there, and a
    paper row (in-domain test, transfer) needs no kept model; the node itself is validated by the task package."""

    name: str
    task: dict[str, Any] | None = None


def _extra_evaluations(value: Any) -> list[ExtraEvaluation]:
    """``extra_evaluations`` checked for shape and names (the task nodes' keys are checked when the run's data is
    prepared); ValueError naming ``extra_evaluations[i]``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"extra_evaluations must be a list of {{name, task}} mappings, got {value!r}")
    out: list[ExtraEvaluation] = []
    for index, item in enumerate(value):
        where = f"extra_evaluations[{index}]"
        if not isinstance(item, dict) or "name" not in item:
            raise ValueError(f"{where} must be a mapping with a name and a task (null: the run's own), got {item!r}")
        refuse_unknown_keys(item, ("name", "task"), where)
        name, task = item["name"], item.get("task")
        if task is not None and (not isinstance(task, dict) or not isinstance(task.get("name"), str)):
            raise ValueError(f"{where}.task must be null (the run's own task) or a task node with a name "
                             f"(like conf/task/*.yaml), got {task!r}")
        expected = OWN_TEST_EVALUATION if task is None else TRANSFER_PREFIX + task["name"]
        scored = "the run's own test split" if task is None else f"task {task['name']!r}"
        if name != expected:
            raise ValueError(f"{where}.name={name!r}: the evaluation on {scored} is named {expected!r}")
        if any(e.name == name for e in out):
            raise ValueError(f"{where}.name={name!r} appears twice; one evaluation per name")
        out.append(ExtraEvaluation(name=name, task=task))
    return out


def _fraction(value: Any) -> float:
    """resources.gpu_memory_fraction as the member gets it: in (0, 1]; ValueError naming the key otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"resources.{MEMBER_GPU_MEMORY_KEY}={value!r} must be in (0, 1]: the member's share of its "
                         "GPU's memory (1: one member per GPU; 0.5: two members packed on one)")
    return float(value)


def _sharers(value: Any) -> int:
    """resources.members_per_gpu as the member gets it: a count >= 1; ValueError naming the key otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"resources.{MEMBER_GPU_SHARERS_KEY}={value!r} must be a count >= 1: how many members "
                         "share this member's GPU")
    return value


@dataclass
class InnerConfig:
    """One training run: task mapping (validated by the task package), model, divergence, train, seed."""

    task: dict[str, Any]
    model: ModelConfig
    divergence: DivergenceConfig
    train: TrainConfig
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    eval_split: str = "validation"
    #: scored after the fitness, on the same trained model (a single run's paper numbers; ES members have none)
    extra_evaluations: list[ExtraEvaluation] = field(default_factory=list)
    #: the member's share of its GPU's memory (resources.gpu_memory_fraction): its generation cache and full-form
    #: chunks are sized from it (inner_loop/generation/memory.py), never from the device's free memory
    gpu_memory_fraction: float = 1.0
    #: how many members share this member's GPU (resources.members_per_gpu; 1: it has the card alone). Its vLLM
    #: engine gets 1/k of the configured utilization and starts while the others on the card wait
    members_per_gpu: int = 1

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], seed: int | None = None) -> "InnerConfig":
        """Parse and validate the resolved inner config; raises ValueError naming the offending key."""
        data = plain(data)
        missing = [k for k in ("task", "model", "divergence", "train") if k not in data]
        if missing:
            raise ValueError(f"inner config is missing node(s) {missing} (see conf/inner.yaml)")
        task = data["task"]
        if not isinstance(task, dict) or not task.get("name"):
            raise ValueError("task.name is required (e.g. task=arith)")
        cfg = cls(
            task=task,
            model=node_config(ModelConfig, "model", data["model"]),
            divergence=divergence_config(data["divergence"]),
            train=node_config(TrainConfig, "train", data["train"]),
            seed=int(data.get("seed", 0) if seed is None else seed),
            options=dict(data.get("options") or {}),
            eval_split=str(data.get("eval_split") or "validation"),
            extra_evaluations=_extra_evaluations(data.get("extra_evaluations")),
            gpu_memory_fraction=_fraction(data.get(MEMBER_GPU_MEMORY_KEY, 1.0)),
            members_per_gpu=_sharers(data.get(MEMBER_GPU_SHARERS_KEY, 1)),
        )
        one_of("eval_split", cfg.eval_split, EVAL_SPLITS)
        if cfg.eval_split != "validation" and cfg.train.eval_every is not None:
            raise ValueError(f"train.eval_every scores the validation split while training; with eval_split="
                             f"{cfg.eval_split} set train.eval_every=null")
        cfg.model.validate()
        cfg.divergence.validate()
        cfg.train.validate()
        if cfg.model.cpu_numerics == "pinned" and cfg.train.num_threads != PINNED_THREADS:
            raise ValueError(f"model.cpu_numerics=pinned computes with {PINNED_THREADS} thread (a threaded reduction "
                             f"sums in another order), but train.num_threads={cfg.train.num_threads}; set "
                             f"train.num_threads={PINNED_THREADS} or model.cpu_numerics=native")
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: the train group's schema in Hydra's ConfigStore (``train/schema``): conf/train/*.yaml name it first in their
#: defaults lists and set only what differs from TrainConfig
TRAIN_SCHEMA = "schema"


def register_schemas() -> None:
    """Put the schemas of the train, divergence, model and task groups in Hydra's ConfigStore (idempotent):
    TrainConfig as ``train/schema``, each registered divergence's config class as ``divergence/<name>_schema``
    (inner_loop.loss.divergences.register_schemas), for each registered model (built-in or an entry point's)
    ModelConfig with its name as ``model/<name>_schema``, and each task's config class as ``task/<name>_schema``
    (inner_loop.tasks.register_schemas). Whoever composes conf/ calls it first (meta's compose,
    inner_loop.run, the transfer's task composition); a group YAML that names a schema composes on it, so a key the
    schema lacks or a value of the wrong type is refused while composing."""
    from hydra.core.config_store import ConfigStore

    from inner_loop.loss.divergences import register_schemas as register_divergences
    from inner_loop.tasks import register_schemas as register_tasks

    store = ConfigStore.instance()
    if f"{TRAIN_SCHEMA}.yaml" not in store.repo.get("train", {}):  # each compose calls this: store it once
        store.store(group="train", name=TRAIN_SCHEMA, node=TrainConfig)
    register_divergences()
    store_schemas(store, "model", models(), _model_schema, _REGISTERED_MODELS)
    register_tasks()


#: the models whose schema this process has put in Hydra's ConfigStore (each compose calls register_schemas)
_REGISTERED_MODELS: dict[str, Any] = {}


def _model_schema(entry: Any) -> Any:
    """A model's YAML's schema: ModelConfig with the entry's name."""
    from omegaconf import OmegaConf

    node = OmegaConf.structured(ModelConfig)
    node.name = entry.name
    return node
