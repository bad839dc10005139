"""The paired statistics (research/paired.py) where the method is the project's own: the coverage of the size
trend's and the multiplier's 95% intervals, measured on simulated ladders, and the robust shift against its
textbook values and the committed shared-rate study."""
import json

import numpy as np
import pytest
from conftest import ROOT

from research.paired import multiplier, paired_difference, robust_shift, trend

# the GPU ladder's rungs (non-embedding parameters), 3 paired seeds each, a paired Δ's sd as measured on the CPU
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


def ladders_with_a_gain(n, rung_sd, rng, gain=-0.005, alpha=0.08):
    """n ladders whose reference follows L = 3 (N / N_max)^-alpha and whose arm is `gain` (relative) below it,
    per-run noise sd 0.01 (reference) and SD (the pair), rung-level noise on both -> (ref means, arm means)."""
    shape = (n, len(SIZES), SEEDS)
    ref = 3.0 * (np.array(SIZES) / SIZES[-1]) ** -alpha
    rung = lambda: rng.normal(0, rung_sd, (n, len(SIZES)))
    ref_runs = ref[None, :, None] + rng.normal(0, 0.01, shape)
    arm_runs = ref_runs * (1 + gain) + rng.normal(0, SD, shape)
    return ref_runs.mean(axis=2) + rung(), arm_runs.mean(axis=2) + rung()


@pytest.mark.parametrize("rung_sd", [0.0, RUNG_SD])
def test_the_multiplier_interval_covers_the_true_multiplier(rung_sd):
    """A constant 0.5% gain on a reference with alpha = 0.08 is worth exp(-ln(0.995) / 0.08) = 1.065x the
    parameters at every size; the 95% CI at the smallest and the largest rung holds it 93-97% of the time."""
    true = np.exp(-np.log(0.995) / 0.08)
    refs, arms = ladders_with_a_gain(2000, rung_sd, np.random.default_rng(7))
    fits = [multiplier(SIZES, r, a) for r, a in zip(refs, arms)]
    for rung in (0, -1):
        coverage = np.mean([f["at"][rung][2][0] <= true <= f["at"][rung][2][1] for f in fits])
        print(f"multiplier coverage at {SIZES[rung]:,} with rung sd {rung_sd}: {coverage:.4f}")
        assert 0.93 <= coverage <= 0.97


def test_the_multiplier_of_exact_power_laws():
    """An arm 1% below a pure power law with alpha = 0.1 is worth 0.99^(-1/0.1) = 1.106x the parameters."""
    ref = [3.0 * (n / 1e8) ** -0.1 for n in SIZES]
    fit = multiplier(SIZES, ref, [0.99 * r for r in ref])
    assert fit["alpha"] == pytest.approx(0.1)
    assert [m for _, m, _ in fit["at"]] == pytest.approx([0.99 ** -10] * 4)
    assert multiplier(SIZES[:2], ref[:2], ref[:2]) is None
    assert multiplier(SIZES, ref[::-1], ref[::-1]) is None  # a loss that grows with size: no power law to invert


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
