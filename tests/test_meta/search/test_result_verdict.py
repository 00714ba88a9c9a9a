"""The search's gain separated from its radius: the random-radius row, the verdict's sentences, tuned rows."""
from __future__ import annotations

import pytest
import torch
import yaml

from meta.search.after.baselines import build_rows, radius_random_vectors, verdict_roles
from meta.compose import compose
from meta.search.config import ConfigError, build_search_config, search_center
from meta.search.run import main
from meta.searchers import build_searcher
from results.report.search.result_table import build_table, render_markdown

SYNTHETIC = "meta.synthetic:member"


def _cfg(*overrides: str):
    raw = compose(list(overrides))
    return build_search_config({**raw, "inner": {**raw["inner"], "entrypoint": SYNTHETIC}})


def _deviations(vectors, centre) -> torch.Tensor:
    return (torch.tensor(vectors, dtype=torch.float64) - centre).reshape(-1)


@pytest.mark.parametrize("overrides,radius", [
    ((), 0.1),                                                   # the embedded default: pgpe, es.radius
    (("es=cmaes", "es.radius=0.3"), 0.3),                        # cmaes maps es.radius to its step size
    (("divergence.param_transform=softplus", "es.radius=2.0"), 2.0),
    (("es=snes",), 0.1), (("es=cem",), 0.1), (("es=openai_es_elite", "es.radius=0.05"), 0.05),
])
def test_the_radius_row_draws_what_the_first_generation_draws_with_its_own_seed(overrides, radius):
    cfg = _cfg(*overrides)
    centre = search_center(cfg)
    drawn = radius_random_vectors(cfg, 40)
    # the search's own first generation, on several run seeds: the same distribution around the same centre
    search = torch.cat([build_searcher(cfg.searcher_settings, centre, cfg.population, seed).ask(0)
                        for seed in range(10)])
    ours, theirs = _deviations(drawn, centre), _deviations(search.tolist(), centre)
    assert ours.std().item() == pytest.approx(radius, rel=0.03)
    assert theirs.std().item() == pytest.approx(ours.std().item(), rel=0.05)
    assert abs(ours.mean().item()) < 4 * radius / len(ours) ** 0.5
    # its own seed: no map is one the search itself trained in generation 0, and every map differs
    generation0 = build_searcher(cfg.searcher_settings, centre, cfg.population, cfg.seed).ask(0)
    assert not any(torch.allclose(torch.tensor(v, dtype=torch.float64), m) for v in drawn for m in generation0)
    assert len({tuple(v) for v in drawn}) == len(drawn)
    assert radius_random_vectors(cfg, 3) == drawn[:3]  # a documented seed per reporting seed: reproducible


def _runs(values):
    return [{"status": "ok", "fitness": v, "mean_response_tokens": 10.0} for v in values]


def _table(exported, center, radius, kl=(0.4, 0.41, 0.39, 0.4), base=(0.5, 0.5, 0.5, 0.5)):
    rows = [("exported", "NM-GRPO-ES (exported init)", exported), ("center", "the start", center),
            ("radius_random", "random-radius maps", radius), ("kl", "KL", kl), ("base", "base model", base)]
    table_rows = [{"name": n, "label": label, "divergence": {"name": "x"}, "coef_source": "-", "runs": _runs(v)}
                  for n, label, v in rows]
    baselines = [n for n, _, _ in rows[1:]]
    return build_table(table_rows, [1, 2, 3, 4], baselines, "exported", verdict_roles(baselines))


def test_the_verdict_credits_a_direction_only_when_the_exported_init_beats_the_random_radius_maps():
    table = _table(exported=(0.60, 0.62, 0.61, 0.63), center=(0.30, 0.33, 0.31, 0.32),
                   radius=(0.45, 0.46, 0.44, 0.47))
    sentences = table["verdict"]
    assert sentences[0].startswith("NM-GRPO-ES (exported init) beats the start on validation pass@1: +0.300 [")
    assert sentences[1].startswith("NM-GRPO-ES (exported init) beats random-radius maps")
    assert "beats KL" in sentences[2] and "beats base model" in sentences[3]
    assert sentences[-1].startswith("The gain over the start is more than the search's radius gives")
    assert not any("comes from the radius" in s for s in sentences)
    assert "**Verdict**" in render_markdown(table, all_pairs=False) and sentences[-1] in render_markdown(table)


def test_the_verdict_says_the_gain_is_the_radius_when_random_maps_at_that_radius_do_as_well():
    table = _table(exported=(0.60, 0.55, 0.62, 0.58), center=(0.30, 0.33, 0.31, 0.32),
                   radius=(0.58, 0.60, 0.57, 0.59))
    sentences = table["verdict"]
    assert "beats the start" in sentences[0]
    assert sentences[1].startswith("NM-GRPO-ES (exported init) against random-radius maps: not resolved at 4 seeds")
    assert sentences[-1].startswith("The gain over the start comes from the radius (the map's scale), not from the "
                                    "direction the search found")
    assert "random-radius maps minus the start: +0.270 [" in sentences[-1]


def test_an_unresolved_comparison_says_so_and_how_many_seeds_would_resolve_it():
    table = _table(exported=(0.50, 0.40, 0.45, 0.55), center=(0.42, 0.44, 0.40, 0.46),
                   radius=(0.45, 0.46, 0.44, 0.47))
    diff = next(d for d in table["differences"] if d["row"] == "exported" and d["baseline"] == "center"
                and d["metric"] == "validation")
    assert diff["low"] < 0 < diff["high"]
    assert table["verdict"][0] == (
        f"NM-GRPO-ES (exported init) against the start: not resolved at 4 seeds ({diff['mean']:+.3f} "
        f"[{diff['low']:+.3f}, {diff['high']:+.3f}], 4 paired seeds, 95% t interval); about "
        f"{diff['seeds_to_exclude_zero']} paired seeds would resolve it at the observed spread.")
    assert diff["seeds_to_exclude_zero"] > 4
    assert not any("radius (the map's scale)" in s or "found a direction" in s for s in table["verdict"])


def test_an_init_below_its_start_is_said_to_be_below_it():
    table = _table(exported=(0.20, 0.22, 0.21, 0.23), center=(0.30, 0.33, 0.31, 0.32),
                   radius=(0.45, 0.46, 0.44, 0.47))
    assert table["verdict"][0].startswith("NM-GRPO-ES (exported init) is below the start on validation pass@1: -0.")
    assert len(table["verdict"]) == 4  # one sentence per comparison, no reading of where a gain comes from


def _tiny_rows(baselines, *extra):
    cfg = _cfg(*extra)
    return {row.name: row for row in build_rows(cfg, list(extra), None, baselines, (), False, 2)}


def test_a_baseline_takes_its_settings_from_a_yaml_of_overrides_and_names_it(tmp_path):
    preset = tmp_path / "kl_strong.yaml"
    preset.write_text(yaml.safe_dump({"divergence": {"coef": 0.3}, "train": {"learning_rate": 2.0e-4}}))
    strong_map = tmp_path / "map.yaml"
    strong_map.write_text("divergence: {coef: 3.0}\n")
    rows = _tiny_rows(["center", "kl", f"kl@{preset}", f"center@{strong_map}"])
    start, tuned_start = rows["center"], rows[f"center@{strong_map}"]
    assert tuned_start.params == start.params and tuned_start.divergence["name"] == "neural_mirror"
    assert tuned_start.divergence["coef"] == 3.0 != start.divergence["coef"]
    plain, tuned = rows["kl"], rows[f"kl@{preset}"]
    assert plain.divergence["coef"] == 0.04 and tuned.divergence["coef"] == 0.3
    assert tuned.inner["divergence"]["coef"] == 0.3 and tuned.inner["train"]["learning_rate"] == 2.0e-4
    assert tuned.inner["train"]["steps"] == plain.inner["train"]["steps"]  # what the file does not set stays
    assert tuned.coef_source == f"preset {preset}" and str(preset) in tuned.label
    assert verdict_roles([f"kl@{preset}"]) == {f"kl@{preset}": "compared"}
    other = tmp_path / "prob.yaml"
    other.write_text(yaml.safe_dump({"divergence": {"name": "prob_l2", "coef": 1.0}}))
    with pytest.raises(ConfigError, match="the preset's divergence is 'prob_l2', the row's 'kl'"):
        _tiny_rows([f"kl@{other}"])
    empty = tmp_path / "empty.yaml"
    empty.write_text("seed: 3\n")
    with pytest.raises(ConfigError, match="sets no divergence or train mapping"):
        _tiny_rows([f"kl@{empty}"])


def test_a_baseline_from_a_small_tune_on_the_tiny_preset_trains_at_the_tuned_coefficient(tmp_path, capsys):
    from meta.status.view import finished, main as status_main
    from meta.tune.cli import main as tune_main

    run_dir, out = tmp_path / "tune", tmp_path / "kl_tuned.yaml"
    assert tune_main([f"run_dir={run_dir}", "new=true", "inner.entrypoint=meta.tune.synthetic:run", "tune.sampler=random",
                      "tune.pruner=none", "launcher=debug", "tune.trials=2", "divergence=kl",
                      "tune.space={divergence.coef: [log, 1e-3, 1.0]}", "+inner.options={step_s: 0.0}"]) == 0
    assert tune_main([f"run_dir={run_dir}", f"export={out}"]) == 0
    # its status says so, and --watch ends instead of refreshing a finished tuning forever
    assert finished(run_dir)
    assert status_main([str(run_dir), "--watch", "0.01"]) == 0
    assert "finished: nothing more to watch" in capsys.readouterr().out
    tuned_coef = yaml.safe_load(out.read_text())["divergence"]["coef"]
    rows = _tiny_rows(["kl", f"kl@{out}", "radius_random"])
    assert rows[f"kl@{out}"].divergence["coef"] == tuned_coef != rows["kl"].divergence["coef"]
    assert rows[f"kl@{out}"].coef_source == f"preset {out}"
    assert len(rows["radius_random"].params_per_seed) == 2 and rows["radius_random"].params is None
    # a preset trained on another task compares nothing: refused, naming the node
    other = tmp_path / "gsm8k.yaml"
    other.write_text(yaml.safe_dump({"task": {"name": "gsm8k"}, "divergence": {"coef": 0.1}}))
    with pytest.raises(ConfigError, match="the preset trains task 'gsm8k'"):
        _tiny_rows([f"kl@{other}"])


@pytest.mark.parametrize("entry,fragment", [
    ("kl@/no/such/preset.yaml", "no preset file /no/such/preset.yaml"),
    ("base@{file}", "the untrained model (base) trains nothing"),
    ("oracle@{file}", "'oracle' is not one of"),
])
def test_a_bad_tuned_baseline_exits_2_before_anything_is_written(tmp_path, capsys, entry, fragment):
    preset = tmp_path / "p.yaml"
    preset.write_text("divergence: {coef: 0.1}\n")
    assert main([f"run_dir={tmp_path / 'r'}", "new=true", "launcher=debug", f"inner.entrypoint={SYNTHETIC}",
                 f"reevaluate.baselines=[center,{entry.format(file=preset)}]"]) == 2
    assert fragment in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_a_row_and_its_tuned_twin_sit_side_by_side_in_the_plan(tmp_path, capsys):
    preset = tmp_path / "kl_tuned.yaml"
    preset.write_text("divergence: {coef: 0.25}\n")
    assert main([f"run_dir={tmp_path / 'plan'}", "new=true", "dry_run=true", f"inner.entrypoint={SYNTHETIC}",
                 f"reevaluate.baselines=[center,radius_random,kl,kl@{preset}]"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.strip().startswith("result table: 5 rows x report_seeds=6") for line in lines)
    tuned = next(line for line in lines if line.strip().startswith(f"kl@{preset}"))
    assert '"coef": 0.25' in tuned and f"preset {preset}" in tuned


def test_the_dry_run_counts_the_random_radius_rows_runs(tmp_path, capsys):
    assert main([f"run_dir={tmp_path / 'plan'}", "new=true", "dry_run=true", f"inner.entrypoint={SYNTHETIC}"]) == 0
    out = capsys.readouterr().out
    assert "result table: 8 rows x report_seeds=6" in out and "= 48 runs" in out
    line = next(line for line in out.splitlines() if line.strip().startswith("radius_random"))
    assert "random maps at the search's radius" in line and "maps: one per reporting seed (6)" in line
