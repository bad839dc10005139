"""
Run a study: every arm gets the same learning-rate search on selection seeds, then its chosen rate is run on
the final seeds, which are never the seeds the rate was chosen on (no winner's curse).

    python sweep.py studies/enwiki_cpu.py --jobs 2 --threads 1 # run it here (2 runs at a time, 1 thread each)
    python sweep.py studies/enwiki_cpu.py --print 8            # the torchrun commands of the runs due now
    python sweep.py studies/enwiki_cpu.py --quick --jobs 2     # try it: 5% of the steps, in out/quick/
    python sweep.py studies/paper_small.py --dry_run           # the plan: runs, tokens, GPU-hours; runs nothing
    python sweep.py studies/paper_small.py --executor slurm --gpus_per_run 8 --slurm_partition gpu --slurm_time 480
                                                               # every due run a SLURM job (submitit), to the end
    python report.py studies/enwiki_cpu.py                     # tables, paired statistics, plots

A study file is plain Python that sets:
    name, config          the study's name and a train.py config file
    overrides             dict of train.py keys for every arm (not learning_rate, seed, out_dir or min_lr,
                          which the sweep sets for each run)
    arms                  dict: arm name -> dict of train.py keys (an arm may set min_lr, e.g. 0.0)
    learning_rates        the base grid, e.g. [4e-3, 8e-3, 1.6e-2] (two or more rates for a search; min_lr =
                          lr / 10 unless the arm sets it); a dict arm -> grid gives arms their own (e.g. rates
                          chosen by an earlier study)
    selection_seeds       seeds the learning rate is chosen on (the mean final loss over them); [] with a
                          single learning rate (per arm) means: no search, that rate is the chosen one
    seeds                 final seeds, disjoint from selection_seeds; the statistics use these alone (each
                          rate and seed appears once in its list)
and optionally seeds_per_arm (dict arm -> how many of seeds it runs; default all), reference (the arm others
are compared with; default "linear"), max_extensions (default 2), half_steps (default True), runs_dir
(default results/<name>/runs; two studies that name the same runs_dir share the runs of their arms, which
must then be the same experiments: a study whose runs folder holds runs of other settings is refused before
anything starts, by sweep.py and report.py alike),
and contrasts (default []: a list of (arm, other, "what the pair isolates"), paired comparisons between two
arms that report.py adds to the comparisons with the reference, e.g. ("nonlinear", "residual", "f's
nonlinearity")), and slurm (default {}: --executor slurm's settings, dict(partition="gpu", time=480 (minutes a
job), gpus_per_run=8, extra=dict(account="...", cpus_per_task=32)); the command line's options override them),
and precision (default None: a target 95% CI half-width of each comparison with the reference, a fraction of
the reference's mean final loss, e.g. 0.003; report.py then gives the final seeds the measured spread needs).

On a cluster (--executor slurm, through submitit): every due run is a job of one node running train.py under
torchrun on --gpus_per_run GPUs (plain python for 1); the driver waits, plans again as runs finish (extensions,
half steps, final seeds) and submits what became due, until the study is complete. Each run's job id is kept in
<run dir>/job.json: a restarted driver waits for the jobs that still run and resubmits only runs whose job
ended unfinished (they resume from their checkpoint). A job that SLURM preempts or that reaches its time limit
gets submitit's USR2, stops train.py at a step boundary with a checkpoint (train.py's docstring) and is
requeued; it resumes exactly.

Per arm: (1) the base grid on the selection seeds; (2) while the best rate is the smallest or the largest
swept, one more grid step in that direction (at most max_extensions); (3) half steps (x/√2, x·√2) around the
best; (4) the best of all swept rates on the final seeds. The "final loss" of a run is its val loss over the
whole val split (val_loss_full), else its last fixed-window val loss; a diverged run counts as +inf.

Each run has its own out_dir, <runs_dir>/<arm>/lr<lr>_seed<seed>. A run whose metrics.jsonl reaches max_iters
(or records divergence) is finished and never rerun, also when only its committed metrics.jsonl and
config.json are there (a study started on one machine finishes on another); one with a checkpoint resumes
exactly. Stop the sweep at any time and start it again. Before it starts, the sweep checks the dataset and
prints how many runs are due and a time estimate from the study's finished runs.

--quick [FRACTION] runs the study at that fraction of each run's steps (default 0.05; warmup, decay, eval
interval and eval batches scaled alike; no whole-split eval) in the scratch folder out/quick/<name>/runs: for trying the
machinery, not for comparing arms (report.py --quick reports it).
"""
import argparse
import difflib
import filecmp
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from checkpoint import atomic_write_text, is_locked, lock_file, read_metrics
from data import load_meta, open_split
from distributed import resolve_device
from model import QUERY_MODE_ALIASES
from preemption import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_PREEMPTED
from settings import (DEFAULTS, NOT_EXPERIMENT, NOT_RESULTS, HelpFormatter, check_value, flops_per_token,
                      model_config, param_counts, parse_config, read_config_file, upgrade)

ROOT = os.path.dirname(os.path.abspath(__file__))  # the repository
TRAIN_PY = os.path.join(ROOT, "train.py")
STUDY_KEYS = ("name", "config", "overrides", "arms", "learning_rates", "selection_seeds", "seeds")
OPTIONAL_KEYS = dict(seeds_per_arm={}, reference="linear", max_extensions=2, half_steps=True, runs_dir=None,
                     contrasts=[], slurm={}, precision=None)
SLURM_KEYS = ("partition", "time", "gpus_per_run", "extra")  # a study's slurm dict (see --executor slurm)
# train.py keys the sweep sets for every run, and what sets them instead (an arm may set min_lr)
PER_RUN = dict(learning_rate="learning_rates", seed="selection_seeds and seeds", out_dir="runs_dir",
               min_lr="each arm's min_lr (default: lr / 10)")


# ------------------------------------------------------------------------------------------- the study file
def load_study(path, quick=None):
    """Study file -> dict. ValueError names a missing key, an unknown train.py key or a bad value, or run
    folders in its runs_dir that hold other experiments (check_shared_runs): sweep.py and report.py accept
    the same studies.

    quick: a fraction in (0, 1]: the study at that fraction of its steps (see quick_keys), its runs in the
    scratch folder out/quick/<name>/runs, whatever its runs_dir (results/ is never touched).
    """
    if os.path.isdir(path):
        raise FileNotFoundError(f"study file {path} is a folder; give a study file (e.g. studies/enwiki_cpu.py)")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"study file {path} not found{close_match(path)}")
    if not path.endswith(".py"):  # it would be run as Python (a metrics log: "name 'null' is not defined")
        raise ValueError(f"study file {path} is not a .py file; give a study file (e.g. studies/enwiki_cpu.py)")
    namespace = read_config_file(path)  # plain Python, like a config file
    missing = [k for k in STUDY_KEYS if k not in namespace]
    if missing:
        hint = (" (selection_seeds: the seeds the learning rate is chosen on, disjoint from the final seeds)"
                if "selection_seeds" in missing else "")
        hint += " (overrides = {} for none: the config's settings as they are)" if "overrides" in missing else ""
        raise ValueError(f"study file {path} does not set {', '.join(missing)}{hint}")
    unknown = set(namespace) - set(STUDY_KEYS) - set(OPTIONAL_KEYS)
    if unknown:
        raise ValueError(f"study file {path} sets unknown keys {sorted(unknown)}; study keys: "
                         f"{', '.join(STUDY_KEYS + tuple(OPTIONAL_KEYS))}")
    study = {**OPTIONAL_KEYS,
             **{k: namespace[k] for k in STUDY_KEYS + tuple(OPTIONAL_KEYS) if k in namespace}}
    # a folder name that needs no quoting in a shell and no care in a path: letters, digits, _ . - (not first)
    plain = lambda name: isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) is not None
    first = {"name": (plain(study["name"]), "a plain folder name (letters, digits, _ . -; not starting with . "
                                            "or -)"),
             "config": (isinstance(study["config"], str), "the path of a train.py config file"),
             "runs_dir": (study["runs_dir"] is None or isinstance(study["runs_dir"], str), "a folder path"),
             "overrides": (isinstance(study["overrides"], dict), "a dict of train.py keys"),
             "arms": (isinstance(study["arms"], dict) and study["arms"] and all(
                 isinstance(a, str) and isinstance(keys, dict) for a, keys in study["arms"].items()),
                      "a non-empty dict: arm name (a plain folder name: letters, digits, _ . -) -> dict of "
                      "train.py keys")}
    for key, (ok, want) in first.items():
        if not ok:
            raise ValueError(f"study file {path}: {key} must be {want}")
    for arm in study["arms"]:  # each arm is a folder of runs_dir
        if not plain(arm):
            raise ValueError(f"study file {path}: arm name {arm!r} is not a plain folder name (letters, digits, "
                             f"_ . -; not starting with . or -); rename the arm")
    owner = os.path.join(ROOT, "studies", study["name"] + ".py")  # results/<name>/ is that study's
    if os.path.isfile(owner) and not filecmp.cmp(owner, path, shallow=False):  # itself, or a copy as it is
        raise ValueError(f"study file {path}: its name {study['name']!r} is the study {os.path.relpath(owner)}'s "
                         f"(taken over from it by an import or a copy?), whose report and runs are in "
                         f"results/{study['name']}/; set name = '...' to a name of this study's own")
    if not os.path.isfile(study["config"]):
        where = ("" if os.path.isabs(study["config"]) or os.path.samefile(os.getcwd(), ROOT) else
                 f" (a relative path in a study file is read from the folder you run in, {os.getcwd()}; "
                 f"run from the repository root, {ROOT})")
        raise FileNotFoundError(f"study file {path}: its config file {study['config']} not found"
                                f"{close_match(study['config'])}{where}")
    study["own_runs_dir"] = os.path.join("results", study["name"], "runs")  # the default
    study["runs_dir"] = study["runs_dir"] or study["own_runs_dir"]
    study["shared_runs_dir"] = study["runs_dir"]  # its full-length runs, even under --quick (time estimates)
    if quick is not None:
        if not (isinstance(quick, (int, float)) and 0 < quick <= 1):
            raise ValueError(f"--quick {quick}: the fraction of the study's steps must be in (0, 1], "
                             f"e.g. 0.05")
        study["quick"] = quick
        study["runs_dir"] = os.path.join(QUICK_DIR, study["name"], "runs")
    if os.path.exists(study["runs_dir"]) and not os.path.isdir(study["runs_dir"]):
        raise ValueError(f"study file {path}: runs_dir {study['runs_dir']} is a file; choose a folder")
    parts = os.path.relpath(os.path.abspath(study["runs_dir"])).split(os.sep)
    if parts[0] == "results" and (len(parts) == 1 or parts[1] != study["name"] and parts[2:] != ["runs"]):
        # results/<other>/runs itself is how studies share runs (check_shared_runs); anything else in
        # results/<other>/ would put runs inside another study's committed report folder
        other = parts[1] if len(parts) > 1 else "<name>"
        raise ValueError(f"study file {path}: runs_dir {study['runs_dir']} is inside results/{other}/, another "
                         f"study's report folder; leave runs_dir out (the default is {study['own_runs_dir']}), or "
                         f"share that study's runs with runs_dir = {os.path.join('results', other, 'runs')!r}")
    number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
    distinct = lambda xs: isinstance(xs, list) and xs and all(map(number, xs)) and len(set(xs)) == len(xs)
    ints = lambda xs: distinct(xs) and all(type(x) is int for x in xs)
    # a grid: positive numbers, each once to 6 significant digits (the run folders' names)
    rate_ok = lambda lr: number(lr) and lr > 0 and math.isfinite(lr)
    grid_ok = lambda g: distinct(g) and all(map(rate_ok, g)) and len({f"{lr:g}" for lr in g}) == len(g)
    n_seeds = len(study["seeds"]) if ints(study["seeds"]) else 0  # (a bad seeds is named by its own check)
    lrs = study["learning_rates"]  # one grid for every arm (the fair default), or a dict arm -> grid
    arms = study["arms"]
    grids = lrs if isinstance(lrs, dict) else {arm: lrs for arm in arms}
    unmatched = (f" (the dict's arms {sorted(grids)}, the study's {sorted(arms)})"
                 if isinstance(lrs, dict) and set(grids) != set(arms) else "")
    bad = [lr for g in grids.values() for lr in (g if isinstance(g, list) else [g]) if not rate_ok(lr)]
    unmatched += f" (not a positive finite number: {bad[0]!r})" if bad else ""
    single = [g for g in grids.values() if rate_ok(g)]
    unmatched += f" (one rate is a list too: [{single[0]!r}])" if single else ""
    checks = {"learning_rates": (set(grids) == set(arms) and all(grid_ok(g) for g in grids.values()),
                                 "a non-empty list of positive numbers, each once (to 6 significant digits), "
                                 f"or a dict arm -> such a list for every arm{unmatched}"),
              "selection_seeds": (ints(study["selection_seeds"]) or study["selection_seeds"] == []
                                  and all(isinstance(g, list) and len(g) == 1 for g in grids.values()),
                                  "a non-empty list of ints, each once (empty only with a single learning "
                                  "rate per arm)"),
              "seeds": (ints(study["seeds"]), "a non-empty list of ints, each once"),
              "reference": (isinstance(study["reference"], str) and study["reference"] in arms,
                            f"the name of one of the arms ({', '.join(arms)}), got {study['reference']!r}"),
              "seeds_per_arm": (isinstance(study["seeds_per_arm"], dict) and all(
                  a in study["arms"] and isinstance(n, int) and 1 <= n <= n_seeds
                  for a, n in study["seeds_per_arm"].items()), f"a dict arm -> 1..{n_seeds}"),
              "max_extensions": (type(study["max_extensions"]) is int and study["max_extensions"] >= 0,
                                 "an int >= 0"),
              "half_steps": (isinstance(study["half_steps"], bool), "True or False"),
              "slurm": (isinstance(study["slurm"], dict) and set(study["slurm"]) <= set(SLURM_KEYS),
                        f"a dict with some of the keys {', '.join(SLURM_KEYS)} (sweep.py --executor slurm)"),
              "precision": (study["precision"] is None or number(study["precision"])
                            and 0 < study["precision"] < 1,
                            "None or the 95% CI half-width the final seeds aim for, a fraction of the "
                            f"reference arm's mean final loss in (0, 1), e.g. 0.003 for 0.3%; got "
                            f"{study['precision']!r} ({type(study['precision']).__name__})"),
              "contrasts": (isinstance(study["contrasts"], list) and all(
                  isinstance(c, tuple) and len(c) == 3 and all(isinstance(x, str) for x in c)
                  and c[0] in arms and c[1] in arms and c[0] != c[1] for c in study["contrasts"]),
                            'a list of (arm, other arm, "what the pair isolates") tuples of two different '
                            'arms of this study')}
    named = [x for c in study["contrasts"] if isinstance(c, tuple) for x in c[:2] if isinstance(x, str)] \
        if isinstance(study["contrasts"], list) else []
    if any(x not in arms for x in named):
        raise ValueError(f"study file {path}: contrasts name {sorted({x for x in named if x not in arms})}, which "
                         f"are not arms of this study; its arms: {', '.join(arms)}")
    per_arm = study["seeds_per_arm"]
    strangers = [a for a in per_arm if a not in arms] if isinstance(per_arm, dict) else []
    if strangers:
        raise ValueError(f"study file {path}: seeds_per_arm names {strangers}, which are not arms of this "
                         f"study (a study that imports another inherits its seeds_per_arm: set "
                         f"seeds_per_arm = {{}})")
    for key, (ok, want) in checks.items():
        if not ok:
            raise ValueError(f"study file {path}: {key} must be {want}")
    places = [("overrides", study["overrides"])] + [(f"arm {arm}", keys) for arm, keys in arms.items()]
    for where, keys in places:
        for key, value in keys.items():  # typed as in a config file: '2' for an int is refused there too
            if key in DEFAULTS and key not in PER_RUN:
                try:
                    check_value(key, value)
                except ValueError as e:
                    raise ValueError(f"study file {path}: {where}: {e}") from None
        clash = [k for k in PER_RUN if k in keys and not (k == "min_lr" and where != "overrides")]
        if clash:
            raise ValueError(f"study file {path}: {where} sets {clash[0]}, which sweep.py sets for every run "
                             f"(it would be ignored); set it with {PER_RUN[clash[0]]}")
        if keys.get("init_from") == "resume":  # every new run would fail: there is nothing to resume yet
            raise ValueError(f"study file {path}: {where} sets init_from='resume'; leave it out: sweep.py "
                             f"resumes each run that has a checkpoint by itself")
        if keys.get("init_from", "scratch") != "scratch":  # GPT-2's shape would replace the study's model keys
            raise ValueError(f"study file {path}: {where} sets init_from={keys['init_from']!r}; a study's runs "
                             f"train from scratch (a GPT-2's weights replace its model settings, so its runs "
                             f"could never match the study's); fine-tune with train.py --init_from")
    single = [arm for arm, grid in grids.items() if len(grid) == 1]
    if study["selection_seeds"] and single:  # nothing to choose between, and no grid step to extend by
        raise ValueError(f"study file {path}: arm {single[0]} has one learning rate ({grids[single[0]][0]:g}) but "
                         f"selection_seeds are set: a search needs a grid of two or more rates (its step is "
                         f"the step of the extensions at an edge); give more rates, or selection_seeds = [] to "
                         f"run the given rate on the final seeds without a search")
    overlap = set(study["selection_seeds"]) & set(study["seeds"])
    if overlap:
        raise ValueError(f"study file {path}: seeds {sorted(overlap)} are both selection and final seeds; "
                         "the final statistics must not use the seeds the learning rate was chosen on")
    study["grids"] = {arm: sorted(grid) for arm, grid in grids.items()}
    # resolve every arm now: a typo or a bad value fails here, not hours into the sweep
    data, budget = {}, {}  # arm -> the dataset folder its runs read; arm -> its training tokens and eval set
    experiments = {}  # what an arm's runs are, apart from their folder: two arms must not be one experiment
    for arm in study["arms"]:  # its lowest rate: where an arm's fixed min_lr could exceed the rate
        try:
            cfg = run_config(study, arm, study["grids"][arm][0], study["seeds"][0])
        except ValueError as e:
            raise ValueError(f"study file {path}: arm {arm} at learning rate {study['grids'][arm][0]:g}: "
                             f"{e}") from None
        unused = set()
        same = json.dumps([study["grids"][arm],  # the model as built (aliases resolved), the settings it reads
                           {k: v for k, v in vars(model_config(cfg)).items() if k not in unused},
                           {k: v for k, v in cfg.items()
                            if k not in NOT_RESULTS | unused | {"out_dir", "query_mode"}}],
                          sort_keys=True, default=str)
        if same in experiments:
            other, other_cfg = experiments[same]
            differ = sorted(k for k in unused if cfg[k] != other_cfg[k])
            raise ValueError(f"study file {path}: arms {other} and {arm} are the same experiment "
                             f"(the same model, settings and learning rates: their runs would be the same runs "
                             f"twice, two names for one arm)"
                             + (f"; they differ only in {', '.join(differ)}, which query_mode={cfg['query_mode']} "
                                f"does not read" if differ else "") + "; drop one, or make them differ")
        experiments[same] = arm, cfg
        data[arm] = os.path.join(cfg["data_dir"], cfg["dataset"])
        step = cfg["batch_size"] * cfg["gradient_accumulation_steps"] * cfg["block_size"]  # tokens per step
        budget[arm] = dict(max_iters=cfg["max_iters"], block_size=cfg["block_size"], tokens_per_step=step,
                           eval_windows=cfg["eval_windows"], eval_interval=cfg["eval_interval"],
                           eval_full_at_end=cfg["eval_full_at_end"])
    first = next(iter(budget))
    if budget[first]["max_iters"] < 1:  # every rate would tie at the untrained loss, and be reported
        raise ValueError(f"study file {path}: max_iters={budget[first]['max_iters']}: its runs would not train "
                         f"(every learning rate ties at the untrained model's loss); give max_iters >= 1")
    differ = [k for k in budget[first] if any(b[k] != budget[first][k] for b in budget.values())]
    if differ:  # paired by seed and step, the arms must train on as many tokens and be evaluated alike
        raise ValueError(f"study file {path}: its arms differ in {differ[0]} ("
                         + ", ".join(f"{arm}: {b[differ[0]]}" for arm, b in budget.items()) + "); the arms of a "
                         "study get the same training tokens and eval set (max_iters, batch_size x "
                         "gradient_accumulation_steps x block_size, eval_windows, eval_interval): "
                         "set them in its config or overrides, not per arm")
    if len(set(data.values())) > 1:  # paired by seed, the arms must see the same tokens
        raise ValueError(f"study file {path}: its arms read different data ("
                         + ", ".join(f"{arm}: {d}" for arm, d in data.items()) + "); the arms of a study are "
                         "compared on one dataset, seed by seed: set data_dir and dataset in its config or "
                         "overrides, not per arm, and give each dataset a study of its own")
    check_shared_runs(study, path)  # and every run already in its folder, before anything starts
    return study


def run_dir(study, arm, lr, seed):
    return os.path.join(study["runs_dir"], arm, f"lr{lr:g}_seed{seed}")


def run_args(study, arm, lr, seed):
    """The train.py arguments of one run: config file, then shared overrides, min_lr = lr / 10, the arm's
    keys, then lr, seed and out_dir (and, for a --quick study, its shortened schedule: quick_keys)."""
    min_lr = float(f"{lr / 10:.6g}")  # 0.0003, not 0.00030000000000000003
    overrides = {**study["overrides"], "min_lr": min_lr, **study["arms"][arm], "learning_rate": lr,
                 "seed": seed, "out_dir": run_dir(study, arm, lr, seed)}
    args = [study["config"]] + [f"--{k}={v}" for k, v in overrides.items()]
    if study.get("quick"):
        args += [f"--{k}={v}" for k, v in quick_keys(parse_config(args), study["quick"]).items()]
    return args


# --quick: any study at a fraction of its steps, in a scratch folder, to try the machinery (not to compare).
QUICK_DIR = os.path.join("out", "quick")
QUICK_FRACTION = 0.05


def quick_option(fraction):
    """The --quick option as a command line gives it: '' (None), ' --quick' (the default fraction) or
    ' --quick 0.1'."""
    return "" if not fraction else " --quick" if fraction == QUICK_FRACTION else f" --quick {fraction:g}"


# the step counts quick_keys scales: runs that differ from a --quick study only in these are another fraction's
QUICK_STEP_KEYS = ("max_iters", "warmup_iters", "eval_interval", "eval_windows", "lr_decay_iters")


def quick_keys(cfg, fraction):
    """The settings that shorten a run to fraction of its steps: max_iters, and with it the warmup, the decay
    and the eval interval, so the run keeps its shape (warmup, decay, evals) in fewer steps; the evals shrink
    alike (eval_windows: fewer windows). The whole-split eval is skipped (on the CPU study it took 4 of a quick
    run's 5 minutes), so a quick run's final loss is its last fixed-window val loss."""
    scale = lambda n: max(1, round(n * fraction))
    keys = dict(max_iters=scale(cfg["max_iters"]), warmup_iters=round(cfg["warmup_iters"] * fraction),
                eval_interval=scale(cfg["eval_interval"]), eval_windows=scale(cfg["eval_windows"]),
                eval_full_at_end=False)
    if cfg["lr_decay_iters"] is not None:
        keys["lr_decay_iters"] = scale(cfg["lr_decay_iters"])
    return keys


def close_match(path):
    """', did you mean X?' for the existing .py file in path's folder whose name is closest to path's, or ''."""
    folder = os.path.dirname(path) or "."
    stems = sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py")) if os.path.isdir(folder) else []
    # by the names without .py, which would make any two short names look alike (nope.py, imp.py)
    match = difflib.get_close_matches(os.path.splitext(os.path.basename(path))[0], stems, n=1)
    return f", did you mean {os.path.join(os.path.dirname(path), match[0] + '.py')}?" if match else ""


def run_config(study, arm, lr, seed):
    return parse_config(run_args(study, arm, lr, seed))


def final_seeds(study, arm):
    """The final seeds an arm runs: the first seeds_per_arm[arm] of seeds (all by default)."""
    return study["seeds"][:study["seeds_per_arm"].get(arm, len(study["seeds"]))]


def torchrun_command(study, arm, lr, seed, nproc):
    """The torchrun line of one run on nproc processes, with the same global batch and the same windows.

    gradient_accumulation_steps must divide among the processes; if it does not, the micro-batch is split
    instead (batch_size / nproc, accumulation x nproc): train.py draws the step's windows as one flat
    sequence, so the runs see the same data. ValueError if neither divides.
    """
    args = nproc_run_args(study, arm, lr, seed, nproc)
    return f"torchrun --standalone --nproc_per_node={nproc} train.py " + shlex.join(args)  # pasteable


def nproc_run_args(study, arm, lr, seed, nproc):
    """run_args for a run on nproc processes (see torchrun_command). ValueError if the batch cannot be shared."""
    args, cfg = run_args(study, arm, lr, seed), run_config(study, arm, lr, seed)
    accum, batch = cfg["gradient_accumulation_steps"], cfg["batch_size"]
    if accum % nproc:
        if batch % nproc:
            raise ValueError(f"neither gradient_accumulation_steps={accum} nor batch_size={batch} divides "
                             f"among {nproc} processes; pick another --print count (or --gpus_per_run)")
        args += [f"--batch_size={batch // nproc}", f"--gradient_accumulation_steps={accum * nproc}"]
    return args


def read_saved_config(path):
    """A run's config.json as a dict, or None if there is none; ValueError if it is not a JSON object."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            saved = json.load(f)
    except ValueError as e:
        saved = e
    if not isinstance(saved, dict):
        raise ValueError(f"{path} is damaged (not a JSON object of settings); restore it from a copy, or "
                         f"delete its run folder to run the run again")
    return upgrade(saved)


CODE_CHANGED = "non-embedding parameters"  # settings_diff's key for a model that model.py builds otherwise now


def settings_diff(study, arm, lr, seed):
    """{key: (saved, study)} for the settings in which the run dir's saved config differs from what the study
    asks now, where the weights started included (initialised_from vs init_from); {} if they agree or there
    is no run yet. A key added to nlq after the run was made counts as its default (committed runs stay
    valid); out_dir is where the run was made, not what it is (runs copied to another clone or folder stay
    valid), and a step split into other micro-batches (more processes) is the same run."""
    out_dir = run_dir(study, arm, lr, seed)
    saved = read_saved_config(os.path.join(out_dir, "config.json"))
    if saved is None:
        if read_metrics(out_dir):  # train.py writes config.json before the first metrics row
            raise ValueError(f"{out_dir} is damaged: it has metrics.jsonl but no config.json, so its settings "
                             f"cannot be checked; restore config.json from a copy, or delete the run folder to "
                             f"run the run again")
        return {}
    saved, wanted = upgrade(saved), run_config(study, arm, lr, seed)
    named = lambda k, v: QUERY_MODE_ALIASES.get(v, v) if k == "query_mode" else v  # 'original' is linear
    diff = {k: (saved.get(k, DEFAULTS[k]), v) for k, v in wanted.items()
            if k not in NOT_EXPERIMENT and k != "out_dir" and named(k, saved.get(k, DEFAULTS[k])) != named(k, v)}
    step = lambda c: c["batch_size"] * c["gradient_accumulation_steps"]  # sequences a step
    if step(saved) == step(wanted):  # the same step split into other micro-batches (more processes): one run
        diff = {k: v for k, v in diff.items() if k not in ("batch_size", "gradient_accumulation_steps")}
    origin = saved.get("initialised_from")  # init_from says 'resume' once a run resumed; this keeps the start
    if origin is not None and origin != wanted["init_from"]:
        diff["initialised_from"] = (origin, wanted["init_from"])
    # the same settings, another model: model.py changed since the run was made (runs made before nlq saved
    # its counts are not checked)
    counts = saved.get("param_counts")
    if counts is not None and not (isinstance(counts, dict) and type(counts.get("non_embedding")) is int):
        raise ValueError(f"{out_dir} is damaged: its config.json's param_counts is {counts!r}, not train.py's "
                         f"counts; restore config.json from a copy, or delete the run folder to run the run again")
    now = param_counts(model_config(wanted))["non_embedding"]
    if counts is not None and counts["non_embedding"] != now:
        diff[CODE_CHANGED] = (counts["non_embedding"], now)
    return diff


def other_quick_fraction(study, diffs):
    """The --quick fraction that runs whose settings differ from a --quick study's (diffs: their settings_diff
    dicts) look made at, when only quick_keys' step counts differ and all point to one fraction; else None."""
    if not diffs or not all("max_iters" in d and set(d) <= set(QUICK_STEP_KEYS) for d in diffs):
        return None
    fractions = {float(f"{study['quick'] * d['max_iters'][0] / d['max_iters'][1]:.2g}") for d in diffs}
    return fractions.pop() if len(fractions) == 1 else None


def clash_fix(study, diffs=()):
    """What to do when a study's runs folder holds other experiments (diffs: their settings_diff dicts): never
    delete runs someone made."""
    code = ("" if not any(CODE_CHANGED in d for d in diffs) else
            "the settings are the study's, but this clone's model.py builds another model from them: it changed "
            "since the runs were made (each run's config.json names its commit under 'code'). Restore that "
            "model.py, or give the changed query mode's arm a new name (new runs), or ")
    if study.get("quick"):
        other = other_quick_fraction(study, diffs)
        reuse = (f"only their step counts differ, as in runs of --quick {other:.2g}: run with that fraction to use "
                 f"them, or " if other else "")
        return (f"{code}{study['runs_dir']} is scratch space for --quick (nothing committed is there): {reuse}"
                f"delete it and run again")
    own = ("set runs_dir to a new folder" if study["runs_dir"] == study["own_runs_dir"] else
           f"leave out runs_dir (the default is {study['own_runs_dir']}) or set runs_dir to a new folder")
    return (f"{code}give this study its own runs folder: {own}. Share a runs_dir only between "
            f"studies whose arms are the same experiments (same config, overrides and arm settings); to try a "
            f"study at fewer steps, use python sweep.py STUDY --quick")


def check_settings(study, arm, lr, seed):
    """ValueError if the run dir already holds a run whose saved config differs from what the study asks now
    (e.g. the study file was edited): its results would be silently reused."""
    diff = settings_diff(study, arm, lr, seed)
    if diff:
        raise ValueError(f"{run_dir(study, arm, lr, seed)} holds a run with other settings (saved, study): "
                         f"{diff}; {clash_fix(study, [diff])}")


RUN_NAME = re.compile(r"lr(.+)_seed(-?\d+)")


def existing_runs(study):
    """[(arm, lr, seed)] of every run folder of the study's arms in its runs_dir, at any learning rate and
    seed (also runs another study sharing the folder made), in folder order."""
    runs = []
    for arm in study["arms"]:
        folder = os.path.join(study["runs_dir"], arm)
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            match = RUN_NAME.fullmatch(name)
            if match and os.path.isdir(os.path.join(folder, name)):
                runs.append((arm, float(match.group(1)), int(match.group(2))))
    return runs


def data_of_runs(study):
    """{dataset name: {contents: (its meta.json as the runs recorded it, [run folders])}} for the runs already
    in the study's runs_dir that recorded their data (config.json's dataset_meta); contents = the bins'
    sha256, so two entries under one name are two different datasets."""
    found = {}
    for run in existing_runs(study):
        saved = read_saved_config(os.path.join(run_dir(study, *run), "config.json")) or {}
        meta = saved.get("dataset_meta") or {}
        if meta.get("sha256"):
            contents = json.dumps(meta["sha256"], sort_keys=True)
            entry = found.setdefault(saved.get("dataset"), {}).setdefault(contents, (meta, []))
            entry[1].append(run_dir(study, *run))
    return found


def describe_data(meta, runs=None):
    """'<n runs on >the data prepared from SOURCE (train.bin sha256 abcdef123456…)', for messages."""
    sha = (meta.get("sha256") or {}).get("train.bin", "?")
    who = f"{len(runs)} run(s) on " if runs is not None else ""
    return f"{who}the data prepared from {meta.get('source', '?')} (train.bin sha256 {sha[:12]}…)"


def check_shared_runs(study, path):
    """ValueError, before anything runs, if any run folder of the study's arms in its runs_dir (also one made
    by another study that shares the folder, at any learning rate and seed) holds a run with other settings
    than this study would give it: the study would read another experiment's results as its own. Names how
    many, the first few with their differences, and a fix that deletes nothing."""
    clashes, diffs = [], []
    for arm, lr, seed in existing_runs(study):
        diff = settings_diff(study, arm, lr, seed)
        if diff:
            diffs.append(diff)
            clashes.append(f"{run_dir(study, arm, lr, seed)}: " + ", ".join(
                f"{k} {saved!r} (study: {wanted!r})" for k, (saved, wanted) in diff.items()))
    for name, contents in data_of_runs(study).items():  # one dataset name, two datasets: not comparable
        if len(contents) > 1:
            clashes.append(f"the runs read {name!r} as different data: " + "; ".join(
                f"{describe_data(meta, runs)}, e.g. {runs[0]}" for meta, runs in contents.values()))
    if clashes:
        shown = "\n  ".join(clashes[:3]) + (f"\n  ... and {len(clashes) - 3} more"
                                            if len(clashes) > 3 else "")
        raise ValueError(f"study file {path}: {len(clashes)} run folder(s) in {study['runs_dir']} hold runs "
                         f"made with other settings than this study's, which it would take as its own:\n  "
                         f"{shown}\nTo fix it, {clash_fix(study, diffs)}.")


# ----------------------------------------------------------------------------------------------- the runs
def final_row(out_dir):
    """The last row of out_dir/metrics.jsonl, or None."""
    rows = read_metrics(out_dir)
    return rows[-1] if rows else None


def is_diverged(row):
    """A metrics row written by a run that train.py stopped because its loss went NaN/inf."""
    return bool(row and row.get("diverged"))


def final_val_loss(row):
    """The comparison figure of a finished run's last row: val_loss_full (every val token once) where the run
    has it, else val_loss on the fixed windows; None for a diverged run or a non-finite loss."""
    if row is None or is_diverged(row):
        return None
    loss = row.get("val_loss_full", row.get("val_loss"))
    return loss if loss is not None and math.isfinite(loss) else None


def is_finished(study, arm, lr, seed):
    """True for a run that reached max_iters, or that diverged (a final state: rerunning gives the same)."""
    row = final_row(run_dir(study, arm, lr, seed))
    return row is not None and (is_diverged(row)
                                or row["iter"] >= run_config(study, arm, lr, seed)["max_iters"])


def selection_loss(study, arm, lr):
    """Mean final loss over the selection seeds; inf if any diverged; None while any is unfinished."""
    losses = []
    for seed in study["selection_seeds"]:
        if not is_finished(study, arm, lr, seed):
            return None
        loss = final_val_loss(final_row(run_dir(study, arm, lr, seed)))
        losses.append(math.inf if loss is None else loss)
    return sum(losses) / len(losses)


def pick_best_lr(losses):
    """{lr: loss, or None/inf/nan (unfinished or diverged)} -> the lr with the lowest finite loss (the smaller
    lr on a tie), or None if there is none. The one best-learning-rate rule of sweep.py and report.py."""
    done = {lr: loss for lr, loss in losses.items() if loss is not None and math.isfinite(loss)}
    return min(done, key=lambda lr: (done[lr], lr)) if done else None


def round_lr(lr):
    """Learning rates made by extension or half steps, to 3 significant digits (readable run names)."""
    return float(f"{lr:.3g}")


def plan(study, arm):
    """Where an arm's learning-rate search stands, replayed from the finished runs (deterministic).

    Returns dict(due=[(arm, lr, seed), ...] runs to run next, swept=[lrs], chosen=lr or None,
    notes=[str], losses={lr: selection loss}). chosen is set once the search is complete; due then lists the
    unfinished final runs. If every swept rate diverged, chosen stays None and a note says so.
    """
    sel = study["selection_seeds"]
    swept, notes = list(study["grids"][arm]), []
    if not sel:  # one given learning rate, nothing to choose: straight to the final seeds
        chosen = swept[0]
        due = [(arm, chosen, s) for s in final_seeds(study, arm) if not is_finished(study, arm, chosen, s)]
        return dict(due=due, swept=swept, chosen=chosen, notes=["learning rate given, not searched"],
                    losses={})
    runs = lambda lrs: [(arm, lr, s) for lr in lrs for s in sel if not is_finished(study, arm, lr, s)]
    out = lambda due, chosen=None: dict(due=due, swept=sorted(swept), chosen=chosen, notes=notes,
                                        losses={lr: selection_loss(study, arm, lr) for lr in sorted(swept)})
    if runs(swept):
        return out(runs(swept))
    ratio = swept[1] / swept[0]  # the base grid's step (a search has two rates or more: load_study)
    extensions = 0
    while True:  # (2) extend while the best is the smallest or the largest rate swept
        best = pick_best_lr({lr: selection_loss(study, arm, lr) for lr in swept})
        if best is None:
            notes.append("every swept learning rate diverged")
            return out([])
        lo, hi = min(swept), max(swept)
        if best not in (lo, hi):
            break
        if extensions == study["max_extensions"]:
            notes.append(f"best rate {best:g} is still at the edge after {extensions} extensions")
            break
        new = round_lr(best / ratio if best == lo else best * ratio)
        notes.append(f"best rate {best:g} was at the {'lower' if best == lo else 'upper'} edge: "
                     f"added {new:g}")
        swept.append(new)
        extensions += 1
        if runs([new]):
            return out(runs([new]))
    best = pick_best_lr({lr: selection_loss(study, arm, lr) for lr in swept})
    if study["half_steps"]:  # (3) half steps around the best
        halves = [h for h in (round_lr(best / math.sqrt(2)), round_lr(best * math.sqrt(2))) if h not in swept]
        swept += halves
        if runs(halves):
            return out(runs(halves))
        best = pick_best_lr({lr: selection_loss(study, arm, lr) for lr in swept})
    due = [(arm, best, s) for s in final_seeds(study, arm) if not is_finished(study, arm, best, s)]
    return out(due, chosen=best)


# ------------------------------------------------------------------------------------------------ running
# The train.py processes the local sweep has started and that still run, and whether a stop signal came: a
# SIGTERM to the sweep (kill PID, a job's end) is passed on to them, and no run starts after it.
RUNNING = set()
STOPPING = threading.Event()
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
STOPPED_BY = []  # the name of the first stop signal the sweep got
PRINTING = threading.Lock()


def say(line):
    """Print line whole and at once: the runs of --jobs N report from N threads, and print's two writes (the
    text, then its newline) from two threads could glue two lines together."""
    with PRINTING:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class SweepStopped(RuntimeError):
    """A stop signal ended the sweep; exit_code is train.py's for the same signal (130 Ctrl-C, 144 others)."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


def stop_runs(signum, frame=None):
    """Signal handler of the local sweep: send SIGTERM (one of train.py's stop signals, whichever signal the
    sweep got) to every running train.py, which checkpoints at its next step boundary and exits with
    EXIT_PREEMPTED, and start no more runs. SIGINT too: a Ctrl-C in the terminal reaches the runs by itself
    (they stop at once, EXIT_INTERRUPTED), but `kill -INT PID` reaches the sweep alone, which would otherwise
    wait for runs that go on for hours."""
    if not STOPPING.is_set():
        STOPPED_BY.append(signal.Signals(signum).name)
    STOPPING.set()
    for proc in list(RUNNING):
        proc.send_signal(signal.SIGTERM)


def launch(study, arm, lr, seed, threads, progress=""):
    """Run (or resume) one training run as a subprocess; its log goes to out_dir/train.log.

    Returns None when the run finished or diverged (both recorded in its metrics.jsonl), else a line saying
    that it failed (also when train.py ended without an error but the log does not reach max_iters), was
    interrupted or stopped (it resumes when the sweep runs again), or was not started because the sweep is
    stopping, and where its log is: one failed run never stops the others. progress: shown in its
    'running:' line (e.g. '3 of 12 due now').
    """
    if STOPPING.is_set():
        return f"{run_dir(study, arm, lr, seed)} was not started: the sweep was stopped"
    check_settings(study, arm, lr, seed)
    if is_finished(study, arm, lr, seed):
        say(f"done already: {arm} lr={lr:g} seed={seed}")
        return None
    out_dir = run_dir(study, arm, lr, seed)
    try:  # again before each run: the dataset may have been prepared again since the sweep started
        check_data(study)
    except (FileNotFoundError, ValueError) as e:
        say(f"not started: {arm} lr={lr:g} seed={seed}: {e}")
        return f"{out_dir} was not started: {e}"
    if is_locked(os.path.join(out_dir, ".lock")):  # e.g. left running by a sweep killed with SIGKILL
        say(f"busy: {arm} lr={lr:g} seed={seed}: another train.py is training it; not started")
        return (f"{out_dir} is being trained by another train.py (it holds {out_dir}/.lock; a run left by a "
                f"killed sweep?): run the sweep again once it has ended")
    os.makedirs(out_dir, exist_ok=True)
    args = run_args(study, arm, lr, seed)
    if os.path.exists(os.path.join(out_dir, "ckpt.pt")):
        args.append("--init_from=resume")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    where = f" ({progress})" if progress else ""
    say(f"running{where}: {arm} lr={lr:g} seed={seed} -> {out_dir}")
    log_path = os.path.join(out_dir, "train.log")
    with open(log_path, "a") as log:
        proc = subprocess.Popen([sys.executable, TRAIN_PY, *args], stdout=log, stderr=subprocess.STDOUT, env=env)
        RUNNING.add(proc)
        if STOPPING.is_set():  # the signal came while it was being started
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait()
        finally:
            RUNNING.discard(proc)
    stopped = code in (EXIT_INTERRUPTED, -signal.SIGINT, EXIT_PREEMPTED, -signal.SIGTERM)
    if code == EXIT_DIVERGED and is_diverged(final_row(out_dir)):
        say(f"diverged: {arm} lr={lr:g} seed={seed} (recorded; the sweep goes on)")
    elif stopped and not is_finished(study, arm, lr, seed):  # (a signal as the run ended: finished, below)
        # Ctrl-C (EXIT_INTERRUPTED) or a stop signal (EXIT_PREEMPTED); -2 and -15: during start-up
        word, how = (("interrupted", "interrupted (Ctrl-C)") if code in (EXIT_INTERRUPTED, -signal.SIGINT)
                     else ("stopped", "stopped by a signal"))
        then = ("it resumes from its last checkpoint" if os.path.exists(os.path.join(out_dir, "ckpt.pt"))
                else "it had no checkpoint yet, so it starts again")
        say(f"{word}: {arm} lr={lr:g} seed={seed} ({then} when the sweep runs again)")
        return f"{out_dir} was {how}; {then} when the sweep runs again"
    elif code != 0 and not stopped:
        say(f"FAILED: {arm} lr={lr:g} seed={seed} (exit code {code}); see {log_path}")
        return f"{out_dir} failed (exit code {code}); see {log_path}"
    elif not is_finished(study, arm, lr, seed):  # else it would be launched again and again
        row = final_row(out_dir)
        say(f"FAILED: {arm} lr={lr:g} seed={seed} (ended without an error before max_iters)")
        return (f"{out_dir} ended before max_iters without an error: its metrics.jsonl ends at iter "
                f"{row and row['iter']} (rows lost?); delete the folder to run it again, see {log_path}")
    else:
        row = final_row(out_dir)
        loss = final_val_loss(row)
        say(f"finished: {arm} lr={lr:g} seed={seed}: val loss {'—' if loss is None else f'{loss:.4f}'}"
            + (f" in {row['elapsed_s'] / 60:.1f} min" if row.get("elapsed_s") else ""))
    return None


def due_runs(study):
    """Every run that is due now, over all arms (arms advance through their phases independently), seed by
    seed: every arm and rate at one seed before the next seed, so a study stopped half-way has whole curves
    on its first seeds rather than every seed of its first arms."""
    due = [run for arm in study["arms"] for run in plan(study, arm)["due"]]
    seeds = study["selection_seeds"] + study["seeds"]
    return sorted(due, key=lambda run: seeds.index(run[2]))  # stable: arms and rates keep their order


class OtherData(ValueError):
    """The prepared dataset is not the one the runs already in a study's runs folder were trained on. now,
    then: describe_data of the prepared data and of the runs' (for a short --dry_run line)."""

    def __init__(self, message, now, then):
        super().__init__(message)
        self.now, self.then = now, then


def check_data(study):
    """FileNotFoundError / ValueError before any run starts if a dataset the study's runs read is missing,
    damaged or too short for their block_size (else every run would fail, the cause only in its train.log),
    or is not the data the runs already in its runs folder were trained on (data_of_runs). Returns the
    datasets' folders."""
    folders, made_on = [], data_of_runs(study)
    for arm in study["arms"]:
        cfg = run_config(study, arm, study["grids"][arm][0], study["seeds"][0])
        folder = os.path.join(cfg["data_dir"], cfg["dataset"])
        try:
            meta = load_meta(folder)
            for split in ("train", "val"):  # what train.py opens first
                open_split(folder, split, meta, cfg["block_size"])
        except (FileNotFoundError, ValueError) as e:
            raise type(e)(f"the study's runs read the dataset {folder} (arm {arm}): {e}; the study file's or "
                          f"its config's comment shows the command that prepares it") from None
        for saved, runs in made_on.get(cfg["dataset"], {}).values():
            if saved["sha256"] != meta.get("sha256"):  # new runs would be compared with runs on other data
                prepared, held = describe_data(meta), describe_data(saved, runs)
                raise OtherData(
                    f"the dataset {folder} is {prepared}, but {study['runs_dir']} holds {held} (its arms' runs "
                    f"at any rate and seed, other studies' "
                    f"in a shared folder included), e.g. {runs[0]}; their results and new ones would be "
                    f"compared as if on one dataset. Prepare it again as they were (their config.json's "
                    f"dataset_meta: source, tokenizer, val_fraction, seed), or {clash_fix(study)}",
                    f"{folder}: {prepared}", f"{study['runs_dir']}: {held}")
        folders.append(folder)
    return sorted(set(folders))


def device_problem(study):
    """None if this machine has the device (and dtype) the study's runs ask for, else 'arm ARM: why'."""
    for arm in study["arms"]:
        try:
            resolve_device(run_config(study, arm, study["grids"][arm][0], study["seeds"][0]))
        except ValueError as e:
            return f"arm {arm}: {e}"
    return None


def device_status(study):
    """[] if this machine has the device the study's runs ask for, else one line for --dry_run saying so (a
    cluster study is planned on a login node: its runs need the nodes' GPUs, not this machine's)."""
    problem = device_problem(study)
    return [f"device: not here ({problem}): run the sweep where the runs' device is, e.g. with --executor slurm "
            f"on a cluster's nodes; a local sweep here would fail those runs"] if problem else []


def data_status(study, complete=False):
    """One line for --dry_run: the datasets the runs read are prepared, or what check_data would stop on
    (complete: the study has nothing left to run, so only a --quick try would need them)."""
    try:
        folders = check_data(study)
        trial = [f for f in folders if "tests/data/" in load_meta(f).get("source", "").replace(os.sep, "/")]
        return (f"data: {', '.join(folders)} prepared"
                + (f" ({', '.join(trial)}: prepared from a file shipped in tests/data, small: fine for --quick "
                   f"and studies of your own, not the data of the committed studies, docs/studies.md)"
                   if trial else ""))
    except (FileNotFoundError, ValueError) as e:
        if complete and isinstance(e, OtherData):  # --quick runs in a scratch folder of its own
            return (f"data: not the runs' data; the report does not need it, and a --quick try (its own "
                    f"folder) may use it:\n  prepared  {e.now}\n  the runs  {e.then} (this study's, and "
                    f"other studies' sharing the folder)")
        if complete:
            return f"data: not ready (the report does not need it; a --quick try would stop at once): {e}"
        return f"data: not ready, so the sweep would stop at once: {e}"


def run_timing(study):
    """How long the study's runs take, measured on its finished runs: (folder measured, {arm: (seconds per
    training step, seconds per run outside the steps or None)}). The second part (evals, start-up) is
    elapsed_s minus the step times, known only for runs that logged elapsed_s. The folder is the study's
    runs folder, else (a --quick study) its full-length runs, else (a full study) its --quick runs: a quick
    try times the real study. (None, {}) when none has finished."""
    quick_dir = os.path.join(QUICK_DIR, study["name"], "runs")
    folders = [study["runs_dir"], study["shared_runs_dir"] if study.get("quick") else quick_dir]
    for runs_dir in folders:
        measured = {}
        for arm in study["arms"]:
            folder = os.path.join(runs_dir, arm)
            for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
                rows = read_metrics(os.path.join(folder, name)) if RUN_NAME.fullmatch(name) else []
                if not rows or rows[-1]["iter"] == 0 or is_diverged(rows[-1]):
                    continue
                steps = sum((r.get("ms_per_iter") or 0) / 1000 * (r["iter"] - p["iter"])
                            for p, r in zip(rows, rows[1:]))
                if steps <= 0:  # no step times logged: nothing to time it by
                    continue
                elapsed = rows[-1].get("elapsed_s")
                measured.setdefault(arm, []).append((steps, rows[-1]["iter"],
                                                     None if elapsed is None else max(0.0, elapsed - steps)))
        if measured:
            return runs_dir, {arm: (sum(s for s, _, _ in m) / sum(n for _, n, _ in m),
                                    None if any(o is None for *_, o in m) else sum(o for *_, o in m) / len(m))
                              for arm, m in measured.items()}
    return None, {}


def announce(study, due, jobs):
    """The line printed before a sweep starts: how many runs are due now and about how long they take."""
    source, timing = run_timing(study)
    done = lambda run: (final_row(run_dir(study, *run)) or {}).get("iter", 0)  # a run resumes where it was
    steps = {run: run_config(study, *run)["max_iters"] - done(run) for run in due}
    searching = any(plan(study, arm)["chosen"] is None for arm in study["arms"])
    head = f"{len(due)} run(s) due now" + (" (more follow as each arm's search goes on: extensions, half "
                                           "steps, final seeds)" if searching else "")
    if not timing:
        return (f"{head}; time: unknown (no finished run of this study to time yet; a run is "
                f"{max(steps.values(), default=0):,} steps of {study['config']}; once one has finished, "
                f"python sweep.py STUDY --dry_run estimates the whole study from it)")
    evals_known = all(other is not None for _, other in timing.values())
    mean = lambda i: sum(t[i] for t in timing.values()) / len(timing)  # arms not timed yet: the others' mean
    per_run = lambda arm, n: n * timing.get(arm, (mean(0),))[0] + (
        (timing[arm][1] if arm in timing else mean(1)) if evals_known else 0.0)
    wall = sum(per_run(run[0], n) for run, n in steps.items()) / max(1, min(jobs, len(due)))
    speed = sorted(1000 * step for step, _ in timing.values())
    return (f"{head}; about {f'{wall / 3600:.1f} h' if wall >= 3600 else f'{max(1, round(wall / 60))} min'}"
            f"{' for these' if searching else ''} at --jobs {jobs} (the whole study: --dry_run), timed on the "
            f"finished runs in {source} ({speed[0]:.0f}-{speed[-1]:.0f} ms/step by arm"
            + (f", plus {mean(1):.0f} s of evals per run" if evals_known else "; evals not included")
            + ("; quick runs skip the whole-split eval, a full run adds it" if QUICK_DIR in source
               and not study.get("quick") else "") + "; measured when and where those runs were made)")


# ------------------------------------------------------------------------------ the plan and its cost (--dry_run)
# bench.py's one-H200 figures at the paper's shapes (bench/RESULTS.md): what --dry_run counts with by default
DEFAULT_BENCH_JSON = os.path.join(ROOT, "bench", "results", "h200_2026-11-30", "bench_nlq_small.json")


def run_tokens(cfg):
    """Training tokens of one run of a resolved config: max_iters x accumulation x micro-batch x block_size."""
    return cfg["max_iters"] * cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["block_size"]


def arm_run_counts(study, arm):
    """-> (first wave, fewest, most): runs of an arm's whole study. The first wave is the base grid on the
    selection seeds; the fewest adds the half steps and the final seeds (no extension); the most adds
    max_extensions grid steps. With no selection seeds, all three are the final seeds."""
    finals = len(final_seeds(study, arm))
    sel = len(study["selection_seeds"])
    if not sel:
        return finals, finals, finals
    grid, halves = len(study["grids"][arm]), 2 * study["half_steps"]
    return grid * sel, (grid + halves) * sel + finals, (grid + study["max_extensions"] + halves) * sel + finals


def read_tokens_per_s(path):
    """bench.py's --json rows -> {query_mode: tokens/s per GPU}. ValueError if the file is not such a list."""
    try:
        with open(path) as f:
            rows = json.load(f)
        if not isinstance(rows, list) or not rows:
            raise ValueError("not a non-empty list")
        return {r["query_mode"]: float(r["tokens_per_s"]) for r in rows}
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ValueError(f"--bench_json {path}: not bench.py's JSON (a list of rows with query_mode and "
                         f"tokens_per_s): {type(e).__name__}: {e}; write one with python bench.py CONFIG "
                         f"--json=PATH") from e


def bench_speed(study, cfg, tokens_per_s):
    """A run's tokens/s from bench.py's figure for its query mode, which was measured on the study's own model
    (its config and overrides): the same, or for an arm that changes the model's size (wide's MLP, another
    query_hidden) that figure x the FLOPs per token it measured / the arm's (the same MFU)."""
    base = parse_config([study["config"]] + [f"--{k}={v}" for k, v in study["overrides"].items()]
                        + [f"--query_mode={cfg['query_mode']}"])
    return tokens_per_s * flops_per_token(model_config(base)) / flops_per_token(model_config(cfg))


def dry_run(study, tokens_per_s=None, bench_json=None):
    """The study's plan and its cost, as text: per arm its runs (finished, due now, the first wave, the fewest
    and the most the search can make: extensions, half steps, final seeds), tokens per run and GPU-hours
    (tokens / tokens_per_s / 3600, per GPU: a run on N GPUs takes 1/N of the time for the same GPU-hours,
    if it scales perfectly; evals not counted). tokens_per_s: one figure for every arm; else bench_json
    (bench.py's --json: each arm at its query mode's figure, bench_speed; default DEFAULT_BENCH_JSON). ValueError if
    the bench file lacks an arm's query mode. A study whose config runs on the CPU, given neither, is timed
    on its own finished runs instead (run_timing): CPU-hours of one process, evals included, '?' for an arm
    with none finished yet. Runs nothing."""
    first = next(iter(study["arms"]))
    on_cpu = run_config(study, first, study["grids"][first][0], study["seeds"][0])["device"] == "cpu"
    timed = on_cpu and not (tokens_per_s or bench_json)
    if timed:
        folder, timing = run_timing(study)
        unit = "CPU"
        no_evals = [arm for arm, (_, other_s) in timing.items() if other_s is None]
        evals = (f"evals not included for {', '.join(no_evals)}, whose runs did not log elapsed_s" if no_evals
                 else "evals and start-up included")
        modes = ",".join(dict.fromkeys(run_config(study, arm, study["grids"][arm][0], study["seeds"][0])
                                       ["query_mode"] for arm in study["arms"]))
        source = (f"CPU-hours of one process, timed on the runs in {folder} ({evals}; each arm's speed as its "
                  f"runs met the machine's load, so tokens/s does not rank the arms: bench.py does)" if folder
                  else f"CPU-hours: unknown, no finished run of this study to time yet; measure a run's speed "
                       f"with python bench.py {study['config']} --threads=1 --query_modes={modes} and pass its "
                       f"tokens/s as --tokens_per_s")
    else:
        unit, per = ("CPU", "process") if on_cpu else ("GPU", "GPU")
        source = (f"{unit}-hours = tokens / tokens per second per {per} / 3600, from "
                  + (f"--tokens_per_s {tokens_per_s:,.0f} for every arm" if tokens_per_s else
                     f"{os.path.relpath(bench_json or DEFAULT_BENCH_JSON)}, each arm at its query mode's tokens/s, "
                     f"scaled by FLOPs per token where the arm changes the model's size")
                  + "; evals not counted")
    speeds = None if tokens_per_s or timed else read_tokens_per_s(bench_json or DEFAULT_BENCH_JSON)
    due = due_runs(study)
    lines = [f"plan of study {study['name']} (dry run: nothing is started); runs in {study['runs_dir']}", source,
             "", f"| arm | query_mode | tokens/s | tokens a run | {unit}-h a run | finished | due now | first wave "
                 f"| fewest | most | {unit}-h first wave | {unit}-h most |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    untimed = []
    total = dict(runs=[0, 0, 0, 0, 0], hours=[0.0, 0.0, 0.0])  # hours: first wave, fewest, most
    for arm in study["arms"]:
        cfg = run_config(study, arm, study["grids"][arm][0], study["seeds"][0])
        mode = cfg["query_mode"]
        if speeds is not None and mode not in speeds:
            raise ValueError(f"{bench_json or DEFAULT_BENCH_JSON} has no row for query_mode {mode} (arm {arm}); "
                             f"it has {', '.join(speeds)}: measure it with bench.py --query_modes={mode}, or "
                             f"pass --tokens_per_s")
        if timed and arm not in timing:
            untimed.append(arm)
            speed = hours = math.nan
        elif timed:
            step_s, other_s = timing[arm]
            speed = run_tokens(cfg) / cfg["max_iters"] / step_s
            hours = (step_s * cfg["max_iters"] + (other_s or 0.0)) / 3600
        else:
            speed = tokens_per_s or bench_speed(study, cfg, speeds[mode])
            hours = run_tokens(cfg) / speed / 3600
        first, fewest, most = arm_run_counts(study, arm)
        finished = sum(is_finished(study, *run) for run in run_list(study, arm))
        now = sum(run[0] == arm for run in due)
        for i, n in enumerate((finished, now, first, fewest, most)):
            total["runs"][i] += n
        for i, n in enumerate((first, fewest, most)):
            total["hours"][i] += n * hours
        lines.append(f"| {arm} | {mode} | {speed:,.0f} | {run_tokens(cfg):,} | {hours:.2f} | {finished} | {now} "
                     f"| {first} | {fewest} | {most} | {first * hours:,.1f} | {most * hours:,.1f} |")
    finished, now, first, fewest, most = total["runs"]
    lines.append(f"| **all** | | | | | {finished} | {now} | {first} | {fewest} | {most} "
                 f"| {total['hours'][0]:,.1f} | {total['hours'][2]:,.1f} |")
    h_first, h_fewest, h_most = total["hours"]
    span = lambda lo, hi, fmt: f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}-{hi:{fmt}}"
    cost = (f"{span(h_fewest, h_most, ',.1f')} {unit}-hours (first wave: {first} runs, {h_first:,.1f} "
            f"{unit}-hours)" if not untimed else
            f"{unit}-hours unknown until {' and '.join(untimed)} ha{'ve' if len(untimed) > 1 else 's'} a finished "
            f"run to time (first wave: {first} runs)")
    lines += ["", "finished: runs done; due now: what the sweep would start now; first wave: the base grid on the "
                  "selection seeds (with no selection seeds: the final runs); fewest / most: the whole study "
                  "without / with every grid extension the search may add (half steps and final seeds included)",
              "", f"The study: {span(fewest, most, 'd')} runs, {cost}; {finished} finished, {now} due now."
              + (" Complete: the sweep has nothing to run; report.py writes its report, and --quick tries the "
                 "study in the scratch folder." if now == 0 else ""),
              data_status(study, complete=now == 0)]
    if now:
        lines += device_status(study)
    return re.sub(r"(?<=\| )nan(?= \|)", "?", "\n".join(lines))


def study_progress(study):
    """'N of the study's F-M runs finished': F and M are the fewest and the most runs its search can make."""
    counts = [arm_run_counts(study, arm) for arm in study["arms"]]
    fewest, most = sum(c[1] for c in counts), sum(c[2] for c in counts)
    finished = sum(is_finished(study, *run) for arm in study["arms"] for run in run_list(study, arm))
    return f"{finished} of the study's {fewest if fewest == most else f'{fewest}-{most}'} runs finished"


def run_list(study, arm):
    """Every run of an arm the plan has named so far: its swept rates on the selection seeds, and the chosen
    rate (once there is one) on its final seeds."""
    p = plan(study, arm)
    runs = [(arm, lr, s) for lr in p["swept"] for s in study["selection_seeds"]]
    return runs + ([(arm, p["chosen"], s) for s in final_seeds(study, arm)] if p["chosen"] is not None else [])


# ------------------------------------------------------------------------- on a cluster: submitit (--executor)
# torchrun forwards these to its workers (and waits up to TORCHRUN_SHUTDOWN_S for them before it kills them):
# SLURM's and submitit's stop signals reach train.py's ranks, which checkpoint and exit (train.py's docstring)
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
TORCHRUN_SHUTDOWN_S = 300
# SLURM job states in which a job may still run, or run again (a requeued job keeps its id)
SLURM_ALIVE = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
               "RESIZING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "UNKNOWN")
EXECUTORS = ("local", "slurm", "local_submitit")  # local_submitit: submitit's LocalExecutor (real jobs, no SLURM)
MAX_ATTEMPTS = 3  # submissions of one run per driver session before it counts as failed
PREEMPT_GRACE_S = 60  # a job whose train.py stopped on a signal waits this long for submitit's requeue


class TrainJob:
    """One run of a study as a submitit job (a Checkpointable: submitit calls checkpoint() on its preemption
    signal, USR2, and requeues what it returns).

    __call__ runs train.py in cwd (the driver's folder: the study's paths are relative to it), resuming from
    out_dir/ckpt.pt when there is one: `python train.py ARGS` on one process, else `torchrun --standalone
    --nproc_per_node=nproc train.py ARGS` (one node). Its output goes to out_dir/train.log. Returns train.py's
    exit status when the run finished or diverged (0 or EXIT_DIVERGED); raises RuntimeError otherwise (the
    driver then resubmits it, and it resumes). checkpoint() sends the child SIGUSR1, waits until it has saved
    its checkpoint and exited, and returns this job again: the requeued job resumes from that checkpoint.
    """

    def __init__(self, args, out_dir, nproc=1, cwd=None, threads=None):
        self.args, self.out_dir, self.nproc = list(args), out_dir, nproc
        self.cwd, self.threads = cwd or os.getcwd(), threads
        self.pid = self.status = None

    def command(self):
        """The command line of this attempt: with --init_from=resume once a checkpoint exists."""
        args = self.args + (["--init_from=resume"]
                            if os.path.exists(os.path.join(self.cwd, self.out_dir, "ckpt.pt")) else [])
        if self.nproc == 1:
            return [sys.executable, TRAIN_PY, *args]
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.nproc}",
                f"--signals_to_handle={TORCHRUN_SIGNALS}", f"--shutdown_timeout={TORCHRUN_SHUTDOWN_S}", TRAIN_PY,
                *args]

    def _wait(self):
        """Reap the child -> its exit status. Not Popen.wait: checkpoint() waits from a signal handler that may
        interrupt this very loop, and Popen.wait holds a lock that the handler would then wait for forever."""
        while self.status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by checkpoint() in between
                break
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
            else:
                time.sleep(0.2)
        return self.status

    def __call__(self):
        env = {**os.environ, **({"OMP_NUM_THREADS": str(self.threads)} if self.threads else {})}
        log_path = os.path.join(self.cwd, self.out_dir, "train.log")
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        with open(log_path, "a") as log:
            proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd, env=env)
        self.pid, self.status = proc.pid, None
        proc.returncode = code = self._wait()  # (Popen would otherwise try to reap it again)
        if code in (0, EXIT_DIVERGED):
            return code
        if code == EXIT_PREEMPTED and "SLURM_JOB_ID" in os.environ:  # SLURM's SIGTERM came first: give its
            time.sleep(PREEMPT_GRACE_S)  # USR2 time to reach submitit, which then requeues this job (checkpoint)
        raise RuntimeError(f"train.py ended with exit status {code}"
                           + (" (stopped by a signal after a checkpoint at a step boundary)"
                              if code == EXIT_PREEMPTED else "")
                           + f"; see {log_path}. Resubmitted, it resumes from its checkpoint")

    def checkpoint(self, *args, **kwargs):
        import submitit  # (only a job that runs under submitit gets here)
        if self.pid is not None and self.status is None:
            try:
                os.kill(self.pid, signal.SIGUSR1)  # train.py (or torchrun, to every rank): checkpoint and exit
            except ProcessLookupError:
                pass
            self._wait()
        requeued = TrainJob(self.args, self.out_dir, self.nproc, self.cwd, self.threads)  # resumes: ckpt.pt
        return submitit.helpers.DelayedSubmission(requeued)

    def __getstate__(self):  # the pickle submitit stores: the run, not this attempt's process
        return {**self.__dict__, "pid": None, "status": None}


def make_executor(kind, folder, gpus_per_run, slurm):
    """A submitit executor whose jobs write their logs in folder: 'slurm' (one node, one task, gpus_per_run
    GPUs; slurm: dict of partition, time in minutes, and extra SlurmExecutor parameters or raw sbatch flags)
    or 'local_submitit' (submitit's LocalExecutor: real subprocess jobs on this machine, for tests)."""
    import submitit
    setup = [f"export PYTHONPATH={shlex.quote(os.path.dirname(TRAIN_PY))}${{PYTHONPATH:+:$PYTHONPATH}}"]
    if kind == "local_submitit":
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(timeout_min=slurm.get("time") or 60 * 24, setup=setup)
        return executor
    executor = submitit.SlurmExecutor(folder=folder)
    known = executor._valid_parameters()
    extra = dict(slurm.get("extra") or {})
    params = dict(nodes=1, ntasks_per_node=1, gpus_per_node=gpus_per_run, setup=setup,
                  **{k: slurm[k] for k in ("partition", "time") if slurm.get(k) is not None},
                  **{k: v for k, v in extra.items() if k in known})
    raw = {k: v for k, v in extra.items() if k not in known}  # any other sbatch flag, as it is
    if raw:
        params["additional_parameters"] = raw
    executor.update_parameters(**params)
    return executor


def job_record_path(study, arm, lr, seed):
    return os.path.join(run_dir(study, arm, lr, seed), "job.json")


def read_job_record(study, arm, lr, seed):
    """The run's job.json: {executor, job_id, folder, job_ids (every submission, oldest first)}, or None."""
    path = job_record_path(study, arm, lr, seed)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def attach(record):
    """The submitit Job of a job.json record (a job submitted by this or an earlier driver)."""
    import submitit
    cls = submitit.SlurmJob if record["executor"] == "slurm" else submitit.LocalJob
    return cls(folder=record["folder"], job_id=record["job_id"])


def job_alive(job, record):
    """Whether a submitted job may still run: on SLURM, a state in SLURM_ALIVE (sacct; a requeued job counts);
    for a local job, no result file yet and its controller process still exists (not a zombie)."""
    if record["executor"] == "slurm":  # the state first: a job SLURM requeued may have a result from before
        state = job.get_info(mode="force").get("State") or "UNKNOWN"
        return state.split()[0] in SLURM_ALIVE
    if job.paths.result_pickle.exists():
        return False
    if getattr(job, "_process", None) is not None:  # submitted by this driver
        return job._process.poll() is None
    try:  # submitted by an earlier driver: its controller, the job id, is an orphan now (or gone)
        with open(f"/proc/{int(record['job_id'])}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, ValueError):
        return False


def submit(study, arm, lr, seed, kind, gpus_per_run, slurm, threads):
    """Submit one run as a job; record it in <run dir>/job.json (atomically) -> the Job. ValueError /
    FileNotFoundError if the data is not the study's (check_data, again before each job)."""
    check_settings(study, arm, lr, seed)
    check_data(study)
    out_dir = run_dir(study, arm, lr, seed)
    os.makedirs(out_dir, exist_ok=True)
    folder = os.path.abspath(os.path.join(out_dir, "submitit"))
    job_fn = TrainJob(nproc_run_args(study, arm, lr, seed, gpus_per_run), out_dir, gpus_per_run, os.getcwd(),
                      threads)
    job = make_executor(kind, folder, gpus_per_run, slurm).submit(job_fn)
    old = read_job_record(study, arm, lr, seed) or {}
    atomic_write_text(job_record_path(study, arm, lr, seed), json.dumps(dict(
        executor="slurm" if kind == "slurm" else "local", job_id=str(job.job_id), folder=folder,
        job_ids=old.get("job_ids", []) + [str(job.job_id)]), indent=1))
    print(f"submitted: {arm} lr={lr:g} seed={seed} as job {job.job_id} ({kind}) -> {out_dir}", flush=True)
    return job


def drive(study, kind, gpus_per_run=1, slurm=None, threads=None, poll_s=30.0):
    """Run the study as jobs (submitit) until it is complete: submit every run that is due, wait until one of
    them ends, plan again (the search's extensions, half steps, then the final seeds), submit what became due,
    and so on. A due run with a job that may still run (job.json, this driver's or an earlier one's) is
    waited for, never submitted twice; a run whose job ended unfinished (killed, failed, preempted without a
    requeue) is submitted again and resumes from its checkpoint, at most MAX_ATTEMPTS times in this session.
    Returns {run: why it failed} for the runs given up on."""
    slurm, failed, attempts, active = slurm or {}, {}, {}, {}
    while True:
        for run in due_runs(study):
            if run in active or run in failed:
                continue
            record = read_job_record(study, *run)
            job = attach(record) if record else None
            if job is not None and job_alive(job, record):
                print(f"attached: {run[0]} lr={run[1]:g} seed={run[2]} is job {record['job_id']}", flush=True)
                active[run] = (job, record)
                continue
            if attempts.get(run, 0) >= MAX_ATTEMPTS:
                failed[run] = (f"{run_dir(study, *run)} did not finish in {MAX_ATTEMPTS} submissions; see its "
                               f"train.log and submitit/ logs")
                continue
            attempts[run] = attempts.get(run, 0) + 1
            job = submit(study, *run, kind, gpus_per_run, slurm, threads)
            active[run] = (job, read_job_record(study, *run))
        if not active:
            return failed
        while not any(not job_alive(job, record) for job, record in active.values()):
            time.sleep(poll_s)
        for run in [r for r, (job, record) in active.items() if not job_alive(job, record)]:
            del active[run]
            state = ("finished" if is_finished(study, *run) else "ended unfinished (resubmitted if still due)")
            print(f"job {run[0]} lr={run[1]:g} seed={run[2]}: {state}", flush=True)


def add_cluster_arguments(parser):
    """--executor and the SLURM options."""
    parser.add_argument("--executor", choices=EXECUTORS, default="local",
                        help="local: runs here (--jobs at a time); slurm: every due run as a SLURM job through "
                             "submitit; local_submitit: submitit's local executor (tests)")
    parser.add_argument("--gpus_per_run", type=int, default=None,
                        help="GPUs (torchrun processes on one node) per run (default: the study's slurm "
                             "gpus_per_run, else 1)")
    parser.add_argument("--slurm_partition", default=None, help="SLURM partition (default: the study's)")
    parser.add_argument("--slurm_time", type=int, default=None,
                        help="SLURM time limit per job, minutes; a run that needs longer is requeued and resumes")
    parser.add_argument("--slurm_extra", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more SlurmExecutor parameters (account=..., qos=..., cpus_per_task=8, mem=...) or "
                             "any sbatch flag (exclusive=true), added to the study's")
    parser.add_argument("--poll_s", type=float, default=30.0, help="seconds between job-state checks")


def slurm_settings(study, args):
    """The study file's slurm dict with the command line's options on top -> (gpus_per_run, slurm dict)."""
    slurm = {**study["slurm"], "extra": dict(study["slurm"].get("extra") or {})}
    for item in args.slurm_extra:
        if "=" not in item:
            raise ValueError(f"--slurm_extra {item!r}: write KEY=VALUE, e.g. account=myproject")
        key, text = item.split("=", 1)
        try:
            slurm["extra"][key] = json.loads(text)
        except ValueError:
            slurm["extra"][key] = text
    slurm.update({k: v for k, v in (("partition", args.slurm_partition), ("time", args.slurm_time))
                  if v is not None})
    gpus = slurm.pop("gpus_per_run", 1)  # 0 is refused, not taken as unset
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"the study file's slurm gpus_per_run={gpus!r}: give 1 or more")
    return args.gpus_per_run or gpus, slurm  # the command line's (checked in main) wins


def add_plan_arguments(parser):
    """--dry_run and the throughput it counts GPU-hours with."""
    parser.add_argument("--dry_run", action="store_true",
                        help="print the plan (runs, tokens, GPU-hours; a study on the CPU: CPU-hours timed on "
                             "its finished runs) and run nothing")
    parser.add_argument("--tokens_per_s", type=float, default=None,
                        help="--dry_run: measured training tokens/s per GPU (per process for a study on the "
                             "CPU: bench.py's tokens/s), for every arm")
    parser.add_argument("--bench_json", default=None,
                        help="--dry_run: bench.py's --json file; each arm at its query mode's tokens/s "
                             "(default: the one-H200 figures, bench/results/h200_2026-11-30/)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("study", help="study file, e.g. studies/enwiki_cpu.py")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time on this machine")
    parser.add_argument("--threads", type=int, default=None,
                        help="OMP_NUM_THREADS per run (default: torch's)")
    parser.add_argument("--print", type=int, metavar="NPROC", dest="nproc",
                        help="print the torchrun commands of the runs due now, with this many processes each")
    parser.add_argument("--quick", type=float, nargs="?", const=QUICK_FRACTION, metavar="FRACTION",
                        help=f"try the machinery: every run at this fraction of its steps (alone: "
                        f"{QUICK_FRACTION}), in {QUICK_DIR}/<name>/runs; results/ is never touched")
    add_plan_arguments(parser)
    add_cluster_arguments(parser)
    args = parser.parse_args(argv)
    for option in ("jobs", "threads", "nproc", "slurm_time"):
        if getattr(args, option) is not None and getattr(args, option) < 1:
            parser.error(f"--{option.replace('nproc', 'print')} must be >= 1")
    if not (math.isfinite(args.poll_s) and args.poll_s > 0):
        parser.error(f"--poll_s {args.poll_s:g}: must be a positive number of seconds")
    study = load_study(args.study, args.quick)
    report_cmd = f"python report.py {shlex.quote(args.study)}{quick_option(args.quick)}"  # (a path with spaces)
    if args.quick:
        print(f"quick: every run at {args.quick:g} of its steps, in {study['runs_dir']} (scratch; results/ "
              f"is not touched). For trying the machinery, not for comparing arms; report: {report_cmd}",
              flush=True)
    if args.tokens_per_s is not None and not (math.isfinite(args.tokens_per_s) and args.tokens_per_s > 0):
        parser.error(f"--tokens_per_s {args.tokens_per_s:g}: must be a positive number (measured tokens/s per GPU)")
    if args.gpus_per_run is not None and args.gpus_per_run < 1:
        parser.error(f"--gpus_per_run {args.gpus_per_run}: give 1 or more")
    if args.dry_run:
        print(dry_run(study, args.tokens_per_s, args.bench_json))
        return
    due = due_runs(study)
    if not args.nproc and not due:  # before the data check: a finished study needs no data (a clone without
        # it reads its report)
        print(f"nothing to run: every run of the study has finished ({study['runs_dir']}); its report: "
              f"{report_cmd}")
        return
    if args.executor == "slurm" and not args.nproc and shutil.which("sbatch") is None:
        parser.error("--executor slurm submits with SLURM's sbatch, which is not on PATH here: run it on the "
                     "cluster's login node, or use --executor local on this machine")
    if args.executor != "local" and not args.nproc:
        check_data(study)
        gpus, slurm = slurm_settings(study, args)
        failed = drive(study, args.executor, gpus, slurm, args.threads, args.poll_s)
        print("chosen learning rates:", json.dumps({arm: plan(study, arm)["chosen"] for arm in study["arms"]}))
        if failed:
            raise RuntimeError(f"{len(failed)} run(s) did not finish; the others did:\n"
                               + "\n".join(failed.values()))
        return
    if args.nproc:
        if due:
            print("\n".join(torchrun_command(study, *run, args.nproc) for run in due))
        if any(plan(study, arm)["chosen"] is None for arm in study["arms"]):
            print("# more runs follow (grid extensions, half steps, final seeds): "
                  "run this again once these finish")
        elif not due:
            print(f"# nothing due: every run of the study has finished; its report: {report_cmd}")
        return
    check_data(study)
    problem = device_problem(study)
    if problem:  # else every run would start and fail, its reason only in its train.log (an adversarial trial)
        raise ValueError(f"the study's runs cannot train on this machine ({problem}); run the sweep where their "
                         f"device is, e.g. with --executor slurm on a cluster's nodes, or set device and dtype "
                         f"in the study's overrides; nothing was started")
    try:
        os.makedirs(study["runs_dir"], exist_ok=True)
    except OSError as e:  # its parent is a file, a dangling link, a name too long
        raise ValueError(f"cannot make the study's runs_dir {study['runs_dir']} ({e.strerror or e}); set runs_dir "
                         f"in the study file to a folder that can be made") from None
    lock = os.path.join(study["runs_dir"], ".sweep.lock")
    try:  # held until the sweep ends
        sweep_lock = lock_file(lock)
    except BlockingIOError:
        raise ValueError(f"another sweep.py is running the runs in {study['runs_dir']} (it holds {lock}): two "
                         f"sweeps would start the same runs; wait for it to end, or stop it, then run this "
                         f"again") from None
    print(announce(study, due, args.jobs), flush=True)
    failed = {}
    STOPPING.clear()
    STOPPED_BY.clear()
    previous = {sig: signal.signal(sig, stop_runs)  # a killed sweep would leave its train.py running
                for sig in STOP_SIGNALS}
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            wave = 0
            while not STOPPING.is_set():  # each wave runs what is due; finished runs decide each arm's next phase
                due = [run for run in due_runs(study) if run not in failed]
                if not due:
                    break
                wave += 1
                print(f"wave {wave}: {len(due)} run(s) due now; {study_progress(study)}", flush=True)
                runs = [(run, f"{i} of {len(due)} due now") for i, run in enumerate(due, 1)]
                for run, failure in zip(due, pool.map(lambda r: launch(study, *r[0], args.threads, r[1]), runs)):
                    if failure:
                        failed[run] = failure
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if sweep_lock is not None:
            sweep_lock.close()
    if STOPPING.is_set():
        stopped = [f for f in failed.values() if "was stopped by a signal" in f or "was interrupted" in f]
        how = "interrupted (Ctrl-C)" if STOPPED_BY[0] == "SIGINT" else f"stopped by {STOPPED_BY[0]}"
        raise SweepStopped(f"the sweep was {how}: {len(stopped)} running run(s) stopped, none started after "
                           f"it; run the same command again to go on (each stopped run resumes from its last "
                           f"checkpoint, or starts again if it had none)",
                           EXIT_INTERRUPTED if STOPPED_BY[0] == "SIGINT" else EXIT_PREEMPTED)
    print("chosen learning rates:", json.dumps({arm: plan(study, arm)["chosen"] for arm in study["arms"]}))
    failed = {run: f for run, f in failed.items() if not is_finished(study, *run)}  # another process's, since
    if failed:
        raise RuntimeError(f"{len(failed)} run(s) did not finish; the others did:\n"
                           + "\n".join(failed.values()))
    print(f"{study_progress(study)}; its report: {report_cmd}")


if __name__ == "__main__":
    try:
        main()
    except SweepStopped as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except (ValueError, OSError, RuntimeError) as e:  # OSError: a runs_dir that cannot be written, a full disk
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume (finished runs are kept)", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
