"""The result table's statistics, the export's selection rule, and each baseline's own coefficient."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from inner_loop.config import DivergenceConfig
from inner_loop.loss.divergences import divergence, length_reference
from meta.search.after.baselines import Coef, Composed, build_rows, nm_random_vector, resolve_coef
from meta.compose import compose
from meta.search.config import build_search_config
from meta.search.after.reevaluate import choose_by_lower_bound, lower_bound
from meta.search.run import main
from mirror_maps import NeuralMirrorMap
from results.report.paired import paired_difference, seeds_to_exclude_zero, t_quantile
from results.report.search.result_table import build_table, render_markdown

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
MBPP_LOCAL = [f"task.train_file={FIXTURES / 'mbpp_train.jsonl'}", f"task.test_file={FIXTURES / 'mbpp_test.jsonl'}",
              "task.validation_size=2"]
#: a local directory where staging would put Qwen3's snapshot: the hub is out of reach here, and a dry run with the
#: model unstaged offline exits 2 (docs/usage.md "Staged, offline members"); a plan reads no weights
STAGED_MODEL = [f"model.name_or_path={FIXTURES}"]


def test_paired_difference_matches_a_hand_computed_t_interval():
    # differences 0.10, 0.15, 0.05: mean 0.10, sd 0.05, se 0.05/sqrt(3); t(0.975, 2) = 4.302653
    row = {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.9}  # seed 3: the baseline failed there, so it is not paired
    base = {0: 0.4, 1: 0.45, 2: 0.65}
    diff = paired_difference("a", row, "b", base)
    half = 4.302653 * 0.05 / math.sqrt(3)
    assert diff.n == 3 and diff.mean == pytest.approx(0.10) and diff.std == pytest.approx(0.05)
    assert (diff.low, diff.high) == (pytest.approx(0.10 - half, abs=1e-6), pytest.approx(0.10 + half, abs=1e-6))
    assert diff.verdict == "includes 0"
    # n = 4: t(3) = 3.182446, 3.182446 x 0.05 / 2 = 0.0796 < 0.10; n = 3 gives 0.1242 > 0.10
    assert diff.seeds_to_exclude_zero == 4
    assert t_quantile(2) == pytest.approx(4.302653, abs=1e-6)
    assert seeds_to_exclude_zero(0.0, 0.1) is None
    one = paired_difference("a", {0: 0.5}, "b", {0: 0.2})
    assert one.n == 1 and one.low is None and one.verdict == "n < 2"


def _candidate(mean, std, n):
    return {"mean": mean, "std": std, "n": n}


def test_export_takes_the_highest_lower_bound_and_never_a_single_seed_over_a_measured_one():
    pooled = 0.05
    # A (0.60, n=3) lower bound 0.60 - 0.05/sqrt(3) = 0.571; B (0.62, std 0.2, n=2): 0.62 - 0.2/sqrt(2) = 0.479
    results = [_candidate(0.60, 0.03, 3), _candidate(0.62, 0.20, 2), _candidate(0.90, None, 1)]
    assert choose_by_lower_bound(results, pooled) == 0  # the n=1 candidate is only taken when nothing has n >= 2
    assert lower_bound(results[0], pooled) == pytest.approx(0.60 - 0.05 / math.sqrt(3))  # pooled > own std
    assert choose_by_lower_bound([_candidate(0.9, None, 1), _candidate(0.7, None, 1)], None) == 0
    # ties: more seeds first, then the earlier candidate
    tied = [_candidate(0.5, 0.0, 2), _candidate(0.5, 0.0, 3), _candidate(0.5, 0.0, 3)]
    assert choose_by_lower_bound(tied, 0.0) == 1
    with pytest.raises(RuntimeError, match="every run"):
        choose_by_lower_bound([_candidate(None, None, 0)], None)


def test_a_preset_coefficient_stays_with_its_own_divergence():
    # experiment=mbpp_qwen3 sets the neural map's coefficient (10); KL keeps kl.yaml's
    assert compose(["experiment=mbpp_qwen3", "divergence=kl"])["divergence"]["coef"] == 0.04
    assert compose(["experiment=mbpp_qwen3"])["divergence"]["coef"] == 10.0
    assert compose(["experiment=mbpp_qwen3", "divergence=kl", "+coef_by_divergence.kl=0.2"])["divergence"]["coef"] == 0.2


def _mbpp_rows(*extra):
    overrides = ["experiment=mbpp_qwen3", *MBPP_LOCAL, *extra]
    raw = compose(overrides)
    cfg = build_search_config({**raw, "inner": {**raw["inner"], "entrypoint": "meta.synthetic:member"}})
    return {row.name: row for row in build_rows(cfg, overrides, None, cfg.reevaluate_settings.baselines,
                                                ("humaneval",), True, cfg.reevaluate_settings.report_seeds)}


def test_the_kl_row_under_mbpp_qwen3_runs_at_kl_coefficient_and_says_where_it_comes_from():
    rows = _mbpp_rows("divergence.coef=3")
    assert rows["kl"].divergence["coef"] == 0.04 and rows["kl"].coef_source == "default_coef of divergence=kl"
    assert rows["prob_l2"].divergence["coef"] == 0.1
    assert rows["center"].divergence["coef"] == 3 and rows["center"].coef_source == "divergence.coef (command line)"
    authors = NeuralMirrorMap.random_init(42, dtype=torch.float64).to_vector()  # the inner loop's default map
    assert rows["nm_random"].params == pytest.approx(authors.tolist()) and 0 <= min(rows["nm_random"].params)
    assert max(rows["nm_random"].params) <= 0.01
    assert rows["base"].inner["train"]["steps"] == 0
    transfer = rows["exported"].inner["extra_evaluations"]
    assert [e["name"] for e in transfer] == ["test", "transfer/humaneval"] and transfer[1]["task"]["name"] == "humaneval"
    preset = _mbpp_rows("+coef_by_divergence.kl=0.5")
    assert preset["kl"].divergence["coef"] == 0.5 and preset["kl"].coef_source == "coef_by_divergence.kl (command line)"
    assert preset["exported"].coef_source == "coef_by_divergence.neural_mirror (experiment=mbpp_qwen3)"


def test_a_coefficient_s_source_names_the_preset_hydra_composed_not_a_guess():
    """Where no override names the preset, the source is Hydra's choice of experiment (not the default's name written
    in the code), and the registry's default is the coefficient a config node leaves unset."""
    composed = Composed({"name": "kl", "coef": 0.3}, {"coef_by_divergence": {"kl": 0.3}}, {"experiment": "gsm8k_qwen3"})
    assert resolve_coef(composed, []) == Coef(0.3, "coef_by_divergence.kl (experiment=gsm8k_qwen3)")
    assert resolve_coef(composed, ["divergence.coef=2"], own=True).source == "divergence.coef (command line)"
    assert resolve_coef(composed, ["divergence.coef=2"]).source == "coef_by_divergence.kl (experiment=gsm8k_qwen3)"
    alone = Composed({"name": "kl", "coef": 0.04}, {}, {"experiment": "tiny_arith"})
    assert resolve_coef(alone, []).source == "default_coef of divergence=kl"
    written = Composed({"name": "kl", "coef": 0.07}, {}, {"experiment": "tiny_arith"})  # a YAML's own number
    assert resolve_coef(written, []).source == "conf/divergence/kl.yaml"
    assert [DivergenceConfig(name=n).coef for n in ("kl", "prob_l2", "neural_mirror")] == [
        divergence(n).default_coef for n in ("kl", "prob_l2", "neural_mirror")]


def test_the_random_init_row_has_the_authors_parameters_whatever_the_transform():
    softplus = torch.tensor(nm_random_vector("softplus"), dtype=torch.float64)
    mapped = NeuralMirrorMap.from_vector(softplus, param_transform="softplus").parameters_for(torch.float64)
    authors = NeuralMirrorMap.random_init(42, dtype=torch.float64).to_vector()
    assert torch.allclose(torch.cat([t.reshape(-1) for t in mapped]), authors, atol=1e-12)


def test_the_dry_run_plan_prints_every_row_with_its_divergence_and_counts_every_run(tmp_path, capsys):
    assert main([f"run_dir={tmp_path / 'plan'}", "new=true", "dry_run=true", "experiment=mbpp_qwen3", *MBPP_LOCAL,
                 *STAGED_MODEL,
                 "reevaluate.report_seeds=4"]) == 0
    out = capsys.readouterr().out
    assert "result table: 8 rows x report_seeds=4" in out and "= 32 runs" in out
    kl_line = next(line for line in out.splitlines() if line.strip().startswith("kl "))
    assert '"coef": 0.04' in kl_line and "default_coef of divergence=kl" in kl_line
    assert "+ 32 reporting runs" in out and not (tmp_path / "plan").exists()


@pytest.mark.parametrize("override,fragment", [
    ("reevaluate.baselines=[kl,oracle]", "'oracle' is not one of"),
    ("reevaluate.transfer=[no_such_task]", "'no_such_task' is not a task"),
    ("reevaluate.report_seeds=1", "report_seeds=1 gives no interval"),
    ("+reevaluate.rows=3", "conf/config.yaml has no key 'reevaluate.rows'"),
])
def test_bad_reevaluation_settings_exit_2_before_anything_is_written(tmp_path, capsys, override, fragment):
    assert main([f"run_dir={tmp_path / 'r'}", "new=true", "launcher=debug", "inner.entrypoint=meta.synthetic:member",
                 override]) == 2
    assert fragment in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_the_table_renders_intervals_and_the_length_change_relative_to_the_registry_s_reference():
    def runs(values, length):
        return [{"status": "ok", "fitness": v, "mean_response_tokens": length, "evaluations": {}} for v in values]

    rows = [{"name": "exported", "label": "E", "divergence": {"name": "neural_mirror", "coef": 1.0},
             "coef_source": "x", "runs": runs([0.5, 0.6, 0.7], 12.0)},
            {"name": "kl", "label": "KL", "divergence": {"name": "kl", "coef": 0.04}, "coef_source": "y",
             "runs": runs([0.4, 0.45, 0.65], 10.0) + [{"status": "failed", "fitness": 0.0}]}]
    table = build_table(rows, [11, 12, 13], ["kl"], "exported", length_reference=length_reference())
    exported, kl = table["rows"]
    assert length_reference() == "kl" and table["length_reference"] == "kl"
    assert exported["response_tokens_vs_reference"] == pytest.approx(0.2) and kl["failed"] == 1
    assert kl["metrics"]["validation"]["n"] == 3
    text = render_markdown(table)
    other = build_table(rows, [11, 12, 13], ["kl"], "exported", length_reference="exported")
    assert [r["response_tokens_vs_reference"] for r in other["rows"]] == pytest.approx([0.0, 10.0 / 12.0 - 1.0])
    assert "response tokens (vs E)" in render_markdown(other)
    none = build_table(rows, [11, 12, 13], ["kl"], "exported")
    assert [r["response_tokens_vs_reference"] for r in none["rows"]] == [None, None]
    assert "response tokens (vs KL)" in text and "+20.0%" in text and "+0.100 [-0.024, +0.224] (n=3)" in text and "includes 0" in text


def test_the_up_front_check_runs_each_distinct_row_config_through_the_member_program_once(monkeypatch):
    """Rows that train the very same config (their seeds apart) are checked once: each check loads the task's data
    and builds TRL's config, and a search's start waits on it."""
    from launch import member
    from meta.search.after.reporting import check_rows, plan_rows

    raw = compose([])
    cfg = build_search_config(raw)
    rows = plan_rows(cfg, [])
    checked = []

    class Counting:
        def validate(self, inner):
            checked.append(inner)

    monkeypatch.setattr(member, "load_program", lambda name: Counting())
    check_rows(cfg, rows)
    distinct = {repr(sorted(row.inner.items())) for row in rows}
    assert len(rows) > len(distinct) and len(checked) == len(distinct)
