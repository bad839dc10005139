"""
The report of a sweep.py study: paired statistics over seeds, the learning-rate search, plots. Or, given run
folders instead of a study file, a side-by-side look at plain train.py runs (no statistics).

    python report.py studies/enwiki_cpu.py                   # -> results/enwiki_cpu/README.md and plots
    python report.py studies/enwiki_cpu.py --out /tmp/rep    # elsewhere
    python report.py out/a out/b                             # a table and out/compare/val_loss.png

Everything is rebuilt from the runs' metrics.jsonl and config.json alone (results/<study>/runs/ is committed),
so anyone can recompute the tables. Run it from the repository root: the study's paths are relative.

Statistics (per arm, against the reference arm, default linear): the final loss of a run is its val loss over
the whole val split (val_loss_full), in nats/token. At one seed every arm sees the same training windows and
the same val tokens, so arms are compared *paired*: per-seed differences d_i = arm_i - ref_i over the final
seeds both finished, their mean, a 95% confidence interval from Student's t with n - 1 degrees of freedom, and
the paired t-test's p-value (scipy.stats). Welch's unpaired test is a secondary column. A difference is called
only when its 95% CI excludes 0. The same paired Δ at every eval step (on the fixed eval windows) shows
whether a gap grows or shrinks with training. The study's contrasts (arm, other, what the pair isolates) get
the same paired statistics between two arms, neither of them the reference. Missing and unfinished runs are
listed, never fatal.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import sys
import tempfile

import matplotlib
matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt
import numpy as np
import torch
from scipy import stats

import eval as nlq_eval  # eval.py (the name shadows the builtin only in this module)
import settings
from checkpoint import atomic_write_text, check_same_dataset, read_metrics, replace_atomically
from data import load_meta
from preemption import EXIT_INTERRUPTED
from settings import HelpFormatter, model_config
from study import (QUICK_DIR, QUICK_FRACTION, check_settings, final_seeds, final_val_loss, is_diverged, load_study,
                   pick_best_lr, plan, quick_option, read_saved_config, run_config, run_dir)
from model import GPTConfig, QUERY_MODE_ALIASES


# ------------------------------------------------------------------------------------------- the numbers
def summarize(values):
    """Final losses -> (mean, sample std with ddof=1, n); std is nan for n < 2, mean nan for n = 0."""
    n = len(values)
    mean = sum(values) / n if n else math.nan
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    return mean, std, n


def paired_difference(arm, ref, confidence=0.95):
    """Paired comparison of two arms over the seeds both finished.

    arm, ref: {seed: final loss}. Returns dict(n, seeds, diffs: arm_i - ref_i in seed order, mean: their mean,
    sd, ci: (lo, hi) from Student's t with n - 1 df, p: two-sided paired t-test p-value, rel: mean / mean(ref)
    in %). ci and p are None for n < 2, and when all differences are equal the CI has zero width (p is then 0
    or nan).
    """
    seeds = sorted(set(arm) & set(ref))
    d = np.array([arm[s] - ref[s] for s in seeds])
    n = len(d)
    out = dict(n=n, seeds=seeds, diffs=d.tolist(), mean=float(d.mean()) if n else math.nan, sd=math.nan,
               ci=None, p=None, rel=float(d.mean() / np.mean([ref[s] for s in seeds]) * 100) if n else math.nan)
    if n >= 2:
        sd = float(d.std(ddof=1))
        half = stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
        out.update(sd=sd, ci=(out["mean"] - half, out["mean"] + half),
                   p=float(stats.ttest_rel([arm[s] for s in seeds], [ref[s] for s in seeds]).pvalue))
    return out


def welch_p(arm_values, ref_values):
    """Two-sided p-value of Welch's unpaired t-test (scipy.stats.ttest_ind, equal_var=False);
    None if n < 2."""
    if len(arm_values) < 2 or len(ref_values) < 2:
        return None
    return float(stats.ttest_ind(arm_values, ref_values, equal_var=False).pvalue)


def fmt_ci(ci):
    """(lo, hi) -> "[lo, hi]" with signs and 4 decimals; None (n < 2) -> "—"."""
    return "—" if ci is None else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def verdict(ci, quick=False):
    """'lower' / 'higher' when the 95% CI of arm - ref excludes 0, else 'no call' (or 'n < 2'). quick (a
    --quick try: runs at a fraction of their steps): never a call, whatever the CI."""
    if ci is None:
        return "n < 2"
    if quick:
        return "no call (--quick try)"
    return "lower" if ci[1] < 0 else "higher" if ci[0] > 0 else "no call"


# ------------------------------------------------------------------------------------------- the runs
def read_run(study, arm, lr, seed):
    """One run dir -> dict(status 'done' | 'diverged' | 'unfinished' | 'missing', iter, max_iters, final loss,
    rows, config). final: final_val_loss of a finished run."""
    check_settings(study, arm, lr, seed)  # never report a run made with other settings (or damaged)
    out_dir = run_dir(study, arm, lr, seed)
    rows, config = read_metrics(out_dir), read_saved_config(os.path.join(out_dir, "config.json"))
    check_token_counts(rows, out_dir)
    max_iters = run_config(study, arm, lr, seed)["max_iters"]
    last = rows[-1] if rows else {}
    status = ("missing" if not rows else "diverged" if is_diverged(last) else
              "done" if last["iter"] >= max_iters else "unfinished")
    final = final_val_loss(last) if status == "done" else None
    if status == "done" and final is None:  # train.py flags a non-finite loss as diverged: this is damage
        raise ValueError(f"{os.path.join(out_dir, 'metrics.jsonl')} is damaged: its last row (iter "
                         f"{last['iter']}) has no finite val loss and no diverged flag; restore it from a copy, "
                         f"or delete the run folder to run the run again")
    return dict(arm=arm, lr=lr, seed=seed, out_dir=out_dir, status=status, iter=last.get("iter"),
                max_iters=max_iters, final=final, rows=rows, config=config)


def collect(study):
    """{arm: dict(plan=plan(...), search={(lr, seed): run}, finals={seed: run at the chosen lr})}."""
    data = {}
    for arm in study["arms"]:
        p = plan(study, arm)
        search = {(lr, s): read_run(study, arm, lr, s) for lr in p["swept"] for s in study["selection_seeds"]}
        finals = ({s: read_run(study, arm, p["chosen"], s) for s in final_seeds(study, arm)}
                  if p["chosen"] is not None else {})
        data[arm] = dict(plan=p, search=search, finals=finals)
    return data


def final_losses(d):
    """{seed: final loss} of an arm's finished final runs."""
    return {s: r["final"] for s, r in d["finals"].items() if r["final"] is not None}


def param_counts(study, arm):
    """(non_embedding, non_embedding_matrix) of the arm's model as this clone's model.py builds it (no memory,
    no data); a run made by a model.py that built another is refused by read_run (settings_diff)."""
    cfg = run_config(study, arm, study["grids"][arm][0], study["seeds"][0])
    counts = settings.param_counts(model_config(cfg))
    return counts["non_embedding"], counts["non_embedding_matrix"]


def tokenizer_of(data):
    """The dataset's tokenizer (gpt2 | char | byte) from any run's config.json, or None."""
    for d in data.values():
        for run in [*d["search"].values(), *d["finals"].values()]:
            if run["config"] and "dataset_meta" in run["config"]:
                return run["config"]["dataset_meta"].get("tokenizer")
    return None


def elapsed_seconds(rows):
    """Training seconds at each eval row (evals excluded): the running sum of ms_per_iter x iterations since
    the previous row. The first step after each (re)start, which pays for warm-up, is counted at the average
    rate."""
    t, out, prev = 0.0, [], 0
    for row in rows:
        t += (row.get("ms_per_iter") or 0.0) / 1000 * (row["iter"] - prev)
        out.append(t)
        prev = row["iter"]
    return out


# ---------------------------------------------------------------------------------- plain runs compared
# Settings that say where a run lives, not what it is, besides settings.NOT_EXPERIMENT's.
NOT_COMPARED = settings.NOT_EXPERIMENT | {"out_dir"}


def check_token_counts(rows, out_dir):
    """ValueError naming the log and the row if a row with a val loss after iter 0 (a point of the val-loss
    plots, whose x axis is training tokens) lacks its int token count: every row train.py writes has one."""
    bad = next((r for r in rows if r["iter"] > 0 and r.get("val_loss") is not None
                and type(r.get("tokens")) is not int), None)
    if bad is not None:
        raise ValueError(f"{os.path.join(out_dir, 'metrics.jsonl')} is damaged: its row of iter {bad['iter']} has "
                         f"no token count ('tokens', which every row train.py writes has); restore it from a copy, "
                         f"or delete that row")


def read_plain_run(path):
    """A train.py run folder -> dict(name, config, rows). ValueError naming what is missing."""
    rows = read_metrics(path)
    config = read_saved_config(os.path.join(path, "config.json"))
    if not rows or config is None:
        log = os.path.join(path, "metrics.jsonl")
        missing = " and ".join(f for f, ok in (("metrics.jsonl", rows), ("config.json", config)) if not ok)
        if os.path.exists(log) and not rows:  # there, but empty, or a first line cut short
            missing = missing.replace("metrics.jsonl", "row in its metrics.jsonl (empty, or cut short before "
                                                       "its first row ended)")
        raise ValueError(f"{path} is not a train.py run folder with results: no {missing} (a run writes both "
                         f"once it has evaluated; give run folders, e.g. out/a out/b, or one study file)")
    check_token_counts(rows, path)
    missing = [k for k in ("dataset", "data_dir", "max_iters") if k not in config]  # what the table reads
    if missing:
        raise ValueError(f"{os.path.join(path, 'config.json')} is damaged: it has no {', '.join(missing)} "
                         f"(train.py writes every setting there); restore it from a copy")
    return dict(name=path, config=config, rows=rows)


def val_bytes_per_token(config, cache, bpe_dir=None):
    """UTF-8 bytes per target token of the run's whole val split (the targets val_loss_full averages over),
    or (None, why) where it cannot be counted. byte: 1. char and gpt2: counted from the dataset's val.bin,
    which must be the one the run was trained on (its sha256 in config.json); gpt2 needs GPT-2's BPE files
    (bpe_dir, or tiktoken's cache)."""
    meta = config.get("dataset_meta") or {}
    if meta.get("tokenizer") == "byte":
        return 1.0, None
    folder = os.path.join(config["data_dir"], config["dataset"])
    if folder not in cache:
        try:
            found = load_meta(folder)
            check_same_dataset(meta, found, folder)
            ids = np.memmap(os.path.join(folder, "val.bin"), dtype=found["dtype"], mode="r")[1:]
            counts = np.bincount(ids, minlength=found["vocab_size"])
            cache[folder] = (int(counts @ nlq_eval.token_bytes(found, bpe_dir)) / len(ids), None)
        except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: DataError (no GPT-2 BPE files)
            cache[folder] = (None, f"{folder}: {e}")
    bytes_per_token, why = cache[folder]
    return (1 / bytes_per_token, None) if bytes_per_token else (None, why)


def compare_table(runs, bpe_dir=None):
    """Markdown table of plain runs: iterations, tokens, the last fixed-window val loss, the whole-split val
    loss, bits per byte (whole split), wall time. Returns (table, notes)."""
    cols = ["run", "iters", "tokens", "val loss (fixed windows)", "val loss (whole split)", "bits/byte",
            "wall time"]
    lines = ["| " + " | ".join(cols) + " |", "|---|" + "---:|" * (len(cols) - 1)]
    notes, cache = [], {}
    for run in runs:
        last, cfg = run["rows"][-1], run["config"]
        status = ("" if last["iter"] >= cfg["max_iters"] or is_diverged(last)
                  else f" (unfinished: max_iters {cfg['max_iters']})")
        full = last.get("val_loss_full")
        bpb = "—"
        if full is not None:
            tokens_per_byte, why = val_bytes_per_token(cfg, cache, bpe_dir)
            if tokens_per_byte is None:
                notes.append(f"bits/byte of {run['name']}: not counted ({why})")
            else:
                bpb = f"{full / math.log(2) * tokens_per_byte:.4f}"
        if last.get("elapsed_s") is not None:
            wall = f"{last['elapsed_s']:.0f} s"
        else:  # runs made before metrics.jsonl had elapsed_s: the step times alone
            wall = f"{elapsed_seconds(run['rows'])[-1]:.0f} s*"
            notes.append(f"* {run['name']}: training steps only (evals not counted; the run predates "
                         f"elapsed_s)")
        val = "diverged" if is_diverged(last) else fmt_loss(last.get("val_loss"))
        lines.append(f"| {run['name']} | {last['iter']:,}{status} | {last.get('tokens', 0):,} | {val} | "
                     f"{fmt_loss(full)} | {bpb} | {wall} |")
    return "\n".join(lines), notes


def fmt_loss(x):
    return "—" if x is None else f"{x:.4f}"


def config_differences(runs):
    """{key: [value per run]} for the settings (and the dataset's contents) that are not the same in every
    run, leaving out where a run lives and how it ran (NOT_COMPARED)."""
    keys = sorted({k for run in runs for k in run["config"]
                   if k in settings.DEFAULTS and k not in NOT_COMPARED})
    diffs = {k: [setting_over_time(run["config"], k) for run in runs] for k in keys}
    diffs = {k: v for k, v in diffs.items() if any(x != v[0] for x in v)}
    origins = [initialised_from(run["config"]) for run in runs]  # scratch, a GPT-2, convert.py's source
    if any(o != origins[0] for o in origins):
        diffs["initialised_from"] = origins
    shas = [json.dumps((run["config"].get("dataset_meta") or {}).get("sha256"), sort_keys=True)
            for run in runs]
    if len(set(shas)) > 1:  # a sha per run would be noise: say which runs share their data
        groups = {sha: i + 1 for i, sha in enumerate(dict.fromkeys(shas))}
        diffs["dataset contents"] = [f"data {groups[sha]}" for sha in shas]
    return diffs


def setting(config, key):
    """A run's value of one config key, as the model was built: a model size left at None (mlp_hidden,
    query_hidden, vocab_size: derived from n_embd or the data) is the size in config.json's model_args, so None
    and 4·n_embd are one setting; a query_mode alias is the mode it names ('original' is linear); attn_scale is
    None (the query mode's own default) also where it was given as that default."""
    value = config.get(key, settings.DEFAULTS[key])
    if key == "query_mode":
        value = QUERY_MODE_ALIASES.get(value, value)
    elif key == "attn_scale" and value is not None:
        try:  # the mode's default scale, as GPTConfig resolves it
            default = GPTConfig(**{k: config.get(k, settings.DEFAULTS[k]) for k in ("n_embd", "n_head",
                                                                                   "query_mode")}).attn_scale
        except ValueError:  # a mode this code does not know (or without a default scale)
            default = None
        if default is not None and math.isclose(value, default):
            value = None
    elif value is None and key != "attn_scale":  # None: the mode's own scale, whatever model_args resolved
        value = (config.get("model_args") or {}).get(key)
    return value


class Changed(str):
    """A setting that a resume changed half-way, written as its values in order ("4, then 8 from iter 20");
    shown as it is, not quoted."""
    __repr__ = str.__str__


def setting_over_time(config, key):
    """setting(config, key), or, for a key that a resume changed (config.json's "resumes", train.py), a
    Changed with each value and the iteration it took over from."""
    steps = [(r["iter"], r["changed"][key]) for r in config.get("resumes") or [] if key in r["changed"]]
    if not steps:
        return setting(config, key)
    return Changed(", then ".join([repr(steps[0][1][0])] + [f"{now!r} from iter {it}" for it, (_, now) in steps]))


def initialised_from(config):
    """Where a run's weights started, from its config.json: train.py's initialised_from ('scratch', a GPT-2,
    'convert.py: <path>'), or, for a run saved before that was recorded, its init_from unless that says
    'resume' (then 'not recorded')."""
    if config.get("initialised_from") is not None:
        return config["initialised_from"]
    first = config.get("init_from", settings.DEFAULTS["init_from"])
    return "not recorded" if first == "resume" else first


def save_figure(fig, path):
    """Save a matplotlib figure as a PNG at path, atomically (replace_atomically), and close it."""
    replace_atomically(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)


def plot_runs(runs, path):
    """Each run's val loss (fixed windows) against training tokens, on one plot; its whole-split val loss as
    an x at its last point."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run in runs:
        rows = [r for r in run["rows"] if r["iter"] > 0 and r.get("val_loss") is not None]
        if not rows:
            continue
        line, = ax.plot([r["tokens"] for r in rows], [r["val_loss"] for r in rows], marker="o", ms=3,
                        label=run["name"])
        if rows[-1].get("val_loss_full") is not None:
            ax.plot(rows[-1]["tokens"], rows[-1]["val_loss_full"], "x", ms=8, color=line.get_color())
    ax.set(xlabel="training tokens", ylabel="val loss (nats/token; ×: whole split)",
           title="val loss of each run (one seed each: no call)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def compare(paths, out, bpe_dir=None):
    """Print a table of plain train.py runs, what differs between their settings, and what such a comparison
    cannot tell; draw their val-loss curves to <out>/val_loss.png (out: an existing folder, main makes it).
    Returns the printed text."""
    runs = [read_plain_run(path) for path in paths]
    table, notes = compare_table(runs, bpe_dir)
    diffs = config_differences(runs)
    show = lambda k, values: ", ".join(f"{run['name']}: {v if k == 'dataset contents' else repr(v)}"
                                       for run, v in zip(runs, values))
    if not diffs:
        differ = "Their settings are the same (" + ", ".join(sorted(NOT_COMPARED)) + " not compared)."
    elif len(diffs) == 1:
        (key, values), = diffs.items()
        differ = f"They differ only in {key}: {show(key, values)}."
    else:
        width = max(len(k) for k in diffs)
        differ = "Settings that differ:\n" + "\n".join(f"  {k:<{width}}  {show(k, v)}"
                                                       for k, v in diffs.items())
    if "dataset contents" in diffs:
        notes.append(f"Their data differ ({show('dataset contents', diffs['dataset contents'])}: other text, or the "
                     f"same split otherwise): their val losses are not over the same tokens.")
    changed = [run["name"] for run in runs if any(r["changed"].keys() - NOT_COMPARED
                                                  for r in run["config"].get("resumes") or [])]
    if changed:
        notes.append(f"{', '.join(changed)} changed settings when resumed (shown as 'A, then B from iter N'): "
                     f"not the curves of straight runs at their final settings.")
    tokenizers = [(run["config"].get("dataset_meta") or {}).get("tokenizer") for run in runs]
    if len(set(tokenizers)) > 1:  # a char's nats and a BPE token's nats are different units
        notes.append(f"Their tokenizers differ ({show('tokenizer', tokenizers)}): val loss is in nats per token "
                     f"of each run's own tokenizer, so only bits/byte compares them.")
    seeds = sorted({run["config"].get("seed") for run in runs})
    caveat = (f"One seed per run (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}): a gap "
              f"between these runs can be seed noise, so this comparison supports no call. For one, write a "
              f"study file (studies/*.py: arms, a learning-rate grid, selection and final seeds), then run "
              f"python sweep.py STUDY and python report.py STUDY (README: \"Experiments\" and \"Add your own "
              f"query mode\"). Wall time is the machine's as it was during each run (its load, threads and "
              f"evals); compare speed with bench.py, which times the modes side by side.")
    plot = os.path.join(out, "val_loss.png")
    plot_runs(runs, plot)
    text = "\n\n".join([table, *(["\n".join(notes)] if notes else []), differ, caveat,
                         f"val-loss curves: {plot}"])
    print(text)
    return text


# ------------------------------------------------------------------------------------------- the report
def header(study_path, study, out):
    """Title, the study file's comment, the commands that produce the report, date and machine."""
    with open(study_path) as f:
        comment = [line[1:].strip() for line in f.read().splitlines() if line.startswith("#")]
    cmds = [c for c in comment if c.startswith("python ")] or [f"python sweep.py {shlex.quote(study_path)}"]
    report_cmd = (f"python report.py {shlex.quote(study_path)}"
                  + ("" if out == default_out(study) else f" --out {shlex.quote(out)}"))
    cmds += [] if any(c.startswith("python report.py") for c in cmds) else [report_cmd]
    about = " ".join(c for c in comment if not c.startswith("python "))
    if study.get("quick"):  # the study at a fraction of its steps: say so first
        q = study["quick"]
        cmds = [f"python {script} {study_path}{quick_option(q)}" for script in ("sweep.py", "report.py")]
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
    bpb = (" Bits per byte = loss / ln 2 (byte-level data: one token per byte)." if tokenizer == "byte"
           else "")
    first = next(iter(study["arms"]))
    full = run_config(study, first, study["grids"][first][0], study["seeds"][0])["eval_full_at_end"]
    final, key = (("its last fixed-window val loss", "`val_loss`: these runs skip the whole-split eval "
                   "(eval_full_at_end=False, as every --quick run does)")
                  if not full else
                  ("its val loss over the whole val split, every val token once", "`val_loss_full`"))
    grids = {tuple(g) for g in study["grids"].values()}
    grid = (f"the base grid {', '.join(f'{lr:g}' for lr in next(iter(grids)))}" if len(grids) == 1
            else "each arm's own base grid (see the search table)")
    if study["selection_seeds"]:
        search = (f"**Method.** Each arm's learning rate is chosen on selection seeds "
                  f"{study['selection_seeds']} (the mean final loss over them): {grid}, one more grid step "
                  f"while the best rate is at an edge (at most {study['max_extensions']}), then half steps "
                  f"(×/÷ √2) around the best{'' if study['half_steps'] else ' (off in this study)'}. "
                  f"The chosen rate is then run on ")
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
            f"'stalled' counts the stalled final runs. {STALL_TEXT}")


def results_table(study, data, tokenizer):
    ref = study["reference"]
    ref_losses = final_losses(data[ref])
    byte = tokenizer == "byte"
    cols = ["arm", "non-embedding params", "non-embedding matrix", "chosen lr", "final loss, mean ± std (n)",
            "stalled"]
    cols += ["bits/byte"] if byte else []
    cols += [f"Δ vs {ref} (paired, nats)", "95% CI", "rel", "paired p", "Welch p", "call"]
    lines = ["| " + " | ".join(cols) + " |", "|---|" + "---:|" * (len(cols) - 2) + "---|"]
    for arm, d in data.items():
        ne, nem = param_counts(study, arm)
        losses = final_losses(d)
        mean, std, n = summarize(list(losses.values()))
        chosen = d["plan"]["chosen"]
        diverged = sum(r["status"] == "diverged" for r in d["finals"].values())
        cells = [arm, f"{ne:,}", f"{nem:,}", "—" if chosen is None else f"{chosen:g}",
                 ("—" if not n else f"{mean:.4f} ± {std:.4f} ({n})" if n > 1 else f"{mean:.4f} (1)")
                 + (f"; {diverged} diverged" if diverged else "")]
        cells += [f"{stalled_count(d['finals'].values())} of {n}" if n else "—"]
        cells += [f"{mean / math.log(2):.4f}" if n else "—"] if byte else []
        if arm == ref or not (losses and ref_losses):
            cells += ["—"] * 6
        else:
            pd = paired_difference(losses, ref_losses)
            wp = welch_p(list(losses.values()), list(ref_losses.values()))
            cells += [f"{pd['mean']:+.4f} (n={pd['n']})",
                      fmt_ci(pd["ci"]),
                      f"{pd['rel']:+.2f}%", "—" if pd["p"] is None else f"{pd['p']:.3g}",
                      "—" if wp is None else f"{wp:.3g}", verdict(pd["ci"], study.get("quick"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def contrasts_table(study, data):
    """The study's contrasts: paired Δ = arm − other over the final seeds both finished, 95% CI, paired p and
    the call (each arm at its own chosen learning rate)."""
    cols = ["arm − other", "what the pair isolates", "Δ (paired, nats)", "95% CI", "paired p", "call"]
    lines = ["| " + " | ".join(cols) + " |", "|---|---|" + "---:|" * 3 + "---|"]
    for arm, other, isolates in study["contrasts"]:
        a, b = final_losses(data[arm]), final_losses(data[other])
        pd = paired_difference(a, b)
        cells = [f"{arm} − {other}", isolates, "—" if not pd["n"] else f"{pd['mean']:+.4f} (n={pd['n']})",
                 fmt_ci(pd["ci"]),
                 "—" if pd["p"] is None else f"{pd['p']:.3g}",
                 verdict(pd["ci"], study.get("quick")) if pd["n"] else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def seeds_needed(sd, half_width, confidence=0.95, n_max=100_000):
    """The fewest pairs n ≥ 2 whose 95% CI half-width t(n − 1) · sd / √n is at most half_width (both in nats),
    for paired differences with standard deviation sd; None if sd is nan or more than n_max would be needed."""
    if not math.isfinite(sd):
        return None
    q = 0.5 + confidence / 2
    z = float(stats.norm.ppf(q))  # t > z: no fewer pairs than the normal approximation's (z · sd / half_width)²
    if not half_width > 0 or z * sd / half_width > math.sqrt(n_max):
        return None
    start = max(2, math.ceil((z * sd / half_width) ** 2))
    return next((n for n in range(start, n_max + 1)
                 if stats.t.ppf(q, n - 1) * sd / math.sqrt(n) <= half_width), None)


def precision_table(study, data):
    """Per arm against the reference: the paired differences' sd over the final seeds both finished, the 95%
    CI half-width now, the study's target (precision × the reference's mean final loss) and the seeds the
    measured sd needs for it (seeds_needed)."""
    ref = study["reference"]
    ref_losses = final_losses(data[ref])
    target = study["precision"] * summarize(list(ref_losses.values()))[0] if ref_losses else math.nan
    target_text = "—" if math.isnan(target) else f"±{target:.4f}"
    cols = [f"arm − {ref}", "pairs", "sd of the differences", "95% CI half-width now", "target",
            "pairs needed at this sd"]
    lines = ["| " + " | ".join(cols) + " |", "|---|" + "---:|" * (len(cols) - 1)]
    for arm, d in data.items():
        if arm == ref:
            continue
        pd = paired_difference(final_losses(d), ref_losses)
        if pd["ci"] is None:
            lines.append(f"| {arm} | {pd['n']} | — | — | {target_text} | — |")
            continue
        half = (pd["ci"][1] - pd["ci"][0]) / 2
        need = seeds_needed(pd["sd"], target)
        lines.append(f"| {arm} | {pd['n']} | {pd['sd']:.4f} | ±{half:.4f} ({half / target:.1f}× the target) | "
                     f"{target_text} | {'more than 100,000' if need is None else need} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- learning-rate curves
# A run is *stalled* when half-way through training (the first eval at or after STALL_AT · max_iters) its val
# loss on the fixed windows is still within STALL_DROP of its loss at the first eval after step 0: it has not
# left the early plateau. The one definition of report.py, for curves, bands and final runs alike.
STALL_AT, STALL_DROP = 0.5, 0.05
STALL_TEXT = (f"A run is *stalled* when at the first eval at or after {STALL_AT:.0%} of its steps its val loss "
              f"(fixed windows) is still within {STALL_DROP:.0%} of its loss at the first eval after step 0 "
              f"(it has not left the early plateau).")


def is_stalled(run):
    """True if the run is stalled (see STALL_AT and STALL_DROP), False if not, None if it cannot tell yet (no
    finite eval after step 0, or none at or after STALL_AT · max_iters that comes later than the first)."""
    evals = [r for r in run["rows"]
             if r["iter"] > 0 and r.get("val_loss") is not None and math.isfinite(r["val_loss"])]
    mid = next((r for r in evals if r["iter"] >= STALL_AT * run["max_iters"]), None)
    if mid is None or mid is evals[0]:
        return None
    return mid["val_loss"] > (1 - STALL_DROP) * evals[0]["val_loss"]


def stalled_count(runs):
    """How many of these runs (collect's dicts) finished and are stalled."""
    return sum(bool(r["status"] == "done" and is_stalled(r)) for r in runs)


def stall_caution(data):
    """[paragraphs] where final runs stalled, else []: the results table counts them, the text says what they
    do to a comparison, and names the arms all of whose final runs stalled. data: collect's {arm: ...}."""
    hit = [(arm, stalled_count(d["finals"].values()), len(final_losses(d))) for arm, d in data.items()]
    hit = [f"{arm} {k} of {n}" for arm, k, n in hit if k]
    out = []
    if hit:
        out.append(f"**Stalled final runs: {', '.join(hit)}.** A stalled run is still on the early plateau "
                   f"half-way through (Method). Its final loss mostly says whether and when it left the plateau, "
                   f"not how well the query learns, so a difference over such runs is about plateaus as much as "
                   f"about the method: more steps, another learning rate or more seeds tell the two apart.")
    # arms none of whose final runs left the plateau: their result says little, and the rate may be wrong
    blind = [f"{arm} ({d['plan']['chosen']:g})" for arm, d in data.items()
             if d["finals"] and all(r["status"] == "done" and is_stalled(r) for r in d["finals"].values())]
    if blind:
        out.append(f"**Every final run stalled: {', '.join(blind)}.** None of these arms' final runs left the "
                   f"early plateau by half-way, so their results say little about the query, and the chosen "
                   f"rate (in brackets) may be far from the arm's best, often a lower one. Give such an arm lower "
                   f"rates (learning_rates as a dict arm -> grid: python sweep.py --help) or more steps (the full "
                   f"study, if this is a --quick try).")
    return out


def mean_ci(values, confidence=0.95):
    """Values -> (mean, (lo, hi)) with a Student's t CI over n - 1 df; the CI is None for n < 2."""
    mean, std, n = summarize(values)
    if n < 2:
        return mean, None
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)
    return mean, (mean - half, mean + half)


def selection_losses(study, d, lr):
    """{selection seed: final loss} of one arm's finished selection runs at one rate."""
    return {s: d["search"][(lr, s)]["final"] for s in study["selection_seeds"]
            if (lr, s) in d["search"] and d["search"][(lr, s)]["final"] is not None}


def curve_points(study, d):
    """One arm's learning-rate curve: {lr: dict(losses=[final loss of each finished selection run], stalled,
    diverged, unfinished: counts of runs)}, over the rates swept."""
    points = {}
    for lr in d["plan"]["swept"]:
        runs = [d["search"][(lr, s)] for s in study["selection_seeds"]]
        points[lr] = dict(losses=list(selection_losses(study, d, lr).values()),
                          stalled=stalled_count(runs),
                          diverged=sum(r["status"] == "diverged" for r in runs),
                          unfinished=sum(r["status"] in ("missing", "unfinished") for r in runs))
    return points


def band(losses, within=0.01):
    """{lr: mean selection loss, or None/inf} -> (best lr, [rates whose mean is within `within` (a fraction)
    of the best mean]); (None, []) while no rate has a finite mean."""
    best = pick_best_lr(losses)
    if best is None:
        return None, []
    return best, sorted(lr for lr, v in losses.items()
                        if v is not None and math.isfinite(v) and v <= (1 + within) * losses[best])


def curve_table(study, data):
    """Rows: learning rates; a cell per arm: mean final loss over the selection seeds, its 95% CI, and how
    many of those runs stalled or diverged ('·' = not swept)."""
    lrs = sorted({lr for d in data.values() for lr in d["plan"]["swept"]})
    lines = ["| learning rate | " + " | ".join(data) + " |", "|---:|" + "---:|" * len(data)]
    curves = {arm: curve_points(study, d) for arm, d in data.items()}
    for lr in lrs:
        cells = []
        for arm in data:
            p = curves[arm].get(lr)
            if p is None:
                cells.append("·")
                continue
            mean, ci = mean_ci(p["losses"])
            text = "—" if not p["losses"] else f"{mean:.4f} {fmt_ci(ci)} (n={len(p['losses'])})"
            marks = [f"{p[k]} {k}" for k in ("stalled", "diverged", "unfinished") if p[k]]
            cells.append(text + ("; " + ", ".join(marks) if marks else ""))
        lines.append(f"| {lr:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def curve_gap_table(study, data):
    """Rows: learning rates; a cell per arm but the study's reference: arm − reference at that rate, paired by
    selection seed over the seeds both finished (at one seed both arms train on the same windows), its 95% CI
    (paired_difference) and the call (verdict). '·' = a rate one of the two did not sweep."""
    ref = study["reference"]
    others = [arm for arm in data if arm != ref]
    lrs = sorted({lr for d in data.values() for lr in d["plan"]["swept"]})
    lines = ["| learning rate | " + " | ".join(f"{arm} − {ref}" for arm in others) + " |",
             "|---:|" + "---:|" * len(others)]
    for lr in lrs:
        cells = []
        for arm in others:
            if lr not in data[arm]["plan"]["swept"] or lr not in data[ref]["plan"]["swept"]:
                cells.append("·")
                continue
            d = paired_difference(selection_losses(study, data[arm], lr), selection_losses(study, data[ref], lr))
            cells.append("—" if not d["n"] else
                         f"{d['mean']:+.4f} {fmt_ci(d['ci'])} (n={d['n']}) {verdict(d['ci'], study.get('quick'))}")
        lines.append(f"| {lr:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def band_table(study, data, within=0.01):
    """Per arm: the best rate (lowest mean over the selection seeds, a diverged seed counting +inf), its mean,
    the band of rates whose mean is within 1% of it, and the stalled and diverged runs over the whole curve and
    among the final runs."""
    cols = ["arm", "best lr", "mean at best", f"rates within {within:.0%} of best", "band width",
            "curve runs stalled / diverged", "final runs stalled / diverged"]
    lines = ["| " + " | ".join(cols) + " |", "|---|" + "---:|" * (len(cols) - 1)]
    for arm, d in data.items():
        best, rates = band(d["plan"]["losses"], within)
        points = curve_points(study, d).values()
        curve_runs = sum(len(p["losses"]) + p["diverged"] for p in points)
        finals = list(d["finals"].values())
        cells = [arm, "—" if best is None else f"{best:g}",
                 "—" if best is None else f"{d['plan']['losses'][best]:.4f}",
                 ", ".join(f"{lr:g}" for lr in rates) or "—",
                 f"×{max(rates) / min(rates):.2f}" if rates else "—",
                 f"{sum(p['stalled'] for p in points)} / {sum(p['diverged'] for p in points)} of {curve_runs}",
                 f"{stalled_count(finals)} / "
                 f"{sum(r['status'] == 'diverged' for r in finals)} of "
                 f"{sum(r['status'] in ('done', 'diverged') for r in finals)}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_lr_curves(study, data, path):
    """Final loss against learning rate (log scale) per arm: the mean over the selection seeds with its 95% CI,
    and every seed's run as a dot (stalled runs as crosses; diverged runs as triangles on the top edge)."""
    fig, ax = plt.subplots(figsize=(8, 5))
    finite = [r["final"] for d in data.values() for r in d["search"].values() if r["final"] is not None]
    top = max(finite) + 0.02 * (max(finite) - min(finite) + 1e-3) if finite else 1.0
    for k, (arm, d) in enumerate(data.items()):
        shift = 2 ** (0.04 * (k - (len(data) - 1) / 2))  # arms side by side at each rate
        points = curve_points(study, d)
        xs = [lr for lr in sorted(points) if points[lr]["losses"]]
        if not xs and not any(p["diverged"] for p in points.values()):
            continue
        stats_at = {lr: mean_ci(points[lr]["losses"]) for lr in xs}
        line, = ax.plot([x * shift for x in xs], [stats_at[x][0] for x in xs], marker="o", ms=4,
                        label=arm)
        color = line.get_color()
        for x in xs:
            mean, ci = stats_at[x]
            if ci is not None:
                ax.errorbar(x * shift, mean, yerr=[[mean - ci[0]], [ci[1] - mean]], color=color, capsize=3)
        for (lr, _), run in d["search"].items():
            if run["status"] == "diverged":
                ax.plot(lr * shift, top, marker="^", ms=7, color=color, clip_on=False)
            elif run["final"] is not None:
                ax.plot(lr * shift, run["final"], marker="x" if is_stalled(run) else ".", ms=7 if is_stalled(run)
                        else 5, color=color, alpha=0.7, ls="none")
    ax.set_xscale("log", base=2)
    rates = sorted({lr for d in data.values() for lr in d["plan"]["swept"]})
    ax.set_xticks(rates, [f"{lr:g}" for lr in rates], rotation=30)
    ax.minorticks_off()
    ax.set(xlabel="peak learning rate (log scale)", ylabel="final val loss (nats/token, whole val split)",
           title=f"learning-rate curves: mean and 95% CI over selection seeds {study['selection_seeds']}\n"
                 f"dots: each seed; ×: stalled; ▲: diverged")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no finished curve runs yet", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    save_figure(fig, path)


def fmt_run(run):
    if run["status"] == "diverged":
        return f"diverged (iter {run['iter']})"
    if run["status"] == "done":
        return "not finite" if run["final"] is None else f"{run['final']:.4f}"
    return "missing" if run["status"] == "missing" else f"unfinished ({run['iter']}/{run['max_iters']})"


def search_table(study, data):
    """Selection loss of every swept rate (rows) per arm (columns); the chosen rate in bold,
    '·' = not swept. While some selection seeds of a rate are unfinished, the mean over the finished ones and
    their number; a diverged seed shows as diverged (it makes the selection loss +inf)."""
    lrs = sorted({lr for d in data.values() for lr in d["plan"]["swept"]})
    seeds = study["selection_seeds"]
    lines = ["| learning rate | " + " | ".join(data) + " |", "|---:|" + "---:|" * len(data)]
    for lr in lrs:
        cells = []
        for d in data.values():
            if lr not in d["plan"]["swept"]:
                cells.append("·")
                continue
            runs = [d["search"][(lr, s)] for s in seeds]
            if not runs:  # a study without a search
                cells.append("given")
                continue
            done = [r["final"] for r in runs if r["status"] == "done" and r["final"] is not None]
            if all(r["status"] == "done" for r in runs) and len(runs) > 1:
                text = f"{d['plan']['losses'][lr]:.4f}"
            elif len(runs) == 1 or any(r["status"] == "diverged" for r in runs) or not done:
                text = fmt_run(next((r for r in runs if r["status"] == "diverged"), runs[0]))
            else:  # some selection seeds still to run: the mean so far, and how many it is over
                text = f"{sum(done) / len(done):.4f} ({len(done)} of {len(runs)} seeds)"
            cells.append(f"**{text}**" if lr == d["plan"]["chosen"] else text)
        lines.append(f"| {lr:g} | " + " | ".join(cells) + " |")
    notes = [f"- {arm}: {note}" for arm, d in data.items() for note in d["plan"]["notes"]]
    return "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "")


def gap_table(study, data):
    """Paired Δ vs the reference arm at every eval step (val loss on the fixed eval windows, which at one seed
    are the same for every arm): does the gap grow or shrink with training? Rows: eval iterations; cells:
    mean Δ and its 95% CI over the final seeds both arms reached that step with a finite loss."""
    ref = study["reference"]
    curves = {arm: {s: {r["iter"]: r["val_loss"] for r in run["rows"]
                        if r["iter"] > 0 and r.get("val_loss") is not None and math.isfinite(r["val_loss"])}
                    for s, run in d["finals"].items()} for arm, d in data.items()}
    others = [arm for arm in data if arm != ref]
    iters = sorted({i for s in curves[ref].values() for i in s})
    if not others or not iters:
        return "No finished eval steps yet."
    lines = ["| iter | " + " | ".join(f"{arm} − {ref}" for arm in others) + " |",
             "|---:|" + "---:|" * len(others)]
    for it in iters:
        ref_at = {s: c[it] for s, c in curves[ref].items() if it in c}
        cells = []
        for arm in others:
            pd = paired_difference({s: c[it] for s, c in curves[arm].items() if it in c}, ref_at)
            cells.append("—" if not pd["n"] else f"{pd['mean']:+.4f}" + (
                "" if pd["ci"] is None else " " + fmt_ci(pd["ci"])) + f" (n={pd['n']})")
        lines.append(f"| {it} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


CURVES_CAPTION = ("The val-loss curves of the final runs at each arm's chosen rate: the line is the mean over "
                  "seeds, the band their min–max; iter 0 (the untrained model) is left out. Against tokens the "
                  "arms are compared; against seconds (right) the curves depend on the machine, its load and "
                  "how many runs shared it (`--jobs`): a guide to cost, not a measurement (bench.py is one).")


def plot_curves(data, path):
    """val loss (fixed windows) vs training tokens and vs training seconds, per arm at its chosen lr: mean
    over the final seeds (line) and min–max (band)."""
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
        axes[1].plot([np.mean(by_time[x]) for x in xs], mean, marker="o", ms=3, color=line.get_color(),
                     label=arm)
    axes[0].set(xlabel="training tokens", ylabel="val loss (nats/token, fixed windows)",
                title="mean over final seeds; band: min–max")
    axes[1].set(xlabel="training seconds (mean over seeds; evals excluded)", ylabel="val loss (nats/token)",
                title="seconds: this machine, its load and --jobs")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no final runs with evaluations yet", ha="center", transform=ax.transAxes)
    fig.suptitle("val loss at each arm's chosen learning rate")
    fig.tight_layout()
    save_figure(fig, path)


def plot_forest(study, data, path):
    """Each arm's paired mean Δ vs the reference with its 95% CI (a forest plot), over the seed-by-seed
    differences it is the mean of (ticks: one stalled seed can move the mean and widen the CI)."""
    ref = study["reference"]
    rows = []
    for arm, d in data.items():
        if arm != ref and final_losses(d) and final_losses(data[ref]):
            rows.append((arm, paired_difference(final_losses(d), final_losses(data[ref]))))
    fig, ax = plt.subplots(figsize=(7, 0.45 * max(len(rows), 2) + 1.5))
    for y, (arm, pd) in enumerate(reversed(rows)):
        ax.plot(pd["diffs"], [y - 0.18] * pd["n"], "|", color="0.45", ms=7)
        lo, hi = pd["ci"] if pd["ci"] is not None else (pd["mean"], pd["mean"])
        color = ("tab:gray" if study.get("quick") else
                 "tab:green" if hi < 0 else "tab:red" if lo > 0 else "tab:gray")
        ax.errorbar(pd["mean"], y, xerr=[[pd["mean"] - lo], [hi - pd["mean"]]], fmt="o", color=color,
                    capsize=3)
    ax.set_yticks(range(len(rows)), [f"{arm} (n={pd['n']})" for arm, pd in reversed(rows)])
    ax.axvline(0, color="black", lw=0.8)
    ax.set(xlabel=f"Δ final loss vs {ref} (nats/token; paired mean, 95% CI)",
           title=("a --quick try (runs at a fraction of their steps): no calls" if study.get("quick")
                  else "lower is better; green/red: the CI excludes 0")
           + "\nticks: each seed's paired difference")
    if not rows:
        ax.text(0.5, 0.5, "no paired results yet", ha="center", transform=ax.transAxes)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    save_figure(fig, path)


def status_section(data):
    runs = {r["out_dir"]: r for d in data.values() for r in [*d["search"].values(), *d["finals"].values()]}
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


def default_out(study):
    """results/<name>, or out/quick/<name> for a --quick study (never results/)."""
    return os.path.join(QUICK_DIR if study.get("quick") else "results", study["name"])


def check_out(p, out, study_name):
    """argparse error (p.error) unless --out can take this output: a folder, or none yet, whose README.md, if
    any, is a report of study_name (None: run folders compared, whose plot must not replace a report's)."""
    if os.path.exists(out) and not os.path.isdir(out):
        p.error(f"--out {out}: cannot create the folder (File exists); choose another --out")
    if os.path.isfile(os.path.join(out, "README.md")):
        with open(os.path.join(out, "README.md"), errors="replace") as f:
            title = f.readline().rstrip("\n")
        if study_name is None or title != f"# Study {study_name}":
            p.error(f"--out {out} holds a README.md that is not a report of "
                    f"{'these runs' if study_name is None else 'study ' + study_name} (its first line: "
                    f"{title[:60]!r}); the report would replace its files: choose another --out")


def make_out(p, out):
    """Create the --out folder; argparse error naming why it cannot be (a broken link, a path under a file)."""
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        p.error(f"--out {out}: cannot create the folder ({e.strerror or e}); choose another --out")


def remove_dead_stages(out):
    """Delete the staging folders (.report-PID-*) in out of report.py runs that are no longer alive: a run killed
    mid-write (SIGKILL, a lost node) cannot remove its own. A live process's folder is left alone."""
    for name in os.listdir(out):
        pid = re.fullmatch(r"\.report-(\d+)-.*", name)
        if not pid or not os.path.isdir(os.path.join(out, name)) or int(pid[1]) == os.getpid():
            continue
        try:
            os.kill(int(pid[1]), 0)  # signal 0 checks only whether the process exists
        except ProcessLookupError:
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)
        except (PermissionError, OverflowError):  # another user's live process, or no such pid at all
            pass


def main(argv=None):
    """Write <out>/README.md, <out>/forest.png and <out>/val_loss.png (and <out>/lr_curves.png for a study with
    several selection seeds); returns the report's markdown.
    <out>/reading.md, if there, is a person's reading of the numbers: it goes in after the plots,
    unchanged."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("study", nargs="+", help="a study file, e.g. studies/enwiki_cpu.py; or train.py run "
                   "folders (each with metrics.jsonl and config.json) to compare, e.g. out/a out/b")
    p.add_argument("--out", type=os.path.expanduser,
                   default=None, help="output folder (default: results/<study name>; for run folders: "
                   "out/compare)")
    p.add_argument("--quick", type=float, nargs="?", const=QUICK_FRACTION, metavar="FRACTION",
                   help="the runs of python sweep.py STUDY --quick (in out/quick/<name>/runs; the report in "
                   "out/quick/<name>)")
    p.add_argument("--bpe_dir", type=os.path.expanduser, default=None, help="run folders: GPT-2's "
                   "encoder.json + vocab.bpe, to count bytes for bits/byte of gpt2 runs (default: the copy "
                   "shipped in tests/data/gpt2)")
    args = p.parse_args(argv)
    if all(os.path.isdir(path) for path in args.study):
        real = [os.path.realpath(path) for path in args.study]
        twice = [path for path, r in zip(args.study, real) if real.count(r) > 1]
        if twice:
            p.error(f"{' and '.join(twice)} are one run folder: give each run once")
        if args.quick is not None:  # it names a study's scratch runs; run folders are read where they are
            p.error("--quick is for a study file (its sweep.py --quick runs); run folders are compared as given")
        out = args.out or os.path.join("out", "compare")
        check_out(p, out, None)
        make_out(p, out)
        return compare(args.study, out, args.bpe_dir)
    if len(args.study) > 1:
        p.error(f"give one study file, or run folders to compare; not a folder: "
                f"{', '.join(x for x in args.study if not os.path.isdir(x))}")
    args.study = args.study[0]
    if not os.path.exists(args.study) and not args.study.endswith(".py"):
        p.error(f"{args.study}: no such run folder (or study file, which ends in .py)")
    study = load_study(args.study, args.quick)
    quick = quick_option(args.quick)  # for the commands the messages give
    out = args.out or default_out(study)
    check_out(p, out, study["name"])  # now, before the runs are read
    data = collect(study)
    runs = [r for d in data.values() for r in (*d["search"].values(), *d["finals"].values())]
    if all(r["status"] == "missing" for r in runs):  # a report of nothing would only be a folder to delete
        raise ValueError(f"no run of study {study['name']} has started yet (0 of the {len(runs)} runs planned so "
                         f"far have metrics in {study['runs_dir']}): nothing to report, nothing written; run "
                         f"python sweep.py {shlex.quote(args.study)}{quick} first")
    make_out(p, out)
    # the report's files are written whole into a hidden folder in out, then moved in together: a failed write
    # (a full disk) leaves the last report as it was, never half of each
    remove_dead_stages(out)
    with tempfile.TemporaryDirectory(dir=out, prefix=f".report-{os.getpid()}-") as stage:
        text = write_report(args.study, study, data, out, stage)
        names = sorted(os.listdir(stage))
        in_the_way = [n for n in names if os.path.isdir(os.path.join(out, n))]
        if in_the_way:
            p.error(f"--out {out} holds a folder named {in_the_way[0]}, where the report writes a file; move it")
        kept = [n for n in names if unchanged_but_the_date(os.path.join(out, n), os.path.join(stage, n))]
        for name in names:
            if name not in kept:
                os.replace(os.path.join(stage, name), os.path.join(out, name))
    written = [os.path.join(out, n) for n in names if n not in kept]
    print(f"wrote {', '.join(written) or 'nothing'}"
          + (f"; {', '.join(kept)} already up to date (a README's date line aside)" if kept else ""))
    left_out = [f"{r['arm']} seed {r['seed']} ({fmt_run(r)})" for d in data.values() for r in d["finals"].values()
                if r["status"] in ("missing", "unfinished")]
    if left_out:  # in progress, or a damaged log: either way the statistics stand on fewer seeds than planned
        print(f"note: {len(left_out)} final run(s) not finished, left out of the statistics: {'; '.join(left_out)}"
              f". Finish them with python sweep.py {shlex.quote(args.study)}{quick} (a committed run's "
              f"metrics.jsonl that lost rows: restore it from git)")
    return text


GENERATED = re.compile(r"^Generated .* UTC on ", re.MULTILINE)  # the header's date line


def unchanged_but_the_date(old, new):
    """Whether file old already says what file new says, apart from the README's 'Generated <date>' line (a
    rebuilt report of runs that did not change leaves the committed files as they are)."""
    if not os.path.isfile(old):
        return False
    with open(old, "rb") as f, open(new, "rb") as g:
        a, b = f.read(), g.read()
    if a == b or not old.endswith(".md"):
        return a == b
    undated = lambda text: [line for line in text.decode("utf-8", "replace").splitlines()
                            if not GENERATED.match(line)]
    return undated(a) == undated(b)


def write_report(study_path, study, data, out, stage):
    """Write the report of study (its runs' data from collect) into the folder stage: README.md, forest.png,
    val_loss.png and, with several selection seeds, lr_curves.png. out is where they will live (its
    reading.md goes in). Returns the README's markdown."""
    tokenizer = tokenizer_of(data)
    plot_curves(data, os.path.join(stage, "val_loss.png"))
    plot_forest(study, data, os.path.join(stage, "forest.png"))
    reading_path = os.path.join(out, "reading.md")  # a person's reading of the numbers, kept across rebuilds
    reading = (["## Reading", open(reading_path).read().strip()] if os.path.exists(reading_path) else [])
    contrasts = (["## Contrasts between arms (paired by seed, final seeds both finished, 95% CI)",
                  contrasts_table(study, data)] if study["contrasts"] else [])
    precision = ([f"**Precision.** The study aims for a 95% CI half-width of {study['precision'] * 100:g}% of "
                  f"{study['reference']}'s mean final loss on each comparison with it. At the spread of the "
                  f"paired differences measured so far (their sd; one stalled seed can dominate it), that "
                  f"takes the number of final seeds below:", precision_table(study, data)]
                 if study["precision"] is not None else [])
    curves = []  # with several selection seeds, every rate's point has a spread: draw and tabulate the curves
    if len(study["selection_seeds"]) > 1:
        plot_lr_curves(study, data, os.path.join(stage, "lr_curves.png"))
        curves = [f"## Learning-rate curves (final loss over selection seeds {study['selection_seeds']})",
                  "Stalled runs as defined above. Means and 95% CIs are over the finished, non-diverged seeds "
                  "at each rate.",
                  "![learning-rate curves](lr_curves.png)", band_table(study, data), curve_table(study, data),
                  f"Each arm against {study['reference']} at the same rate, paired by selection seed (95% CI; a "
                  f"call only where the CI excludes 0):", curve_gap_table(study, data)]
    text = "\n\n".join([
        header(study_path, study, out), "## Results", method(study, tokenizer),
        results_table(study, data, tokenizer), *stall_caution(data), *precision, "![forest plot](forest.png)",
        *contrasts,
        "![val loss](val_loss.png)", CURVES_CAPTION, *curves, *reading,
        (f"## Learning-rate search (mean final loss over selection seeds {study['selection_seeds']})"
         if study["selection_seeds"] else "## Learning rates (one per arm, given by the study: no search)"),
        search_table(study, data),
        "## The gap along training (paired Δ on the fixed eval windows, 95% CI, final seeds)",
        gap_table(study, data), "## Runs", status_section(data)]) + "\n"
    atomic_write_text(os.path.join(stage, "README.md"), text)
    return text


def interrupt(signum, frame):
    """SIGTERM and SIGHUP end report.py as Ctrl-C does: by an exception, so that its staging folder goes."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    try:
        main()
    except (OSError, ValueError) as e:  # a missing file, a full disk: one line, nothing half-written
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:  # the report is rebuilt from the runs alone
        print("interrupted; run the same command again to write the report", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
