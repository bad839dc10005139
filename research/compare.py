"""
Plain train.py runs side by side (python -m research.report RUN RUN ...): their table, the settings that differ
and their val-loss curves, with no statistics (one seed each). Also the file helpers every report shares:
markdown tables, plots as PNG bytes, files written atomically.
"""
import io
import json
import math
import os
import pathlib
import re
import sys

import numpy as np

try:  # the report's libraries, beyond the core install
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    import scipy  # noqa: F401  (paired.py's statistics)
except ImportError as e:
    sys.exit(f"error: report.py needs {e.name}, which is not installed: pip install -r requirements-report.txt "
             f"(scipy and matplotlib)")

from model import QUERY_MODE_ALIASES, GPTConfig
from nlq import settings
from nlq.checkpoint import check_same_dataset, read_metrics, read_saved_config, replace_atomically
from nlq.data import load_meta
from nlq.tokenizers import token_bytes
from research.study import elapsed_seconds, is_diverged, is_final


def fmt_loss(x):
    return "—" if x is None else f"{x:.4f}"


def table(cols, rows, align=None):
    """A markdown table; align: 'l' or 'r' per column (default: the first left, the rest right)."""
    align = align or "l" + "r" * (len(cols) - 1)
    rule = "|" + "".join("---|" if a == "l" else "---:|" for a in align)
    return "\n".join(["| " + " | ".join(cols) + " |", rule] + ["| " + " | ".join(r) + " |" for r in rows])


def png(fig, axes=(), empty=None):
    """A grid and a legend (or the text empty, where nothing was drawn) on each of axes; the figure as PNG."""
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        elif empty:
            ax.text(0.5, 0.5, empty, ha="center", transform=ax.transAxes)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format="png")
    plt.close(fig)
    return buf.getvalue()


GENERATED = re.compile(r"^Generated .* UTC on .*$", re.MULTILINE)  # the README's date line


def write_files(out, files):
    """Write {name: bytes} into out, each file atomically, but for those that already say the same (a README's
    date line aside: a rebuild of unchanged runs leaves git clean). Returns (paths written, names kept)."""
    os.makedirs(out, exist_ok=True)
    written, kept = [], []
    for name in sorted(files):
        path, new = os.path.join(out, name), files[name]
        undated = lambda b: GENERATED.sub("", b.decode("utf-8", "replace")) if name.endswith(".md") else b
        if os.path.isfile(path) and undated(pathlib.Path(path).read_bytes()) == undated(new):
            kept.append(name)
            continue
        replace_atomically(path, lambda tmp: pathlib.Path(tmp).write_bytes(new))
        written.append(path)
    return written, kept


# ---------------------------------------------------------------------------------- plain runs compared
COMPARED = "# Runs compared"  # the title of a comparison's README


def tokens_per_byte(config, cache):
    """Target tokens per UTF-8 byte of the val.bin the run was trained on, or a str saying why they cannot be
    counted."""
    meta = config.get("dataset_meta") or {}
    if meta.get("tokenizer") == "byte":
        return 1.0
    folder = os.path.join(config["data_dir"], config["dataset"])
    if folder not in cache:
        try:
            found = load_meta(folder)
            check_same_dataset(meta, found, folder)
            ids = np.memmap(os.path.join(folder, "val.bin"), dtype=found["dtype"], mode="r")[1:]
            counts = np.bincount(ids, minlength=found["vocab_size"])
            cache[folder] = 1 / (int(counts @ token_bytes(found)) / len(ids))
        except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: DataError (no GPT-2 BPE files)
            cache[folder] = f"{folder}: {e}"
    return cache[folder]


def compare_table(runs):
    """Plain runs -> (markdown table, [notes])."""
    rows, notes, cache = [], [], {}
    for run in runs:
        last, cfg = run["rows"][-1], run["config"]
        status = "" if is_final(last, cfg["max_iters"]) else f" (unfinished: max_iters {cfg['max_iters']})"
        full, bpb = last.get("val_loss_full"), "—"
        if full is not None:
            per_byte = tokens_per_byte(cfg, cache)
            if isinstance(per_byte, str):
                notes.append(f"bits/byte of {run['name']}: not counted ({per_byte})")
            else:
                bpb = f"{full / math.log(2) * per_byte:.4f}"
        if last.get("elapsed_s") is not None:
            wall = f"{last['elapsed_s']:.0f} s"
        else:  # runs made before metrics.jsonl had elapsed_s: the step times alone
            wall = f"{elapsed_seconds(run['rows'])[-1]:.0f} s*"
            notes.append(f"* {run['name']}: training steps only (evals not counted; the run predates elapsed_s)")
        val = "diverged" if is_diverged(last) else fmt_loss(last.get("val_loss"))
        rows.append([run["name"], f"{last['iter']:,}{status}", f"{last.get('tokens', 0):,}", val, fmt_loss(full),
                     bpb, wall])
    cols = ["run", "iters", "tokens", "val loss (fixed windows)", "val loss (whole split)", "bits/byte",
            "wall time"]
    return table(cols, rows), notes


class Changed(str):
    """A setting that a resume changed half-way ("4, then 8 from iter 20"), shown as it is, not quoted."""
    __repr__ = str.__str__


def setting(config, key):
    """A run's value of one key as the model was built: a size left at None is the one model_args resolved, an
    alias the query mode it names, attn_scale given as the mode's own default None (as if left out); for a key a
    resume changed (config.json's "resumes"), each value in turn."""
    steps = [(r["iter"], r["changed"][key]) for r in config.get("resumes") or [] if key in r["changed"]]
    if steps:
        return Changed(", then ".join([repr(steps[0][1][0])] + [f"{now!r} from iter {it}" for it, (_, now) in steps]))
    value = config[key]
    if key == "query_mode":
        value = QUERY_MODE_ALIASES.get(value, value)
    elif key == "attn_scale" and value is not None:
        default = GPTConfig(n_embd=config["n_embd"], n_head=config["n_head"], query_mode=config["query_mode"])
        value = None if math.isclose(value, default.attn_scale) else value
    elif value is None and key != "attn_scale":
        value = (config.get("model_args") or {}).get(key)
    return value


def config_differences(runs):
    """{key: [value per run]} for the settings (and the dataset's contents) that differ between the runs."""
    keys = sorted({k for run in runs for k in run["config"]
                   if k in settings.DEFAULTS and k not in settings.NOT_EXPERIMENT})
    diffs = {k: [setting(run["config"], k) for run in runs] for k in keys}
    diffs = {k: v for k, v in diffs.items() if any(x != v[0] for x in v)}
    # where the weights started; a run saved before train.py recorded it: its init_from, unless that says resume
    origins = [c.get("initialised_from") or ("not recorded" if c["init_from"] == "resume" else c["init_from"])
               for c in (run["config"] for run in runs)]
    if any(o != origins[0] for o in origins):
        diffs["initialised_from"] = origins
    shas = [json.dumps((run["config"].get("dataset_meta") or {}).get("sha256"), sort_keys=True) for run in runs]
    if len(set(shas)) > 1:  # a sha per run would be noise: say which runs share their data
        groups = {sha: i + 1 for i, sha in enumerate(dict.fromkeys(shas))}
        diffs["dataset contents"] = [f"data {groups[sha]}" for sha in shas]
    return diffs


def plot_runs(runs, names):
    """Each run's val loss against training tokens, named by names; its whole-split val loss as an x at its end."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run, name in zip(runs, names):
        rows = [r for r in run["rows"] if r["iter"] > 0 and r.get("val_loss") is not None]
        if not rows:
            continue
        line, = ax.plot([r["tokens"] for r in rows], [r["val_loss"] for r in rows], marker="o", ms=3, label=name)
        if rows[-1].get("val_loss_full") is not None:
            ax.plot(rows[-1]["tokens"], rows[-1]["val_loss_full"], "x", ms=8, color=line.get_color())
    ax.set(xlabel="training tokens", ylabel="val loss (nats/token; ×: whole split)",
           title="val loss of each run (one seed each: no call)")
    return png(fig, [ax])


def compare(paths, out):
    """Compare plain train.py runs: a table, the settings that differ and what such a comparison cannot tell,
    printed and written to <out>/README.md beside their val-loss curves (<out>/val_loss.png)."""
    runs = [dict(name=p, rows=read_metrics(p), config=read_saved_config(os.path.join(p, "config.json")))
            for p in paths]
    empty = [run["name"] for run in runs if not run["rows"] or run["config"] is None]
    if empty:
        raise ValueError(f"{empty[0]} is not a train.py run folder with results (metrics.jsonl and config.json)")
    table_text, notes = compare_table(runs)
    diffs = {k: [v if k == "dataset contents" else repr(v) for v in values]
             for k, values in config_differences(runs).items()}
    show = lambda values: ", ".join(f"{run['name']}: {v}" for run, v in zip(runs, values))
    if not diffs:
        differ = "Their settings are the same (" + ", ".join(sorted(settings.NOT_EXPERIMENT)) + " not compared)."
    elif len(diffs) == 1:
        (key, values), = diffs.items()
        differ = f"They differ only in {key}: {show(values)}."
    else:
        differ = "Settings that differ:\n\n" + table(["setting", *(run["name"] for run in runs)],
                                                      [[k, *values] for k, values in diffs.items()])
    if "dataset contents" in diffs:
        notes.append(f"Their data differ ({show(diffs['dataset contents'])}: other text, or the same split "
                     f"otherwise): their val losses are not over the same tokens.")
    changed = [run["name"] for run in runs
               if any(r["changed"].keys() - settings.NOT_EXPERIMENT for r in run["config"].get("resumes") or [])]
    if changed:
        notes.append(f"{', '.join(changed)} changed settings when resumed (shown as 'A, then B from iter N'): not "
                     f"the curves of straight runs at their final settings.")
    tokenizers = [repr((run["config"].get("dataset_meta") or {}).get("tokenizer")) for run in runs]
    if len(set(tokenizers)) > 1:  # a char's nats and a BPE token's nats are different units
        notes.append(f"Their tokenizers differ ({show(tokenizers)}): val loss is in nats per token of each run's "
                     f"own tokenizer, so only bits/byte compares them.")
    seeds = ", ".join(map(str, sorted({run["config"]["seed"] for run in runs})))
    caveat = (f"One seed per run (seeds {seeds}): a gap can be seed noise, so this comparison supports no call; "
              f"for one, write a study (studies/*.py) and run python -m research.sweep STUDY, then "
              f"python -m research.report STUDY. "
              f"Wall time is the machine's during each run; bench.py compares speed.")
    # each run's name in the plot: the values it differs in (a query mode by its name alone), then its folder
    names = [", ".join(v.strip("'") if k in ("query_mode", "dataset contents") else f"{k}={v}"
                       for k, v in zip(diffs, values)) + f" ({run['name']})"
             for run, values in zip(runs, zip(*diffs.values()))] or paths
    text = "\n\n".join([table_text, *notes, differ, caveat])
    write_files(out, {"val_loss.png": plot_runs(runs, names), "README.md": (
        f"{COMPARED}\n\n{text}\n\n![val-loss curves](val_loss.png)\n").encode()})
    text += f"\n\nWritten to {out}: README.md (this text) and val_loss.png (the val-loss curves)"
    print(text)
    return text
