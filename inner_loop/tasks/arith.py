"""Procedurally generated integer arithmetic: the embedded default task, small enough for a CPU-trained model.

Prompts look like "37+5=" and the answer is the exact integer result. Each problem belongs to exactly one
split, decided by the hash of its prompt (80% train / 10% validation / 10% test of the problem space), and each
split is drawn with its own seed. So the splits are disjoint by construction, a split's problems do not change
when another split's size changes, and `check_disjoint` confirms it on every load.

Reward: the FIRST integer in the completion (optional minus and digits, so "42", " 42<eos>" and "42 is it"
all read 42) must equal the answer exactly; anything else scores 0.
"""
from __future__ import annotations

import hashlib
import random
import string
from dataclasses import astuple, dataclass, field, replace

from inner_loop.tasks.base import Problem, SplitTask
from inner_loop.tasks.common.numbers import first_integer
from inner_loop.tasks.task_config import require_non_negative

OPERATORS = ("+", "-", "*")
MAX_PROMPT_CHARS = 23
# The fraction of the problem space owned by each split, as [start, end) ranges of a prompt's hash in [0, 1).
_SPLIT_RANGES = {"train": (0.0, 0.8), "validation": (0.8, 0.9), "test": (0.9, 1.0)}
_SPLIT_STREAM = {"train": 0, "validation": 1, "test": 2}
#: the splits drawn in this process, by the config's values: a search's up-front check validates every member config
#: it will run (the search's, the control's, each result-table row's: 9 on the embedded default), and each drew the
#: same 4,400 problems again (0.18 CPU-s each); a task's splits are a pure function of its config
_DRAWN: dict[str, dict[str, tuple[Problem, ...]]] = {}
_DRAWN_KEPT = 16


@dataclass
class ArithConfig:
    """The schema of task=arith: conf/task/arith.yaml composes on it (task/arith_schema, with its
    name), so each field is the one home of its key's type, default and meaning."""

    #: number of distinct training problems (must be <= half the training share of the problem space)
    train_size: int = 4000
    #: number of validation problems; validation pass@1 on these is a population member's fitness
    validation_size: int = 200
    #: number of held-out test problems (reporting only, never fitness)
    test_size: int = 200
    #: base seed; train / validation / test draw from separate streams derived from it
    seed: int = 0
    #: each operand has between min_digits and max_digits digits (digit count drawn uniformly, then the number)
    min_digits: int = 1
    max_digits: int = 2
    #: operators to use, any non-empty subset of ["+", "-", "*"]; addition only by default (learnable by the tiny model)
    operators: list[str] = field(default_factory=lambda: ["+"])
    #: if false, a - b is drawn with a >= b so answers are never negative
    allow_negative: bool = False
    #: prompt format with fields {a}, {op}, {b} (format specs allowed); prompts must stay <= 23 characters. Zero-padded
    #: operands ("07+38=") line the digits up at fixed positions: the tiny model learns addition ~3x faster than with
    #: "7+38=" (greedy pass@1 0.56 vs 0.08 after 600 warm-up steps), so RL has a learnable task.
    prompt_template: str = "{a:02d}{op}{b:02d}="


def _hash_unit(prompt: str) -> float:
    """A stable pseudo-uniform number in [0, 1) for a prompt (independent of PYTHONHASHSEED)."""
    return int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big") / 2.0**64


class ArithTask(SplitTask):
    name = "arith"
    config_class = ArithConfig
    reward = "1 when the first integer in the completion is the exact answer, else 0"

    def __init__(self, config: ArithConfig) -> None:
        super().__init__()
        self.config = config
        self._validate()

    def _validate(self) -> None:
        c = self.config
        require_non_negative(self.name, train_size=c.train_size, validation_size=c.validation_size,
                             test_size=c.test_size)
        if not 1 <= c.min_digits <= c.max_digits <= 9:
            raise ValueError(
                f"task 'arith': need 1 <= task.min_digits <= task.max_digits <= 9, got {c.min_digits}, {c.max_digits}"
            )
        if not c.operators or any(op not in OPERATORS for op in c.operators):
            raise ValueError(f"task 'arith': task.operators={c.operators!r}; use a non-empty subset of {OPERATORS}")
        if len(set(c.operators)) != len(c.operators):
            raise ValueError(f"task 'arith': task.operators={c.operators!r} repeats an operator")
        widest = 10**c.max_digits - 1
        try:
            longest = c.prompt_template.format(a=widest, op="*", b=widest)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"task 'arith': task.prompt_template={c.prompt_template!r} is not a valid template with the "
                f"fields {{a}}, {{op}}, {{b}} ({exc!r})"
            ) from exc
        # Fields may carry a format spec ("{a:02d}" zero-pads operands to a fixed width, which lines digits up).
        fields = {name for _, name, _, _ in string.Formatter().parse(c.prompt_template) if name is not None}
        for needed in ("a", "op", "b"):
            if needed not in fields:
                raise ValueError(f"task 'arith': task.prompt_template must contain {{{needed}}}")
        if len(longest) > MAX_PROMPT_CHARS:
            raise ValueError(
                f"task 'arith': prompts can reach {len(longest)} characters ({longest!r}); keep them <= "
                f"{MAX_PROMPT_CHARS} for the tiny model by lowering task.max_digits or shortening task.prompt_template"
            )
        for split in ("train", "validation", "test"):
            size = getattr(c, f"{split}_size")
            start, end = _SPLIT_RANGES[split]
            capacity = self._space_size() * (end - start)
            if size > capacity / 2:
                raise ValueError(
                    f"task 'arith': task.{split}_size={size} is too large for this problem space (about "
                    f"{int(capacity)} distinct {split} problems with digits {c.min_digits}..{c.max_digits} and "
                    f"operators {c.operators}); lower task.{split}_size or raise task.max_digits"
                )

    def _operand_count(self) -> int:
        c = self.config
        low = 0 if c.min_digits == 1 else 10 ** (c.min_digits - 1)
        return 10**c.max_digits - low

    def _space_size(self) -> float:
        """A lower bound on the number of distinct prompts (subtraction without negatives halves its pairs)."""
        n = self._operand_count()
        per_op = [n * n / 2 if op == "-" and not self.config.allow_negative else n * n for op in self.config.operators]
        return float(sum(per_op))

    def _operand(self, rng: random.Random) -> int:
        """Digit count uniform in [min_digits, max_digits], then a uniform number with that many digits;
        short numbers are thereby common, which gives a tiny model easy problems to start from."""
        digits = rng.randint(self.config.min_digits, self.config.max_digits)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return rng.randint(low, 10**digits - 1)

    def _draw(self, rng: random.Random) -> tuple[int, str, int]:
        a, op, b = self._operand(rng), rng.choice(self.config.operators), self._operand(rng)
        if op == "-" and not self.config.allow_negative and a < b:
            a, b = b, a
        return a, op, b

    def _generate(self, split: str) -> list[Problem]:
        size = getattr(self.config, f"{split}_size")
        start, end = _SPLIT_RANGES[split]
        rng = random.Random(f"arith/{self.config.seed}/{_SPLIT_STREAM[split]}")
        problems: list[Problem] = []
        seen: set[str] = set()
        attempts, limit = 0, 200 * size + 1000
        while len(problems) < size:
            attempts += 1
            if attempts > limit:  # unreachable with the capacity check above; guards against a bad edit
                raise ValueError(f"task 'arith': could not draw {size} distinct {split} problems; lower task.{split}_size")
            a, op, b = self._draw(rng)
            prompt = self.config.prompt_template.format(a=a, op=op, b=b)
            if prompt in seen or not start <= _hash_unit(prompt) < end:
                continue
            seen.add(prompt)
            answer = a + b if op == "+" else a - b if op == "-" else a * b
            problems.append(Problem(id=f"arith-{split}-{len(problems)}", prompt=prompt, answer=str(answer),
                                    meta={"a": a, "op": op, "b": b}))
        return problems

    def _build_splits(self) -> dict[str, list[Problem]]:
        key = repr(astuple(self.config))
        if key not in _DRAWN:
            if len(_DRAWN) >= _DRAWN_KEPT:
                _DRAWN.pop(next(iter(_DRAWN)))
            _DRAWN[key] = {split: tuple(self._generate(split)) for split in ("train", "validation", "test")}
        # problems of their own (a Problem's meta is a dict its holder may change)
        return {split: [replace(problem, meta=dict(problem.meta)) for problem in problems]
                for split, problems in _DRAWN[key].items()}

    def score(self, problem: Problem, completion: str) -> float:
        value = first_integer(completion)
        return 1.0 if value is not None and value == int(problem.answer) else 0.0

    def demonstration(self, problem: Problem) -> str:
        """The bare answer; the end-of-sequence token the tokenizer appends is the terminator."""
        return problem.answer
