"""
Markdown report and validation-loss plot of a sweep.py study.

    python report.py studies/enwiki_cpu.py                   # -> results/enwiki_cpu/README.md and val_loss.png
    python report.py studies/enwiki_cpu.py --out /tmp/rep    # elsewhere

Run it from the folder the sweep ran in: the study's config file and out_root are relative paths.
Missing and unfinished runs are listed in the report, never fatal. An arm's best learning rate is the one with
the lowest final val loss at seeds[0] (sweep.py's rule); while its sweep is incomplete it is marked provisional.
"""
import argparse
import datetime
import json
import math
import os
import platform
import sys

import matplotlib
matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt
import torch

import sweep
from common import model_config
from model import GPT
from sweep import pick_best_lr
from prepare_data import load_meta

BASELINE = "linear"
SPREAD_RULE = ("an arm's difference to linear exceeds the seed-to-seed spread when |mean_arm - mean_linear| > "
               "2·sqrt(s_arm²/n_arm + s_linear²/n_linear), i.e. twice the standard error of the difference of the "
               "means, with s the sample std over seeds (ddof=1); n/a with fewer than 2 finished seeds in either arm")


# ------------------------------------------------------------------------------------------- the numbers
def summarize(values):
    """Final losses (nats/token) -> (mean, sample std with ddof=1, n); std is nan for n < 2, mean for n = 0."""
    n = len(values)
    mean = sum(values) / n if n else math.nan
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    return mean, std, n


def relative_change(a, b):
    """(a - b) / b in % (the paper's convention: negative = a has the lower loss)."""
    return (a - b) / b * 100


def exceeds_spread(a_values, b_values):
    """SPREAD_RULE: True/False, or None if either arm has fewer than 2 values."""
    (ma, sa, na), (mb, sb, nb) = summarize(a_values), summarize(b_values)
    if na < 2 or nb < 2:
        return None
    return abs(ma - mb) > 2 * math.sqrt(sa ** 2 / na + sb ** 2 / nb)


# ------------------------------------------------------------------------------------------- the runs
def read_text(path):
    """A file's text, or "" if it does not exist (a run not started yet)."""
    if not os.path.isfile(path):
        return ""
    with open(path) as f:
        return f.read()


def read_run(study, arm, lr, seed):
    """One run dir -> dict(status 'done' | 'diverged' | 'unfinished' | 'missing', iter, max_iters, val_loss,
    rows, config). val_loss: sweep.final_val_loss of a finished run (whole-split loss where recorded)."""
    sweep.check_settings(study, arm, lr, seed)  # never report a run made with other settings
    out_dir = sweep.run_dir(study, arm, lr, seed)
    rows, cfg_path = sweep.read_metrics(out_dir), os.path.join(out_dir, "config.json")
    config = json.loads(read_text(cfg_path) or "null")
    max_iters = sweep.run_config(study, arm, lr, seed)["max_iters"]
    last = rows[-1] if rows else {}
    status = ("missing" if not rows else "diverged" if sweep.is_diverged(last) else
              "done" if last["iter"] >= max_iters else "unfinished")
    return dict(arm=arm, lr=lr, seed=seed, out_dir=out_dir, status=status, iter=last.get("iter"),
                max_iters=max_iters, val_loss=sweep.final_val_loss(last) if status == "done" else None, rows=rows,
                config=config)


def collect(study):
    """{arm: dict(sweep={lr: run at seeds[0]}, best_lr, provisional, seeds={seed: run at best_lr})}."""
    out = {}
    for arm in study["arms"]:
        swept = {lr: read_run(study, arm, lr, study["seeds"][0]) for lr in study["learning_rates"]}
        best = pick_best_lr({lr: r["val_loss"] for lr, r in swept.items()})
        seeds = {s: swept[best] if s == study["seeds"][0] else read_run(study, arm, best, s)
                 for s in study["seeds"]} if best is not None else {}
        out[arm] = dict(sweep=swept, best_lr=best, seeds=seeds,
                        provisional=any(r["status"] not in ("done", "diverged") for r in swept.values()))
    return out


def param_counts(study, arm, runs):
    """(non_embedding, non_embedding_matrix) of the arm's model, built on the meta device (no memory, no data).
    From the study's config of the arm (the vocabulary enters neither count)."""
    cfg = sweep.run_config(study, arm, study["learning_rates"][0], study["seeds"][0])
    with torch.device("meta"):
        counts = GPT(model_config(cfg)).param_breakdown()
    return counts["non_embedding"], counts["non_embedding_matrix"]


def tokenizer_of(study):
    """The study dataset's tokenizer (gpt2 | char | byte), or None if its meta.json is not here."""
    cfg = sweep.run_config(study, next(iter(study["arms"])), study["learning_rates"][0], study["seeds"][0])
    try:
        return load_meta(os.path.join(cfg["data_dir"], cfg["dataset"]))["tokenizer"]
    except FileNotFoundError:
        return None


# ------------------------------------------------------------------------------------------- the report
def header(study_path, study, out):
    """Title, the study file's comment, the commands that produce the report, date and machine."""
    comment = [line[1:].strip() for line in read_text(study_path).splitlines() if line.startswith("#")]
    cmds = [c for c in comment if c.startswith("python ")] or [f"python sweep.py {study_path}"]
    report_cmd = f"python report.py {study_path}" + ("" if out == default_out(study) else f" --out {out}")
    cmds += [] if any(c.startswith("python report.py") for c in cmds) else [report_cmd]
    about = " ".join(c for c in comment if not c.startswith("python "))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    return (f"# Study {study['name']}\n\n{about}\n\nProduced by (from the repository root):\n\n```\n"
            + "\n".join(cmds) + f"\n```\n\nGenerated {now} on {machine}; Python {platform.python_version()}, "
            f"torch {torch.__version__}.")


def fmt_loss(run):
    if run["status"] == "diverged":
        return f"diverged (iter {run['iter']})"
    if run["status"] == "done":
        return "not finite" if run["val_loss"] is None else f"{run['val_loss']:.4f}"
    return "missing" if run["status"] == "missing" else f"unfinished ({run['iter']}/{run['max_iters']})"


def results_table(study, data, tokenizer):
    """One row per arm: parameters, best lr, mean ± std over seeds, perplexity, bits/byte, change vs linear."""
    finals = {arm: [r["val_loss"] for r in d["seeds"].values() if r["status"] == "done" and r["val_loss"] is not None]
              for arm, d in data.items()}
    base = finals.get(BASELINE, [])
    byte = tokenizer == "byte"
    cols = ["arm", "non-embedding params", "non-embedding matrix", "best lr", "val loss (nats/token), mean ± std (n)",
            "perplexity"] + (["bits/byte"] if byte else []) + [f"vs {BASELINE}", "exceeds seed spread"]
    lines = ["| " + " | ".join(cols) + " |", "|---|" + "---:|" * (len(cols) - 1)]
    for arm, d in data.items():
        ne, nem = param_counts(study, arm, list(d["sweep"].values()) + list(d["seeds"].values()))
        mean, std, n = summarize(finals[arm])
        lr = "—" if d["best_lr"] is None else f"{d['best_lr']:g}" + (" (provisional)" if d["provisional"] else "")
        loss = "—" if not n else f"{mean:.4f} ± {std:.4f} (n={n})" if n > 1 else f"{mean:.4f} (n=1)"
        cells = [arm, f"{ne:,}", f"{nem:,}", lr, loss, f"{math.exp(mean):.3f}" if n else "—"]
        cells += [f"{mean / math.log(2):.4f}" if n else "—"] if byte else []
        if arm == BASELINE or not (n and base):
            cells += ["—", "—"]
        else:
            spread = exceeds_spread(finals[arm], base)
            cells += [f"{relative_change(mean, summarize(base)[0]):+.2f}%",
                      "n/a" if spread is None else "yes" if spread else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sweep_table(study, data):
    """Final val loss (nats/token) at seeds[0] for every learning rate x arm; the best per arm in bold."""
    lines = ["| learning rate | " + " | ".join(data) + " |", "|---:|" + "---:|" * len(data)]
    for lr in study["learning_rates"]:
        cells = [f"**{fmt_loss(d['sweep'][lr])}**" if lr == d["best_lr"] else fmt_loss(d["sweep"][lr])
                 for d in data.values()]
        lines.append(f"| {lr:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(data, path):
    """val loss vs training tokens per arm at its best lr: mean over seeds (line), min-max over seeds (band)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm, d in data.items():
        by_x = {}
        for run in d["seeds"].values():
            for row in run["rows"]:
                if row["iter"] > 0 and row.get("val_loss") is not None:  # iter 0: the untrained model, ~ln(vocab)
                    by_x.setdefault(row["tokens"], []).append(row["val_loss"])
        if by_x:
            xs = sorted(by_x)
            line, = ax.plot(xs, [sum(by_x[x]) / len(by_x[x]) for x in xs], marker="o", ms=3,
                            label=f"{arm} (lr {d['best_lr']:g})")
            ax.fill_between(xs, [min(by_x[x]) for x in xs], [max(by_x[x]) for x in xs], alpha=0.2,
                            color=line.get_color())
    ax.set(xlabel="training tokens", ylabel="val loss (nats/token)", title="val loss at each arm's best lr")
    if ax.lines:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no runs with evaluations yet", ha="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def status_section(data):
    runs = {r["out_dir"]: r for d in data.values() for r in [*d["sweep"].values(), *d["seeds"].values()]}
    todo = [r for r in runs.values() if r["status"] != "done"]
    note = ("" if all(d["best_lr"] is not None for d in data.values()) else
            " (an arm's other seeds are listed once one of its learning rates has finished)")
    if not todo:
        return f"All {len(runs)} runs finished{note}."
    return f"{len(runs) - len(todo)} of {len(runs)} runs finished{note}. Not finished:\n\n" + "\n".join(
        f"- {r['out_dir']}: {fmt_loss(r)}" for r in todo)


def default_out(study):
    return os.path.join("results", study["name"])


def main(argv=None):
    """Write <out>/README.md and <out>/val_loss.png; returns the report's markdown."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", help="study file, e.g. studies/enwiki_cpu.py")
    p.add_argument("--out", default=None, help="output folder (default: results/<study name>)")
    args = p.parse_args(argv)
    study = sweep.load_study(args.study)
    out = args.out or default_out(study)
    os.makedirs(out, exist_ok=True)
    data, tokenizer = collect(study), tokenizer_of(study)
    plot(data, os.path.join(out, "val_loss.png"))
    bpb = ("Bits per byte = loss / ln 2 (byte-level data: one token per byte)." if tokenizer == "byte" else
           f"No bits/byte column: the tokenizer is {tokenizer or 'unknown (dataset not found)'}; use eval.py.")
    text = "\n\n".join([
        header(args.study, study, out), "## Results",
        f"Final val loss: train.py's last evaluation (iter max_iters) on its fixed val windows, in nats/token; "
        f"mean ± sample std over seeds {study['seeds']} at each arm's best learning rate. Perplexity = exp(mean). "
        f"{bpb} 'vs {BASELINE}' = (arm − {BASELINE}) / {BASELINE} × 100 on the means. Spread rule: {SPREAD_RULE}.",
        results_table(study, data, tokenizer), "![val loss](val_loss.png)",
        f"## Learning-rate sweep (seed {study['seeds'][0]}, final val loss in nats/token)",
        sweep_table(study, data), "## Runs", status_section(data)]) + "\n"
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(text)
    print(f"wrote {os.path.join(out, 'README.md')} and val_loss.png")
    return text


if __name__ == "__main__":
    try:
        main()
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
