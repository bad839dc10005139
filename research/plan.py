"""
The plan of a study and its cost, for python -m research.sweep STUDY --dry_run: each arm's runs (finished, due now,
the fewest and the most its search can make), tokens and hours a run, the budget, whether its data are prepared.
"""
import json
import math
import os
import re

from nlq.checkpoint import read_metrics, read_saved_config
from nlq.data import load_meta
from nlq.settings import flops_per_token, model_config, param_counts, parse_config
from research.study import (ROOT, arm_config, arm_run_counts, check_data, due_runs, elapsed_seconds, existing_runs,
                            horizon_fit, is_diverged, is_finished, plan, run_dir, run_list, run_tokens, rungs_of)

# bench.py's one-H200 figures at the paper's shapes (bench/RESULTS.md): what --dry_run counts with by default
DEFAULT_BENCH_JSON = os.path.join(ROOT, "bench", "results", "h200_2026-11-30", "bench_nlq_small.json")


def run_timing(study):
    """{arm: (seconds a step, seconds a run outside its steps or None without elapsed_s)} of its finished runs."""
    measured = {}
    parts = (study, *study["horizon_studies"].values())  # with horizons, the selection runs' studies too
    for part, run in [(part, run) for part in parts for run in existing_runs(part)]:
        rows = read_metrics(run_dir(part, *run))
        if rows and rows[-1]["iter"] > 0 and not is_diverged(rows[-1]):
            steps, elapsed = elapsed_seconds(rows)[-1], rows[-1].get("elapsed_s")
            if steps > 0:  # (no step times logged: nothing to time it by)
                rest = None if elapsed is None else max(0.0, elapsed - steps)
                measured.setdefault(run[0], []).append((steps, rows[-1]["iter"], rest))
    return {arm: (sum(s for s, _, _ in m) / sum(n for _, n, _ in m),
                  None if any(o is None for *_, o in m) else sum(o for *_, o in m) / len(m))
            for arm, m in measured.items()}


def bench_speeds(study, cfgs, path):
    """{arm: tokens/s} from bench.py's --json rows: the row of the arm's query mode at the model size closest to
    the arm's, scaled by its FLOPs per token / the arm's (the same MFU). Rows without flops_per_token were measured
    on config/nlq_small.py (DEFAULT_BENCH_JSON) or, for another file, on the study's own model."""
    try:
        with open(path) as f:
            rows = [(r["query_mode"], float(r["tokens_per_s"]), r.get("flops_per_token")) for r in json.load(f)]
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ValueError(f"--bench_json {path}: not bench.py's JSON (a list of rows with query_mode and "
                         f"tokens_per_s): {type(e).__name__}: {e}") from e
    measured_on = ([os.path.join(ROOT, "config", "nlq_small.py")] if path == DEFAULT_BENCH_JSON else
                   [study["config"]] + [f"--{k}={v}" for k, v in study["overrides"].items()])
    flops_of = lambda mode, flops: flops or flops_per_token(model_config(parse_config(
        measured_on + [f"--query_mode={mode}"])))
    speeds = {}
    for arm, cfg in cfgs.items():
        found = [(speed, flops_of(mode, flops)) for mode, speed, flops in rows if mode == cfg["query_mode"]]
        if not found:
            raise ValueError(f"{path} has no row for query_mode {cfg['query_mode']} (arm {arm}); it has "
                             f"{', '.join(dict.fromkeys(mode for mode, _, _ in rows))}: measure it with bench.py, "
                             f"or pass --tokens_per_s")
        arm_flops = flops_per_token(model_config(cfg))
        speed, flops = min(found, key=lambda sf: abs(math.log(sf[1] / arm_flops)))
        speeds[arm] = speed * flops / arm_flops
    return speeds


def arm_costs(study, tokens_per_s=None, bench_json=None):
    """-> (unit, source, {arm: (tokens/s, hours a final run, hours a selection run)}, nan where unknown): from
    tokens_per_s, else bench_json, but a study on the CPU given neither is timed on its finished runs."""
    cfgs = {arm: arm_config(study, arm) for arm in study["arms"]}
    parts = list(study["horizon_studies"].values()) or [study]  # where the selection runs are
    on_cpu = next(iter(cfgs.values()))["device"] == "cpu"
    unit, rest_s = "CPU" if on_cpu else "GPU", dict.fromkeys(cfgs, 0)  # seconds of a run outside its steps
    if on_cpu and not (tokens_per_s or bench_json):
        timing = run_timing(study)
        if not timing and study.get("quick"):  # a --quick try's steps run at the speed of the study's own runs
            study = {**study, "runs_dir": study["study_runs_dir"]}
            timing = {arm: (step_s, None) for arm, (step_s, _) in run_timing(study).items()}
        speeds = {arm: run_tokens(cfg) / cfg["max_iters"] / timing[arm][0] if arm in timing else math.nan
                  for arm, cfg in cfgs.items()}
        rest_s.update({arm: rest or 0 for arm, (_, rest) in timing.items()})
        evals = ("evals and start-up included" if all(rest is not None for _, rest in timing.values()) else
                 "the steps alone: evals and start-up not counted" if study.get("quick") else
                 "evals not included where the runs did not log elapsed_s")
        modes = ",".join(dict.fromkeys(cfg["query_mode"] for cfg in cfgs.values()))
        source = (f"CPU-hours of one process, timed on the runs in {study['runs_dir']} ({evals}; each arm's speed "
                  f"as its runs met the machine's load, so tokens/s does not rank the arms: bench.py does)"
                  if timing else f"CPU-hours: unknown, no finished run of this study to time yet; measure a run's "
                  f"speed with python bench.py {study['config']} --threads=1 --query_modes={modes} and pass its "
                  f"tokens/s as --tokens_per_s")
    else:
        path = bench_json or DEFAULT_BENCH_JSON
        speeds = dict.fromkeys(cfgs, tokens_per_s) if tokens_per_s else bench_speeds(study, cfgs, path)
        source = (f"{unit}-hours = tokens / tokens per second per {'process' if on_cpu else 'GPU'} / 3600, from "
                  + (f"--tokens_per_s {tokens_per_s:,.0f} for every arm" if tokens_per_s else
                     f"{os.path.relpath(path)}, each arm at its query mode's tokens/s, scaled by FLOPs per token "
                     f"where the arm changes the model's size") + "; evals not counted")
    hours = lambda cfg, arm: (run_tokens(cfg) / speeds[arm] + rest_s[arm]) / 3600
    return unit, source, {arm: (speed, hours(cfgs[arm], arm),
                                sum(hours(arm_config(part, arm), arm) for part in parts) / len(parts))
                          for arm, speed in speeds.items()}


def span(lo, hi, fmt, sep="-"):
    """'lo-hi' in format fmt, or one number where both read the same."""
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}{sep}{hi:{fmt}}"


LEGEND = ("finished: runs done; due now: what the sweep would start now; fewest / most: the whole study without / "
          "with every grid extension the search may add (half steps and final seeds included); a / b: a selection "
          "run / a final run, where horizons make them differ (a selection run's mean over the horizons)")


def plan_table(study, unit, costs):
    """One study's (or rung's) plan by arm -> (markdown table, summary line, totals (runs due now, fewest, most;
    hours fewest, most))."""
    due = due_runs(study)
    lines = [f"| arm | query_mode | tokens/s | tokens a final run | {unit}-h a run | finished | due now | fewest "
             f"| most | {unit}-h most |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    total = [0] * 6  # runs finished, due now, fewest, most; hours fewest, most
    for arm in study["arms"]:
        cfg = arm_config(study, arm)
        speed, h_final, h_sel = costs[arm]
        fewest, most, finals = arm_run_counts(study, arm)
        h_fewest, h_most = fewest * h_sel + finals * h_final, most * h_sel + finals * h_final
        finished = sum(is_finished(study, *run) for run in run_list(study, arm))
        now = sum(run[0].rpartition("/")[2] == arm for run in due)  # (h<h>/<arm>: a selection run at a horizon)
        total = [t + n for t, n in zip(total, (finished, now, fewest + finals, most + finals, h_fewest, h_most))]
        lines.append(f"| {arm} | {cfg['query_mode']} | {speed:,.0f} | {run_tokens(cfg):,} | "
                     f"{span(h_sel, h_final, '.2f', ' / ')} | {finished} | {now} | {fewest + finals} | "
                     f"{most + finals} | {h_most:,.1f} |")
    finished, now, fewest, most, h_fewest, h_most = total
    lines.append(f"| **all** | | | | | {finished} | {now} | {fewest} | {most} | {h_most:,.1f} |")
    untimed = [arm for arm, (speed, *_) in costs.items() if math.isnan(speed)]
    cost = (f"{span(h_fewest, h_most, ',.1f')} {unit}-hours" if not untimed else
            f"{unit}-hours unknown until {' and '.join(untimed)} ha{'ve' if untimed[1:] else 's'} a finished run "
            f"to time")
    summary = (f"{span(fewest, most, 'd')} runs, {cost}; {finished} finished, {now} due now."
               + (" Complete: the sweep has nothing to run; report.py writes its report, and --quick tries the "
                  "study in the scratch folder." if now == 0 else ""))
    table = re.sub(r"(?<=\| )nan(?= \|)", "?", "\n".join(lines))
    return table, summary, (now, fewest, most, h_fewest, h_most)


def budget(study, cfg):
    """A run's training budget both ways -> dict(tokens, total and non-embedding parameters, tokens per
    parameter on each, training FLOPs = FLOPs per token (6 x matmul parameters + attention) x tokens)."""
    try:  # the vocabulary, which sizes the embeddings: the data's, else a run's record of it, else GPT-2's
        vocab = load_meta(os.path.join(cfg["data_dir"], cfg["dataset"]))["vocab_size"]
    except (FileNotFoundError, ValueError):
        saved = (read_saved_config(os.path.join(run_dir(study, *run), "config.json")) for run in existing_runs(study))
        vocab = next(((c.get("dataset_meta") or {}).get("vocab_size") for c in saved if c), None)
    model, tokens = model_config(cfg, vocab), run_tokens(cfg)
    counts = param_counts(model)
    return dict(tokens=tokens, total=counts["total"], non_embedding=counts["non_embedding"],
                per_param=tokens / counts["total"], per_non_embedding=tokens / counts["non_embedding"],
                flops=flops_per_token(model) * tokens)


def budget_text(study):
    """The dry run's budget line(s) of the reference arm's final run (and selection run at each horizon): tokens
    per parameter (Chinchilla's count, embeddings included), per non-embedding parameter (Kaplan's) and FLOPs."""
    arm, lines = study["reference"], []
    for kind, part in [("final", study)] + [(f"{sub['horizon']:,}-step selection", sub)
                                            for sub in study["horizon_studies"].values()]:
        b = budget(study, arm_config(part, arm))
        lines.append(f"budget of a {kind} run ({arm}): {b['tokens']:,} tokens = "
                     f"{b['per_param']:.1f} tokens per parameter ({b['total']:,} parameters, embeddings included: "
                     f"the convention) = {b['per_non_embedding']:.1f} per non-embedding parameter "
                     f"({b['non_embedding']:,}); {b['flops']:.3g} training FLOPs")
    return "\n".join(lines)


def dry_run(study, tokens_per_s=None, bench_json=None):
    """The study's plan and its cost, as text. Runs nothing."""
    unit, source, costs = arm_costs(study, tokens_per_s, bench_json)
    table, summary, (now, *_) = plan_table(study, unit, costs)
    fit = ["", "The rate carried to the final horizon:", "", horizon_table(study)] if study["horizons"] else []
    return "\n".join([f"plan of study {study['name']} (dry run: nothing is started); runs in {study['runs_dir']}",
                      source, budget_text(study), "", table, "", LEGEND, *fit, "", f"The study: {summary}",
                      data_status(study, complete=now == 0)])


def ladder_dry_run(ladder, tokens_per_s=None, bench_json=None):
    """A ladder's plan: each rung's table (plan_table), then the cost by model size and in all."""
    parts, rows, total, data = [], [], [0, 0, 0.0, 0.0], []
    for study in rungs_of(ladder):
        unit, source, costs = arm_costs(study, tokens_per_s, bench_json)
        table, summary, (now, *cost) = plan_table(study, unit, costs)
        parts.append(f"## rung {study['rung']}\n\nruns in {study['runs_dir']}\n{budget_text(study)}\n\n{table}\n\n"
                     f"The rung: {summary}")
        data.append(data_status(study, complete=now == 0))
        total = [t + c for t, c in zip(total, cost)]
        b = budget(study, arm_config(study, study["reference"]))
        rows.append(f"| {study['rung']} | {b['total']:,} | {b['non_embedding']:,} | {b['tokens']:,} | "
                    f"{b['per_param']:.1f} | {b['per_non_embedding']:.1f} | {b['flops']:.3g} "
                    f"| {span(*cost[:2], 'd')} | {span(*cost[2:], ',.1f')} |")
    return "\n\n".join([f"plan of ladder {ladder['name']} (dry run: nothing is started)", source, LEGEND] + parts + [
        f"## the ladder {ladder['name']}: cost by rung", f"A final run of the reference arm: tokens per parameter on "
        f"total parameters (embeddings included: the convention), and on non-embedding parameters; training FLOPs = "
        f"FLOPs per token x tokens.\n\n| rung | parameters | non-embedding | tokens a final run | tokens per parameter "
        f"| per non-embedding parameter | training FLOPs | runs | {unit}-hours |\n"
        f"|---|---:|---:|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows)
        + f"\n| **all** | | | | | | | {span(*total[:2], 'd')} | {span(*total[2:], ',.1f')} |",
        f"The ladder: {span(*total[:2], 'd')} runs, {span(*total[2:], ',.1f')} {unit}-hours (fewest-most: without and "
        f"with every grid extension the searches may add).", power_text(rungs_of(ladder)), *dict.fromkeys(data)])


# the gap's change a ladder is built to see (nats per 10x), and the sd of a linear - nonlinear pair on the CPU
# studies without flagged pairs (results/shared_rate_cpu, 27 pairs; 0.017 with the late pair kept)
TREND_SLOPE, PAIR_SD = -0.025, 0.014


def power_text(rungs):
    """One line for a ladder's dry run: the share of ladders like it whose trend sees TREND_SLOPE at PAIR_SD."""
    try:
        from research.paired import trend_power  # scipy: the report's libraries
    except ImportError:
        return "trend power: needs scipy (pip install -r requirements-report.txt)"
    b = [budget(s, arm_config(s, s["reference"])) for s in rungs]
    key, axis = (("non_embedding", "non-embedding parameters") if len({x["non_embedding"] for x in b}) > 1 else
                 ("tokens", "training tokens"))  # the report's axis (report.ladder_axis)
    sizes, seeds = [x[key] for x in b], len(rungs[0]["seeds"])
    power = trend_power(sizes, seeds, TREND_SLOPE, PAIR_SD) if len(set(sizes)) >= 3 else 0.0
    return (f"Trend power: {power:.0%} of ladders of these {len(b)} rungs x {seeds} seeds find a gap that changes by "
            f"{TREND_SLOPE} nats per 10x {axis} (trend's 95% CI excludes 0), at the CPU studies' pair sd without "
            f"flagged pairs, {PAIR_SD} (aim for 60% or more: add rungs, then seeds).")


def horizon_table(study, boot=1000):
    """Each arm's rate carried to the final horizon (study.horizon_fit) as a markdown table: lr* at each horizon,
    β and the carried rate with their 95% bootstrap intervals; an arm still searching, its selection runs due."""
    heads = [f"lr* at {h:,} steps" for h in study["horizons"]]
    rows = []
    for arm in study["arms"]:
        p = plan(study, arm)
        if p["fit"] is None:
            why = f"searching: {len(p['due'])} selection runs due now" if p["due"] else "; ".join(p["notes"])
            rows.append([arm] + ["—"] * len(heads) + [why, "—"])
            continue
        fit = horizon_fit(study, arm, p["searches"], boot)
        (b_lo, b_hi), (c_lo, c_hi) = fit["beta_ci"], fit["carried_ci"]
        rows.append([arm, *(f"{lr:.3g}" + (" (edge)" if edge else "") for _, lr, edge in fit["points"]),
                     f"{fit['beta']:.2f} [{b_lo:.2f}, {b_hi:.2f}]", f"**{fit['carried']:g}** [{c_lo:.3g}, {c_hi:.3g}]"])
    final = arm_config(study, study["reference"])
    lines = [f"| arm | {' | '.join(heads)} | β [95% CI] | carried to {final['max_iters']:,} steps [95% CI] |",
             "|---" + "|---:" * (len(heads) + 2) + "|"] + ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def data_status(study, complete=False):
    """One line for --dry_run: the datasets the runs read are prepared, or what check_data would stop on
    (complete: the study has nothing left to run, so only a --quick try would need them)."""
    try:
        folders = check_data(study)
    except (FileNotFoundError, ValueError) as e:
        return (f"data: not ready for a sweep (the report does not need it): {e}" if complete else
                f"data: not ready, so the sweep would stop at once: {e}")
    trial = [f for f in folders if "tests/data/" in load_meta(f).get("source", "")]  # (README: for --quick)
    return f"data: {', '.join(folders)} prepared" + (f" ({', '.join(trial)}: from a small file shipped in tests/data: "
                                                     f"fine for --quick, not for a study's results)" if trial else "")
