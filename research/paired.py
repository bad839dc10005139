"""
Paired statistics over seeds, the numbers behind every report: at one seed every arm of a study sees the same
training windows and val tokens, so arms are compared seed by seed. Δ = the mean of arm_i − ref_i over the seeds
both finished, its 95% CI from Student's t with n − 1 degrees of freedom; a difference is called only when the CI
excludes 0. trend fits how a Δ changes with model size over a ladder's rungs.
"""
import math

import numpy as np
from scipy import stats


def summarize(values):
    """Final losses -> (mean, sample std with ddof=1, n); std is nan for n < 2, mean nan for n = 0."""
    n = len(values)
    mean = sum(values) / n if n else math.nan
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    return mean, std, n


def paired_difference(arm, ref, confidence=0.95):
    """arm, ref: {seed: final loss} -> dict(n, seeds both have, diffs arm_i - ref_i, their mean and sd, ci from
    Student's t with n - 1 df, p of the paired t-test, rel = mean / mean(ref) in %); ci and p None for n < 2."""
    seeds = sorted(set(arm) & set(ref))
    d = [arm[s] - ref[s] for s in seeds]
    n, (mean, ci) = len(d), mean_ci(d, confidence)
    p = float(stats.ttest_rel([arm[s] for s in seeds], [ref[s] for s in seeds]).pvalue) if n >= 2 else None
    rel = float(mean / np.mean([ref[s] for s in seeds]) * 100) if n else math.nan
    return dict(n=n, seeds=seeds, diffs=d, mean=mean, sd=summarize(d)[1], ci=ci, p=p, rel=rel)


def welch_p(arm_values, ref_values):
    """Two-sided p-value of Welch's unpaired t-test; None if either side has n < 2."""
    if min(len(arm_values), len(ref_values)) < 2:
        return None
    return float(stats.ttest_ind(arm_values, ref_values, equal_var=False).pvalue)


def mean_ci(values, confidence=0.95):
    """Values -> (mean, (lo, hi)) with a Student's t CI over n - 1 df; the CI is None for n < 2."""
    mean, std, n = summarize(values)
    if n < 2:
        return mean, None
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)
    return mean, (mean - half, mean + half)


def seeds_needed(sd, half_width, confidence=0.95, n_max=100_000):
    """The fewest pairs n ≥ 2 whose CI half-width t(n − 1) · sd / √n is at most half_width; None beyond n_max."""
    n = np.arange(2, n_max + 1)
    enough = stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / np.sqrt(n) <= half_width
    return int(n[enough.argmax()]) if enough.any() else None


def verdict(ci, quick=False):
    """'lower' / 'higher' when the CI of arm - ref excludes 0, else 'no call'; a --quick try never calls."""
    if ci is None or quick:
        return "n < 2" if ci is None else "no call (--quick try)"
    return "lower" if ci[1] < 0 else "higher" if ci[0] > 0 else "no call"


def fmt_ci(ci):
    return "—" if ci is None else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def trend(sizes, diffs):
    """How a paired Δ changes with model size: a fit of Δ = a + b·log10(size) over the rungs, each rung's Δ
    weighted by 1 / se² (se = its sd / sqrt(n)), the rungs independent -> (b, its 95% CI) per 10x size, or None
    with fewer than two rungs of n ≥ 2."""
    pts = [(math.log10(n), d["mean"], d["sd"] / math.sqrt(d["n"])) for n, d in zip(sizes, diffs) if d["n"] >= 2]
    pts = [(x, y, se) for x, y, se in pts if se > 0]
    if len({x for x, _, _ in pts}) < 2:
        return None
    x, y, w = (np.array(v) for v in zip(*[(x, y, 1 / se ** 2) for x, y, se in pts]))
    x_bar = (w * x).sum() / w.sum()
    b = float((w * (x - x_bar) * y).sum() / (w * (x - x_bar) ** 2).sum())
    half = float(stats.norm.ppf(0.975) / math.sqrt((w * (x - x_bar) ** 2).sum()))
    return b, (b - half, b + half)
