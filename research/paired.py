"""
Paired statistics over seeds, the numbers behind every report: at one seed every arm of a study sees the same
training windows and val tokens, so arms are compared seed by seed. Δ = the mean of arm_i − ref_i over the seeds
both finished, its 95% CI from Student's t with n − 1 degrees of freedom; a difference is called only when the CI
excludes 0. Beside it, robust_shift gives what a few outlying pairs (a stalled run) cannot move far: the
Hodges–Lehmann shift with its CI and the Wilcoxon signed-rank p. Over a ladder's rungs, trend fits how a Δ
changes with size, and multiplier turns a gap into the size the reference would need to close it.
"""
import math

import numpy as np
from scipy import optimize, stats


def summarize(values):
    """Final losses -> (mean, sample std with ddof=1, n); std is nan for n < 2, mean nan for n = 0."""
    n = len(values)
    return float(np.mean(values)) if n else math.nan, float(np.std(values, ddof=1)) if n > 1 else math.nan, n


def paired_difference(arm, ref, confidence=0.95):
    """arm, ref: {seed: final loss} -> dict(n, seeds both have, diffs arm_i - ref_i, their mean and sd, ci from
    Student's t with n - 1 df, p of the paired t-test, rel = mean / mean(ref) in %); ci and p None for n < 2."""
    seeds = sorted(set(arm) & set(ref))
    d = [arm[s] - ref[s] for s in seeds]
    n, (mean, ci) = len(d), mean_ci(d, confidence)
    p = float(stats.ttest_rel([arm[s] for s in seeds], [ref[s] for s in seeds]).pvalue) if n >= 2 else None
    ref_mean = float(np.mean([ref[s] for s in seeds])) if n else math.nan
    return dict(n=n, seeds=seeds, diffs=d, mean=mean, sd=summarize(d)[1], ci=ci, p=p, rel=mean / ref_mean * 100,
                ref_mean=ref_mean)


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
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)  # (t.interval refuses a zero spread)
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


def rate_ci(k, n, confidence=0.95):
    """k events in n trials (a stall rate) -> the exact (Clopper–Pearson) CI of their rate, (lo, hi)."""
    ci = stats.binomtest(k, n).proportion_ci(confidence, method="exact")
    return ci.low, ci.high


def fmt_ci(ci):
    return "—" if ci is None else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def robust_shift(diffs, confidence=0.95):
    """Paired differences -> dict(hl, ci, p): the Hodges–Lehmann shift (the median of the n(n+1)/2 Walsh
    averages (d_i + d_j) / 2, i <= j), its distribution-free CI and the two-sided Wilcoxon signed-rank p.

    The CI is the set of shifts δ that the signed-rank test of d − δ does not reject (scipy.stats.wilcoxon, exact
    for n <= 50): between two neighbouring Walsh averages the test's statistic does not change, so the test is
    run once at the midpoint of each gap, and the CI runs from the Walsh average below the first accepted gap to
    the one above the last. It needs only that the differences are symmetric about their centre, not normal, and
    one stalled pair moves it by one rank, not by its size. ci is None where no finite CI exists: at 95% that is
    n <= 5 (the smallest possible p is 2 / 2^n); hl and p are None for n = 0 and n = 0 or 1."""
    d = np.asarray(diffs, dtype=float)
    if not len(d):
        return dict(hl=None, ci=None, p=None)
    i, j = np.triu_indices(len(d))
    walsh = np.sort((d[i] + d[j]) / 2)
    p = float(stats.wilcoxon(d).pvalue) if len(d) > 1 and d.any() else None
    gaps = np.concatenate([[walsh[0] - 1], (walsh[1:] + walsh[:-1]) / 2, [walsh[-1] + 1]])
    accepted = np.flatnonzero(stats.wilcoxon(d[None, :] - gaps[:, None], axis=1).pvalue > 1 - confidence)
    if len(d) < 2 or not len(accepted) or accepted[0] == 0 or accepted[-1] == len(walsh):
        return dict(hl=float(np.median(walsh)), ci=None, p=p)
    return dict(hl=float(np.median(walsh)), ci=(float(walsh[accepted[0] - 1]), float(walsh[accepted[-1]])), p=p)


def trend(sizes, values, confidence=0.95):
    """How a paired gap changes with size over a ladder's rungs: least squares of the rungs' gaps (values: each
    rung's mean Δ, or its rel) on log10(size) -> dict(slope per 10× size, its CI, k rungs), or None with fewer
    than 3 rungs.

    Why unweighted, with t on k − 2 df: each rung's Δ carries its seeds' noise and noise of its own (the rate its
    search chose, its data order), and with 3 seeds a rung's se is itself a guess on 2 df, so weights 1 / se²
    taken as known undercover. The rungs' scatter about the line measures both noises at once; with equal seeds
    per rung the interval is exact for normal noise (tests/test_paired.py measures its coverage). Its price is
    width: 4 rungs leave 2 df (t = 4.30)."""
    x, k = np.log10(np.asarray(sizes, dtype=float)), len(sizes)
    if len(set(x.tolist())) < 3:  # no degree of freedom left for the rungs' scatter
        return None
    fit = stats.linregress(x, values)
    half = stats.t.ppf(0.5 + confidence / 2, k - 2) * fit.stderr
    return dict(slope=float(fit.slope), ci=(float(fit.slope - half), float(fit.slope + half)), k=k)


def trend_power(sizes, seeds, slope, sd, confidence=0.95):
    """The chance that trend's CI excludes 0 on the slope's side for a gap that changes by slope per 10× size,
    each rung's Δ the mean of seeds pairs of sd sd (normal noise, none of the rungs' own): the fitted slope over
    its standard error is then a noncentral t on k − 2 df."""
    x = np.log10(np.asarray(sizes, dtype=float))
    k, sxx = len(x), ((x - x.mean()) ** 2).sum()
    ncp = abs(slope) * math.sqrt(sxx * seeds) / sd
    return float(stats.nct.sf(stats.t.ppf(0.5 + confidence / 2, k - 2), k - 2, ncp))


def floor_fit(sizes, losses):
    """The reference's loss along a ladder as a power law with a floor, L(N) = E + B·N^(−α) (the form of
    Kaplan et al. and Hoffmann et al.: a curve that flattens towards E, where a pure power law stays straight
    on log axes), least squares over the rung means -> (E, B, α), or None with fewer than 3 rungs or a loss
    that does not fall with size. For each α, E and B are a linear least squares; α in (0, 3] minimises it."""
    n, y = np.asarray(sizes, dtype=float), np.asarray(losses, dtype=float)
    if len(set(n.tolist())) < 3:
        return None
    x = n / n[0]  # sizes relative to the smallest rung, so that x^(−α) stays near 1

    def solve(alpha):
        design = np.stack([np.ones_like(x), x ** -alpha], axis=1)
        coef = np.linalg.lstsq(design, y, rcond=None)[0]
        return coef, ((design @ coef - y) ** 2).sum()
    alpha = optimize.minimize_scalar(lambda a: solve(a)[1], bounds=(1e-3, 3.0), method="bounded",
                                     options=dict(xatol=1e-9)).x
    (floor, b), _ = solve(alpha)
    return None if b <= 0 else (float(floor), float(b * n[0] ** alpha), float(alpha))


def multiplier(sizes, ref_means, gaps):
    """The effective-size multiplier of an arm at each rung: how many times the size the reference would need
    to reach the arm's loss. The reference's curve is floor_fit's, L(N) = E + B·N^(−α); the arm's loss at a
    rung is L(N) + Δ, Δ the rung's paired difference (gaps: paired_difference's dicts), so M solves
    L(M·N) = L(N) + Δ:  M = (N^(−α) + Δ / B)^(−1/α) / N  (inf where L(N) + Δ is at or below the floor E: no
    size of the reference gets there). Its 95% CI is the paired Δ's t interval mapped through the same curve,
    the curve taken as known: it rests on the whole fall of the loss over the ladder, Δ on a fraction of a
    percent, and tests/test_paired.py measures the coverage this gives with a floor at α 0.2-0.4.
    -> dict(floor E, alpha, at=[(size, M, (lo, hi) or None)]), or None without a falling curve."""
    fit = floor_fit(sizes, ref_means)
    if fit is None:
        return None
    floor, b, alpha = fit

    def m(size, delta):
        u = size ** -alpha + delta / b
        return math.inf if u <= 0 else u ** (-1 / alpha) / size
    at = [(float(size), m(size, d["mean"]), d["ci"] and (m(size, d["ci"][1]), m(size, d["ci"][0])))
          for size, d in zip(sizes, gaps)]
    return dict(floor=floor, alpha=alpha, at=at)
