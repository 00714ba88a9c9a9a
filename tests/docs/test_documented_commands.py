"""Every command line the documentation shows runs: README.md, docs/*.md and the comments of conf/**/*.yaml.

Where the commands come from, mechanically, so that a newly documented command is tested without touching this file:

- README.md and docs/*.md: every line of a fenced code block whose info string is bash, sh, shell or console (a line
  ending in a backslash goes on on the next; ``# ...`` after the command is a comment). A command line anywhere else in
  a page (an indented block, a text block) fails ``test_markdown_commands_are_in_command_blocks``.
- conf/**/*.yaml: every ``python -m`` in a comment: the backticked span when it is in backticks, else the module and
  the arguments after it that are ``key=value``, ``+key=value`` or ``-flag``, up to the first word that is none of
  these (the prose that follows).

What "runs" means, per program: everything the command checks before it starts working, through its own entry point,
in this process, and no work (nothing trains, nothing is submitted, nothing waits):

- ``meta.run``, ``meta.pilot``, ``meta.tune``, ``meta.stage``: the command with ``dry_run=true`` added (its own dry
  run: compose, validate every member's config, print the plan; it writes and submits nothing);
- ``inner_loop.run``: the real entry point (Hydra's composition, ``-m`` sweeps included, and ``validate_inner``) with
  the training function replaced by a recorder, which must have been reached;
- ``inner_loop.evaluate``: the real entry point up to loading the trained model (the arguments, the finished run, the
  task composed and its test problems loaded), which must have been reached;
- ``meta.status``, ``meta.export``, ``meta.reevaluate``, ``results.report``, ``results.compare``: the whole command, on
  run directories prepared by small runs with the synthetic objective (``--watch`` shows one frame and is
  interrupted, as Ctrl-C would);
- ``bench/*.py``: the script's own argument parser on the documented arguments (a benchmark itself takes minutes);
  so are the Python scripts that ``scripts/*.sh`` exec (``scripts/gpu_pass.sh``, ``scripts/node_bundle.sh``);
- ``scripts/main.sh``: the command the script execs, read from the script, with the documented arguments, as above.

Placeholders in the docs (``outputs/meta_...``, ``<pilot dir>``, ...) are replaced by the prepared directories
(PLACEHOLDERS); commands that read a hub dataset or model get the repository's fixtures instead (HUB_DATA: there is no
network here). Commands this test cannot run cheaply are listed in UNCHECKABLE with the reason. Each table is checked
to be in use, so none of them grows entries that hide nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import re
import runpy
import shlex
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
logger = logging.getLogger(__name__)

COMMAND_FENCES = ("bash", "sh", "shell", "console")
FENCE = re.compile(r"^\s*```\s*([A-Za-z0-9_+-]*)\s*$")
INTERPRETERS = ("python", "python3", ".venv/bin/python")
ENV_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")
#: a line that is a command: what test_markdown_commands_are_in_command_blocks looks for outside command blocks
COMMAND_LINE = re.compile(r"^\s*(?:[A-Z_][A-Z0-9_]*=\S+\s+)*(?:python3?\s|\.venv/bin/python\s|scripts/\S+\.sh\b)")

#: placeholder -> the prepared directory (a field of Prepared) the test puts in its place
PLACEHOLDERS: dict[str, str] = {
    "outputs/meta_...": "search",        # the run dir a search prints when it starts
    "outputs/tune_...": "tune",          # a tuning's run dir
    "<pilot dir>": "pilot",              # a pilot's run dir
    "outputs/inner/<run>": "single_run",  # a finished single run's work_dir
    "<finished run>": "single_run",
    "outputs/inner/...": "single_runs",  # a folder of finished single runs
}
#: placeholders that stand for the run dir of the command they are in: (program, placeholder) -> prepared directory
PLACEHOLDERS_BY_PROGRAM: dict[tuple[str, str], str] = {
    ("python -m meta.run", "<run>"): "search",
    ("python -m meta.run", "<run dir>"): "search",
    ("python -m meta.tune", "<run dir>"): "tune",
}
#: hub repository -> (the overrides that select it, the overrides that put the repository's fixtures in the hub's format
#: in its place; tests/test_meta/settings/test_experiments.py composes the presets the same way). A hub model gets a local
#: directory in place of its staged snapshot (docs/usage.md "Staged, offline members"): no command checked here reads
#: its weights.
HUB_DATA: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "google-research-datasets/mbpp": (
        ("experiment=mbpp_qwen3", "task=mbpp"),
        (f"task.train_file={FIXTURES / 'mbpp_train.jsonl'}", f"task.test_file={FIXTURES / 'mbpp_test.jsonl'}",
         "task.validation_size=2")),
    "Qwen/Qwen3-1.7B": (("experiment=mbpp_qwen3", "experiment=gsm8k_qwen3", "model=qwen3_1_7b"),
                        (f"model.name_or_path={FIXTURES}",)),
    "openai/gsm8k": (
        ("experiment=gsm8k_qwen3", "task=gsm8k"),
        (f"task.train_file={FIXTURES / 'gsm8k_train.jsonl'}", f"task.test_file={FIXTURES / 'gsm8k_test.jsonl'}",
         "task.validation_size=2")),
}
#: programs whose documented commands this test does not run, and why
UNCHECKABLE: dict[str, str] = {
    "scripts/test.sh": "it is the whole test suite, this test included, and it starts a SLURM cluster as root",
    "scripts/local_slurm/up.sh": "it installs SLURM and MariaDB with apt and starts their daemons as root",
    "scripts/local_slurm/status.sh": "it reports on a cluster this test does not start: its exit status says whether "
                                     "one is up, not whether the command works",
    "scripts/local_slurm/down.sh": "it stops the cluster that other sessions' SLURM tests may be using",
    "scancel": "it signals a running SLURM job (tests/slurm/test_slurm_failures.py sends the requeue signal for real)",
    "tensorboard": "it starts TensorBoard's web server, which runs until it is stopped",
    "trl": "`trl vllm-serve` starts a vLLM server, which runs until it is stopped and syncs weights over NCCL (a GPU) "
           "(docs/trl_options.md)",
    "python -m pytest": "it runs test files of this suite (the CUDA ones on a GPU), which the suite itself runs",
    "python -m pip": "it installs a node bundle's wheels on a GPU node (tests/scripts/test_node_bundle.py installs a "
                     "bundle the same way, into a folder of its own)",
    "export": "it sets the shell's environment for the commands after it (the node bundle's PYTHONPATH and PATH)",
}
#: entry points checked through their own dry run
DRY_RUN = ("python -m meta.run", "python -m meta.pilot", "python -m meta.tune", "python -m meta.stage")
#: entry points run for real on the prepared run directories (cheap: they read, report or export)
RUN_ON_PREPARED = ("python -m meta.status", "python -m meta.export", "python -m meta.reevaluate",
                   "python -m results.report", "python -m results.compare", "python -m meta.early_cuts")
#: entry points whose whole run is their work (tests/test_inner_loop/numerics/test_fingerprint.py runs it): their arguments
#: are checked
PARSE_ONLY = ("python -m inner_loop.fingerprint",)
MAIN_SH_EXEC = re.compile(r'^exec \.venv/bin/python -m (\S+) "\$@"$', re.MULTILINE)
#: a script of scripts/ that runs a Python script of scripts/ with its arguments (its parser is checked, as a bench's)
SCRIPT_EXEC = re.compile(r'^exec "\$PY" (scripts/\S+\.py) "\$@"$', re.MULTILINE)
SANDBOX_OVERRIDE = "+task.sandbox.require_isolation=true"


# ------------------------------------------------------------------ what the documentation shows
@dataclass(frozen=True)
class Documented:
    source: str  # path:line
    text: str    # the command as written, comment stripped, continuations joined

    @property
    def tokens(self) -> list[str]:
        return shlex.split(self.text)


def strip_comment(line: str) -> str:
    """The line without a shell comment: a ``#`` at the start or after whitespace, outside quotes."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _shown(path: Path) -> str:
    """The path as a message shows it: relative to the repository when it is inside."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def markdown_commands(path: Path) -> list[Documented]:
    """Every command line of the page's command blocks."""
    found: list[Documented] = []
    in_block, commands, pending, start = False, False, "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            in_block, commands = (False, False) if in_block else (True, fence.group(1) in COMMAND_FENCES)
            continue
        if not (in_block and commands):
            continue
        text = strip_comment(line.strip())
        if not text and not pending:
            continue
        start = start if pending else number
        if text.endswith("\\"):
            pending += text[:-1].rstrip() + " "
            continue
        found.append(Documented(f"{_shown(path)}:{start}", pending + text))
        pending = ""
    return found


def _yaml_command(comment: str, at: int) -> str:
    """The ``python -m`` command starting at ``comment[at:]``: its backticked span, or its arguments up to prose."""
    if comment[:at].count("`") % 2 == 1:
        end = comment.find("`", at)
        return comment[at:] if end < 0 else comment[at:end]
    words = comment[at:].split()
    taken = words[:3]  # python -m <module>
    for word in words[3:]:
        if not ("=" in word or word.startswith("-")):
            break
        taken.append(word)
    taken[-1] = taken[-1].rstrip(".,;:")
    return " ".join(taken)


def yaml_commands(path: Path) -> list[Documented]:
    """Every ``python -m`` command in the file's comments."""
    found: list[Documented] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        hash_at = line.find("#")
        if hash_at < 0:
            continue
        comment = line[hash_at:]
        for match in re.finditer(r"python -m ", comment):
            found.append(Documented(f"{_shown(path)}:{number}", _yaml_command(comment, match.start())))
    return found


def markdown_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_commands() -> list[Documented]:
    commands = [c for page in markdown_pages() for c in markdown_commands(page)]
    commands += [c for path in sorted((ROOT / "conf").rglob("*.yaml")) for c in yaml_commands(path)]
    return commands


COMMANDS = documented_commands()


# ------------------------------------------------------------------ which program a command runs
@dataclass(frozen=True)
class Program:
    name: str                 # "python -m meta.run", "python bench/bench_sandbox.py", "scripts/main.sh", "scancel"
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


def program_of(tokens: list[str]) -> Program:
    env = []
    while tokens and ENV_ASSIGNMENT.match(tokens[0]):
        key, _, value = tokens[0].partition("=")
        env.append((key, value))
        tokens = tokens[1:]
    assert tokens, "a command with nothing to run"
    if tokens[0] in INTERPRETERS:
        if tokens[1] == "-m":
            return Program(f"python -m {tokens[2]}", tuple(tokens[3:]), tuple(env))
        return Program(f"python {tokens[1]}", tuple(tokens[2:]), tuple(env))
    return Program(tokens[0], tuple(tokens[1:]), tuple(env))


def delegated(program: Program) -> Program:
    """scripts/main.sh runs set-up, then execs one entry point with its arguments: that entry point. A script that
    execs a Python script of scripts/ with its arguments (``exec "$PY" scripts/x.py "$@"``): that script."""
    script = ROOT / program.name
    if program.name.startswith("scripts/") and program.name.endswith(".sh") and script.is_file():
        found = SCRIPT_EXEC.findall(script.read_text())
        if found:
            return Program(f"python {found[0]}", program.args, program.env)
    if program.name != "scripts/main.sh":
        return program
    (module,) = MAIN_SH_EXEC.findall((ROOT / "scripts" / "main.sh").read_text())
    return Program(f"python -m {module}", program.args, program.env)


# ------------------------------------------------------------------ the prepared directories
@dataclass(frozen=True)
class Prepared:
    search: Path       # a finished search with both re-evaluation stages
    tune: Path         # a finished tuning
    pilot: Path        # a finished pilot
    single_run: Path   # a finished single run, its model in final/
    single_runs: Path  # the folder holding it
    work: Path         # the directory the commands run in (relative outputs land here)


@dataclass
class Outcome:
    exit_code: int
    stdout: str
    stderr: str = ""
    trained: list[Any] = field(default_factory=list)   # the specs inner_loop.run would have trained
    evaluation: Any = None                             # the checked plan inner_loop.evaluate would have scored
    parsed: Any = None                                 # the arguments a parse-only check accepted


class ReachedWork(Exception):
    """The command passed its checks and was about to load a model: where this test stops it."""


@dataclass
class _Validated:
    """What the recorder standing in for train_member returns to inner_loop.run: the run was configured and checked."""

    spec: Any
    ok: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"validated": True, "work_dir": self.spec.work_dir}


@contextlib.contextmanager
def separate_process_state() -> Iterator[None]:
    """Undo what an entry point changes in this process and a process of its own would take with it: sys.argv and
    sys.path, the environment, the root logger (Hydra's job logging replaces its handlers, the meta commands set its
    level), Hydra's global state and torch's thread count."""
    import torch
    from hydra.core.global_hydra import GlobalHydra

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    argv, path, environ = list(sys.argv), list(sys.path), dict(os.environ)
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        sys.argv[:], sys.path[:] = argv, path
        os.environ.clear()
        os.environ.update(environ)
        GlobalHydra.instance().clear()
        torch.set_num_threads(threads)


def _exit_code(code: Any) -> int:
    return 0 if code is None else code if isinstance(code, int) else 1


def run_python(module: str | None, script: Path | None, args: list[str]) -> int:
    """``python -m module args`` or ``python script args`` in this process: its exit status."""
    with separate_process_state(), warnings.catch_warnings():
        # runpy re-executes a module the tests imported already; that is the point, not a hazard here
        warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package",
                                category=RuntimeWarning)
        sys.argv[:] = [module or str(script), *args]
        try:
            if module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exc:
            return _exit_code(exc.code)
    return 0


def resolved(command: Documented, prepared: Prepared) -> Program:
    """The program the command runs, with every placeholder replaced and hub data swapped for the fixtures."""
    name = program_of(command.tokens).name
    table = {**PLACEHOLDERS, **{p: d for (n, p), d in PLACEHOLDERS_BY_PROGRAM.items() if n == name}}
    text = command.text
    for placeholder in sorted(table, key=len, reverse=True):
        text = text.replace(placeholder, shlex.quote(str(getattr(prepared, table[placeholder]))))
    unresolved = re.findall(r"<[^>]*>|\S*\.\.\.\S*", text)
    assert not unresolved, (f"{command.source}: unresolved placeholder(s) {unresolved}: add them to PLACEHOLDERS with "
                            "the directory they stand for")
    program = delegated(program_of(shlex.split(text)))
    args = list(program.args)
    for selectors, fixture_overrides in HUB_DATA.values():
        if any(arg in selectors for arg in args):
            args += fixture_overrides
    return Program(program.name, tuple(args), program.env)


#: outcomes by the command line checked: a command documented in several places is run once
_CHECKED: dict[tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]], Outcome] = {}


def check(command: Documented, prepared: Prepared, monkeypatch: pytest.MonkeyPatch,
          capsys: pytest.CaptureFixture[str]) -> Outcome:
    """Run ``command`` as far as it goes before any work (see the module docstring)."""
    program = resolved(command, prepared)
    checked = (program.name, program.args, program.env)
    if checked in _CHECKED:
        return _CHECKED[checked]
    args = list(program.args)
    outcome = Outcome(exit_code=-1, stdout="")
    with monkeypatch.context() as patch:
        for key, value in program.env:
            patch.setenv(key, value)
        patch.chdir(prepared.work)
        module, script = _prepare_program(command, program, outcome, patch)
        if program.name in DRY_RUN and "dry_run=true" not in args:
            args.append("dry_run=true")
        capsys.readouterr()
        try:
            outcome.exit_code = run_python(module, script, args)
        except ReachedWork:
            # the bench's parser accepted the arguments / inner_loop.evaluate checked everything and loads the model
            outcome.exit_code = 0 if (script is not None or outcome.evaluation is not None
                                      or outcome.parsed is not None) else 1
        captured = capsys.readouterr()
        outcome.stdout, outcome.stderr = captured.out, captured.err
    _CHECKED[checked] = outcome
    return outcome


def _prepare_program(command: Documented, program: Program, outcome: Outcome,
                     patch: pytest.MonkeyPatch) -> tuple[str | None, Path | None]:
    """(module, script) to run for ``program``, with the stand-ins that stop it before its work patched in."""
    if program.name.startswith(("python bench/", "python scripts/")) or program.name in PARSE_ONLY:
        parse_args = argparse.ArgumentParser.parse_args

        def parse_then_stop(self: argparse.ArgumentParser, *a: Any, **k: Any) -> argparse.Namespace:
            outcome.parsed = parse_args(self, *a, **k)
            raise ReachedWork(outcome.parsed)

        patch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
        if program.name in PARSE_ONLY:
            return program.name.removeprefix("python -m "), None
        return None, ROOT / program.name.split(" ", 1)[1]
    assert program.name.startswith("python -m "), f"{command.source}: no check for {program.name!r}"
    module = program.name.removeprefix("python -m ")
    if module == "inner_loop.run":
        import inner_loop.member.entry

        def record(spec: Any, save_final: bool = False) -> _Validated:
            outcome.trained.append(spec)
            return _Validated(spec)

        patch.setattr(inner_loop.member.entry, "train_member", record)
    elif module == "inner_loop.evaluate":
        import inner_loop.training.transfer

        plan_evaluation = inner_loop.training.transfer.plan_evaluation

        def plan_and_record(argv: Any) -> Any:
            outcome.evaluation = plan_evaluation(argv)
            return outcome.evaluation

        def stop(run: Any) -> Any:
            raise ReachedWork(run)

        patch.setattr(inner_loop.training.transfer, "plan_evaluation", plan_and_record)
        patch.setattr(inner_loop.training.transfer, "load_run_model", stop)
    elif program.name == "python -m meta.status" and any(a.startswith("--watch") for a in program.args):
        def interrupt(seconds: float) -> None:
            raise KeyboardInterrupt

        patch.setattr(time, "sleep", interrupt)  # one frame, then Ctrl-C
    else:
        assert program.name in DRY_RUN + RUN_ON_PREPARED, f"{command.source}: no check for {program.name!r}"
    return module, None


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prepared]:
    """Small finished runs of every kind a documented command reads, made by the commands themselves (synthetic
    objectives for the search, the tuning and the pilot; the tiny model, 0 steps, for the single run)."""
    from meta.search.after.export import main as export_main
    from meta.pilot.cli import main as pilot_main
    from meta.search.run import main as run_main
    from meta.tune.cli import main as tune_main

    base = tmp_path_factory.mktemp("documented")
    work = base / "work"
    work.mkdir()
    search, tune, pilot, runs = base / "meta_search", base / "tune_run", base / "pilot_run", base / "inner"
    with contextlib.chdir(work), separate_process_state():
        # one baseline row (the base model): the result table and a documented re-evaluation need a row, not
        # every row (each composes its own config, here and in `meta.reevaluate` again)
        assert run_main([f"run_dir={search}", "new=true", "launcher=debug", "inner.entrypoint=meta.synthetic:member",
                         "population=2", "generations=1", "reevaluate.top_k=1", "reevaluate.seeds=2",
                         "reevaluate.report_seeds=2", "reevaluate.baselines=[base]", "train.eval_every=20",
                         "+inner.options={noise: 0.05, intermediate_noise: 0.01}"]) == 0
        assert tune_main([f"run_dir={tune}", "new=true", "launcher=debug", "inner.entrypoint=meta.tune.synthetic:run",
                          "tune.sampler=random", "tune.pruner=none", "tune.trials=2", "tune.seeds=1",
                          "+inner.options={step_s: 0.0}"]) == 0
        assert pilot_main([f"run_dir={pilot}", "new=true", "launcher=debug", "inner.entrypoint=meta.synthetic:member",
                           "pilot.seeds=2", "pilot.pairs=2", "train.eval_every=20",
                           "+inner.options={slope: 1.0, param_noise: 0.05, noise: 0.02, intermediate_noise: 0.01}"]) == 0
        # the init file the documented single runs load, where they look for it
        assert export_main([f"run_dir={search}", "which=best", f"out={work / 'best_mirror.safetensors'}"]) == 0
    single = runs / "arith_none_seed0"
    with contextlib.chdir(work):
        assert run_python("inner_loop.run", None, [f"work_dir={single}", "divergence=none", "train.steps=0",
                                                   "model.warmup_max_steps=0", "task.validation_size=8",
                                                   "task.test_size=8"]) == 0
    assert (single / "final").is_dir()
    yield Prepared(search, tune, pilot, single, runs, work)


def plan_disagreements(name: str, tokens: list[str], plan: str) -> list[str]:
    """What a dry run's plan says against the command it was printed for: the population, the generations, the
    tuning's trials, and a new run said to be one."""
    values = dict(t.lstrip("+").split("=", 1) for t in tokens if "=" in t and not t.startswith("~"))
    wrong = []
    if name == "python -m meta.run" and "population" in values and f"population {values['population']} x" not in plan:
        wrong.append(f"population {values['population']}")
    if name == "python -m meta.pilot" and "population" in values \
            and f"population={values['population']}," not in plan:
        wrong.append(f"the SNR at population {values['population']}")
    if name == "python -m meta.run" and "generations" in values:
        count = int(values["generations"])
        if f"..{count - 1} ({count} to run)" not in plan and f"all {count} done" not in plan:
            wrong.append(f"generations {count}")
    if name == "python -m meta.tune" and "tune.trials" in values and f"trials: {values['tune.trials']} x" not in plan:
        wrong.append(f"tune.trials {values['tune.trials']}")
    if values.get("new") == "true" and not re.search(r"\bnew (search|pilot|tuning run) in ", plan.splitlines()[0]):
        wrong.append("a new run, not said to be one")
    return wrong


# ------------------------------------------------------------------ the tests
def _id(command: Documented) -> str:
    return f"{command.source} {command.text[:60]}"


def test_the_documentation_shows_its_commands_and_the_setup_commands_come_first():
    readme = markdown_commands(ROOT / "README.md")
    assert [c.text for c in readme[:2]] == ["scripts/main.sh", "scripts/test.sh"]
    sources = {c.source.split(":")[0] for c in COMMANDS}
    assert {"README.md", "docs/usage.md", "docs/pilot.md", "docs/tuning.md", "conf/config.yaml"} <= sources
    assert any(SANDBOX_OVERRIDE in c.tokens for c in COMMANDS), f"{SANDBOX_OVERRIDE} is documented in no command"
    assert len(COMMANDS) == len({(c.source, c.text) for c in COMMANDS})


def test_extraction_reads_blocks_continuations_comments_and_yaml_prose(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n```bash\npython -m meta.run a=1 \\\n    'b={x: 1}'   # why\n\n# a note\n```\n"
                    "```text\npython -m not.a.command\n```\n")
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("x: 1  # see `python -m meta.tune run_dir=<run dir>`. Or python -m meta.run a=1 b=2. then\n"
                         "y: 2  # python -m inner_loop.run always writes final/\n")
    assert [c.text for c in markdown_commands(page)] == ["python -m meta.run a=1 'b={x: 1}'"]
    assert markdown_commands(page)[0].source == f"{page}:4"
    assert [c.text for c in yaml_commands(yaml_file)] == ["python -m meta.tune run_dir=<run dir>",
                                                          "python -m meta.run a=1 b=2", "python -m inner_loop.run"]


def test_markdown_commands_are_in_command_blocks():
    """A command shown outside a bash block would not be tested: every one goes in a fenced bash block."""
    outside = []
    for page in markdown_pages():
        in_block, commands = False, False
        for number, line in enumerate(page.read_text().splitlines(), 1):
            fence = FENCE.match(line)
            if fence:
                in_block, commands = (False, False) if in_block else (True, fence.group(1) in COMMAND_FENCES)
            elif not commands and COMMAND_LINE.match(line):
                outside.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not outside, "command lines outside a ```bash block:\n" + "\n".join(outside)


@pytest.mark.parametrize("command", COMMANDS, ids=_id)
def test_documented_command_runs(command: Documented, prepared: Prepared, monkeypatch, capsys):
    program = program_of(command.tokens)
    if program.name in UNCHECKABLE:
        assert UNCHECKABLE[program.name].strip()
        if program.name.startswith("scripts/"):
            script = ROOT / program.name
            assert script.is_file() and os.access(script, os.X_OK), f"{command.source}: {script} is not a script"
        return
    if "use_vllm: true" in command.text and importlib.util.find_spec("vllm") is None:
        if os.environ.get("MIRROR_ES_REQUIRE_VLLM"):
            pytest.fail(f"{command.source}: MIRROR_ES_REQUIRE_VLLM is set but vLLM is not installed")
        pytest.skip(f"{command.source} generates with vLLM, which is not installed (scripts/install_vllm.sh)")
    outcome = check(command, prepared, monkeypatch, capsys)
    assert outcome.exit_code == 0, f"{command.source}: `{command.text}` exited {outcome.exit_code}"
    assert "Traceback" not in outcome.stderr + outcome.stdout, f"{command.source}: a traceback"
    name = delegated(program).name
    if name in DRY_RUN:
        assert outcome.stdout.strip(), f"{command.source}: the dry run printed no plan"
        disagreements = plan_disagreements(name, command.tokens, outcome.stdout)
        assert not disagreements, f"{command.source}: the plan of `{command.text}` says otherwise: {disagreements}"
    if name == "python -m inner_loop.run":
        assert outcome.trained, f"{command.source}: inner_loop.run never reached training"
    if name == "python -m inner_loop.evaluate":
        assert outcome.evaluation.problems, f"{command.source}: no test problems to score"


def test_every_table_entry_is_used_by_a_documented_command():
    texts = [c.text for c in COMMANDS]
    names = {program_of(c.tokens).name for c in COMMANDS}
    unused = [p for p in PLACEHOLDERS if not any(p in t for t in texts)]
    unused += [f"{n}: {p}" for n, p in PLACEHOLDERS_BY_PROGRAM
               if not any(program_of(c.tokens).name == n and p in c.text for c in COMMANDS)]
    unused += [hub for hub, (selectors, _) in HUB_DATA.items() if not any(s in c.tokens for c in COMMANDS
                                                                           for s in selectors)]
    unused += [name for name in UNCHECKABLE if name not in names]
    assert not unused, f"table entries no documented command uses (remove them): {unused}"


def test_the_sandbox_isolation_override_reaches_the_task_it_is_documented_for(prepared, monkeypatch, capsys):
    documented = [c for c in COMMANDS if SANDBOX_OVERRIDE in c.tokens]
    assert documented
    for command in documented:
        outcome = check(command, prepared, monkeypatch, capsys)
        assert outcome.exit_code == 0, command.source
        if outcome.trained:
            assert all(spec.inner["task"]["sandbox"]["require_isolation"] is True for spec in outcome.trained)
        else:
            assert outcome.evaluation.task_node["sandbox"]["require_isolation"] is True, command.source
    logger.info("checked %s in %d documented command(s)", SANDBOX_OVERRIDE, len(documented))


def test_a_plan_that_disagrees_with_its_command_is_found():
    plan = "DRY RUN: nothing is submitted or written. new search in /x\nsearch: population 4 x generations 0..1 (2 to run)"
    assert plan_disagreements("python -m meta.run", ["population=4", "generations=2", "new=true"], plan) == []
    assert plan_disagreements("python -m meta.run", ["population=180", "generations=15"], plan) == [
        "population 180", "generations 15"]
    assert plan_disagreements("python -m meta.pilot", ["population=180"], "SNR at population=4, seeds") == [
        "the SNR at population 180"]


def test_a_broken_documented_command_fails_its_check(prepared, monkeypatch, capsys):
    """The checks can fail: a wrong key, a wrong flag and a missing run dir each give a non-zero exit."""
    broken = [Documented("x:1", "python -m meta.run populaton=4"),
              Documented("x:2", "python -m inner_loop.run train.stepz=3"),
              Documented("x:3", "python -m inner_loop.run divergence=kl train.learning_rate=-1"),
              Documented("x:4", "python -m meta.status run_dir=outputs/meta_.../nothing"),
              Documented("x:5", ".venv/bin/python bench/bench_sandbox.py --no-such-flag")]
    for command in broken:
        outcome = check(command, prepared, monkeypatch, capsys)
        assert outcome.exit_code != 0, command.text
        assert not outcome.trained
