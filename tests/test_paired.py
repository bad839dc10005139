"""The paired statistics (research/paired.py) where the method is the project's own: the coverage of the size
trend's and the multiplier's 95% intervals, measured on simulated ladders (the multiplier's on curves with a
loss floor), and the robust shift against its
textbook values and the committed shared-rate study."""
import json

import numpy as np
import pytest
from conftest import ROOT

from research import report
from research.paired import multiplier, paired_difference, robust_shift, trend, trend_power

# the GPU ladder's four larger rungs (non-embedding parameters; its fifth and smallest, 1.8M, raises the trend's
# power from these rungs' 43% to 79%: tests/test_gpu_studies.py), 3 paired seeds each, a pair's sd on the CPU
SIZES = [3_148_032, 10_621_824, 25_174_528, 84_953_856]
SEEDS, SD, RUNG_SD = 3, 0.014, 0.005


def null_ladders(n, rung_sd, rng):
    """n ladders with no true trend: each rung's mean Δ over SEEDS pairs, plus rung-level noise."""
    return rng.normal(0, SD, (n, len(SIZES), SEEDS)).mean(axis=2) + rng.normal(0, rung_sd, (n, len(SIZES), 1))[..., 0]


@pytest.mark.parametrize("rung_sd", [0.0, RUNG_SD])
def test_the_trend_interval_covers_a_null_slope_95_percent_of_the_time(rung_sd):
    """4,000 null ladders of 4 rungs x 3 seeds: the 95% CI of the slope holds 0 in 93-97% of them, with and
    without 0.005 nats of rung-level noise (the old 1/se²-weighted z interval: 78% and 71%)."""
    ladders = null_ladders(4000, rung_sd, np.random.default_rng(52))
    cis = [trend(SIZES, means)["ci"] for means in ladders]
    coverage = np.mean([lo <= 0 <= hi for lo, hi in cis])
    print(f"coverage with rung sd {rung_sd}: {coverage:.4f}")
    assert 0.93 <= coverage <= 0.97


def test_the_trend_needs_three_rungs_and_gives_the_slope_per_10x():
    assert trend(SIZES[:2], [0.01, 0.02]) is None  # 2 rungs: no degree of freedom left for their scatter
    fit = trend([1e6, 1e7, 1e8], [0.03, 0.02, 0.01])  # exactly -0.01 per 10x: no scatter, a zero-width CI
    assert fit["slope"] == pytest.approx(-0.01) and fit["k"] == 3 and fit["ci"] == pytest.approx((-0.01, -0.01))


def floor_law(alpha, top=3.9, bottom=3.3):
    """A reference loss L(N) = E + B·N^(−alpha) that falls from `top` at the smallest rung to `bottom` at the
    largest: the curvature of a real ladder (alpha 0.2-0.4) -> L as a function of N."""
    n = np.array(SIZES, dtype=float)
    b = (top - bottom) / (n[0] ** -alpha - n[-1] ** -alpha)
    return lambda size: top - b * n[0] ** -alpha + b * np.asarray(size, dtype=float) ** -alpha


def simulated_ladders(n, loss, gap, rng):
    """n ladders: each rung's reference mean over SEEDS runs (per-run sd 0.01, rung-level sd RUNG_SD) and its
    paired differences (true gap(N) at every seed, pair sd SD) -> [(ref means, [paired_difference per rung])]."""
    out = []
    for _ in range(n):
        ref = loss(SIZES)[:, None] + rng.normal(0, RUNG_SD, (len(SIZES), 1)) + rng.normal(0, 0.01, (len(SIZES), SEEDS))
        runs = [dict(enumerate(r)) for r in ref]
        arms = [{s: v + g + e for (s, v), e in zip(r.items(), rng.normal(0, SD, SEEDS))}
                for r, g in zip(runs, gap(np.array(SIZES, dtype=float)))]
        out.append(([np.mean(list(r.values())) for r in runs],
                    [paired_difference(a, r) for a, r in zip(arms, runs)]))
    return out


@pytest.mark.parametrize("alpha", [0.2, 0.3, 0.4])
def test_the_multiplier_interval_covers_the_true_multiplier_with_a_floor(alpha):
    """On the GPU ladder's rungs, a reference with a loss floor and an arm worth a constant 1.2x the parameters
    (its gap L(1.2 N) − L(N)): at every rung the 95% CI holds 1.2 in 93-97% of 2,000 ladders (the pure power
    law that multiplier fitted before: 0.50-0.55 here), and the estimate's median is within 2% of it."""
    loss = floor_law(alpha)
    ladders = simulated_ladders(2000, loss, lambda n: loss(1.2 * n) - loss(n), np.random.default_rng(63))
    fits = [multiplier(SIZES, ref, gaps)["at"] for ref, gaps in ladders]
    for rung in range(len(SIZES)):
        coverage = np.mean([f[rung][2][0] <= 1.2 <= f[rung][2][1] for f in fits])
        print(f"alpha {alpha}, rung {rung}: coverage {coverage:.4f}")
        assert 0.93 <= coverage <= 0.97
        assert np.median([f[rung][1] for f in fits]) == pytest.approx(1.2, rel=0.02)


@pytest.mark.parametrize("alpha", [0.2, 0.3, 0.4])
def test_the_multiplier_of_exact_curves(alpha):
    """Noise-free rung means on a curve with a floor: the fit finds the curve, and M its true value to 1e-6,
    both for a constant multiplier (1.2) and for a constant gap (−0.02 nats, worth more where the curve is
    flatter: at the larger rungs)."""
    loss = floor_law(alpha)
    exact = lambda n, gap: paired_difference({s: loss(n) + gap for s in range(SEEDS)},
                                             {s: loss(n) for s in range(SEEDS)})
    fit = multiplier(SIZES, loss(SIZES), [exact(n, loss(1.2 * n) - loss(n)) for n in SIZES])
    assert fit["alpha"] == pytest.approx(alpha, rel=1e-6)
    assert [m for _, m, _ in fit["at"]] == pytest.approx([1.2] * len(SIZES), rel=1e-6)
    fit = multiplier(SIZES, loss(SIZES), [exact(n, -0.02) for n in SIZES])
    true = [(((loss(n) - 0.02) - loss(np.inf)) / (loss(n) - loss(np.inf))) ** (-1 / alpha) for n in SIZES]
    assert [m for _, m, _ in fit["at"]] == pytest.approx(true, rel=1e-6)
    assert true == sorted(true)
    assert multiplier(SIZES[:2], loss(SIZES[:2]), []) is None
    assert multiplier(SIZES, loss(SIZES)[::-1], []) is None  # a loss that grows with size: no curve to invert


def test_the_robust_shift_by_hand():
    """Hodges-Lehmann: the median of the Walsh averages; its 95% CI the 9th smallest and 9th largest of the 55
    for n = 10 (the signed-rank table's critical value 8), the extreme ones for n = 6, none for n <= 5."""
    d = np.random.default_rng(0).normal(0, 1, 10)
    walsh = np.sort([(d[i] + d[j]) / 2 for i in range(10) for j in range(i, 10)])
    r = robust_shift(d)
    assert r["hl"] == pytest.approx(np.median(walsh)) and r["ci"] == pytest.approx((walsh[8], walsh[46]))
    assert robust_shift(d[:6])["ci"] == pytest.approx((walsh_of(d[:6])[0], walsh_of(d[:6])[-1]))
    three = robust_shift([0.01, -0.02, 0.03])
    assert three == dict(hl=pytest.approx(0.0075), ci=None, p=pytest.approx(0.75))  # 2 of 8 sign patterns
    assert robust_shift([]) == dict(hl=None, ci=None, p=None)


def walsh_of(d):
    return np.sort([(d[i] + d[j]) / 2 for i in range(len(d)) for j in range(i, len(d))])


def test_the_shared_rate_study_by_its_median_shift():
    """The committed 30 pairs of results/shared_rate_cpu: t CI [-0.0123, +0.0495], but a median shift of -0.0005
    [-0.0065, +0.0057] with Wilcoxon p = 0.79: 2 stalled runs drive the mean, not the other 28."""
    final = lambda arm, seed: json.loads((ROOT / "results" / "enwiki_cpu" / "runs" / arm / f"lr0.008_seed{seed}"
                                          / "metrics.jsonl").read_text().splitlines()[-1])["val_loss_full"]
    seeds = range(2001, 2031)
    pd = paired_difference({s: final("nonlinear", s) for s in seeds}, {s: final("linear", s) for s in seeds})
    assert pd["ci"] == pytest.approx((-0.0123, 0.0495), abs=1e-4)
    r = robust_shift(pd["diffs"])
    assert r["hl"] == pytest.approx(-0.0005, abs=1e-4) and r["ci"] == pytest.approx((-0.0065, 0.0057), abs=1e-4)
    assert r["p"] == pytest.approx(0.792, abs=1e-3) and sum(d > 0 for d in pd["diffs"]) == 13


def test_a_stalled_seed_left_out_by_the_ladder_rule_costs_trend_little_power():
    """600 ladders of 4 rungs x 3 seeds (pair sd 0.014) whose gap falls 0.025 nats per 10x: trend calls the
    fall in about 40% of them. One stalled run (+0.35 nats, as the CPU studies' stalls end) at a random rung
    drives that to near 0 when its pair is kept, and costs at most 0.1 of it when the ladder's rule
    (study.LADDER_FLAGS, report.unflagged_gap) leaves the pair out."""
    n, rng, x = 600, np.random.default_rng(63), np.log10(np.array(SIZES) / SIZES[0])
    ref = rng.normal(3.5, 0.05, (n, len(SIZES), SEEDS))
    arm = ref - 0.025 * x[:, None] + rng.normal(0, SD, ref.shape)
    rung, seed = rng.integers(len(SIZES), size=n), rng.integers(SEEDS, size=n)
    stalled = arm.copy()
    stalled[np.arange(n), rung, seed] += 0.35
    calls = lambda gaps: np.mean([trend(SIZES, g)["ci"][1] < 0 for g in gaps])
    finals = lambda losses, flagged=None: dict(finals={s: dict(final=v, flag="stalled" if s == flagged else None)
                                                       for s, v in enumerate(losses)})
    left_out = [[report.unflagged_gap(finals(stalled[k, i], seed[k] if i == rung[k] else None), finals(ref[k, i]))
                 for i in range(len(SIZES))] for k in range(n)]
    assert all(sum(g["left_out"] for g in gaps) == 1 for gaps in left_out)
    power = dict(none=calls((arm - ref).mean(axis=2)), kept=calls((stalled - ref).mean(axis=2)),
                 left_out=calls([[g["mean"] for g in gaps] for gaps in left_out]))
    print(power)
    assert power["none"] == pytest.approx(trend_power(SIZES, SEEDS, -0.025, SD), abs=0.05)  # 0.43: its formula
    assert 0.3 <= power["none"] <= 0.55 and power["kept"] < 0.05 and power["left_out"] >= power["none"] - 0.1


def test_the_dry_runs_pair_sd_is_the_committed_runs(monkeypatch):
    """plan.PAIR_SD, the pair sd the ladder's dry-run power uses: shared_rate_cpu's nonlinear − linear without the
    flagged pairs (27 of 30; with them 0.083)."""
    from research import plan, study
    monkeypatch.chdir(ROOT)  # the study file's paths are the repository's
    data = study.collect(study.load_study("studies/shared_rate_cpu.py"))
    gap = report.unflagged_gap(data["nonlinear"], data["linear"])
    assert gap["n"] == 27 and gap["left_out"] == 3 and round(gap["sd"], 3) == plan.PAIR_SD
