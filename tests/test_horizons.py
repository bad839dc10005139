"""A study with horizons: the rate searched at several selection horizons, its power law in training tokens
carried to the final runs (research/study.py, horizon_plan and fit_horizons), and the short pick's regret."""
import math

import numpy as np
import pytest
from test_sweep import tiny_study, write_run

from research import report, sweep
from research.study import (due_runs, fit_horizons, is_finished, load_study, plan, run_config,
                            run_dir, settings_diff)

GRID = [8e-3, 1.13e-2, 1.6e-2, 2.26e-2]  # studies/horizon_cpu.py's
STEP, HORIZONS, FINAL = 2048, [300, 600], 4800  # tokens a step of config/enwiki_bytes.py, its horizons
BETA, AT_300 = 0.3, 0.014  # a power law LR*(D) = c D^-beta through 0.014 at the 300-step horizon


def lr_star(tokens):
    return AT_300 * (tokens / (HORIZONS[0] * STEP)) ** -BETA


def simulated_curves(rng, seeds, point_sd=0.003, seed_sd=0.01, grid=GRID, horizons=HORIZONS):
    """Selection curves loss(lr, D) = L0(D) + k (ln lr − ln lr*(D))² + a seed's offset + noise at each point, k =
    0.06 (an octave off the best costs 0.029 nats, as on the CPU curves), for every horizon."""
    curves = []
    for h in horizons:
        d, offset = h * STEP, rng.normal(0, seed_sd, seeds)
        curves.append({lr: list(2.5 - 0.1 * math.log(h) + 0.06 * math.log(lr / lr_star(d)) ** 2 + offset
                                + rng.normal(0, point_sd, seeds)) for lr in grid})
    return curves


def test_the_fit_recovers_a_power_law_and_its_bootstrap_interval_covers_it():
    """Exact curves: β and the carried rate exactly (to 3 digits). Noisy ones (4 selection seeds, 60 simulated
    studies): the carried rate's median error under 5%, and its 95% bootstrap interval covers the truth in most
    of them (about 0.85 at 4 seeds, 0.67 at 2: a percentile bootstrap over so few seeds is too narrow)."""
    final, tokens = FINAL * STEP, [h * STEP for h in HORIZONS]
    fit = fit_horizons(tokens, simulated_curves(np.random.default_rng(0), 2, 0, 0), final)
    assert fit["beta"] == pytest.approx(BETA, abs=1e-9) and fit["carried"] == float(f"{lr_star(final):.3g}")
    assert [lr for _, lr, _ in fit["points"]] == pytest.approx([lr_star(d) for d in tokens])
    three = fit_horizons([h * STEP for h in (150, 300, 600)], simulated_curves(
        np.random.default_rng(0), 2, 0, 0, GRID + [5.66e-3], horizons=(150, 300, 600)), final)
    assert three["beta"] == pytest.approx(BETA, abs=1e-9)  # three horizons: least squares through all
    rng, covered, errors = np.random.default_rng(58), [], []
    for _ in range(60):
        fit = fit_horizons(tokens, simulated_curves(rng, 4), final, boot=100)
        covered.append(fit["carried_ci"][0] <= lr_star(final) <= fit["carried_ci"][1])
        errors.append(math.log(fit["carried"] / lr_star(final)))
        assert fit["beta_ci"][0] <= fit["beta"] <= fit["beta_ci"][1]
    print(f"coverage {np.mean(covered):.2f}, median log error {np.median(errors):+.3f}")
    assert np.mean(covered) >= 0.7 and abs(np.median(errors)) < 0.05


def test_a_best_rate_at_an_edge_is_taken_as_it_is_and_flagged():
    """At an edge of the curve (or beside a diverged rate) no parabola: the best rate itself, flagged."""
    edge = {1e-3: [2.0, 2.1], 2e-3: [2.2, 2.3], 4e-3: [2.4, 2.5]}
    inside = {1e-3: [2.3, 2.3], 2e-3: [2.0, 2.0], 4e-3: [2.3, 2.3]}  # symmetric: the vertex at 2e-3
    fit = fit_horizons([100, 200], [edge, inside], 800)
    assert fit["points"] == [(100, 1e-3, True), (200, pytest.approx(2e-3), False)]
    assert fit["beta"] == pytest.approx(-1) and fit["carried"] == 8e-3  # (a rising rate, from a bad edge)
    diverged = {**inside, 4e-3: [math.inf, 2.3]}
    assert fit_horizons([100, 200], [diverged, inside], 800)["points"][0] == (100, 2e-3, True)


HORIZON = ("horizons = [10, 20]\nhalf_steps = False\nmax_extensions = 0\nshort_pick = True\nselection_seeds = [1, 3]\n"
           "learning_rates = [3e-3, 6e-3, 1.2e-2]\noverrides = {'max_iters': 40, 'lr_decay_iters': 40, "
           "'warmup_iters': 4, 'eval_interval': 20}\n")


def test_a_horizon_study_runs_each_horizon_then_the_carried_and_the_short_pick(tmp_path, capsys):
    """Selection runs at 10 and 20 steps in <runs_dir>/h<h>/<arm>/ with warmup 10% as in the 40-step final runs
    (one rule), one of them a real train.py run whose folder the study accepts; once every horizon's search is
    done the final seed runs at the carried rate and at the short pick; the dry run, the report's fit and its
    regret table read them."""
    study_file = tiny_study(tmp_path, HORIZON)
    study = load_study(str(study_file))
    due = due_runs(study)
    assert due[:3] == [("h10/linear", 3e-3, 1), ("h10/linear", 6e-3, 1), ("h10/linear", 1.2e-2, 1)]
    assert len(due) == 2 * 2 * 3 * 2 and {run[0] for run in due} == {"h10/linear", "h20/linear", "h10/nonlinear",
                                                                      "h20/nonlinear"}
    assert run_dir(study, "h20/linear", 3e-3, 1) == str(tmp_path / "runs" / "h20" / "linear" / "lr0.003_seed1")
    for h in (10, 20):
        cfg = run_config(study, f"h{h}/linear", 3e-3, 1)
        assert (cfg["max_iters"], cfg["lr_decay_iters"], cfg["warmup_iters"], cfg["eval_interval"]) == (h, h, h // 10,
                                                                                                        h // 2)
    assert run_config(study, "linear", 3e-3, 2)["max_iters"] == 40  # a final run
    assert sweep.launch(study, "h10/linear", 3e-3, 1, threads=1) is None  # a real run, through the sweep
    assert is_finished(study, "h10/linear", 3e-3, 1)
    assert settings_diff(study, "h10/linear", 3e-3, 1) == {}  # its config.json is the study's
    sweep.main([str(study_file), "--dry_run", "--tokens_per_s=100"])
    dry = capsys.readouterr().out
    assert "budget of a 10-step selection run (linear): 640 tokens" in dry
    assert "| 2,560 | 0.00 / 0.01 | 1 | 11 | 14 | 14 |" in dry  # 2 horizons x 3 rates x 2 seeds + 2 finals
    assert "| linear | — | — | searching: 11 selection runs due now | — |" in dry
    # curves with their minimum at 6e-3 (10 steps) and 5e-3 (20 steps): beta ln 1.2 / ln 2, carried 4.17e-3
    for h, best in ((10, 6e-3), (20, 5e-3)):
        for arm, shift in (("linear", 0), ("nonlinear", 0.01)):
            for lr in (3e-3, 6e-3, 1.2e-2):
                for seed in (1, 3):
                    loss = 2 + shift + 0.1 * math.log(lr / best) ** 2 + seed / 1000
                    row = dict(iter=h, tokens=64 * h, val_loss=loss, val_loss_full=loss)
                    write_run(study, f"h{h}/{arm}", lr, seed, [row])
    p = plan(study, "linear")
    assert p["fit"]["beta"] == pytest.approx(math.log(1.2) / math.log(2)) and p["chosen"] == 4.17e-3
    assert p["short"] == 6e-3 and p["due"] == [("linear", 4.17e-3, 2), ("linear", 6e-3, 2)]
    for arm, carried, short in (("linear", 2.00, 2.05), ("nonlinear", 2.02, 2.03)):
        for lr, loss in ((4.17e-3, carried), (6e-3, short)):
            write_run(study, arm, lr, 2, [dict(iter=40, tokens=2560, val_loss=loss + 0.1, val_loss_full=loss)])
    assert due_runs(study) == []
    text = report.main([str(study_file), "--out", str(tmp_path / "report")])
    assert "| linear | 0.006 | 0.005 | 0.26 [0.26, 0.26] | **0.00417** [0.00417, 0.00417] |" in text
    assert "| linear | 0.006 | 0.00417 | 2.0500 (n=1) | 2.0000 (n=1) | -0.0500 (n=1) | — |" in text
    assert "| nonlinear − linear | -0.0400 (n=1) | — | n < 2 |" in text  # a smaller regret for nonlinear
    assert "## Learning-rate search at 10 steps" in text and "## Learning-rate search at 20 steps" in text


@pytest.mark.parametrize("extra, message", [
    ("horizons = [20, 10]\n", "horizons must be None or a list of 2 or more selection max_iters, ascending"),
    ("horizons = [10, 40]\n", r"each below the final runs' max_iters \(40\)"),
    ("arms = {'linear': dict(query_mode='linear', warmup_iters=2)}\n", "arm linear must be without max_iters"),
    ("short_pick = True\nhorizons = None\n", "short_pick must be True or False, and True only with horizons"),
])
def test_bad_horizons_are_refused(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        load_study(str(tiny_study(tmp_path, HORIZON + extra)))
