"""
Run a study: every arm gets the same learning-rate sweep, then its best learning rate is rerun with more seeds.

    python sweep.py studies/enwiki_cpu.py               # run it here, one run after another (or --jobs 2)
    python sweep.py studies/enwiki_cpu.py --print 8     # print the torchrun commands for a cluster instead
    python report.py studies/enwiki_cpu.py              # the markdown table and the plot

A study file is plain Python that sets: name, config (a train.py config file), overrides (dict, for all arms),
arms (dict: arm name -> dict of overrides), learning_rates (list), seeds (list; the sweep uses seeds[0]),
and optionally out_root (default "runs"). Each run gets its own out_dir, out_root/<name>/<arm>/lr<lr>_seed<seed>.
A run whose metrics.jsonl already reaches max_iters is skipped; one with a checkpoint resumes from it (exact
resume, so the result is the same as an uninterrupted run). Stop the sweep at any time and start it again.
"""
import argparse
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from common import EXIT_DIVERGED, parse_config, read_config_file, read_metrics

TRAIN_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
STUDY_KEYS = ("name", "config", "overrides", "arms", "learning_rates", "seeds")


def load_study(path):
    """Study file -> dict. ValueError names a missing key, an unknown train.py key or a bad value."""
    namespace = read_config_file(path)  # plain Python, like a config file
    missing = [k for k in STUDY_KEYS if k not in namespace]
    if missing:
        raise ValueError(f"study file {path} does not set {', '.join(missing)}")
    study = {k: namespace[k] for k in STUDY_KEYS}
    study["out_root"] = namespace.get("out_root", "runs")
    checks = {"arms": isinstance(study["arms"], dict) and study["arms"],
              "learning_rates": isinstance(study["learning_rates"], list) and study["learning_rates"]
              and all(isinstance(lr, (int, float)) and lr > 0 for lr in study["learning_rates"]),
              "seeds": isinstance(study["seeds"], list) and study["seeds"]
              and all(isinstance(seed, int) for seed in study["seeds"])}
    for key, ok in checks.items():
        if not ok:
            raise ValueError(f"study file {path}: {key} must be a non-empty "
                             + {"arms": "dict", "learning_rates": "list of positive numbers",
                                "seeds": "list of ints"}[key])
    for arm in study["arms"]:  # resolve every arm now: a typo or a bad value fails here, not hours into the sweep
        run_config(study, arm, study["learning_rates"][0], study["seeds"][0])
    return study


def run_dir(study, arm, lr, seed):
    return os.path.join(study["out_root"], study["name"], arm, f"lr{lr:g}_seed{seed}")


def run_args(study, arm, lr, seed):
    """The train.py arguments of one run: config file, then shared overrides, then the arm's, lr, seed, out_dir."""
    overrides = {**study["overrides"], **study["arms"][arm], "learning_rate": lr, "min_lr": lr / 10,
                 "seed": seed, "out_dir": run_dir(study, arm, lr, seed)}
    return [study["config"]] + [f"--{k}={v}" for k, v in overrides.items()]


def torchrun_command(study, arm, lr, seed, nproc):
    """The torchrun line of one run on nproc processes, with the same global batch and the same windows.

    gradient_accumulation_steps must divide among the processes; if it does not, the micro-batch is split
    instead (batch_size / nproc, accumulation x nproc): train.py draws the step's windows as one flat
    sequence, so the runs see the same data. ValueError if neither divides.
    """
    args, cfg = run_args(study, arm, lr, seed), run_config(study, arm, lr, seed)
    accum, batch = cfg["gradient_accumulation_steps"], cfg["batch_size"]
    if accum % nproc:
        if batch % nproc:
            raise ValueError(f"neither gradient_accumulation_steps={accum} nor batch_size={batch} divides "
                             f"among {nproc} processes; pick another --print count")
        args += [f"--batch_size={batch // nproc}", f"--gradient_accumulation_steps={accum * nproc}"]
    return f"torchrun --standalone --nproc_per_node={nproc} train.py " + " ".join(args)


def run_config(study, arm, lr, seed):
    return parse_config(run_args(study, arm, lr, seed))


# Keys that do not change a run's results; any other difference means the run dir holds another experiment.
NOT_EXPERIMENT = {"init_from", "log_interval", "wandb_log", "wandb_project", "wandb_run_name", "device", "dtype",
                  "compile", "fsdp"}


def check_settings(study, arm, lr, seed):
    """ValueError if the run dir already holds a run whose saved config differs from what the study asks now
    (e.g. the study file was edited): its results would be silently reused."""
    path = os.path.join(run_dir(study, arm, lr, seed), "config.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        saved = json.load(f)
    wanted = run_config(study, arm, lr, seed)
    diff = {k: (saved.get(k), v) for k, v in wanted.items() if k not in NOT_EXPERIMENT and saved.get(k) != v}
    if diff:
        raise ValueError(f"{os.path.dirname(path)} holds a run with other settings (saved, study): {diff}; "
                         f"delete it, or give the changed study a new name")


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
    return row is not None and (is_diverged(row) or row["iter"] >= run_config(study, arm, lr, seed)["max_iters"])


def pick_best_lr(final_losses):
    """{lr: final val loss, or None (unfinished or diverged)} -> the lr with the lowest loss, or None if there
    is none. The one best-learning-rate rule of sweep.py and report.py."""
    done = {lr: loss for lr, loss in final_losses.items() if loss is not None and math.isfinite(loss)}
    return min(done, key=done.get) if done else None


def best_lr(study, arm):
    """The swept learning rate with the lowest final val loss for this arm (seeds[0]); None while unfinished."""
    seed = study["seeds"][0]
    if not all(is_finished(study, arm, lr, seed) for lr in study["learning_rates"]):
        return None
    return pick_best_lr({lr: final_val_loss(final_row(run_dir(study, arm, lr, seed)))
                         for lr in study["learning_rates"]})


def launch(study, arm, lr, seed, threads):
    """Run (or resume) one training run as a subprocess; its log goes to out_dir/train.log.

    Returns None when the run finished or diverged (both recorded in its metrics.jsonl), else a line saying
    that it failed and where its log is: one failed run never stops the others.
    """
    if lr is None:  # phase 2 of an arm whose every swept rate diverged
        print(f"skipped: {arm} seed={seed} (no learning rate of its sweep finished without diverging)", flush=True)
        return None
    check_settings(study, arm, lr, seed)
    if is_finished(study, arm, lr, seed):
        print(f"done already: {arm} lr={lr:g} seed={seed}", flush=True)
        return None
    out_dir = run_dir(study, arm, lr, seed)
    os.makedirs(out_dir, exist_ok=True)
    args = run_args(study, arm, lr, seed)
    if os.path.exists(os.path.join(out_dir, "ckpt.pt")):
        args.append("--init_from=resume")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    print(f"running: {arm} lr={lr:g} seed={seed} -> {out_dir}", flush=True)
    log_path = os.path.join(out_dir, "train.log")
    with open(log_path, "a") as log:
        code = subprocess.run([sys.executable, TRAIN_PY, *args], stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if code == EXIT_DIVERGED and is_diverged(final_row(out_dir)):
        print(f"diverged: {arm} lr={lr:g} seed={seed} (recorded; the sweep goes on)", flush=True)
    elif code != 0:
        print(f"FAILED: {arm} lr={lr:g} seed={seed} (exit code {code}); see {log_path}", flush=True)
        return f"{out_dir} failed (exit code {code}); see {log_path}"
    return None


def phases(study):
    """Phase 1: each arm x each learning rate at seeds[0]. Phase 2: each arm's best rate x the other seeds."""
    sweep = [(arm, lr, study["seeds"][0]) for arm in study["arms"] for lr in study["learning_rates"]]
    rerun = lambda: [(arm, best_lr(study, arm), seed) for arm in study["arms"] for seed in study["seeds"][1:]]
    return sweep, rerun


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", help="study file, e.g. studies/enwiki_cpu.py")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time on this machine")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS per run (default: torch's)")
    parser.add_argument("--print", type=int, metavar="NPROC", dest="nproc",
                        help="print torchrun commands with this many processes per run instead of running")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    study = load_study(args.study)
    sweep, rerun = phases(study)
    if args.nproc:
        print("\n".join(torchrun_command(study, *run, args.nproc) for run in sweep))
        if any(lr is None for _, lr, _ in rerun()):
            print("# phase 2 (best learning rate x other seeds): run this again once the runs above have finished")
        else:
            print("\n".join(torchrun_command(study, *run, args.nproc) for run in rerun()))
        return
    with ThreadPoolExecutor(args.jobs) as pool:
        failed = [f for f in pool.map(lambda run: launch(study, *run, args.threads), sweep) if f]
        failed += [f for f in pool.map(lambda run: launch(study, *run, args.threads), rerun()) if f]  # phase 1's
    print(json.dumps({arm: best_lr(study, arm) for arm in study["arms"]}))
    if failed:
        raise RuntimeError(f"{len(failed)} run(s) failed; the others finished:\n" + "\n".join(failed))


if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit("interrupted; run the same command again to resume (finished runs are kept)")
