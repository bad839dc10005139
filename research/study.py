"""
A study: the arms of one comparison, each given the same learning-rate search, then run on final seeds.

A study file (studies/*.py) is plain Python that sets name (its report goes to results/<name>/), config (a
train.py config file), overrides (train.py keys for every arm; {} for none), arms (arm name -> train.py keys; the
sweep sets learning_rate, seed and out_dir, and min_lr = lr / 10 unless the arm sets it), learning_rates (the
grid, e.g. [4e-3, 8e-3, 1.6e-2], or a dict arm -> grid), selection_seeds (the seeds the rate is chosen on; [] with
one rate per arm: no search) and seeds (the final seeds: the statistics use these alone). It may set seeds_per_arm
(arm -> how many of seeds), reference (the arm the others are compared with; "linear"), contrasts ([(arm, other,
"what the pair isolates")]), max_extensions (2), half_steps (True), precision (report.py's target CI half-width, a
fraction of the loss), slurm (sweep.py --executor slurm's partition, time, gpus_per_run, extra), runs_dir
(results/<name>/runs; studies may share one for arms that are one experiment), stall_margin (None; e.g. 2: no rate
chosen within a x2 step below a rate, or at a rate, where a selection run stalled or diverged), horizons (None;
e.g. [300, 600]: the rate searched at each of these max_iters and carried to the final runs', horizon_plan),
horizon_evals (None: the final runs' evals a run; else evals a selection run) and short_pick (False; True: the
final seeds also run at the shortest horizon's pick, for the regret table). Weight decay is not searched
(docs/studies.md: token budgets, the AdamW timescale).

Per arm: (1) the grid on the selection seeds; (2) one more grid step beyond an edge best (at most
max_extensions); (3) half steps x/√2 and x·√2 around the best; (4) the best rate (the lowest mean final loss over
the selection seeds; a diverged run counts as +inf) on the final seeds, which never took part in choosing it
(docs/studies.md: the protocol). Each run has a folder <runs_dir>/<arm>/lr<lr>_seed<seed>, and where the search
stands is replayed from the finished runs there: a study can stop, restart, or finish on another machine.
"""
import filecmp
import functools
import json
import math
import os
import re

import numpy as np

from nlq.checkpoint import read_metrics, read_saved_config
from nlq.data import load_meta, open_split
from nlq.settings import (NOT_EXPERIMENT, check_value, differing, model_config, param_counts,
                          parse_config, read_config_file)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
REQUIRED = ("name", "config", "overrides", "arms", "learning_rates", "selection_seeds", "seeds")
OPTIONAL = dict(seeds_per_arm={}, reference="linear", contrasts=[], max_extensions=2, half_steps=True,
                precision=None, slurm={}, runs_dir=None, stall_margin=None, horizons=None,
                horizon_evals=None, short_pick=False)
SLURM_KEYS = ("partition", "time", "gpus_per_run", "extra")
# train.py keys the sweep sets for every run, and what sets them instead (an arm may set min_lr)
PER_RUN = dict(learning_rate="learning_rates", seed="selection_seeds and seeds", out_dir="runs_dir",
               min_lr="each arm's min_lr (default: lr / 10)")
EVAL_KEYS = ("block_size", "eval_windows", "eval_interval", "eval_full_at_end")  # the eval set, the same per arm
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a folder name that needs no care in a shell or a path
# --quick: any study at a fraction of its steps, in a scratch folder, to try the machinery (not to compare)
QUICK_DIR = os.path.join("out", "quick")
QUICK_FRACTION = 0.05


# ------------------------------------------------------------------------------------------- the study file
def load_study(path, quick=None):
    """Study file -> the study (make_study, or make_ladder), its runs_dir's runs checked (check_shared_runs).
    ValueError or FileNotFoundError naming the file."""
    keys = read_config_file(path)  # plain Python, like a config file
    try:
        study = make_ladder(keys, quick) if "rungs" in keys else make_study(keys, quick)
        owner = os.path.join(ROOT, "studies", study["name"] + ".py")  # results/<name>/ is that study's
        if os.path.isfile(owner) and not filecmp.cmp(owner, path, shallow=False):  # itself, or a copy as it is
            raise ValueError(f"its name {study['name']!r} is the study {os.path.relpath(owner)}'s (taken over by an "
                             f"import or a copy?): set name = '...' to a name of its own")
        for rung in rungs_of(study):  # and every run already in its folders, before anything starts
            for part in (rung, *rung["horizon_studies"].values()):
                check_shared_runs(part)
    except (ValueError, FileNotFoundError) as e:
        raise type(e)(f"study file {path}: {e}") from None
    return study


def make_study(keys, quick=None):
    """A study file's keys -> the checked study, with grids (arm -> its rates, ascending) and runs_dir. quick: the
    study at that fraction of its steps (run_args), its runs in out/quick/<name>/runs."""
    missing = [k for k in REQUIRED if k not in keys]
    if missing:
        raise ValueError(f"it does not set {', '.join(missing)}")
    unknown = set(keys) - set(REQUIRED) - set(OPTIONAL)
    if unknown:
        raise ValueError(f"it sets unknown keys {sorted(unknown)}; the keys: {', '.join([*REQUIRED, *OPTIONAL])}")
    study = {**OPTIONAL, **keys}
    require(isinstance(study["name"], str) and PLAIN_NAME.fullmatch(study["name"]), "name",
            "a plain folder name (letters, digits, _ . -; not starting with . or -)")
    arms = study["arms"]
    require(isinstance(arms, dict) and arms and all(isinstance(v, dict) for v in arms.values()), "arms",
            "a non-empty dict: arm name -> dict of train.py keys")
    for arm in arms:  # each arm is a folder of runs_dir
        require(isinstance(arm, str) and PLAIN_NAME.fullmatch(arm), f"arm name {arm!r}",
                "a plain folder name (letters, digits, _ . -; not starting with . or -)")
    if not os.path.isfile(study["config"]):  # (the committed studies' paths are relative to the repository)
        raise FileNotFoundError(f"its config file {study['config']} not found in {os.getcwd()}")
    place_runs(study, quick)
    check_options(study)
    check_grids(study)
    check_train_keys(study)
    check_arms(study)
    make_horizons(study)
    return study


def make_ladder(keys, quick=None):
    """A scaling ladder: keys["rungs"] = {rung: its train.py keys, and its own learning_rates and horizons if any},
    each rung a study with the ladder's protocol, its runs in <runs_dir>/<rung>. -> dict(name, runs_dir, rungs)."""
    rungs = keys["rungs"]
    keys = {k: v for k, v in keys.items() if k != "rungs"}
    ladder = dict(name=keys.get("name"), quick=quick, rungs={})
    for rung, rung_keys in rungs.items():
        rung_keys = dict(rung_keys)
        lrs = rung_keys.pop("learning_rates", keys.get("learning_rates"))
        horizons = rung_keys.pop("horizons", keys.get("horizons"))
        runs_dir = os.path.join(keys.get("runs_dir") or os.path.join("results", str(keys.get("name")), "runs"), rung)
        try:
            study = make_study({**keys, "overrides": {**keys.get("overrides", {}), **rung_keys},
                                "learning_rates": lrs, "runs_dir": runs_dir, "horizons": horizons}, quick)
        except ValueError as e:
            raise ValueError(f"rung {rung}: {e}") from None
        if quick is not None:  # each rung its own scratch folder, and its horizons' in it
            study["runs_dir"] = os.path.join(study["runs_dir"], rung)
            make_horizons(study)
        ladder["rungs"][rung] = {**study, "rung": rung}
    ladder["runs_dir"] = os.path.dirname(study["runs_dir"])  # the rungs' parent folder
    return ladder


def rungs_of(study):
    """The studies a study file runs: a ladder's rungs, smallest first as the file lists them, or the study."""
    return list(study["rungs"].values()) if "rungs" in study else [study]


def require(ok, key, want):
    if not ok:
        raise ValueError(f"{key} must be {want}")


def place_runs(study, quick):
    """study["runs_dir"]: its own (results/<name>/runs), the one it names, or --quick's scratch folder."""
    own = os.path.join("results", study["name"], "runs")
    study["runs_dir"] = study["runs_dir"] or own
    if quick is not None:
        require(0 < quick <= 1, "--quick", "a fraction of the study's steps in (0, 1], e.g. 0.05")
        study["quick"], study["study_runs_dir"] = quick, study["runs_dir"]
        study["runs_dir"] = os.path.join(QUICK_DIR, study["name"], "runs")
    parts = os.path.relpath(os.path.abspath(study["runs_dir"])).split(os.sep)
    if parts[0] == "results" and (len(parts) == 1 or parts[1] != study["name"] and parts[2:] != ["runs"]):
        # results/<other>/runs is how studies share runs (check_shared_runs); anything else in results/<other>/
        # would put runs inside another study's committed report
        other = parts[1] if len(parts) > 1 else "<name>"
        raise ValueError(f"runs_dir {study['runs_dir']} is inside results/{other}/, another study's report folder; "
                         f"leave runs_dir out (the default is {own}) or share its runs: results/{other}/runs")


SELECTION_SEEDS = "a non-empty list of ints, each once (empty only with one learning rate per arm)"


def check_options(study):
    """Seeds each once, the final ones never the selection ones; arms named where arms are named."""
    arms, seeds, sel = study["arms"], study["seeds"], study["selection_seeds"]
    distinct_ints = lambda xs: isinstance(xs, list) and all(type(x) is int for x in xs) and len({*xs}) == len(xs)
    require(distinct_ints(seeds) and seeds, "seeds", "a non-empty list of ints, each once")
    require(distinct_ints(sel), "selection_seeds", SELECTION_SEEDS)
    overlap = set(sel) & set(seeds)
    if overlap:
        raise ValueError(f"seeds {sorted(overlap)} are both selection and final seeds; the final statistics must "
                         f"not use the seeds the learning rate was chosen on")
    is_arm = lambda x: isinstance(x, str) and x in arms
    require(is_arm(study["reference"]), "reference", f"the name of one of the arms ({', '.join(arms)})")
    require(isinstance(study["seeds_per_arm"], dict) and all(
        is_arm(a) and type(n) is int and 1 <= n <= len(seeds) for a, n in study["seeds_per_arm"].items()),
            "seeds_per_arm", f"a dict: arm of this study -> how many of its {len(seeds)} seeds (1 or more)")
    require(isinstance(study["contrasts"], list) and all(
        isinstance(c, tuple) and len(c) == 3 and is_arm(c[0]) and is_arm(c[1]) and c[0] != c[1]
        for c in study["contrasts"]),
            "contrasts", f'a list of (arm, other arm, "what the pair isolates"), two different arms of '
                         f'{", ".join(arms)}')
    require(isinstance(study["slurm"], dict) and set(study["slurm"]) <= set(SLURM_KEYS), "slurm",
            f"a dict with some of the keys {', '.join(SLURM_KEYS)}")
    margin = study["stall_margin"]
    require(margin is None or type(margin) in (int, float) and margin >= 1, "stall_margin",
            "None or a factor >= 1 (2: no rate chosen within a x2 step below a stalled or diverged selection run)")
    horizons = study["horizons"]
    require(horizons is None or isinstance(horizons, list) and len(horizons) >= 2 and all(
        type(h) is int and h >= 1 for h in horizons) and horizons == sorted(set(horizons)), "horizons",
            "None or a list of 2 or more selection max_iters, ascending, e.g. [300, 600]")
    require(not horizons or sel, "horizons", "None without selection_seeds: the rate is searched at each horizon")
    require(study["short_pick"] in (False, True) and (horizons or not study["short_pick"]), "short_pick",
            "True or False, and True only with horizons")


def check_grids(study):
    """study["grids"]: arm -> its rates, ascending: two or more for a search (their step is its step), else one."""
    lrs, arms = study["learning_rates"], study["arms"]
    grids = lrs if isinstance(lrs, dict) else {arm: lrs for arm in arms}
    rate = lambda lr: type(lr) in (int, float) and 0 < lr < math.inf
    # each rate once, to 6 significant digits: the run folders' names
    grid = lambda g: isinstance(g, list) and g and all(map(rate, g)) and len({f"{lr:g}" for lr in g}) == len(g)
    require(set(grids) == set(arms) and all(map(grid, grids.values())), "learning_rates",
            "a non-empty list of positive numbers, each once (to 6 significant digits), or a dict arm -> such a "
            "list for every arm")
    for arm, g in grids.items():
        if study["selection_seeds"] and len(g) == 1:
            raise ValueError(f"arm {arm} has one learning rate but selection_seeds are set: a search needs two "
                             f"or more rates (or selection_seeds = [] to run that rate without a search)")
        require(study["selection_seeds"] or len(g) == 1, "selection_seeds", SELECTION_SEEDS)
    study["grids"] = {arm: sorted(g) for arm, g in grids.items()}


def check_train_keys(study):
    """The train.py keys of overrides and arms: known and typed, none the sweep sets, no init_from (from scratch)."""
    places = [("overrides", study["overrides"])] + [(f"arm {arm}", keys) for arm, keys in study["arms"].items()]
    for where, keys in places:
        for key, value in keys.items():
            if key in PER_RUN and not (key == "min_lr" and where != "overrides"):
                raise ValueError(f"{where} sets {key}, which sweep.py sets for every run (it would be ignored); "
                                 f"set it with {PER_RUN[key]}")
            if key == "init_from" and value != "scratch":
                raise ValueError(f"{where} sets init_from={value!r}; a study's runs train from scratch (sweep.py "
                                 f"resumes them itself; fine-tune with train.py --init_from)")
            try:
                check_value(key, value)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None


def check_arms(study):
    """Resolve every arm now (a bad value fails here, not hours into the sweep), and refuse arms that cannot be
    compared seed by seed: arms on other data, training tokens or eval sets."""
    shared = {}
    for arm in study["arms"]:
        try:
            cfg = arm_config(study, arm)
        except ValueError as e:
            raise ValueError(f"arm {arm} at learning rate {study['grids'][arm][0]:g}: {e}") from None
        step = cfg["batch_size"] * cfg["gradient_accumulation_steps"] * cfg["block_size"]  # tokens a step
        shared[arm] = dict(data=os.path.join(cfg["data_dir"], cfg["dataset"]), max_iters=cfg["max_iters"],
                           tokens_per_step=step, **{k: cfg[k] for k in EVAL_KEYS})
    first = next(iter(shared.values()))
    for key in first:
        if any(s[key] != first[key] for s in shared.values()):
            raise ValueError(f"its arms differ in {key} (" + ", ".join(f"{a}: {s[key]}" for a, s in shared.items())
                             + "); the arms of a study get the same data, training tokens and eval set: set it in "
                               "its config or overrides, not per arm")


HORIZON_KEYS = ("max_iters", "lr_decay_iters", "warmup_iters", "eval_interval")  # what each horizon sets


def make_horizons(study):
    """horizons: study["horizon_studies"] = {"h<h>": the study of its selection runs at max_iters = lr_decay_iters
    = h, in <runs_dir>/h<h>/}. One warmup rule by construction: warmup_iters is the same fraction of the run at
    every horizon as in the final runs; eval_interval = h / horizon_evals, else the final runs' fraction too."""
    study["horizon_studies"] = {}
    if not study["horizons"]:
        return
    final = arm_config({**study, "quick": None}, study["reference"])  # (a --quick try scales every run itself)
    set_by_arm = [arm for arm, keys in study["arms"].items() if set(keys) & set(HORIZON_KEYS)]
    require(not set_by_arm, f"arm {', '.join(set_by_arm)}", f"without {', '.join(HORIZON_KEYS)} in a study with "
            f"horizons: each horizon sets them for every arm")
    require(final["lr_decay_iters"] in (None, final["max_iters"]) and study["horizons"][-1] < final["max_iters"],
            "horizons", f"each below the final runs' max_iters ({final['max_iters']}), which must end their decay "
            f"there (lr_decay_iters = max_iters)")
    evals = study["horizon_evals"] or final["max_iters"] / final["eval_interval"]
    for h in study["horizons"]:
        keys = dict(max_iters=h, lr_decay_iters=h, warmup_iters=round(h * final["warmup_iters"] / final["max_iters"]),
                    eval_interval=max(1, round(h / evals)))
        study["horizon_studies"][f"h{h}"] = {**study, "overrides": {**study["overrides"], **keys}, "seeds": [],
                                             "horizons": None, "horizon_studies": {}, "short_pick": False,
                                             "runs_dir": os.path.join(study["runs_dir"], f"h{h}"), "horizon": h}


# -------------------------------------------------------------------------------------------- a study's runs
def run_dir(study, arm, lr, seed):
    return os.path.join(study["runs_dir"], arm, f"lr{lr:g}_seed{seed}")


def run_args(study, arm, lr, seed):
    """The train.py arguments of one run (arm h<h>/<arm>: a selection run at horizon h), later ones winning: config
    file, overrides, min_lr = lr / 10, the arm's keys, lr, seed and out_dir. --quick scales its steps, keeping its
    shape (warmup, decay, evals: fewer windows), and skips the whole-split eval (4 of a quick CPU run's 5 minutes):
    its final loss is its last val_loss."""
    horizon, _, arm_name = arm.rpartition("/")
    if horizon:  # a selection run at a horizon, named h<h>/<arm> (its folder in runs_dir): that horizon's study
        return run_args(study["horizon_studies"][horizon], arm_name, lr, seed)
    min_lr = float(f"{lr / 10:.6g}")  # 0.0003, not 0.00030000000000000003
    overrides = {**study["overrides"], "min_lr": min_lr, **study["arms"][arm], "learning_rate": lr,
                 "seed": seed, "out_dir": run_dir(study, arm, lr, seed)}
    args = [study["config"]] + [f"--{k}={v}" for k, v in overrides.items()]
    if study.get("quick"):
        cfg, scale = parse_config(args), lambda n: max(1, round(n * study["quick"]))
        quick = dict(max_iters=scale(cfg["max_iters"]), warmup_iters=round(cfg["warmup_iters"] * study["quick"]),
                     eval_interval=scale(cfg["eval_interval"]), eval_windows=scale(cfg["eval_windows"]),
                     eval_full_at_end=False)
        if cfg["lr_decay_iters"] is not None:
            quick["lr_decay_iters"] = scale(cfg["lr_decay_iters"])
        args += [f"--{k}={v}" for k, v in quick.items()]
    return args


def run_config(study, arm, lr, seed):
    return parse_config(run_args(study, arm, lr, seed))


def arm_config(study, arm):
    """An arm's config at its lowest rate and first seed: what all its runs (of that horizon) share."""
    return run_config(study, arm, study["grids"][arm][0], (study["seeds"] or study["selection_seeds"])[0])


def final_seeds(study, arm):
    """The final seeds an arm runs: the first seeds_per_arm[arm] of seeds (all by default)."""
    return study["seeds"][:study["seeds_per_arm"].get(arm, len(study["seeds"]))]


def quick_option(fraction):
    """The --quick option as a command line gives it: '' (None), ' --quick' (the default) or ' --quick 0.1'."""
    return "" if not fraction else " --quick" if fraction == QUICK_FRACTION else f" --quick {fraction:g}"


CODE_CHANGED = "non-embedding parameters"  # settings_diff's key for a model that model.py builds otherwise now


def settings_diff(study, arm, lr, seed):
    """{key: (saved, study)} where the run's saved config differs from what the study asks now (its start and the
    model model.py builds, CODE_CHANGED, included; NOT_EXPERIMENT's keys not compared); {} if none or no run yet."""
    out_dir = run_dir(study, arm, lr, seed)
    saved = read_saved_config(os.path.join(out_dir, "config.json"))
    if saved is None:
        if read_metrics(out_dir):  # train.py writes config.json before the first metrics row
            raise ValueError(f"{out_dir} is damaged: it has metrics.jsonl but no config.json, so its settings "
                             f"cannot be checked; restore config.json, or delete the folder to run it again")
        return {}
    wanted = run_config(study, arm, lr, seed)
    diff = differing(saved, wanted, NOT_EXPERIMENT)
    origin = saved.get("initialised_from")  # init_from says 'resume' once a run resumed; this keeps the start
    if origin is not None and origin != wanted["init_from"]:
        diff["initialised_from"] = (origin, wanted["init_from"])
    counts = saved.get("param_counts")  # (runs made before nlq saved its counts are not checked)
    now = param_counts(model_config(wanted))["non_embedding"]
    if counts is not None and counts["non_embedding"] != now:
        diff[CODE_CHANGED] = (counts["non_embedding"], now)
    return diff


def clash_fix(study, code_changed=False):
    """What to do when a study's runs folder holds other experiments: never delete runs someone made."""
    if code_changed:
        return ("the settings are the study's, but this clone's model.py builds another model from them (each "
                "run's config.json names its commit under 'code'): restore that model.py, or give the arm a new name")
    if study.get("quick"):
        return f"{study['runs_dir']} is scratch space for --quick: delete it and run again"
    return ("give this study its own runs folder (runs_dir), shared only with studies whose arms are the same "
            "experiments; to try it at fewer steps, use sweep.py --quick")


def existing_runs(study):
    """[(arm, lr, seed)] of every run folder of the study's arms in its runs_dir (another study's too)."""
    runs = []
    for arm in study["arms"]:
        folder = os.path.join(study["runs_dir"], arm)
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            match = re.fullmatch(r"lr(.+)_seed(-?\d+)", name)  # run_dir's names
            if match and os.path.isdir(os.path.join(folder, name)):
                runs.append((arm, float(match.group(1)), int(match.group(2))))
    return runs


def data_of_runs(study):
    """{dataset name: {the bins' sha256: (meta.json as recorded, [run folders])}} of the runs in runs_dir."""
    found = {}
    for run in existing_runs(study):
        saved = read_saved_config(os.path.join(run_dir(study, *run), "config.json")) or {}
        meta = saved.get("dataset_meta") or {}
        if meta.get("sha256"):
            contents = json.dumps(meta["sha256"], sort_keys=True)
            found.setdefault(saved["dataset"], {}).setdefault(contents, (meta, []))[1].append(run_dir(study, *run))
    return found


def describe_data(meta, runs=None):
    """'<n run(s) on >the data prepared from SOURCE (train.bin sha256 abcdef123456…)', for messages."""
    sha = (meta.get("sha256") or {}).get("train.bin", "?")
    return (f"{len(runs)} run(s) on " if runs is not None else "") + (
        f"the data prepared from {meta.get('source', '?')} (train.bin sha256 {sha[:12]}…)")


def check_shared_runs(study):
    """ValueError if a run in the study's runs_dir (another study's too) has other settings, or its runs read one
    dataset name as two datasets: the study would take another experiment's results as its own."""
    clashes, code_changed = [], False
    for run in existing_runs(study):
        diff = settings_diff(study, *run)
        if diff:
            code_changed |= CODE_CHANGED in diff
            clashes.append(f"{run_dir(study, *run)}: " + ", ".join(
                f"{k} {saved!r} (study: {wanted!r})" for k, (saved, wanted) in diff.items()))
    for name, contents in data_of_runs(study).items():
        if len(contents) > 1:
            clashes.append(f"the runs read {name!r} as different data: " + "; ".join(
                f"{describe_data(meta, runs)}, e.g. {runs[0]}" for meta, runs in contents.values()))
    if clashes:
        more = f"; and {len(clashes) - 3} more" if len(clashes) > 3 else ""
        raise ValueError(f"{len(clashes)} run folder(s) in {study['runs_dir']} hold runs made with other settings "
                         f"than this study's, which it would take as its own: {'; '.join(clashes[:3])}{more}. To "
                         f"fix it, {clash_fix(study, code_changed)}")


def check_data(study):
    """-> the dataset folders the runs read. FileNotFoundError / ValueError if one is missing, damaged or too
    short for block_size (each run would fail), or is not the data of the runs already in the runs folder."""
    folders, made_on = set(), data_of_runs(study)
    for arm in study["arms"]:
        cfg = arm_config(study, arm)
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
                raise ValueError(f"the dataset {folder} is {describe_data(meta)}, but {study['runs_dir']} holds "
                                 f"{describe_data(saved, runs)}, e.g. {runs[0]}: prepare it again as they were "
                                 f"(their config.json's dataset_meta), or {clash_fix(study)}")
        folders.add(folder)
    return sorted(folders)


# ------------------------------------------------------------------------------------------ the search
def final_row(out_dir):
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


def is_final(row, max_iters):
    """Whether a run's last metrics row ends it: it reached max_iters, or it diverged (rerunning gives the same)."""
    return row is not None and (is_diverged(row) or row["iter"] >= max_iters)


def elapsed_seconds(rows):
    """Training seconds at each metrics row (evals excluded): the running sum of ms_per_iter x iterations."""
    steps = np.diff([0] + [row["iter"] for row in rows])
    return np.cumsum([(row.get("ms_per_iter") or 0.0) / 1000 * n for row, n in zip(rows, steps)]).tolist()


def is_finished(study, arm, lr, seed):
    return is_final(final_row(run_dir(study, arm, lr, seed)), run_config(study, arm, lr, seed)["max_iters"])


def seed_losses(study, arm, lr):
    """The final loss of each selection seed's run (inf if it diverged); None while any is unfinished."""
    losses = []
    for seed in study["selection_seeds"]:
        row = final_row(run_dir(study, arm, lr, seed))
        if not is_final(row, run_config(study, arm, lr, seed)["max_iters"]):
            return None
        loss = final_val_loss(row)
        losses.append(math.inf if loss is None else loss)
    return losses


def selection_loss(study, arm, lr):
    """Mean final loss over the selection seeds; inf if any diverged; None while any is unfinished."""
    losses = seed_losses(study, arm, lr)
    return None if losses is None else sum(losses) / len(losses)


def pick_best_lr(losses):
    """{lr: loss, or None/inf/nan (unfinished or diverged)} -> the lr with the lowest finite loss (the smaller
    lr on a tie), or None if there is none. The one best-learning-rate rule of sweep.py and report.py."""
    done = {lr: loss for lr, loss in losses.items() if loss is not None and math.isfinite(loss)}
    return min(done, key=lambda lr: (done[lr], lr)) if done else None


def round_lr(lr):
    """Learning rates made by extension or half steps, to 3 significant digits (readable run names)."""
    return float(f"{lr:.3g}")


# A final run that has not trained like its arm's others by half-way is flagged: one definition for the search's
# stall rule (stalled alone: selection runs have no group), every report table and a ladder's handling of flags.
STALL_AT, STALL_DROP, LATE_BY, LATE_GROUP = 0.5, 0.05, 0.05, 3
STALL_TEXT = (f"A run is *stalled* when at the first eval at or after {STALL_AT:.0%} of its steps its val loss "
              f"(fixed windows) is still within {STALL_DROP:.0%} of its loss at the first eval after step 0 (it has "
              f"not left the early plateau). A final run is *late* when it is not stalled but its val loss there is "
              f"{LATE_BY:.0%} or more above the median of its arm's final runs (all at one rate and horizon; "
              f"{LATE_GROUP} or more of them, else only the plateau rule applies): it left the plateau later "
              f"than they did. Both are *flagged*; an arm's stall rate counts both.")
LADDER_FLAGS = ("In a ladder, a pair with a flagged final run is left out of its rung's Δ and so of the trend over "
                "the rungs (the table counts them): one stalled seed would otherwise decide the slope. A reading "
                "that finds no change where pairs were left out says so: it has less power than the design.")
STALL_RULE = ("With stall_margin m, a rate is chosen only if no selection run stalled or diverged at it or at any "
              "swept rate less than m times above it (a 1% allowance for the 3-digit rates): m = 2 keeps the "
              "choice a x2 step below the first failure above it, since a rate next to one whose runs stall stalls "
              "on other seeds too (results/lr_sensitivity_cpu/reading.md). Failures below a rate do not count "
              "against it (a rate too low to leave the plateau by half-way reads as stalled too). The search runs "
              "no half step the rule rules out, and extends downward while it rules out every swept rate.")


def half_way(rows, max_iters):
    """A run's (first eval after step 0, first eval at or after STALL_AT of its steps) rows, or None before that."""
    evals = [r for r in rows if r["iter"] > 0 and r.get("val_loss") is not None and math.isfinite(r["val_loss"])]
    mid = next((r for r in evals if r["iter"] >= STALL_AT * max_iters), None)
    return None if mid is None or mid is evals[0] else (evals[0], mid)


def is_stalled(rows, max_iters):
    """True or False (STALL_TEXT) for a run's metrics rows, None while it cannot tell (half_way)."""
    half = half_way(rows, max_iters)
    return None if half is None else half[1]["val_loss"] > (1 - STALL_DROP) * half[0]["val_loss"]


def flag_finals(finals):
    """{seed: read_run} of one arm's final runs -> each run's flag and why (STALL_TEXT), set in place."""
    half = {s: half_way(r["rows"], r["max_iters"]) for s, r in finals.items() if r["status"] == "done"}
    half = {s: h for s, h in half.items() if h}
    median = float(np.median([mid["val_loss"] for _, mid in half.values()])) if len(half) >= LATE_GROUP else math.inf
    for s, r in finals.items():
        first, mid = half.get(s, (None, None))
        if r["stalled"]:
            r["why"] = f"{mid['val_loss'] / first['val_loss'] - 1:+.1%} from iter {first['iter']}"
        elif mid and mid["val_loss"] >= (1 + LATE_BY) * median:
            r["flag"], r["why"] = "late", f"{mid['val_loss'] / median - 1:+.1%} over the median {median:.3f}"
        if r["flag"]:
            r["why"] = f"{mid['val_loss']:.3f} at iter {mid['iter']}, {r['why']}"


def stall_rule(study, arm, swept):
    """The stall rule (STALL_RULE) over an arm's swept rates (a list the search may extend) -> a function lr ->
    the failed rate that rules lr out, or None where the rule allows lr (always, without a stall_margin)."""
    m = study["stall_margin"]
    if not m:
        return lambda lr: None
    max_iters = arm_config(study, arm)["max_iters"]  # every run's (check_arms)

    @functools.cache
    def failed(lr):
        return any((rows := read_metrics(run_dir(study, arm, lr, seed)))
                   and (is_diverged(rows[-1]) or is_stalled(rows, max_iters)) for seed in study["selection_seeds"])
    return lambda lr: next((f for f in sorted(swept) if lr <= f and lr > f / m * 1.01 and failed(f)), None)


def search(study, arm):
    """Where an arm's learning-rate search stands, replayed from the finished runs: dict(due=[(arm, lr, seed)] to
    run next, swept, best=its best rate once the search is complete (else None), notes, losses={lr: selection
    loss}, allowed=[the swept rates the stall rule allows])."""
    sel = study["selection_seeds"]
    swept, notes = list(study["grids"][arm]), []
    if not sel:  # one given learning rate, nothing to choose
        return dict(due=[], swept=swept, best=swept[0], notes=["learning rate given, not searched"], losses={},
                    allowed=swept)
    runs = lambda lrs: [(arm, lr, s) for lr in lrs for s in sel if not is_finished(study, arm, lr, s)]
    out = lambda due, best=None: dict(due=due, swept=sorted(swept), best=best, notes=notes,
                                      losses={lr: selection_loss(study, arm, lr) for lr in sorted(swept)},
                                      allowed=[lr for lr in sorted(swept) if ruled_out(lr) is None])
    ruled_out = stall_rule(study, arm, swept)  # (swept grows below: the rule reads it as it is then)
    best = lambda: pick_best_lr({lr: selection_loss(study, arm, lr) for lr in swept if ruled_out(lr) is None})
    if runs(swept):  # (1) the grid
        return out(runs(swept))
    ratio = swept[1] / swept[0]  # the grid's step (a search has two rates or more: check_grids)
    for extensions in range(study["max_extensions"] + 1):  # (2) extend while the best is at an edge
        lr, lo, hi = best(), min(swept), max(swept)
        if lr is None and not any(map(ruled_out, swept)):
            notes.append("every swept learning rate diverged")
            return out([])
        if lr is None:  # the stall rule rules out every swept rate: look lower
            notes.append("the stall rule rules out every swept rate")
        elif lr not in (lo, hi):
            break
        if extensions == study["max_extensions"]:
            notes.append(f"best rate {lr or lo:g} is still at the edge after {extensions} extensions")
            break
        new = round_lr(lr * ratio if lr == hi and lr != lo else (lr or lo) / ratio)
        notes.append(f"best rate {lr or lo:g} was at the {'upper' if new > hi else 'lower'} edge: added {new:g}")
        swept.append(new)
        if runs([new]):
            return out(runs([new]))
    if study["half_steps"] and best() is not None:  # (3) half steps around the best that the rule allows
        lr = best()
        swept += [h for h in (round_lr(lr / math.sqrt(2)), round_lr(lr * math.sqrt(2)))
                  if h not in swept and ruled_out(h) is None]
        if runs(swept):
            return out(runs(swept))
    lr, ruled = best(), {r: ruled_out(r) for r in swept if ruled_out(r) is not None}
    if ruled:
        notes.append("stall rule: " + ", ".join(f"{r:g}" for r in ruled) + " ruled out (a selection run stalled "
                     "or diverged at " + ", ".join(sorted({f"{f:g}" for f in ruled.values()})) + ")")
    if lr is None:  # the rule rules out every swept rate, after every extension
        finite = [r for r in swept if (selection_loss(study, arm, r) or math.inf) < math.inf]
        lr = min(finite, default=None)
        notes.append("every swept learning rate diverged" if lr is None else
                     f"the stall rule rules out every swept rate: chose the lowest with a finite loss, {lr:g}")
    return out([], best=lr)


def plan(study, arm):
    """An arm's search (with horizons, horizon_plan), then its final runs: search's dict with due its unfinished
    final runs, chosen=lr once the search is complete (else None), finals_at=[the rates its final seeds run at]."""
    if study["horizons"]:
        return horizon_plan(study, arm)
    p = {**search(study, arm), "chosen": None, "finals_at": []}
    if p["due"] or p["best"] is None:
        return p
    lr = p["best"]
    due = [(arm, lr, s) for s in final_seeds(study, arm) if not is_finished(study, arm, lr, s)]
    return {**p, "due": due, "chosen": lr, "finals_at": [lr]}  # (4) the best of all swept rates on the final seeds


def horizon_plan(study, arm):
    """plan with horizons: the arm's search at every horizon (runs named h<h>/<arm>), then the final seeds at the
    carried rate (horizon_fit) and with short_pick at the shortest horizon's; with searches={"h<h>": search}, fit."""
    searches = {h: search(sub, arm) for h, sub in study["horizon_studies"].items()}
    p = dict(due=[(f"{h}/{arm}", lr, s) for h, q in searches.items() for _, lr, s in q["due"]], swept=[], losses={},
             notes=[f"{h}: {note}" for h, q in searches.items() for note in q["notes"]], chosen=None, short=None,
             finals_at=[], searches=searches, fit=None)
    if p["due"] or any(q["best"] is None for q in searches.values()):
        return p
    fit = horizon_fit(study, arm, searches)
    short = searches[f"h{study['horizons'][0]}"]["best"] if study["short_pick"] else None
    rates = list(dict.fromkeys(r for r in (fit["carried"], short) if r is not None))
    due = [(arm, lr, s) for lr in rates for s in final_seeds(study, arm) if not is_finished(study, arm, lr, s)]
    return {**p, "due": due, "chosen": fit["carried"], "short": short, "finals_at": rates, "fit": fit}


def horizon_fit(study, arm, searches, boot=0):
    """fit_horizons on an arm's selection runs at each horizon (searches: horizon_plan's), at the rates allowed."""
    subs = study["horizon_studies"]
    curves = [{lr: seed_losses(subs[h], arm, lr) for lr in sorted({*q["allowed"], q["best"]})}
              for h, q in searches.items()]
    tokens = [run_tokens(arm_config(sub, arm)) for sub in subs.values()]
    return fit_horizons(tokens, curves, run_tokens(arm_config(study, arm)), boot)


def curve_minimum(means):
    """{lr: mean selection loss} -> (lr*, edge): the minimum of the parabola in log(lr) through the best rate and
    its two neighbours, or the best rate itself (edge=True) where it is the lowest or highest finite rate."""
    best, rates = pick_best_lr(means), sorted(means)
    i = rates.index(best)
    near = rates[max(i - 1, 0):i + 2]
    if len(near) < 3 or i == 0 or not all(math.isfinite(means[lr]) for lr in near):
        return best, True
    a, b, _ = np.polyfit(np.log(near), [means[lr] for lr in near], 2)  # a >= 0: the middle point is the lowest
    return (float(np.exp(-b / (2 * a))), False) if a > 0 else (best, True)  # (a = 0: a flat curve)


def fit_horizons(tokens, curves, final_tokens, boot=0, seed=0):
    """The best rate carried to the final horizon: at each horizon (its training tokens D, its curve {lr: [final
    loss of each selection seed]}) lr*(D) by curve_minimum of the seeds' mean; then log lr* fitted linearly on
    log D, the power law LR*(D) = c D^-beta (Bjorck et al., ICLR 2025), read at final_tokens (3 significant
    digits). boot: that many bootstrap resamples of each horizon's seeds -> the 95% percentile intervals.
    -> dict(points=[(D, lr*, edge)], beta, carried, carried_ci, beta_ci; the intervals None without boot)."""
    x, final = np.log(tokens), math.log(final_tokens)

    def fit(curves):
        points = [curve_minimum({lr: float(np.mean(v)) for lr, v in c.items()}) for c in curves]
        slope, intercept = np.polyfit(x, np.log([lr for lr, _ in points]), 1)
        return points, -float(slope), float(np.exp(intercept + slope * final))
    points, beta, carried = fit(curves)
    out = dict(points=[(d, lr, edge) for d, (lr, edge) in zip(tokens, points)], beta=beta, carried=round_lr(carried),
               carried_ci=None, beta_ci=None)
    if boot:
        rng, draws = np.random.default_rng(seed), []
        for _ in range(boot):
            picks = [rng.integers(0, len(next(iter(c.values()))), len(next(iter(c.values())))) for c in curves]
            draws.append(fit([{lr: np.asarray(v)[i] for lr, v in c.items()} for c, i in zip(curves, picks)])[1:])
        (b_lo, c_lo), (b_hi, c_hi) = np.percentile(draws, [2.5, 97.5], axis=0)
        out.update(beta_ci=(float(b_lo), float(b_hi)), carried_ci=(float(c_lo), float(c_hi)))
    return out


def due_runs(study):
    """Every run due now over all arms, seed by seed: a study stopped half-way has whole curves on its first seeds
    rather than every seed of its first arms."""
    due = [run for arm in study["arms"] for run in plan(study, arm)["due"]]
    seeds = study["selection_seeds"] + study["seeds"]
    return sorted(due, key=lambda run: seeds.index(run[2]))  # stable: arms and rates keep their order


def run_list(study, arm):
    """Every run of an arm the plan has named so far, selection (at every horizon) and final."""
    p, sel = plan(study, arm), study["selection_seeds"]
    runs = [(f"{h}/{arm}", lr, s) for h, q in p.get("searches", {}).items() for lr in q["swept"] for s in sel]
    runs += [(arm, lr, s) for lr in p["swept"] for s in sel]
    return runs + [(arm, lr, s) for lr in p["finals_at"] for s in final_seeds(study, arm)]


def arm_run_counts(study, arm):
    """-> (fewest, most, finals): an arm's selection runs without and with every grid extension, and its final
    runs."""
    finals, sel = len(final_seeds(study, arm)) * (1 + study["short_pick"]), len(study["selection_seeds"])
    grid, halves, n = len(study["grids"][arm]), 2 * study["half_steps"], len(study["horizons"] or [None])
    return (grid + halves) * sel * n, (grid + study["max_extensions"] + halves) * sel * n, finals


def study_progress(study):
    """'N of the study's F-M runs finished': F and M are the fewest and the most runs its search can make."""
    counts = [arm_run_counts(study, arm) for arm in study["arms"]]
    fewest, most = sum(c[0] + c[2] for c in counts), sum(c[1] + c[2] for c in counts)
    finished = sum(is_finished(study, *run) for arm in study["arms"] for run in run_list(study, arm))
    return f"{finished} of the study's {fewest if fewest == most else f'{fewest}-{most}'} runs finished"


# ------------------------------------------------------------------------------ a study's runs, as read for its report
def read_run(study, arm, lr, seed):
    """One run -> dict(status: done | diverged | unfinished | missing, final: its final loss once done, rows,
    stalled, flag (collect sets late), config, ...)."""
    out_dir = run_dir(study, arm, lr, seed)
    rows, max_iters = read_metrics(out_dir), run_config(study, arm, lr, seed)["max_iters"]
    last = rows[-1] if rows else {}
    status = ("missing" if not rows else "diverged" if is_diverged(last) else
              "done" if last["iter"] >= max_iters else "unfinished")
    return dict(arm=arm, lr=lr, seed=seed, out_dir=out_dir, status=status, iter=last.get("iter"),
                max_iters=max_iters, final=final_val_loss(last) if status == "done" else None, rows=rows,
                stalled=(stalled := status == "done" and bool(is_stalled(rows, max_iters))),
                flag="stalled" if stalled else None, why=None,
                config=read_saved_config(os.path.join(out_dir, "config.json")))


def collect(study):
    """{arm: dict(plan, search={(lr, seed) or ("h<h>", lr, seed): run}, finals={seed: run}, short={seed: run})}."""
    data = {}
    for arm in study["arms"]:
        p = plan(study, arm)
        search = {(lr, s): read_run(study, arm, lr, s) for lr in p["swept"] for s in study["selection_seeds"]}
        search.update({(h, lr, s): read_run(study["horizon_studies"][h], arm, lr, s) for h, q in p.get(
            "searches", {}).items() for lr in q["swept"] for s in study["selection_seeds"]})
        finals, short = ({s: read_run(study, arm, lr, s) for s in final_seeds(study, arm)} if lr is not None else {}
                         for lr in (p["chosen"], p.get("short")))
        flag_finals(finals)
        data[arm] = dict(plan=p, search=search, finals=finals, short=short)
    return data


def all_runs(data):
    return [r for d in data.values() for r in (*d["search"].values(), *d["finals"].values())]


def count(runs, *statuses):
    return sum(r["status"] in statuses for r in runs)


def final_losses(d, flagged=True):
    """{seed: final loss} of an arm's finished final runs, the flagged ones (STALL_TEXT) left out unless flagged."""
    return {s: r["final"] for s, r in d["finals"].items() if r["final"] is not None and (flagged or not r["flag"])}


def swept_rates(data):
    return sorted({lr for d in data.values() for lr in d["plan"]["swept"]})


def run_tokens(cfg):
    """Training tokens of one run of a resolved config: max_iters x accumulation x micro-batch x block_size."""
    return cfg["max_iters"] * cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["block_size"]
