"""
The report of a sweep.py study: paired statistics over seeds, the learning-rate search, plots. Or, given run
folders instead of a study file, a side-by-side look at plain train.py runs (no statistics: research/compare.py).

    python -m research.report studies/enwiki_cpu.py                   # -> results/enwiki_cpu/README.md and plots
    python -m research.report studies/enwiki_cpu.py --out /tmp/rep    # elsewhere
    python -m research.report out/a out/b                             # -> out/compare/README.md and val_loss.png

Everything is rebuilt from the runs' metrics.jsonl and config.json alone (results/<study>/runs/ is committed),
so anyone can recompute the tables. Run it from the repository root: the study's paths are relative.

Statistics: each arm against the reference, paired by seed (research/paired.py; a call only where the 95% CI
excludes 0); missing and unfinished runs are listed, never fatal.
"""
import argparse
import datetime
import math
import os
import pathlib
import platform
import shlex
import sys

import numpy as np
import torch

from nlq import settings
from nlq.settings import HelpFormatter, model_config
from research.compare import (COMPARED, compare, fmt_loss, plt, png, table,  # plt: matplotlib's, imported there or
                              write_files)  # an error naming the install command
from research.paired import (fmt_ci, mean_ci, multiplier, paired_difference, rate_ci, robust_shift, seeds_needed,
                             summarize, trend, verdict, welch_p)
from research.plan import horizon_table
from research.study import (LADDER_FLAGS, QUICK_DIR, QUICK_FRACTION, STALL_RULE, STALL_TEXT, all_runs, arm_config,
                            collect, count, elapsed_seconds, final_losses, load_study, pick_best_lr, quick_option,
                            run_tokens, rungs_of, swept_rates)


# ------------------------------------------------------------------------------------------- the report
def header(study_path, study, out):
    """Title, the study file's comment, the commands that produce the report, date and machine."""
    comment = [line[1:].strip() for line in pathlib.Path(study_path).read_text().splitlines() if line[:1] == "#"]
    cmds = [c for c in comment if c.startswith("python ")] or [f"python -m research.sweep {shlex.quote(study_path)}"]
    if not any(c.startswith("python -m research.report") for c in cmds):
        cmds.append(f"python -m research.report {shlex.quote(study_path)}"
                    + ("" if out == default_out(study) else f" --out {shlex.quote(out)}"))
    about = " ".join(c for c in comment if not c.startswith("python "))
    if study.get("quick"):  # the study at a fraction of its steps: say so first
        q = study["quick"]
        cmds = [f"python -m research.{script} {study_path}{quick_option(q)}" for script in ("sweep", "report")]
        about = (f"**A --quick try of this study: every run at {q:g} of its steps. For trying the machinery, "
                 f"not for comparing arms: no difference is called, and a run this short may count as "
                 f"stalled. Its runs skip the whole-split eval, so where the study's text below speaks of "
                 f"the whole val split, this try has the last fixed-window val loss (Method).** {about}")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()  # usable ones
    machine = f"{platform.processor() or platform.machine()}, {cpus} CPUs"
    return (f"# Study {study['name']}\n\n{about}\n\nProduced by (from the repository root):\n\n```\n"
            + "\n".join(cmds) + f"\n```\n\nGenerated {now} on {machine}; Python {platform.python_version()}, "
            f"torch {torch.__version__}. Raw runs (each run's metrics.jsonl and config.json): "
            f"`{study['runs_dir']}/`.")


def method(study, tokenizer):
    ref = study["reference"]
    bpb = " Bits per byte = loss / ln 2 (byte-level data: one token per byte)." if tokenizer == "byte" else ""
    if arm_config(study, next(iter(study["arms"])))["eval_full_at_end"]:
        final, key = "its val loss over the whole val split, every val token once", "`val_loss_full`"
    else:
        final, key = ("its last fixed-window val loss", "`val_loss`: these runs skip the whole-split eval "
                      "(eval_full_at_end=False, as every --quick run does)")
    grids = {tuple(g) for g in study["grids"].values()}
    grid = (f"the base grid {', '.join(f'{lr:g}' for lr in next(iter(grids)))}" if len(grids) == 1
            else "each arm's own base grid (see the search table)")
    if study["selection_seeds"]:
        margin = study["stall_margin"]
        stall = f"The stall rule (stall_margin {margin:g}): {STALL_RULE} " if margin else ""
        horizons = (f"The search runs at each horizon of {', '.join(map(str, study['horizons']))} steps (warmup the "
                    f"same fraction of a run as in the final runs), and the final seeds run at the rate carried to "
                    f"the final horizon: {HORIZON_TEXT} " if study["horizons"] else "")
        search = (f"**Method.** Each arm's learning rate is chosen on selection seeds "
                  f"{study['selection_seeds']} (the mean final loss over them): {grid}, one more grid step "
                  f"while the best rate is at an edge (at most {study['max_extensions']}), then half steps "
                  f"(×/÷ √2) around the best{'' if study['half_steps'] else ' (off in this study)'}. "
                  f"{stall}{horizons}The chosen rate is then run on ")
    else:
        rates = ", ".join(f"{arm} {g[0]:g}" for arm, g in study["grids"].items())
        search = f"**Method.** Each arm's learning rate is given, not searched ({rates}); it is run on "
    return (search +
            f"the final seeds {study['seeds']} (disjoint from any selection seeds; arms on fewer: "
            f"{', '.join(f'{a} {n}' for a, n in study['seeds_per_arm'].items()) or 'none'}), and only "
            f"these enter the statistics. A run's final loss is {final} ({key}; the same tokens for every "
            f"arm and seed), in nats/token.{bpb} Each arm is compared with `{ref}` *paired* "
            f"by seed (at one seed both see the same training windows): Δ = mean over shared seeds of (arm − "
            f"{ref}), its 95% CI from Student's t with n − 1 degrees of freedom, and the paired t-test's "
            f"p-value; Welch's unpaired p-value is a secondary column. **A difference is called only when "
            f"its 95% CI excludes 0**; otherwise the column says 'no call'. 'rel' = Δ / mean({ref}) in %. "
            f"'stalled' counts the stalled final runs. {STALL_TEXT} {ROBUST_TEXT}")


def results_table(study, data, tokenizer):
    """Per arm: parameters, chosen rate, final loss, stalled runs, and the paired statistics vs the reference."""
    ref, byte = study["reference"], tokenizer == "byte"
    ref_losses = final_losses(data[ref])
    rows = []
    for arm, d in data.items():
        counts = settings.param_counts(model_config(arm_config(study, arm)))  # as this clone's model.py builds it
        losses = final_losses(d)
        mean, std, n = summarize(list(losses.values()))
        chosen = d["plan"]["chosen"]
        diverged = count(d["finals"].values(), "diverged")
        cells = [arm, f"{counts['non_embedding']:,}", f"{counts['non_embedding_matrix']:,}",
                 "—" if chosen is None else f"{chosen:g}",
                 ("—" if not n else f"{mean:.4f} ± {std:.4f} ({n})" if n > 1 else f"{mean:.4f} (1)")
                 + (f"; {diverged} diverged" if diverged else ""),
                 f"{sum(r['stalled'] for r in d['finals'].values())} of {n}" if n else "—"]
        cells += [f"{mean / math.log(2):.4f}" if n else "—"] if byte else []
        pd = paired_difference(losses, ref_losses if arm != ref else {})
        wp = welch_p(list(losses.values()), list(ref_losses.values())) if pd["n"] else None
        rows.append(cells + delta_cells(pd, study.get("quick"), f"{pd['rel']:+.2f}%", fmt_p(pd["p"]), fmt_p(wp)))
    cols = ["arm", "non-embedding params", "non-embedding matrix", "chosen lr", "final loss, mean ± std (n)",
            "stalled", *(["bits/byte"] if byte else []), f"Δ vs {ref} (paired, nats)", "95% CI", "rel",
            "paired p", "Welch p", "call", *ROBUST_COLS]
    return table(cols, rows, "l" + "r" * (len(cols) - 4) + "lrr")


ROBUST_COLS = ["HL shift [95% CI]", "Wilcoxon p"]
ROBUST_TEXT = ("Beside each t interval, 'HL shift' is the Hodges–Lehmann shift, the median of the pairs' Walsh "
               "averages (d_i + d_j) / 2, with its distribution-free 95% CI (the shifts the Wilcoxon signed-rank "
               "test does not reject; none exists for n ≤ 5), and 'Wilcoxon p' that test's two-sided p: a stalled "
               "pair moves them by one rank, not by its size. The call is the t interval's.")


def fmt_p(p):
    return "—" if p is None else f"{p:.3g}"


def delta_cells(pd, quick, *middle):
    """A paired_difference's cells: Δ (n), its 95% CI, the middle cells given, the call, the robust summaries
    (the Hodges–Lehmann shift [its CI], the Wilcoxon p); every cell '—' where no seed is shared."""
    if not pd["n"]:
        return ["—"] * (5 + len(middle))
    r = robust_shift(pd["diffs"])
    return [f"{pd['mean']:+.4f} (n={pd['n']})", fmt_ci(pd["ci"]), *middle, verdict(pd["ci"], quick),
            f"{r['hl']:+.4f} " + (fmt_ci(r["ci"]) if r["ci"] else "(no CI at n ≤ 5)"), fmt_p(r["p"])]


def contrasts_table(study, data):
    """The study's contrasts: paired Δ = arm − other (each at its chosen rate), 95% CI, paired p, the call."""
    rows = []
    for arm, other, isolates in study["contrasts"]:
        pd = paired_difference(final_losses(data[arm]), final_losses(data[other]))
        rows.append([f"{arm} − {other}", isolates, *delta_cells(pd, study.get("quick"), fmt_p(pd["p"]))])
    cols = ["arm − other", "what the pair isolates", "Δ (paired, nats)", "95% CI", "paired p", "call", *ROBUST_COLS]
    return table(cols, rows, "llrrrlrr")


def precision_table(study, data):
    """Per arm vs the reference: the paired differences' sd, the CI half-width now and the seeds it needs."""
    ref = study["reference"]
    ref_losses = final_losses(data[ref])
    target = study["precision"] * summarize(list(ref_losses.values()))[0] if ref_losses else math.nan
    target_text = "—" if math.isnan(target) else f"±{target:.4f}"
    rows = []
    for arm, d in data.items():
        if arm == ref:
            continue
        pd = paired_difference(final_losses(d), ref_losses)
        if pd["ci"] is None:
            rows.append([arm, str(pd["n"]), "—", "—", target_text, "—"])
            continue
        half = (pd["ci"][1] - pd["ci"][0]) / 2
        need = seeds_needed(pd["sd"], target)
        rows.append([arm, str(pd["n"]), f"{pd['sd']:.4f}", f"±{half:.4f} ({half / target:.1f}× the target)",
                     target_text, "more than 100,000" if need is None else str(need)])
    cols = [f"arm − {ref}", "pairs", "sd of the differences", "95% CI half-width now", "target",
            "pairs needed at this sd"]
    return table(cols, rows)


# ------------------------------------------------------------------------------- learning-rate curves
def unflagged_gap(d, other):
    """The paired Δ of two arms over the pairs where neither final run is flagged, with left_out: how many not."""
    gap = paired_difference(final_losses(d, flagged=False), final_losses(other, flagged=False))
    return {**gap, "left_out": len(set(final_losses(d)) & set(final_losses(other))) - gap["n"]}


def stall_caution(study, data):
    """[paragraphs]: per arm its flagged final runs, stall rate and Δ without them; arms all of whose runs stalled."""
    ref, rows = study["reference"], []
    for arm, d in data.items():
        flagged = [f"{s} {r['flag']} ({r['why']})" for s, r in d["finals"].items() if r["flag"]]
        k, n = len(flagged), count(d["finals"].values(), "done")
        lo, hi = rate_ci(k, n) if n else (None, None)
        gap = unflagged_gap(d, data[ref]) if arm != ref else dict(n=0)
        rows.append([arm, "; ".join(flagged) or "none",
                     f"{k} of {n}: {k / n:.0%} [{lo:.0%}, {hi:.0%}]" if n else "—",
                     f"{gap['mean']:+.4f} (n={gap['n']}) {fmt_ci(gap['ci'])}" if gap["n"] else "—"])
    out = [f"**Stalls (final runs; Method).** Each arm's flagged runs and why, its stall rate (stalled + late) "
           f"with its exact (Clopper–Pearson) 95% interval, and Δ vs {ref} over the pairs where neither run is "
           f"flagged (beside the all-pairs Δ above, paired t 95% CI).",
           table(["arm", "flagged final runs", "stall rate [95% CI]", f"Δ vs {ref} without flagged pairs"], rows,
                 "llrr")]
    blind = [f"{arm} ({d['plan']['chosen']:g})" for arm, d in data.items()
             if d["finals"] and all(r["stalled"] for r in d["finals"].values())]
    if blind:
        out.append(f"**Every final run stalled: {', '.join(blind)}.** None of these arms' final runs left the "
                   f"early plateau by half-way, so their results say little about the query, and the chosen "
                   f"rate (in brackets) may be far from the arm's best, often a lower one. Give such an arm lower "
                   f"rates (learning_rates as a dict arm -> grid: python -m research.sweep --help) or more steps "
                   f"(the full study, if this is a --quick try).")
    return out


def curve_points(study, d):
    """An arm's learning-rate curve: {lr: dict(losses={selection seed: final loss}, stalled, diverged, unfinished)}."""
    points = {}
    for lr in d["plan"]["swept"]:
        runs = [d["search"][(lr, s)] for s in study["selection_seeds"]]
        points[lr] = dict(losses={r["seed"]: r["final"] for r in runs if r["final"] is not None},
                          stalled=sum(r["stalled"] for r in runs), diverged=count(runs, "diverged"),
                          unfinished=count(runs, "missing", "unfinished"))
    return points


def rate_table(data, columns, cell, names=None):
    """Rows: the swept learning rates; a cell(lr, column) per column, headed by its name (default: itself)."""
    rows = [[f"{lr:g}", *(cell(lr, c) for c in columns)] for lr in swept_rates(data)]
    return table(["learning rate", *(names or columns)], rows, "r" * (len(columns) + 1))


def curve_tables(study, data):
    """Per rate and arm: mean final loss over the selection seeds, its 95% CI, runs stalled, diverged, unfinished;
    and arm − reference at that rate, paired by selection seed, its 95% CI and the call."""
    curves, ref = {arm: curve_points(study, d) for arm, d in data.items()}, study["reference"]

    def loss(lr, arm):
        p = curves[arm].get(lr)
        if p is None:
            return "·"
        mean, ci = mean_ci(list(p["losses"].values()))
        marks = [f"{p[k]} {k}" for k in ("stalled", "diverged", "unfinished") if p[k]]
        return ("—" if not p["losses"] else f"{mean:.4f} {fmt_ci(ci)} (n={len(p['losses'])})") + (
            "; " + ", ".join(marks) if marks else "")

    def gap(lr, arm):
        if lr not in curves[arm] or lr not in curves[ref]:
            return "·"
        d = paired_difference(curves[arm][lr]["losses"], curves[ref][lr]["losses"])
        return ("—" if not d["n"] else
                f"{d['mean']:+.4f} {fmt_ci(d['ci'])} (n={d['n']}) {verdict(d['ci'], study.get('quick'))}")
    others = [arm for arm in data if arm != ref]
    return rate_table(data, list(data), loss), rate_table(data, others, gap, [f"{arm} − {ref}" for arm in others])


def band_table(study, data):
    """Per arm: the best rate, its mean, the rates within 1% of it, the stalled and diverged runs."""
    rows = []
    for arm, d in data.items():
        losses = d["plan"]["losses"]
        best = pick_best_lr(losses)  # and the rates within 1% of its mean
        rates = [] if best is None else sorted(lr for lr, v in losses.items()
                                               if v is not None and math.isfinite(v) and v <= 1.01 * losses[best])
        points = curve_points(study, d).values()
        curve_runs = sum(len(p["losses"]) + p["diverged"] for p in points)
        finals = list(d["finals"].values())
        rows.append([arm, "—" if best is None else f"{best:g}",
                     "—" if best is None else f"{losses[best]:.4f}",
                     ", ".join(f"{lr:g}" for lr in rates) or "—",
                     f"×{max(rates) / min(rates):.2f}" if rates else "—",
                     f"{sum(p['stalled'] for p in points)} / {sum(p['diverged'] for p in points)} of {curve_runs}",
                     f"{sum(r['stalled'] for r in finals)} / {count(finals, 'diverged')} of "
                     f"{count(finals, 'done', 'diverged')}"])
    cols = ["arm", "best lr", "mean at best", "rates within 1% of best", "band width",
            "curve runs stalled / diverged", "final runs stalled / diverged"]
    return table(cols, rows)


def plot_lr_curves(study, data):
    """Final loss against learning rate per arm: mean and 95% CI over the selection seeds, and every run."""
    fig, ax = plt.subplots(figsize=(8, 5))
    finite = [r["final"] for d in data.values() for r in d["search"].values() if r["final"] is not None]
    top = max(finite) + 0.02 * (max(finite) - min(finite) + 1e-3) if finite else 1.0
    for k, (arm, d) in enumerate(data.items()):
        shift = 2 ** (0.04 * (k - (len(data) - 1) / 2))  # arms side by side at each rate
        points = curve_points(study, d)
        xs = [lr for lr in sorted(points) if points[lr]["losses"]]
        if not xs and not any(p["diverged"] for p in points.values()):
            continue
        stats_at = {lr: mean_ci(list(points[lr]["losses"].values())) for lr in xs}
        line, = ax.plot([x * shift for x in xs], [stats_at[x][0] for x in xs], marker="o", ms=4, label=arm)
        color = line.get_color()
        for x in xs:
            mean, ci = stats_at[x]
            if ci is not None:
                ax.errorbar(x * shift, mean, yerr=[[mean - ci[0]], [ci[1] - mean]], color=color, capsize=3)
        for (lr, _), run in d["search"].items():
            if run["status"] == "diverged":
                ax.plot(lr * shift, top, marker="^", ms=7, color=color, clip_on=False)
            elif run["final"] is not None:
                stalled = run["stalled"]
                ax.plot(lr * shift, run["final"], marker="x" if stalled else ".", ms=7 if stalled else 5,
                        color=color, alpha=0.7, ls="none")
    ax.set_xscale("log", base=2)
    rates = swept_rates(data)
    ax.set_xticks(rates, [f"{lr:g}" for lr in rates], rotation=30)
    ax.minorticks_off()
    ax.set(xlabel="peak learning rate (log scale)", ylabel="final val loss (nats/token, whole val split)",
           title=f"learning-rate curves: mean and 95% CI over selection seeds {study['selection_seeds']}\n"
                 f"dots: each seed; ×: stalled; ▲: diverged")
    return png(fig, [ax], "no finished curve runs yet")


# ------------------------------------------------------------------------------- search, gap, status
def fmt_run(run):
    if run["status"] == "diverged":
        return f"diverged (iter {run['iter']})"
    if run["status"] == "done":
        return fmt_loss(run["final"])
    return "missing" if run["status"] == "missing" else f"unfinished ({run['iter']}/{run['max_iters']})"


def search_table(study, data):
    """Selection loss per rate and arm, the chosen rate in bold: while seeds are unfinished, the mean so far."""
    def cell(lr, arm):
        d = data[arm]
        if lr not in d["plan"]["swept"]:
            return "·"
        runs = [d["search"][(lr, s)] for s in study["selection_seeds"]]
        if not runs:  # a study without a search
            return "given"
        done = [r["final"] for r in runs if r["status"] == "done" and r["final"] is not None]
        if all(r["status"] == "done" for r in runs) and len(runs) > 1:
            text = f"{d['plan']['losses'][lr]:.4f}"
        elif len(runs) == 1 or any(r["status"] == "diverged" for r in runs) or not done:
            text = fmt_run(next((r for r in runs if r["status"] == "diverged"), runs[0]))
        else:  # some selection seeds still to run: the mean so far, and how many it is over
            text = f"{sum(done) / len(done):.4f} ({len(done)} of {len(runs)} seeds)"
        return f"**{text}**" if lr == d["plan"]["chosen"] else text
    notes = [f"- {arm}: {note}" for arm, d in data.items() for note in d["plan"]["notes"]]
    return rate_table(data, list(data), cell) + ("\n\n" + "\n".join(notes) if notes else "")


def gap_table(study, data):
    """Paired Δ vs the reference at every eval step (fixed eval windows): does the gap grow with training?"""
    ref = study["reference"]
    curves = {arm: {s: {r["iter"]: r["val_loss"] for r in run["rows"]
                        if r["iter"] > 0 and r.get("val_loss") is not None and math.isfinite(r["val_loss"])}
                    for s, run in d["finals"].items()} for arm, d in data.items()}
    others = [arm for arm in data if arm != ref]
    iters = sorted({i for s in curves[ref].values() for i in s})
    if not others or not iters:
        return "No finished eval steps yet."
    rows = []
    for it in iters:
        ref_at = {s: c[it] for s, c in curves[ref].items() if it in c}
        cells = [str(it)]
        for arm in others:
            pd = paired_difference({s: c[it] for s, c in curves[arm].items() if it in c}, ref_at)
            cells.append("—" if not pd["n"] else f"{pd['mean']:+.4f}" + (
                "" if pd["ci"] is None else " " + fmt_ci(pd["ci"])) + f" (n={pd['n']})")
        rows.append(cells)
    return table(["iter", *(f"{arm} − {ref}" for arm in others)], rows, "r" * (len(others) + 1))


def status_section(data):
    runs = {r["out_dir"]: r for r in all_runs(data)}
    todo = [r for r in runs.values() if r["status"] not in ("done", "diverged")]
    pending = [arm for arm, d in data.items() if d["plan"]["chosen"] is None]
    note = (f" Arms whose search is not complete yet (their next runs are not listed): {', '.join(pending)}."
            if pending else "")
    diverged = [r for r in runs.values() if r["status"] == "diverged"]
    if diverged:  # finished, but with no final loss: a table cell alone would hide them
        note += (f" {len(diverged)} of them diverged (the loss became NaN/inf; recorded, no final loss):\n\n"
                 + "\n".join(f"- {r['out_dir']}: {fmt_run(r)}" for r in diverged) + "\n")
    if not todo:
        return f"All {len(runs)} runs {'so far ' if pending else ''}finished.{note}"
    return f"{len(runs) - len(todo)} of {len(runs)} runs finished.{note} Not finished:\n\n" + "\n".join(
        f"- {r['out_dir']}: {fmt_run(r)}" for r in todo)


# ------------------------------------------------------------------------------------------- the plots
CURVES_CAPTION = ("The val-loss curves of the final runs at each arm's chosen rate: the line is the mean over "
                  "seeds, the band their min–max; iter 0 (the untrained model) is left out. Against tokens the "
                  "arms are compared; against seconds (right) the curves depend on the machine, its load and "
                  "how many runs shared it (`--jobs`): a guide to cost, not a measurement (bench.py is one).")


def plot_curves(data):
    """Val loss vs training tokens and seconds per arm: mean over the final seeds, and their min–max."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm, d in data.items():
        by_tokens, by_time = {}, {}
        for run in d["finals"].values():
            rows = [r for r in run["rows"] if r.get("val_loss") is not None]
            for row, t in zip(rows, elapsed_seconds(rows)):
                if row["iter"] > 0:  # iter 0: the untrained model, ~ln(vocab) for every arm
                    by_tokens.setdefault(row["tokens"], []).append(row["val_loss"])
                    by_time.setdefault(row["tokens"], []).append(t)
        if not by_tokens:
            continue
        xs = sorted(by_tokens)
        mean = [np.mean(by_tokens[x]) for x in xs]
        line, = axes[0].plot(xs, mean, marker="o", ms=3, label=f"{arm} (lr {d['plan']['chosen']:g})")
        axes[0].fill_between(xs, [min(by_tokens[x]) for x in xs], [max(by_tokens[x]) for x in xs], alpha=0.15,
                             color=line.get_color())
        axes[1].plot([np.mean(by_time[x]) for x in xs], mean, marker="o", ms=3, color=line.get_color(), label=arm)
    axes[0].set(xlabel="training tokens", ylabel="val loss (nats/token, fixed windows)",
                title="mean over final seeds; band: min–max")
    axes[1].set(xlabel="training seconds (mean over seeds; evals excluded)", ylabel="val loss (nats/token)",
                title="seconds: this machine, its load and --jobs")
    fig.suptitle("val loss at each arm's chosen learning rate")
    return png(fig, axes, "no final runs with evaluations yet")


PROBE_CAPTION = ("The probe (nlq/probe.py), at every eval on a fixed batch of val windows, final seeds' mean per "
                 "arm: left, the largest pre-softmax attention logit over every layer and head (logit growth is "
                 "the instability QK-norm cures); right, for the nonlinear query, ‖f(x)‖ / ‖x‖ averaged over "
                 "tokens and layers (how much f adds to the attention input). Runs made before the probe existed "
                 "have neither.")


def has_probe(runs):
    return any("attn_logit_max" in row for run in runs for row in run["rows"])


def plot_probe(data):
    """Per arm against training tokens, mean over its final seeds: PROBE_CAPTION's two numbers."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm, d in data.items():
        for ax, key, over_layers in ((axes[0], "attn_logit_max", max), (axes[1], "f_ratio", np.mean)):
            at = {}
            for run in d["finals"].values():
                for row in run["rows"]:
                    values = [v for v in row.get(key) or [] if v is not None]
                    if values:
                        at.setdefault(row["tokens"], []).append(over_layers(values))
            if at:
                xs = sorted(at)
                ax.plot(xs, [np.mean(at[x]) for x in xs], marker="o", ms=3, label=arm)
    axes[0].set(xlabel="training tokens", ylabel="largest pre-softmax attention logit (max over layers)",
                title="attention logits")
    axes[1].set(xlabel="training tokens", ylabel="‖f(x)‖ / ‖x‖ (mean over tokens and layers)",
                title="the nonlinear query's residual")
    return png(fig, axes, "no run with the probe's numbers")


def plot_forest(study, data):
    """Each arm's paired Δ vs the reference with its 95% CI, over each seed's difference (a forest plot)."""
    ref_losses = final_losses(data[study["reference"]])
    rows = [(arm, paired_difference(final_losses(d), ref_losses)) for arm, d in data.items()
            if arm != study["reference"] and final_losses(d) and ref_losses]
    fig, ax = plt.subplots(figsize=(7, 0.45 * max(len(rows), 2) + 1.5))
    for y, (arm, pd) in enumerate(reversed(rows)):
        ax.plot(pd["diffs"], [y - 0.18] * pd["n"], "|", color="0.45", ms=7)
        lo, hi = pd["ci"] if pd["ci"] is not None else (pd["mean"], pd["mean"])
        color = "tab:gray" if study.get("quick") else "tab:green" if hi < 0 else "tab:red" if lo > 0 else "tab:gray"
        ax.errorbar(pd["mean"], y, xerr=[[pd["mean"] - lo], [hi - pd["mean"]]], fmt="o", color=color, capsize=3)
    ax.set_yticks(range(len(rows)), [f"{arm} (n={pd['n']})" for arm, pd in reversed(rows)])
    ax.axvline(0, color="black", lw=0.8)
    ax.set(xlabel=f"Δ final loss vs {study['reference']} (nats/token; paired mean, 95% CI)",
           title=("a --quick try (runs at a fraction of their steps): no calls" if study.get("quick")
                  else "lower is better; green/red: the CI excludes 0") + "\nticks: each seed's paired difference")
    if not rows:
        ax.text(0.5, 0.5, "no paired results yet", ha="center", transform=ax.transAxes)
    ax.grid(alpha=0.3, axis="x")
    return png(fig)


# ------------------------------------------------------------------------------------------- the files
def tokenizer_of(runs):
    """The tokenizer the runs trained with (their config.json's dataset_meta), or None."""
    return next((r["config"]["dataset_meta"].get("tokenizer") for r in runs
                 if r["config"] and "dataset_meta" in r["config"]), None)


def reading_section(out):
    """A person's reading of the numbers (out/reading.md, kept across rebuilds) as report parts, or []."""
    reading = pathlib.Path(out, "reading.md")
    return ["## Reading", reading.read_text().strip()] if reading.exists() else []


def render(study_path, study, data, out):
    """The report of study -> (README markdown, {file name: bytes})."""
    tokenizer = tokenizer_of(all_runs(data))
    files = {"val_loss.png": plot_curves(data), "forest.png": plot_forest(study, data)}
    contrasts = (["## Contrasts between arms (paired by seed, final seeds both finished, 95% CI)",
                  contrasts_table(study, data)] if study["contrasts"] else [])
    precision = ([f"**Precision.** The study aims for a 95% CI half-width of {study['precision'] * 100:g}% of "
                  f"{study['reference']}'s mean final loss on each comparison with it. At the spread of the "
                  f"paired differences measured so far (their sd; one stalled seed can dominate it), that "
                  f"takes the number of final seeds below:", precision_table(study, data)]
                 if study["precision"] is not None else [])
    curves = []  # with several selection seeds, every rate's point has a spread: draw and tabulate the curves
    if len(study["selection_seeds"]) > 1 and not study["horizons"]:
        files["lr_curves.png"] = plot_lr_curves(study, data)
        losses, gaps = curve_tables(study, data)
        curves = [f"## Learning-rate curves (final loss over selection seeds {study['selection_seeds']})",
                  "Stalled runs as defined above. Means and 95% CIs are over the finished, non-diverged seeds "
                  "at each rate.",
                  "![learning-rate curves](lr_curves.png)", band_table(study, data), losses,
                  f"Each arm against {study['reference']} at the same rate, paired by selection seed (95% CI; a "
                  f"call only where the CI excludes 0):", gaps]
    if has_probe(all_runs(data)):
        files["probe.png"] = plot_probe(data)
        curves += ["## Inside attention (the probe)", PROBE_CAPTION, "![probe](probe.png)"]
    text = "\n\n".join([
        header(study_path, study, out), "## Results", method(study, tokenizer),
        results_table(study, data, tokenizer), *stall_caution(study, data), *precision, "![forest plot](forest.png)",
        *contrasts, "![val loss](val_loss.png)", CURVES_CAPTION, *horizon_sections(study, data), *curves,
        *reading_section(out), *search_sections(study, data),
        "## The gap along training (paired Δ on the fixed eval windows, 95% CI, final seeds)",
        gap_table(study, data), "## Runs", status_section(data)]) + "\n"
    files["README.md"] = text.encode()
    return text, files


HORIZON_TEXT = ("at each horizon an arm's best rate lr* is the minimum of the parabola in log(lr) through the mean "
                "selection losses of its best rate and their two neighbours (at an edge of its curve: the best rate "
                "itself, flagged); log lr* is fitted linearly on log(training tokens), the power law LR*(D) ∝ D^−β "
                "(Bjorck et al., ICLR 2025), and read at the final runs' tokens (3 significant digits). Its 95% "
                "interval, and β's, are bootstrap percentiles over the selection seeds (each horizon's seeds "
                "resampled with replacement, the parabolas and the fit redone): with 2 seeds a horizon has 3 "
                "distinct resamples, and on simulated curves the interval holds the true rate in about 2 of 3 "
                "studies (tests/test_horizons.py): it shows the least the uncertainty is.")


def search_sections(study, data):
    """The learning-rate search's section(s): one table, or one per horizon."""
    if not study["horizons"]:
        return [f"## Learning-rate search (mean final loss over selection seeds {study['selection_seeds']})"
                if study["selection_seeds"] else "## Learning rates (one per arm, given by the study: no search)",
                search_table(study, data)]
    return [part for sub in study["horizon_studies"].values() for part in (
        f"## Learning-rate search at {sub['horizon']:,} steps (mean final loss over selection seeds "
        f"{study['selection_seeds']}; runs in {sub['runs_dir']})", search_table(sub, collect(sub)))]


def horizon_sections(study, data):
    """With horizons: each arm's fit (plan.horizon_table); with short_pick, per arm the final loss of (a) the short
    pick and (b) the carried rate, (b) − (a) paired by seed, and each arm's regret (a) − (b) against the reference's."""
    if not study["horizons"]:
        return []
    parts = ["## The rate carried to the final horizon", HORIZON_TEXT[0].upper() + HORIZON_TEXT[1:],
             horizon_table(study)]
    if not study["short_pick"]:
        return parts
    ref, rows, regret = study["reference"], [], {}
    for arm, d in data.items():
        a = {s: r["final"] for s, r in d["short"].items() if r["final"] is not None}
        b = final_losses(d)
        pd = paired_difference(b, a)
        regret[arm] = {s: a[s] - b[s] for s in pd["seeds"]}
        p = d["plan"]
        rows.append([arm, "—" if p["short"] is None else f"{p['short']:g}",
                     "—" if p["chosen"] is None else f"{p['chosen']:g}", *(
                         f"{m:.4f} (n={n})" if n else "—" for m, _, n in map(summarize, (list(a.values()),
                                                                                           list(b.values())))),
                     *delta_cells(pd, study.get("quick"), fmt_p(pd["p"]))[:4]])
    gaps = [[f"{arm} − {ref}", *delta_cells(paired_difference(regret[arm], regret[ref]), study.get("quick"))[:3]]
            for arm in data if arm != ref]
    return parts + [
        "**Short pick against carried rate.** Each arm's final seeds at (a) the short pick, the rate its search "
        f"chose at the shortest horizon ({study['horizons'][0]:,} steps), and (b) the carried rate: the final loss "
        "of each (mean, n), and (b) − (a) paired by seed with its 95% CI (negative: the carried rate is better). "
        "Where they are one rate, (b) − (a) is 0.",
        table(["arm", "short pick (a)", "carried (b)", "loss at (a)", "loss at (b)", "(b) − (a) (paired, nats)",
               "95% CI", "paired p", "call"], rows, "lrrrrrrrl"),
        f"Does the regret of the short pick, (a) − (b), depend on the arm? Each arm's regret against {ref}'s, "
        f"paired by final seed (95% CI):",
        table(["regret difference", "Δ (paired, nats)", "95% CI", "call"], gaps, "lrrl")]


# ------------------------------------------------------------------------------------------- a ladder
def ladder_axis(rungs):
    """What a ladder's rungs vary -> (axis name, {rung: x}, {x: a final run's training FLOPs}): non-embedding
    parameters (Kaplan et al.'s count), or, where every rung has the same model, a final run's training tokens."""
    cfgs = {s["rung"]: arm_config(s, s["reference"]) for s in rungs}
    axis, xs = "non-embedding parameters", {r: settings.param_counts(model_config(c))["non_embedding"]
                                            for r, c in cfgs.items()}
    if len(set(xs.values())) == 1:
        axis, xs = "training tokens a run", {r: run_tokens(c) for r, c in cfgs.items()}
    return axis, xs, {xs[r]: run_tokens(c) * settings.flops_per_token(model_config(c)) for r, c in cfgs.items()}


def rel_ci(d):
    """A paired Δ in % of the reference's mean loss, with its CI on the same scale: '+0.52% [-0.10, +1.14]'."""
    ci = "" if d["ci"] is None else " [" + ", ".join(f"{c / d['ref_mean'] * 100:+.2f}" for c in d["ci"]) + "]"
    return f"{d['rel']:+.2f}%{ci}"


def ladder_table(gaps, quick, axis):
    rows = [[f"{arm} − {other}", rung, f"{x:,}", *delta_cells(d, quick, rel_ci(d)), str(d["left_out"])]
            for (arm, other), points in gaps.items() for rung, x, d in points]
    return table(["pair", "rung", axis, "Δ (paired, nats)", "95% CI", "Δ in % of other [95% CI]", "call",
                  *ROBUST_COLS, "flagged pairs left out"], rows, "llrrrrlrrr")


def plot_ladder(gaps, axis):
    """The paired Δ of each pair and its 95% CI against the rungs' sizes: in nats, and in % of the other's loss."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, scale, unit in ((axes[0], lambda d: 1.0, "nats"), (axes[1], lambda d: 100 / d["ref_mean"], "% of other")):
        for i, ((arm, other), points) in enumerate(gaps.items()):
            points = [(x * 1.03 ** i, d) for _, x, d in points if d["n"]]  # pairs side by side at each size
            ci = [d["ci"] or (d["mean"], d["mean"]) for _, d in points]
            ax.errorbar([x for x, _ in points], [d["mean"] * scale(d) for _, d in points], marker="o", capsize=3,
                        yerr=[[(d["mean"] - lo) * scale(d) for (_, d), (lo, _) in zip(points, ci)],
                              [(hi - d["mean"]) * scale(d) for (_, d), (_, hi) in zip(points, ci)]],
                        label=f"{arm} − {other}")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set(xlabel=axis, ylabel=f"paired Δ final val loss ({unit}), 95% CI")
    return png(fig, axes, empty="no rung has a paired difference yet")


def ladder_reading(gaps, quick, axis, flops):
    """What the data support, pair by pair: the rungs whose CI excludes 0, the fitted change with size (called
    only where its CI excludes 0), and the reference's multiplier at each rung (flops: {x: a final run's FLOPs})."""
    lines = []
    for (arm, other), points in gaps.items():
        called = [f"{verdict(d['ci'], quick)} at {rung}" for rung, _, d in points
                  if verdict(d["ci"], quick) in ("lower", "higher")]
        text = (f"- **{arm} − {other}**: " + (f"{', '.join(called)} (the other rungs: no call)" if called
                                              else "no rung's 95% CI excludes 0"))
        paired = [(x, d) for _, x, d in points if d["n"] >= 2]  # rungs with a paired Δ
        fit, rel = [None if quick else trend([x for x, _ in paired], [d[key] for _, d in paired])
                    for key in ("mean", "rel")]  # (a --quick try calls no trend)
        left = sum(d["left_out"] for _, _, d in points)
        lost = f" ({left} flagged pairs left out: less power than the design, not evidence of none)" if left else ""
        if fit is None and not quick:
            text += f"; no trend: a fit needs 3 or more rungs with 2 or more pairs, and {len(paired)} have them{lost}"
        elif fit is not None:
            k = fit["k"]
            excludes = not fit["ci"][0] <= 0 <= fit["ci"][1]
            what = (f"{arm} gains on {other} as the rungs grow" if excludes and fit["slope"] < 0 else
                    f"{arm} loses ground to {other} as the rungs grow" if excludes else
                    f"no change along the rungs is supported (its CI includes 0){lost}")
            text += (f"; across the {k} rungs Δ changes by {fit['slope']:+.4f} {fmt_ci(fit['ci'])} nats, "
                     f"{rel['slope']:+.2f}% [{rel['ci'][0]:+.2f}, {rel['ci'][1]:+.2f}] of {other}'s loss, per 10× "
                     f"{axis} (least squares over the {k} rungs' mean Δ, t on {k - 2} df): {what}")
            text += multiplier_text(arm, other, paired, axis, flops)
        lines.append(text + ".")
    return "\n".join(lines)


def multiplier_text(arm, other, paired, axis, flops):
    """'. To reach arm's loss, other would need M× ...' at each rung (paired.multiplier: the reference's curve with
    a loss floor), in the ladder's axis and in training FLOPs along its recipe (flops: {x: a final run's FLOPs}):
    M^b, b the local exponent of FLOPs against x between neighbouring rungs (tokens grow with parameters, so b
    is not 2, nor the same at every rung)."""
    xs = [x for x, _ in paired]
    fit = multiplier(xs, [d["ref_mean"] for _, d in paired], [d for _, d in paired])
    if fit is None:
        return f"; no multiplier: {other}'s loss does not fall along the rungs"
    b = np.gradient(np.log([flops[x] for x in xs]), np.log(xs))
    cell = lambda m, ci, e: f"×{m ** e:.3g}" + (f" [{ci[0] ** e:.3g}, {ci[1] ** e:.3g}]" if ci else "")
    at = ", ".join(f"{cell(m, ci, 1)} ({cell(m, ci, e)} training FLOPs) at {x:,.0f}"
                   for (x, m, ci), e in zip(fit["at"], b))
    return (f". To reach {arm}'s loss, {other} would need M times the {axis}: {at} ({other}'s loss fitted as "
            f"E + B·N^(−α) over the rungs, floor E = {fit['floor']:.3f}, α = {fit['alpha']:.3f}; each rung's "
            f"95% CI is its paired Δ's; M > 1: {arm} is worth more)")


def render_ladder(study_path, ladder, datas, out):
    """A ladder's report -> (README markdown, {file name: bytes}): the gap against model size, then each rung."""
    rungs = rungs_of(ladder)
    tokenizer = tokenizer_of(run for data in datas.values() for run in all_runs(data))
    axis, xs, flops = ladder_axis(rungs)
    gaps = {}  # {(arm, other): [(rung, x, unflagged_gap)]}: each arm against the reference, and the contrasts
    for study in rungs:
        data, ref = datas[study["rung"]], study["reference"]
        pairs = [(arm, ref) for arm in study["arms"] if arm != ref] + [(a, o) for a, o, _ in study["contrasts"]]
        for arm, other in pairs:
            gaps.setdefault((arm, other), []).append(
                (study["rung"], xs[study["rung"]], unflagged_gap(data[arm], data[other])))  # LADDER_FLAGS
    files = {"gap_vs_size.png": plot_ladder(gaps, axis)}
    parts = [header(study_path, {**rungs[0], "name": ladder["name"], "runs_dir": ladder["runs_dir"]}, out),
             "## The gap against model size" if "param" in axis else "## The gap against training length",
             f"The same study at {len(rungs)} rungs, each with its own learning-rate search; every Δ is a "
             f"paired difference over final seeds (Method, below), a call only where its 95% CI excludes 0, also "
             f"given in % of the other arm's mean loss (the losses fall along the rungs, so a constant relative "
             f"gain shrinks in nats). {STALL_TEXT} {LADDER_FLAGS}", ladder_table(gaps, ladder["quick"], axis),
             "![gap against size](gap_vs_size.png)", "**What the data support.**",
             ladder_reading(gaps, ladder["quick"], axis, flops)]
    parts += [*reading_section(out), "## Method", method(rungs[0], tokenizer)]
    for study in rungs:
        rung, data, cfg = study["rung"], datas[study["rung"]], arm_config(study, study["reference"])
        parts += [f"## Rung {rung}: {cfg['n_layer']} × {cfg['n_embd']}, {run_tokens(cfg):,} tokens a final run",
                  results_table(study, data, tokenizer), *stall_caution(study, data),
                  *(horizon_sections(study, data) + search_sections(study, data) if study["horizons"] else
                    [search_table(study, data)])]
        if has_probe(all_runs(data)):
            files[f"probe_{rung}.png"] = plot_probe(data)
            parts += [PROBE_CAPTION, f"![probe of rung {rung}](probe_{rung}.png)"]
    text = "\n\n".join(parts) + "\n"
    return text, {"README.md": text.encode(), **files}


def default_out(study):
    return os.path.join(QUICK_DIR if study.get("quick") else "results", study["name"])


def check_out(p, out, study_name):
    """argparse error if --out holds a README.md that is not a report of study_name (None: of run folders)."""
    readme = pathlib.Path(out, "README.md")
    if readme.is_file():
        title = readme.read_text(errors="replace").split("\n", 1)[0]
        if title != (COMPARED if study_name is None else f"# Study {study_name}"):
            p.error(f"--out {out} holds a README.md that is not a report of "
                    f"{'these runs' if study_name is None else 'study ' + study_name} (its first line: "
                    f"{title[:60]!r}); the report would replace its files: choose another --out")


def main(argv=None):
    """A study file: write its report, return its markdown. Run folders: compare them, return the text."""
    p = argparse.ArgumentParser(prog="python -m research.report", description=__doc__, formatter_class=HelpFormatter,
                                allow_abbrev=False)
    p.add_argument("study", nargs="+", help="a study file, or train.py run folders to compare")
    p.add_argument("--out", type=os.path.expanduser, default=None,
                   help="output folder (default: results/<study name>; for run folders: out/compare)")
    p.add_argument("--quick", type=float, nargs="?", const=QUICK_FRACTION, metavar="FRACTION",
                   help="the runs of python -m research.sweep STUDY --quick (the report in out/quick/<name>)")
    args = p.parse_args(argv)
    if all(os.path.isdir(path) for path in args.study):
        out = args.out or os.path.join("out", "compare")
        check_out(p, out, None)
        return compare(args.study, out)
    if len(args.study) > 1:
        p.error(f"give one study file, or run folders to compare; not a folder: "
                f"{', '.join(x for x in args.study if not os.path.isdir(x))}")
    study = load_study(args.study[0], args.quick)
    again = f"python -m research.sweep {shlex.quote(args.study[0])}{quick_option(args.quick)}"
    out = args.out or default_out(study)
    check_out(p, out, study["name"])  # now, before the runs are read
    datas = {r.get("rung"): collect(r) for r in rungs_of(study)}
    runs = [run for data in datas.values() for run in all_runs(data)]
    if all(r["status"] == "missing" for r in runs):  # a report of nothing would only be a folder to delete
        raise ValueError(f"no run of study {study['name']} has started yet (0 of the {len(runs)} runs planned so "
                         f"far have metrics in {study['runs_dir']}): nothing to report, nothing written; run {again} "
                         f"first")
    text, files = (render_ladder(args.study[0], study, datas, out) if "rungs" in study else
                   render(args.study[0], study, datas[None], out))
    written, kept = write_files(out, files)
    print(f"wrote {', '.join(written) or 'nothing'}"
          + (f"; {', '.join(kept)} already up to date (a README's date line aside)" if kept else ""))
    left_out = [f"{r['arm']} seed {r['seed']} ({fmt_run(r)})" for by_arm in datas.values() for d in by_arm.values()
                for r in d["finals"].values() if r["status"] in ("missing", "unfinished")]
    if left_out:  # the statistics stand on fewer seeds than planned: say so where it is seen
        print(f"note: {len(left_out)} final run(s) not finished, left out of the statistics: "
              f"{'; '.join(left_out)}; finish them with {again}")
    return text


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError) as e:  # a missing file, a full disk: one line
        sys.exit(f"error: {e}")
