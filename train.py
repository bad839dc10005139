"""
Train a GPT (model.py) with a linear, identity or nonlinear attention query.

    python train.py config/shakespeare_char.py --query_mode=nonlinear       # one process (CPU, one GPU, MPS)
    torchrun --standalone --nproc_per_node=8 train.py config/nlq_small.py   # DDP on 8 GPUs
    torchrun --standalone --nproc_per_node=8 train.py config/nlq_large.py   # FSDP (fsdp=True) on 8 GPUs

Data: data_dir/dataset as prepare_data.py writes it. Tiny Shakespeare (dataset shakespeare_char or shakespeare)
ships with nlq and is prepared on first use; every other dataset is prepared with prepare_data.py first.
Configuration: the defaults (common.DEFAULTS; the model's come from model.GPTConfig), then a config file
(plain Python assignments), then --key=value overrides. Unknown keys and values of the wrong type are errors.
gradient_accumulation_steps is the global number of micro-batches per optimizer step; under DDP each rank does
its share, and every rank draws the same global stream of windows, so the data order does not depend on the
number of processes. fsdp=True shards the weights, gradients and AdamW states over the processes (FSDP2)
instead of replicating them (DDP); checkpoints are the same single file either way, so a run can resume on any
number of processes, with or without FSDP.

Numbers that go bad are data, not crashes: an eval whose loss is NaN/inf is logged, never checkpointed, and
stops the run; so do max_nonfinite_steps consecutive steps with a non-finite training loss. The run then exits
with status 3 (EXIT_DIVERGED), and the last finite checkpoint stays in place.

Preemption: SIGTERM, SIGUSR1 or SIGUSR2 (what SLURM sends before it preempts a job or ends it at its time limit;
submitit's default is USR2) let the current optimizer step finish, save a checkpoint at that step boundary (the
full state, as at an eval: model, optimizer, every rank's RNG, iter, tokens) and exit with status 144
(EXIT_PREEMPTED, common.py says why 144). Under torchrun the ranks agree on the stop at every step, so a signal
that reaches one rank stops them all at the same step. --init_from=resume then continues exactly where the run
stopped: the same weights, bit for bit, as a run never stopped. Ctrl-C (SIGINT) stops at once and exits with
status 130 (EXIT_INTERRUPTED): during a step it keeps the last eval's checkpoint (a step half done cannot be
saved); during an eval (the final whole-split eval can take an hour) it checkpoints the step boundary first, as a
stop signal does, so no training is lost.
"""
import errno
import json
import math
import os
import shlex
import signal
import sys
import threading
import time
import warnings
from contextlib import ExitStack, contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from common import (DEFAULTS, EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_PREEMPTED, MODEL_KEYS, NOT_RESULTS,
                    EvalStopped, atomic_write_text, autocast, check_fsdp_support, check_model_fits,
                    check_same_dataset, code_version, damaged_checkpoint, end_distributed, estimate_loss,
                    eval_window_count, eval_windows, format_config, full_split_loss, full_split_windows, get_batch,
                    is_fsdp, is_locked, load_checkpoint, load_meta, make_writable_folder, model_config, open_split,
                    param_counts, parse_config, read_metrics, resolve_device, safe_exp, save_checkpoint,
                    lock_file, settings_help, setup_distributed, shard_model, split_otherwise, use_compile,
                    validate, window_starts)
from model import GPT, GPTConfig, unused_query_settings
from prepare_data import BIN_FILES, SHIPPED_DATASETS, DataError, not_a_folder, prepare_shipped

# Settings a resumed run must share with its checkpoint, besides the model's: they define the experiment. (The
# optimizer's state would silently keep the old betas and weight decay; a new seed would redraw the eval
# windows.) What may change: the run's length and layout (max_iters, lr_decay_iters with a warning, batch shape,
# processes, device, dtype, compile, evals and logging).
RESUME_FIXED = MODEL_KEYS + ("dataset", "lr_schedule", "decay_lr", "learning_rate", "min_lr", "warmup_iters",
                             "beta1", "beta2", "weight_decay", "grad_clip", "seed")
# Progress bars for the fixed-window evals above this many forward FLOPs (a minute or more on a CPU), and a
# line before and after each checkpoint write above this many bytes.
LARGE_EVAL_FLOPS = 1e13
LARGE_CHECKPOINT_BYTES = 100e6


class TrainingDiverged(RuntimeError):
    """The loss became NaN/inf; the message names the iteration, the last finite checkpoint and what to
    try."""


class CheckpointNotWritten(RuntimeError):
    """The checkpoint could not be written (a full disk, a quota); the previous one is intact (written
    atomically), and the message says how to go on."""


class TrainingPreempted(RuntimeError):
    """A stop signal (SIGTERM, SIGUSR1, SIGUSR2) ended the run at a step boundary, after a checkpoint there; the
    message names the iteration and the checkpoint. train.py exits with EXIT_PREEMPTED."""


# ------------------------------------------------------------------------------------- stop signals
# What a cluster sends before it takes the machine away: SLURM sends SIGTERM at a preemption and at the time
# limit, or the signal of sbatch --signal (USR1 by convention; submitit asks for USR2 and delivers it to every
# process of the job step, train.py included, whose default action for it would be to die mid-step).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


class StopSignals:
    """While entered (a with block, in the main thread), STOP_SIGNALS set .received to the first signal's name
    instead of killing the process; the training loop reads it at the end of each step. The previous handlers
    come back on exit. Off the main thread Python cannot install handlers: nothing is installed."""

    def __init__(self):
        self.received, self._previous = None, {}

    def _handle(self, signum, frame):
        self.received = self.received or signal.Signals(signum).name

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @contextmanager
    def paused(self):
        """A with block in which the stop signals and Ctrl-C end the process at once (their default action),
        for a call that blocks in C++ where no Python handler runs: the process group's rendezvous, waiting
        for a rank that never comes. Nothing is written before it, so nothing is lost."""
        if not self._previous:  # off the main thread: nothing was installed
            yield
            return
        ours = {sig: signal.signal(sig, signal.SIG_DFL) for sig in (*STOP_SIGNALS, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in ours.items():
                signal.signal(sig, handler)


# ------------------------------------------------------------------------------------------- the schedule
def get_lr(it, cfg, decay_iters=None):
    """Learning rate at iteration it: linear warmup (lr(0) > 0), then cosine or linear decay (lr_schedule) to
    min_lr at decay_iters (default: lr_decay_iters, else max_iters), then flat at min_lr."""
    if not cfg["decay_lr"]:
        return cfg["learning_rate"]
    decay_iters = decay_iters or cfg["lr_decay_iters"] or cfg["max_iters"]
    if it < cfg["warmup_iters"]:
        return cfg["learning_rate"] * (it + 1) / (cfg["warmup_iters"] + 1)
    if it >= decay_iters:
        return cfg["min_lr"]
    progress = (it - cfg["warmup_iters"]) / max(1, decay_iters - cfg["warmup_iters"])  # 0 -> 1
    weight = 1 - progress if cfg["lr_schedule"] == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
    return cfg["min_lr"] + weight * (cfg["learning_rate"] - cfg["min_lr"])


# --------------------------------------------------------------------------------------- resume, logs
def check_out_dir_is_ours(cfg):
    """ValueError, before anything is written, if out_dir is the init_from folder, holds a Hugging Face export
    (model.safetensors, or a config.json that is not train.py's) or a prepared dataset (meta.json, the bins),
    or is the repository: the run writes its own files there, and the other folder could no longer be loaded
    (or be told apart from a run); and, for a new run (not init_from=resume), if it holds
    a finished run without its checkpoint (a committed study run), whose results the new run would replace. A
    folder of an nlq run stopped before its first checkpoint may start again."""
    out, source = cfg["out_dir"], cfg["init_from"]
    if source not in ("scratch", "resume") and os.path.isdir(source) and os.path.isdir(out) \
            and os.path.samefile(out, source):
        raise ValueError(f"out_dir {out} is the init_from folder: the run would overwrite its config.json; "
                         f"give the run a new out_dir (e.g. --out_dir=out/NAME)")
    if not os.path.isdir(out):
        return
    found = [f for f in ("model.safetensors", *BIN_FILES) if os.path.lexists(os.path.join(out, f))]
    if os.path.samefile(out, os.path.dirname(os.path.abspath(__file__))):
        found.append("nlq's own code: out_dir is the repository")
    path, saved = os.path.join(out, "config.json"), {}
    if os.path.exists(path):
        try:
            with open(path) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            saved = None
        ours = isinstance(saved, dict) and "model_type" not in saved and {"out_dir", "model_args"} <= set(saved)
        kind = saved.get("model_type") if isinstance(saved, dict) else None
        if saved is None:
            found.append("a config.json that is not JSON")
        elif not ours:
            found.append("a config.json that is not train.py's" + (f" (model_type {kind!r})" if kind else ""))
    if found:
        raise ValueError(f"out_dir {out} holds a Hugging Face export, a prepared dataset or another program's "
                         f"files ({', '.join(found)}): the run would write its checkpoint and config.json among "
                         f"them; give the run a new out_dir (e.g. --out_dir=out/NAME)")
    rows = read_metrics(out) if cfg["init_from"] != "resume" else []
    if rows and not os.path.exists(os.path.join(out, "ckpt.pt")) \
            and (rows[-1].get("diverged") or rows[-1]["iter"] >= saved.get("max_iters", math.inf)):
        # a finished run whose checkpoint is gone (a committed study run keeps only its metrics and config):
        # starting again would replace its results; one stopped before its first checkpoint may start again
        raise ValueError(f"out_dir {out} holds a finished run (metrics.jsonl up to iter {rows[-1]['iter']}, no "
                         f"ckpt.pt): a new run there would replace its results; give the run a new out_dir "
                         f"(e.g. --out_dir=out/NAME), or delete the folder to run it again")


def hold_out_dir(out_dir, held):
    """Lock out_dir/.lock for this run (fcntl.flock; the lock goes when the process ends, however it ends, and
    held, an ExitStack, closes the file). ValueError if another train.py holds it: two runs would write one
    checkpoint (e.g. a sweep restarted beside an orphan of a killed one), or if .lock is a folder. No lock where
    fcntl is missing."""
    path = os.path.join(out_dir, ".lock")
    if os.path.isdir(path):
        raise ValueError(f"{path} is a folder; train.py keeps its lock in a file of that name: move or remove "
                         f"the folder (it is not train.py's), then run again")
    try:
        lock = lock_file(path)
    except BlockingIOError:
        raise ValueError(in_use_message(out_dir)) from None
    if lock is not None:
        held.enter_context(lock)


def in_use_message(out_dir):
    """The error for an out_dir whose .lock another train.py holds."""
    return (f"out_dir {out_dir} is in use by another train.py (it holds {out_dir}/.lock): two runs would write "
            f"one checkpoint; wait for it to end or stop it, or use another out_dir")


def checkpoint_to_resume(cfg, model_cfg, ckpt_path, meta, data_dir):
    """The checkpoint to resume from, or None for init_from=scratch (or GPT-2's weights). meta: the meta.json
    dict of the dataset at data_dir, its folder.

    ValueError if out_dir is a file or cannot be written, a scratch run would overwrite a checkpoint, or a
    resumed run reads other data (check_same_dataset: first, since other data may also size another
    vocabulary) or asks for other RESUME_FIXED settings (model, dataset, optimizer, seed) than its checkpoint's.
    """
    if os.path.exists(cfg["out_dir"]) and not os.path.isdir(cfg["out_dir"]):
        raise ValueError(f"out_dir {cfg['out_dir']} is a file; choose a folder")
    try:  # a folder that cannot be made or written fails now, not at the first checkpoint
        make_writable_folder(cfg["out_dir"])
    except OSError as e:
        in_the_way = not_a_folder(cfg["out_dir"])  # a file above it, or a link to nothing
        raise ValueError(f"cannot write to out_dir {cfg['out_dir']} ({e.strerror or e}); "
                         + ("{} is {}; ".format(*in_the_way) if in_the_way else "") + "choose a writable folder") from e
    if os.path.isdir(ckpt_path):
        raise ValueError(f"{ckpt_path} is a folder, not a checkpoint; move it away, or give the run a new out_dir")
    if cfg["init_from"] != "resume":
        if os.path.exists(ckpt_path):  # never overwrite a trained model by accident
            if is_locked(os.path.join(cfg["out_dir"], ".lock")):  # a run training there now: say that
                raise ValueError(in_use_message(cfg["out_dir"]))  # (a resume learns it from hold_out_dir)
            raise ValueError(f"{ckpt_path} exists; continue it with --init_from=resume, or pick a new "
                             f"out_dir (or delete the old run) to start from scratch")
        return None
    if not os.path.isfile(ckpt_path):
        rows = read_metrics(cfg["out_dir"])
        raise FileNotFoundError(f"init_from=resume but {ckpt_path} does not exist; " + (
            f"{cfg['out_dir']} holds only a run's log (metrics.jsonl up to iter {rows[-1]['iter']}: a committed "
            f"study run keeps no checkpoint), so there is nothing to resume; give the run a new out_dir"
            if rows else "use init_from=scratch"))
    ckpt = load_checkpoint(ckpt_path)
    # the same dataset name, other data: said first (older checkpoints lack dataset_meta; another name is a
    # setting that differs, below)
    if "dataset_meta" in ckpt and cfg["dataset"] == ckpt["config"].get("dataset"):
        check_same_dataset(ckpt["dataset_meta"], meta, data_dir)
    # the model as built (a None of the config resolved: mlp_hidden 4·n_embd, the mode's attention scale, the
    # data's vocabulary), so that attn_scale=0.1 at training and None now is a difference, not a silent change
    ours = {**{k: cfg[k] for k in RESUME_FIXED}, **vars(model_cfg)}
    theirs = {**ckpt["config"], **vars(GPTConfig(**ckpt["model_args"]))}  # resolved (older ones saved None)
    changed = {k: (ours[k], theirs.get(k, DEFAULTS[k])) for k in RESUME_FIXED
               if ours[k] != theirs.get(k, DEFAULTS[k])}
    if changed:  # the flags to give: the checkpoint's settings as its config had them (not what they resolved
        # to: a query_mode's default attn_scale, the data's vocab_size), for the keys the config sets otherwise
        saved = {k: ckpt["config"].get(k, DEFAULTS[k]) for k in changed}
        flags = " ".join(f"--{k}={v}" for k, v in saved.items() if v != cfg[k])
        raise ValueError(f"settings differ from the checkpoint's (yours, checkpoint's): {changed}; resume with "
                         f"the checkpoint's settings{f' ({flags})' if flags else ''} or start a new out_dir")
    return ckpt


def settings_changed_at_resume(saved, cfg, iter_num):
    """The settings a resume at iter_num changes, as a list of at most one record, [{"iter": iter_num,
    "changed": {key: [the checkpoint's value, this start's]}}], or []: the keys RESUME_FIXED lets change that
    can change what the run computes (tokens per step, max_iters, lr_decay_iters, the eval set, dtype, ...),
    not where it lives or how it logs (NOT_RESULTS, out_dir, data_dir: its contents are checked), nor a step
    or an eval set split into other batches (the same run). train.py keeps these records in the checkpoint
    and in config.json ("resumes"), whose settings are this start's: report.py shows a setting that changed
    half-way as such."""
    saved = {**DEFAULTS, **saved}  # a key added to nlq after the checkpoint was written: its default
    skip = NOT_RESULTS | {"out_dir", "data_dir"} | set(split_otherwise(saved, cfg))
    changed = {k: [saved[k], cfg[k]] for k in DEFAULTS if k not in skip and saved[k] != cfg[k]}
    return [dict(iter=iter_num, changed=changed)] if changed else []


def kept_on_resume(ckpt_path, cfg, log):
    """Settings a resumed run takes from its checkpoint rather than from its config -> {key: value}.

    - The eval set. With eval_windows unset, a run evaluates on eval_iters x batch_size windows; a resume with
      another batch_size would change the eval set half-way through the run's val-loss curve, so it keeps the
      checkpoint's number of windows (the same windows: they are drawn from the seed). An explicit
      eval_windows that differs is allowed, with a warning. A run with no eval logged yet (convert.py's
      runs) has no curve to keep.
    - The model keys of a run that started from GPT-2 weights: the GPT-2 set them on the first run, whatever
      the config said (hf.gpt2_settings), so a resume takes them from the checkpoint in the same way and needs
      no more flags than the first run did. Other runs' model keys come from their config and are checked
      against the checkpoint (checkpoint_to_resume).
    """
    ckpt = load_checkpoint(ckpt_path, mmap=True)  # its settings only; the weights are read later
    kept = {}
    saved_windows, windows = eval_window_count(ckpt["config"]), eval_window_count(cfg)
    curve = any(r.get("val_loss") is not None and r["iter"] <= ckpt["iter_num"]
                for r in read_metrics(cfg["out_dir"]))  # none yet (e.g. a convert.py run): nothing to keep
    converted = (initialised_from(cfg, ckpt) or "").startswith("convert.py")  # its log starts at its resume
    if not curve and ckpt["iter_num"] > 0 and not converted:
        warnings.warn(f"{os.path.join(cfg['out_dir'], 'metrics.jsonl')} holds no eval up to the checkpoint's "
                      f"iter {ckpt['iter_num']} (deleted or moved?): the log goes on from there, and the curve "
                      f"before it is lost; put the file back first to keep it")
    if windows != saved_windows and curve:
        where = f"the checkpoint's {saved_windows:,} eval windows per split, not {windows:,}"
        if cfg["eval_windows"] is None:
            kept["eval_windows"] = saved_windows
            log(f"eval set kept: {where} (eval_iters x batch_size now), so the val losses before and after "
                f"the resume are on the same windows (to change it anyway: --eval_windows=N)")
        else:
            warnings.warn(f"eval_windows={windows} changes the eval set at this resume ({where}): val losses "
                          f"after iter {ckpt['iter_num']} are on other windows than those before")
    origin = initialised_from(cfg, ckpt)
    if origin not in (None, "scratch") and not origin.startswith("convert.py"):
        import hf
        keys = hf.GPT2_SHAPE_KEYS + (("attn_scale",) if cfg["attn_scale"] is None else ())
        shape = {k: ckpt["model_args"][k] for k in keys}
        log(f"started from GPT-2 weights ({origin}): its shape from the checkpoint, "
            + " ".join(f"{k}={v}" for k, v in shape.items() if k != "attn_scale"))
        kept.update(shape)
    return kept


def initialised_from(cfg, ckpt):
    """Where the run's weights started, kept across resumes (config.json's init_from then says 'resume'):
    'scratch', a GPT-2 name or folder, or 'convert.py: <official checkpoint>'; None for a checkpoint written
    before this was recorded, after a resume."""
    if ckpt is None:
        return cfg["init_from"]
    if "initialised_from" in ckpt:
        return ckpt["initialised_from"]
    if "converted_from" in ckpt:
        return f"convert.py: {ckpt['converted_from']['path']}"
    first = ckpt["config"].get("init_from")
    return None if first == "resume" else first


def set_away_from_default(cfg, keys):
    """['key=value', ...] for those of keys whose value in cfg is not DEFAULTS' (for notes on unused settings)."""
    return [f"{k}={cfg[k]!r}" for k in keys if cfg[k] != DEFAULTS[k]]


def lr_decay_iters_for(cfg, ckpt, log):
    """The iteration at which the LR reaches min_lr. lr_decay_iters unset: a new run decays over max_iters, a
    resumed run keeps its checkpoint's schedule (raising max_iters then trains on at min_lr). A different
    explicit value on resume is allowed, with a warning naming both (the LR jumps). A note is printed when the
    run goes on past the decay (at min_lr) or stops before it, or, with decay_lr=False, names the schedule
    settings a constant rate leaves unused; none of these for a resume with nothing left to train."""
    decay_iters = cfg["lr_decay_iters"] or cfg["max_iters"]
    to_train = ckpt is None or ckpt["iter_num"] < cfg["max_iters"]  # no note on steps that will not run
    if ckpt is not None:
        trained = (ckpt.get("lr_decay_iters") or ckpt["config"]["lr_decay_iters"]
                   or ckpt["config"]["max_iters"])
        if cfg["lr_decay_iters"] is None:
            decay_iters = trained
            if trained != cfg["max_iters"] and cfg["decay_lr"] and to_train:
                log(f"note: lr_decay_iters is unset; keeping the checkpoint's schedule (decay to min_lr "
                    f"at iter {trained}), not max_iters={cfg['max_iters']}; pass --lr_decay_iters=N to "
                    f"change it")
        elif cfg["lr_decay_iters"] != trained and cfg["decay_lr"] and to_train:
            it = ckpt["iter_num"]
            warnings.warn(f"lr_decay_iters={cfg['lr_decay_iters']} differs from the checkpoint's {trained}: "
                          f"the learning rate at iter {it} changes from {get_lr(it, cfg, trained):.3e} to "
                          f"{get_lr(it, cfg, cfg['lr_decay_iters']):.3e}")
    if not to_train:
        return decay_iters
    if cfg["decay_lr"]:
        for kind, text in schedule_notes(cfg, decay_iters):
            warnings.warn(text) if kind == "warning" else log(f"note: {text}")
    else:
        unused = set_away_from_default(cfg, ("warmup_iters", "lr_decay_iters", "min_lr", "lr_schedule"))
        if unused:
            log(f"note: decay_lr=False: every step runs at learning_rate={cfg['learning_rate']:g}, so "
                f"{', '.join(unused)} {'is' if len(unused) == 1 else 'are'} not used")
    return decay_iters


def schedule_notes(cfg, decay_iters):
    """What the schedule does that a reader may not expect, as [(kind 'note' | 'warning', text)].

    Iterations are counted as the log counts them: iteration k is the k-th optimizer step, 1..max_iters, and
    runs at get_lr(k - 1). Warnings: the run ends during warmup (the peak learning rate is never reached), or
    the warmup does not end before the decay does (no decay at all: the rate drops from the warmup to min_lr).
    Notes: the last steps run flat at min_lr, or the run stops before the decay ends.
    """
    warmup, steps, peak = cfg["warmup_iters"], cfg["max_iters"], cfg["learning_rate"]
    out = []
    if 0 < steps <= warmup:
        out.append(("warning", f"the whole run is warmup (warmup_iters={warmup} >= max_iters={steps}): the "
                               f"learning rate rises from {get_lr(0, cfg, decay_iters):.2e} to "
                               f"{get_lr(steps - 1, cfg, decay_iters):.2e} and never reaches learning_rate="
                               f"{peak:g}; lower warmup_iters"))
        return out
    if warmup >= decay_iters:
        out.append(("warning", f"the warmup (warmup_iters={warmup}) does not end before the decay does "
                               f"(lr_decay_iters={decay_iters}): the learning rate rises to "
                               f"{get_lr(warmup - 1, cfg, decay_iters):.2e} until iteration {warmup}, then "
                               f"drops straight to min_lr={cfg['min_lr']:g}, with no decay; set lr_decay_iters "
                               f"above warmup_iters"))
    flat_from = max(decay_iters, warmup)  # the first step (0-based) that runs at min_lr
    if steps > flat_from:
        out.append(("note", f"the last {steps - flat_from} of {steps} steps (iterations {flat_from + 1}-"
                            f"{steps}) run at min_lr={cfg['min_lr']:g}: the schedule reaches min_lr at "
                            f"lr_decay_iters={decay_iters}"))
    elif steps < decay_iters:
        out.append(("note", f"the run stops at max_iters={steps}, before the learning rate has decayed to "
                            f"min_lr (at lr_decay_iters={decay_iters}); its last step runs at "
                            f"{get_lr(steps - 1, cfg, decay_iters):.2e} (--lr_decay_iters={steps} decays "
                            f"to min_lr by the last step)"))
    return out


def rng_state(train_gen, device):
    """This process's RNG states: the training window stream, torch's CPU RNG (dropout on the CPU) and, on
    CUDA, the RNG of the one device this process uses (dropout there)."""
    state = dict(train=train_gen.get_state(), torch=torch.get_rng_state())
    if device.startswith("cuda"):
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(saved, rank, train_gen, device, seed, iter_num):
    """Restore this rank's RNG states from a checkpoint's list of per-rank states (saved).

    The training stream is global (every rank draws the same windows), so any rank's copy continues it. The
    dropout streams are per rank: a rank that was saved gets its own back; a rank beyond the saved ones (a run
    resumed on more processes) gets a fresh stream seeded from (seed, rank, iter_num), distinct from every
    other rank's. CUDA: the device's own state; checkpoints written before 2026-12 hold one state per visible
    device, of which the first is taken (so a run resumes with fewer GPUs visible than it was saved with).
    """
    train_gen.set_state(saved[0]["train"])
    if rank >= len(saved):
        torch.manual_seed(seed + rank + 1_000_003 * iter_num)  # also seeds every CUDA device
        return
    state = saved[rank]
    torch.set_rng_state(state["torch"])
    if device.startswith("cuda") and "cuda" in state:
        cuda = state["cuda"]
        torch.cuda.set_rng_state(cuda[0] if isinstance(cuda, (list, tuple)) else cuda, device)


def tokens_in_checkpoint(ckpt):
    """Training tokens seen up to a checkpoint: its count, or for checkpoints written before nlq kept one
    (2026-12), iter_num times the tokens per step of its config."""
    if "tokens" in ckpt:
        return ckpt["tokens"]
    c = ckpt["config"]
    return ckpt["iter_num"] * c["gradient_accumulation_steps"] * c["batch_size"] * c["block_size"]


def clock(seconds):
    """Seconds as h:mm:ss (or m:ss under an hour), for the log's elapsed time and ETA."""
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def is_eval_iter(iter_num, cfg):
    """Whether the loop evaluates at iter_num: every eval_interval steps, and at max_iters."""
    return iter_num % cfg["eval_interval"] == 0 or iter_num == cfg["max_iters"]


def evals_after(iter_num, cfg):
    """How many fixed-window evals the loop still runs after iter_num: at every multiple of eval_interval up
    to max_iters, and at max_iters."""
    last, interval = cfg["max_iters"], cfg["eval_interval"]
    n = last // interval - iter_num // interval
    return n + (last % interval != 0 and iter_num < last)


def state_bytes(obj, seen=None):
    """Bytes of the tensors in a (nested) state dict, each storage once (tied weights share one), as
    torch.save writes them: about the size of its checkpoint file."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if isinstance(obj, dict):
        return sum(state_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v, seen) for v in obj)
    return 0


def json_safe(row):
    """A metrics row with NaN/inf floats written as null (JSON has no NaN); 'diverged' says why they are."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def append_metrics(out_dir, row, truncate_after=None):
    """Append one JSON line to out_dir/metrics.jsonl. With truncate_after, first drop lines with iter > it
    (written after the checkpoint a run resumes from), so the log matches the resumed run."""
    path = os.path.join(out_dir, "metrics.jsonl")
    if truncate_after is not None and os.path.exists(path):
        keep = [r for r in read_metrics(out_dir) if r["iter"] <= truncate_after]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in keep))
    if row is not None:
        with open(path, "a") as f:
            f.write(json.dumps(json_safe(row)) + "\n")


def stop_diverged(cfg, master, row, reason, ckpt_path, last_saved):
    """Log the bad numbers as the run's last metrics row and raise TrainingDiverged; the last finite
    checkpoint stays. Every rank reaches this together (the losses it looks at are all-reduced)."""
    if master:
        append_metrics(cfg["out_dir"], {**row, "diverged": True})
    kept = (f"the last finite checkpoint is {ckpt_path} (iter {last_saved})" if last_saved is not None
            else "no checkpoint was written")
    raise TrainingDiverged(f"training diverged at iter {row['iter']}: {reason}; {kept}. Try a lower "
                           f"learning_rate, a longer warmup_iters or grad_clip > 0 (now {cfg['grad_clip']})")


def all_finite(model):
    """True if every parameter of the model is finite, on every rank. FSDP's sharded parameters (DTensors) are
    checked shard by shard and the verdict is all-reduced, so that all ranks stop together or none does."""
    shards = list(model.parameters())
    if is_fsdp(model):
        from torch.distributed.tensor import DTensor  # FSDP only: see common.shard_model
        shards = [p.to_local() if isinstance(p, DTensor) else p for p in shards]
    finite = torch.stack([torch.isfinite(p).all() for p in shards]).all().float()
    if dist.is_initialized():
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    return bool(finite.item())


# ------------------------------------------------------------------- FSDP: gradients, full state dicts
def gradient_sync(model, raw_model, sync):
    """The context for one micro-step: its backward reduces gradients across ranks only if sync (the step's
    last micro-step). Otherwise, DDP: no_sync(); FSDP: each rank accumulates unsharded float32 gradients
    and keeps the gathered weights for the next forward; gradients are reduce-scattered once, at the end."""
    if isinstance(model, DDP):
        return nullcontext() if sync else model.no_sync()
    if is_fsdp(raw_model):
        raw_model.set_requires_gradient_sync(sync)
        raw_model.set_reshard_after_backward(sync)
    return nullcontext()


def optimizer_param_names(model, optimizer):
    """The name of each parameter the optimizer holds, in its order: position i is the key i of
    optimizer.state_dict(). A tied parameter (wte = lm_head) has its first name, as
    torch.distributed.checkpoint names it."""
    names = {p: name for name, p in model.named_parameters()}
    return [names[p] for group in optimizer.param_groups for p in group["params"]]


def rekey_optimizer_state(state, new_key):
    """An optimizer state dict with each parameter's key k (index or name) replaced by new_key[k]."""
    groups = [{**g, "params": [new_key[k] for k in g["params"]]} for g in state["param_groups"]]
    return dict(state={new_key[k]: v for k, v in state["state"].items()}, param_groups=groups)


def full_state_dicts(model, optimizer):
    """(model state, optimizer state) as one unsharded process has them: model.state_dict()'s {name: tensor}
    and optimizer.state_dict()'s {state: {index: ...}, param_groups}, so that a checkpoint loads anywhere.

    Under FSDP the shards are gathered (collective: every rank must call this) onto rank 0's CPU, and only
    rank 0's dicts are complete. Without FSDP: the state dicts themselves, on every rank.
    """
    if not is_fsdp(model):
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint import state_dict as dcp  # FSDP only: see common.shard_model
    options = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = dcp.get_model_state_dict(model, options=options)
    if not optimizer.state:  # before the first step there is nothing to gather, and the helper would
        return model_state, optimizer.state_dict()  # initialise the moments with a zero step (step = 1)
    by_name = dcp.get_optimizer_state_dict(model, optimizer, options=options)
    index = {name: i for i, name in enumerate(optimizer_param_names(model, optimizer))}
    return model_state, (rekey_optimizer_state(by_name, index) if by_name else {})


def load_full_state_dicts(model, optimizer, model_state, optimizer_state):
    """Load the state dicts full_state_dicts returns (any checkpoint's) into a plain or FSDP model and its
    optimizer. Under FSDP every rank passes the full dicts and keeps its own shards."""
    if not is_fsdp(model):
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        return
    from torch.distributed.checkpoint import state_dict as dcp  # FSDP only: see common.shard_model
    options = dcp.StateDictOptions(full_state_dict=True)
    dcp.set_model_state_dict(model, model_state, options=options)
    if not optimizer_state["state"]:  # saved before the first step: hyperparameters only, nothing to shard
        optimizer.load_state_dict(optimizer_state)
        return
    names = dict(enumerate(optimizer_param_names(model, optimizer)))
    dcp.set_optimizer_state_dict(model, optimizer, rekey_optimizer_state(optimizer_state, names),
                                 options=options)


# ------------------------------------------------------------------------------------------------ the data
def prepare_on_first_use(cfg, master, world_size, log):
    """Prepare data_dir/dataset from the data shipped with nlq if it is a shipped dataset (SHIPPED_DATASETS: Tiny
    Shakespeare by characters or GPT-2 BPE) and its folder holds none of a dataset's files; anything else is
    left to load_meta. The bins are those `python prepare_data.py DATASET` writes, written atomically. Under
    torchrun rank 0 prepares while the others wait at a barrier (every rank of a shipped dataset calls it); on
    several nodes data_dir must be shared, as for any dataset. ValueError if the preparation fails (e.g.
    data_dir cannot be written)."""
    if cfg["dataset"] not in SHIPPED_DATASETS:
        return
    folder = os.path.join(cfg["data_dir"], cfg["dataset"])
    if master and not any(os.path.exists(os.path.join(folder, f)) for f in BIN_FILES):
        try:
            meta = prepare_shipped(cfg["dataset"], cfg["data_dir"])
        except DataError as e:
            raise ValueError(f"cannot prepare {folder} on first use: {e}") from e
        log(f"{folder} was missing: prepared it from {meta['source']} (shipped with nlq), as python "
            f"prepare_data.py {cfg['dataset']} does: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val "
            f"tokens ({meta['tokenizer']})")
    if world_size > 1:
        dist.barrier()


# ------------------------------------------------------------------------------------------------ the job
def train(cfg):
    """Run one training job from a resolved config dict (see common.DEFAULTS). Returns the last eval's losses.

    Raises ValueError / FileNotFoundError for invalid settings, data or checkpoints, before anything is
    written (a token id beyond meta.json's vocabulary: at the batch that holds it, keeping the last
    checkpoint), TrainingDiverged when the loss goes NaN/inf (after logging it; the last finite
    checkpoint is kept), TrainingPreempted after a stop signal (STOP_SIGNALS, caught while it runs) and
    the checkpoint at the step boundary that followed it, and CheckpointNotWritten when a checkpoint cannot be
    written (a full disk; the previous one is kept).
    """
    with StopSignals() as stop, ExitStack() as held:  # held: files open for the whole run (the bins)
        return train_until_stopped(cfg, stop, held)


def train_until_stopped(cfg, stop, held):
    """train(cfg), with stop (a StopSignals) telling the loop that a stop signal came; held (an ExitStack)
    closes the files the run holds open when it ends."""
    validate(cfg)
    if cfg["wandb_log"]:
        try:  # now, not after the run has started
            import wandb  # imported here, once: a missing package fails before anything starts
        except ImportError:
            raise ValueError("wandb_log=True but the wandb package is not installed: pip install wandb, or "
                             "drop --wandb_log") from None
    check_out_dir_is_ours(cfg)  # never write into another program's folder
    # -- processes and devices -------------------------------------------------------------------------------
    with stop.paused():  # a rendezvous that hangs can still be stopped
        rank, local_rank, world_size = setup_distributed(cfg)
    master = rank == 0
    log = print if master else (lambda *a, **k: None)
    if not master:  # every rank resolves the same settings: rank 0 warns about them once, as it logs
        warnings.filterwarnings("ignore", module=__name__)
    unused = set_away_from_default(cfg, unused_query_settings(cfg["query_mode"]))
    if unused:  # f's settings, for a mode without f (a study's arms may share them)
        log(f"note: query_mode={cfg['query_mode']} does not read {', '.join(unused)}: "
            f"{'it changes' if len(unused) == 1 else 'they change'} nothing")
    accum = cfg["gradient_accumulation_steps"]
    if accum % world_size:
        raise ValueError(f"gradient_accumulation_steps={accum} is not divisible by the {world_size} "
                         f"processes; make it a multiple of {world_size}")
    local_accum = accum // world_size  # micro-batches per rank per step
    device, device_type, ptdtype = resolve_device(cfg, local_rank, world_size)
    if cfg["fsdp"]:
        check_fsdp_support(device_type, ptdtype)
    ctx = autocast(device_type, ptdtype)
    B, T = cfg["batch_size"], cfg["block_size"]
    tokens_per_iter = accum * B * T

    ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
    if cfg["init_from"] == "resume" and os.path.isfile(ckpt_path):
        cfg.update(kept_on_resume(ckpt_path, cfg, log))

    # -- data: memory-mapped token bins; fixed eval windows (N,) drawn from the seed, not from the batch shape --
    data_dir = os.path.join(cfg["data_dir"], cfg["dataset"])
    prepare_on_first_use(cfg, master, world_size, log)
    meta = load_meta(data_dir)
    bins, n_tokens, splits = {}, {}, {}
    for split in ("train", "val"):
        n_tokens[split] = len(open_split(data_dir, split, meta, T))
        # held open for the whole run: prepare_data.py puts new bins in place by renaming, so a dataset
        # prepared again (--overwrite) while this run trains leaves the data it reads (and meta) as they were
        bins[split] = held.enter_context(open(os.path.join(data_dir, f"{split}.bin"), "rb"))
        splits[split] = (bins[split], meta["dtype"], eval_windows(n_tokens[split], T, eval_window_count(cfg),
                                                                   cfg["seed"]), T)

    # -- model, optimizer, and the checkpoint to resume from -------------------------------------------------
    gpt2_weights = None
    if cfg["init_from"] not in ("scratch", "resume"):  # GPT-2 (hf.py): its shape sets the model keys
        import hf
        # its settings and tokenizer are checked against the run's before its weights are read
        gpt2_config = hf.load_gpt2_config(cfg["init_from"])
        settings, notes = hf.gpt2_settings(gpt2_config, cfg, meta)
        gpt2_weights, _ = hf.load_gpt2(cfg["init_from"], gpt2_config)
        cfg.update(settings)
        log("\n".join(notes))
    model_cfg = model_config(cfg, meta["vocab_size"])
    check_model_fits(param_counts(model_cfg)["total"], device, world_size if cfg["fsdp"] else 1)
    ckpt = checkpoint_to_resume(cfg, model_cfg, ckpt_path, meta, data_dir)
    if master:
        hold_out_dir(cfg["out_dir"], held)  # one train.py per out_dir
    torch.manual_seed(cfg["seed"])  # the same initial weights for every rank and every run with this seed
    raw_model = GPT(model_cfg)
    if gpt2_weights is not None:
        hf.load_gpt2_weights(raw_model, gpt2_weights)
    log(raw_model.param_table())
    # a fixed-window eval's forward FLOPs (both splits): above LARGE_EVAL_FLOPS it gets a progress bar
    eval_flops = 2 * sum(p.numel() for p in raw_model.parameters()) * 2 * eval_window_count(cfg) * T
    if cfg["fsdp"]:
        shard_model(raw_model, device_type, ptdtype)  # in place; moves each unit's shard to the device
    else:
        raw_model.to(device)
    optimizer = raw_model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"],
                                               (cfg["beta1"], cfg["beta2"]), device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=(ptdtype == torch.float16))
    train_gen = torch.Generator().manual_seed(cfg["seed"] + 1)  # the training stream of windows
    torch.manual_seed(cfg["seed"] + rank)  # dropout differs per rank
    decay_iters = lr_decay_iters_for(cfg, ckpt, log)
    origin = initialised_from(cfg, ckpt)
    iter_num, best_val, resumed_at, tokens_seen = 0, math.inf, None, 0
    elapsed_before, eval_pending, resumes = 0.0, False, []
    if ckpt is not None:
        try:
            load_full_state_dicts(raw_model, optimizer, ckpt["model"], ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise damaged_checkpoint(ckpt_path, e) from e
        scaler.load_state_dict(ckpt["scaler"])
        restore_rng(ckpt["rng"], rank, train_gen, device, cfg["seed"], ckpt["iter_num"])
        iter_num, best_val = ckpt["iter_num"], ckpt["best_val_loss"]
        eval_pending = ckpt.get("eval_pending", False)  # saved on a stop signal before its iter's eval
        tokens_seen = tokens_in_checkpoint(ckpt)
        saved_per_iter = ckpt["config"]["gradient_accumulation_steps"] * ckpt["config"]["batch_size"] * T
        if saved_per_iter != tokens_per_iter:
            log(f"note: resuming with {tokens_per_iter:,} tokens per step instead of the checkpoint's "
                f"{saved_per_iter:,}: training goes on from the same point of the same window stream, the "
                f"token counts stay true ({tokens_seen:,} so far), but the steps from here are not those of "
                f"an uninterrupted run")
        elapsed_before = ckpt.get("elapsed_s", 0.0)  # the run's seconds before this start (older: none)
        resumes = ckpt.get("resumes", []) + settings_changed_at_resume(ckpt["config"], cfg, iter_num)
        resumed_at = iter_num  # its eval is in the log already, unless eval_pending
        log(f"resumed from {ckpt_path} at iter {iter_num}, after {clock(elapsed_before)} of training (the "
            f"log's elapsed time is the whole run's)" + (f"; max_iters={cfg['max_iters']} is reached "
            "already, nothing to train (raise max_iters to go on)" if iter_num >= cfg["max_iters"] else ""))
        del ckpt
    last_saved = resumed_at

    if master:
        os.makedirs(cfg["out_dir"], exist_ok=True)
        atomic_write_text(os.path.join(cfg["out_dir"], "config.json"), json.dumps(
            {**cfg, "model_args": vars(model_cfg), "world_size": world_size, "resolved_device": device,
             "resolved_dtype": str(ptdtype), "tokens_per_iter": tokens_per_iter, "lr_decay_iters_resolved":
             decay_iters, "dataset_meta": meta, "initialised_from": origin, "resumes": resumes,
             # what the code built, and which code: sweep.py and report.py refuse runs that other code made
             "param_counts": param_counts(model_cfg), "code": code_version()}, indent=2))
        # a fresh run starts a fresh log; a resumed one drops lines written after its checkpoint (and the
        # checkpoint's own iter when its eval is still to come)
        append_metrics(cfg["out_dir"], None, truncate_after=-1 if resumed_at is None
                       else resumed_at - eval_pending)
    log("config:\n" + format_config(cfg))
    layout = f"{accum} micro-batch{'es' * (accum > 1)} of {B} x {T}, {world_size} process{'es' * (world_size > 1)}"
    log(f"tokens per iteration: {tokens_per_iter:,} ({layout}"
        f"{', FSDP' if cfg['fsdp'] else ', DDP' if world_size > 1 else ''})")
    log(f"eval set: {eval_window_count(cfg):,} fixed windows of {T} tokens per split, {B} at a time " + (
        "(eval_windows)" if cfg["eval_windows"] else "(eval_iters x batch_size; set eval_windows to keep it "
                                                     "when the micro-batch changes)"))
    distinct = min(n_tokens.values()) - T  # window offsets a split has: more windows than that repeat some
    if eval_window_count(cfg) > distinct:
        warnings.warn(f"{eval_window_count(cfg):,} eval windows per split, but the smaller split has only "
                      f"{distinct:,} windows of {T} tokens: the eval repeats windows and takes longer for no "
                      f"better estimate; lower eval_windows (or eval_iters), or use eval_full_at_end for every "
                      f"val token once")

    model = raw_model
    if use_compile(cfg, device_type):
        if torch._dynamo.is_dynamo_supported():
            model = torch.compile(model)
        else:
            warnings.warn("torch.compile is not supported on this platform; running eager")
    if world_size > 1 and not cfg["fsdp"]:
        model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)
    if cfg["wandb_log"] and master:
        wandb.init(project=cfg["wandb_project"], name=cfg["wandb_run_name"], config=cfg)

    def stop_asked():
        """Whether a stop signal reached any rank (every rank asks at the same point: one all-reduce)."""
        if world_size == 1:
            return stop.received is not None
        flag = torch.tensor(float(stop.received is not None), device=device)
        dist.all_reduce(flag)
        return flag.item() > 0

    def preempt(eval_pending, when):
        """Checkpoint at this step boundary (eval_pending: its eval is still to come) and stop the run."""
        save_state(eval_pending)
        message = (f"stopped by {stop.received or 'a stop signal to another rank'} {when}: checkpoint "
                   f"{ckpt_path} at iter {iter_num}; continue with --init_from=resume")
        log(message, flush=True)
        end_distributed()  # its barrier: no rank exits before rank 0 has written the checkpoint
        raise TrainingPreempted(message)

    def save_state(eval_pending=False):
        """Checkpoint the full training state at this step boundary: weights, AdamW, the scaler, every rank's RNG
        states (so that a resume continues every stream), iter and tokens. Every rank calls it (it gathers);
        rank 0 writes. eval_pending: iter_num is an eval step whose eval has not run yet (a stop signal)."""
        rngs = [rng_state(train_gen, device)]
        if world_size > 1:
            rngs = [None] * world_size
            dist.all_gather_object(rngs, rng_state(train_gen, device))
        model_state, optimizer_state = full_state_dicts(raw_model, optimizer)  # FSDP: every rank
        if master:
            size, t_save = state_bytes((model_state, optimizer_state)), time.time()
            if size > LARGE_CHECKPOINT_BYTES:  # a 124M model's checkpoint is 0.5-1.5 GB
                log(f"writing checkpoint {ckpt_path} ({size / 1e6:,.0f} MB) ...", flush=True)
            try:
                save_checkpoint(ckpt_path, dict(
                    model=model_state, optimizer=optimizer_state, scaler=scaler.state_dict(),
                    iter_num=iter_num, best_val_loss=best_val, config=cfg, model_args=vars(model_cfg),
                    rng=rngs, dataset_meta=meta, lr_decay_iters=decay_iters, tokens=tokens_seen,
                    elapsed_s=round(elapsed_before + time.time() - started, 3), eval_pending=eval_pending,
                    initialised_from=origin, resumes=resumes))
            except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
                kept = (f"the previous checkpoint {ckpt_path} is intact: free space (or move out_dir) and "
                        f"continue with --init_from=resume" if os.path.exists(ckpt_path) else
                        "there is no earlier checkpoint: free space and run the same command again")
                raise CheckpointNotWritten(f"could not write the checkpoint at iter {iter_num} ({e}); "
                                           f"{kept}") from e
            if size > LARGE_CHECKPOINT_BYTES:
                log(f"checkpoint written in {time.time() - t_save:.1f} s")

    # -- the loop: eval + checkpoint, then one optimizer step of accum micro-batches -------------------------
    # Timing: ms_per_iter in metrics.jsonl is the mean step time since the previous eval, and the log line's
    # the mean since the previous log line; both leave out eval time and the first step after a start (it pays for
    # compilation and warm-up). The ETA adds the evals still to come at their mean time so far.
    losses, nonfinite_steps = {}, 0
    steps_timed, time_timed = 0, 0.0      # since the last eval: -> metrics.jsonl's ms_per_iter
    log_steps, log_time = 0, 0.0          # since the last log line: -> the log line's ms/iter
    all_steps, all_time = 0, 0.0          # since this start: -> the ETA
    evals_done, eval_time = 0, 0.0
    started = time.time()
    t0 = time.time()
    while True:
        if is_eval_iter(iter_num, cfg) and (iter_num != resumed_at or eval_pending):
            t_eval = time.time()
            try:  # a stop signal during an eval (it can take an hour) stops it: checkpoint, eval still to come
                losses = estimate_loss(model, splits, ctx, rank, world_size, device, meta["vocab_size"], B,
                                       progress=master and eval_flops > LARGE_EVAL_FLOPS, stop=stop_asked)
                evals_done, eval_time = evals_done + 1, eval_time + time.time() - t_eval
                # every val token once: the final figure
                if cfg["eval_full_at_end"] and iter_num == cfg["max_iters"]:
                    batches = full_split_windows(n_tokens["val"], T, 4 * B)
                    log(f"whole-split eval: val loss over all {n_tokens['val'] - 1:,} next-token predictions of "
                        f"the {n_tokens['val']:,} val tokens ({sum(len(s) for s, _ in batches):,} windows of "
                        f"{T}, {len(batches):,} batches of {4 * B}); turn it off with --eval_full_at_end=False")
                    nats, n, _ = full_split_loss(raw_model, ctx, bins["val"], meta["dtype"], T, 4 * B, device,
                                                 rank, world_size, vocab_size=meta["vocab_size"], progress=master,
                                                 stop=stop_asked)
                    losses["val_full"] = nats / n
            except EvalStopped:
                preempt(eval_pending=True, when=f"during the eval of iter {iter_num}")
            except KeyboardInterrupt:  # Ctrl-C: the state is this step boundary's; save it as a stop signal does
                if world_size > 1 or iter_num == (last_saved or 0):  # ranks may sit in different collectives;
                    raise  # or no step was trained since the last checkpoint (or the start): nothing to save
                save_state(eval_pending=True)
                log(f"interrupted during the eval of iter {iter_num}: checkpoint {ckpt_path} at iter "
                    f"{iter_num}, its eval still to come", flush=True)
                raise
            dt = time_timed / steps_timed if steps_timed else None
            row = dict(iter=iter_num, tokens=tokens_seen, lr=get_lr(max(iter_num - 1, 0), cfg,
                       decay_iters), train_loss=losses["train"], val_loss=losses["val"],
                       val_ppl=safe_exp(losses["val"]), ms_per_iter=dt and 1000 * dt,
                       tokens_per_s=dt and tokens_per_iter / dt,
                       mfu=dt and raw_model.estimate_mfu(B * local_accum, dt),
                       elapsed_s=round(elapsed_before + time.time() - started, 3))
            if "val_full" in losses:
                row["val_loss_full"] = losses["val_full"]
            log(f"eval iter {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, "
                f"val ppl {row['val_ppl']:.2f}" + (f", val loss (whole split) {losses['val_full']:.4f}"
                                                   if "val_full" in losses else ""))
            if not all(math.isfinite(v) for v in losses.values()) or not all_finite(raw_model):
                stop_diverged(cfg, master, row, "the eval loss or the weights are not finite", ckpt_path,
                              last_saved)
            if master:
                append_metrics(cfg["out_dir"], row)
                if cfg["wandb_log"]:
                    wandb.log(json_safe(row))
            if losses["val"] < best_val or cfg["always_save_checkpoint"]:  # the same on every rank
                best_val = min(best_val, losses["val"])
                save_state()
                last_saved = iter_num
            eval_pending = False
            steps_timed, time_timed = 0, 0.0
            t0 = time.time()  # eval time is not step time
        if iter_num >= cfg["max_iters"]:
            break

        lr = get_lr(iter_num, cfg, decay_iters)
        for group in optimizer.param_groups:
            group["lr"] = lr
        # Every rank draws the whole step's windows, (accum, B) offsets, and takes its own local_accum rows:
        # rank r gets micro-batches r*local_accum ... (r+1)*local_accum - 1 of the global stream.
        step_starts = window_starts(n_tokens["train"], T, (accum, B), train_gen)  # (accum, B)
        starts = step_starts[rank * local_accum:(rank + 1) * local_accum]  # (local_accum, B)
        loss_sum = torch.zeros((), device=device)
        for micro in range(local_accum):
            x, y = get_batch(bins["train"], meta["dtype"], starts[micro], T, device,  # (B, T) each
                             meta["vocab_size"])
            sync = world_size == 1 or micro == local_accum - 1  # reduce gradients on the last micro-step only
            with gradient_sync(model, raw_model, sync), ctx:
                _, loss = model(x, y)
                loss = loss / local_accum  # the mean over the step's micro-batches
            scaler.scale(loss).backward()
            loss_sum += loss.detach()
        if cfg["grad_clip"] > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        tokens_seen += tokens_per_iter

        # The step's loss summed over the ranks, and how many ranks got a stop signal, in one all-reduce: every
        # rank then takes the same decisions below (a stop too, if any rank was signalled).
        step_stats = torch.stack([loss_sum, torch.tensor(float(stop.received is not None), device=device)])
        if world_size > 1:
            dist.all_reduce(step_stats)
        step_loss = (step_stats[0] / world_size).item()  # waits for the step to finish
        stopping = step_stats[1].item() > 0
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if iter_num > 1 + (resumed_at or 0):  # the first step pays for compilation and warm-up
            steps_timed, time_timed = steps_timed + 1, time_timed + dt
            log_steps, log_time = log_steps + 1, log_time + dt
            all_steps, all_time = all_steps + 1, all_time + dt
        nonfinite_steps = 0 if math.isfinite(step_loss) else nonfinite_steps + 1
        if iter_num % cfg["log_interval"] == 0 or nonfinite_steps == 1:
            step = log_time / log_steps if log_steps else dt  # the mean since the last log line
            per_step = all_time / all_steps if all_steps else dt
            eta = ((cfg["max_iters"] - iter_num) * per_step
                   + evals_after(iter_num, cfg) * (eval_time / evals_done if evals_done else 0.0))
            mfu = raw_model.estimate_mfu(B * local_accum, step) if step > 0 else None
            log(f"iter {iter_num}: loss {step_loss:.4f}, lr {lr:.2e}, {1000 * step:.1f} ms/iter, "
                f"{tokens_per_iter / max(step, 1e-9):,.0f} tokens/s"
                + (f", MFU {100 * mfu:.1f}%" if mfu else "")
                + f", elapsed {clock(elapsed_before + time.time() - started)}, ETA {clock(eta)}"
                + (" + the whole-split eval" if cfg["eval_full_at_end"] else ""))
            log_steps, log_time = 0, 0.0
        if nonfinite_steps >= cfg["max_nonfinite_steps"]:
            stop_diverged(cfg, master, dict(iter=iter_num, tokens=tokens_seen, lr=lr,
                                            train_loss=step_loss),
                          f"the training loss was not finite for {nonfinite_steps} consecutive steps "
                          f"(max_nonfinite_steps={cfg['max_nonfinite_steps']})", ckpt_path, last_saved)
        if stopping:  # a stop signal (a preemption or the time limit is near): checkpoint here, then exit
            preempt(eval_pending=is_eval_iter(iter_num, cfg), when=f"after iter {iter_num}")

    out = shlex.quote(cfg["out_dir"])
    kept = "no checkpoint" if last_saved is None else f"checkpoint {ckpt_path}"
    if last_saved is not None and last_saved != iter_num:  # always_save_checkpoint=False keeps the best
        why = "" if cfg["always_save_checkpoint"] else ", its lowest val loss: always_save_checkpoint=False"
        kept += f" (iter {last_saved}{why})"
    log(f"done: {iter_num} iterations; {kept}, metrics {cfg['out_dir']}/metrics.jsonl\n"
        f"next: text: python sample.py --out_dir={out}; loss: python eval.py --out_dir={out} --full; "
        f"compare: python report.py {out} OTHER_RUN")
    end_distributed()
    return losses


def usage():
    """The module docstring and every config key with its default, meaning and allowed values, for --help."""
    return (f"usage: python train.py [CONFIG_FILE.py] [--key=value ...]\n{__doc__}\n"
            f"Config keys, their defaults and meanings:\n{settings_help()}")


def one_line_warning(message, category, filename, lineno, line=None, _python_format=warnings.formatwarning):
    """train.py's own warnings as "warning: <text>" (they name the setting and the fix; the source line that
    raised them says nothing to a user); every other module's as Python formats them."""
    if os.path.abspath(filename) == os.path.abspath(__file__):
        return f"warning: {message}\n"
    return _python_format(message, category, filename, lineno, line)


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(print(usage()))
    warnings.formatwarning = one_line_warning
    try:
        config = parse_config(sys.argv[1:])
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"config error: {e}")
    try:
        train(config)
    except (ValueError, FileNotFoundError) as e:  # bad data, settings or paths: the message says what to do
        sys.exit(f"error: {e}")
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(EXIT_DIVERGED)
    except CheckpointNotWritten as e:
        sys.exit(f"error: {e}")
    except OSError as e:  # a full disk or a folder that cannot be written, e.g. as the metrics log grows
        fix = "free space" if e.errno == errno.ENOSPC else "mend that path"
        path = e.filename if isinstance(e.filename, (str, bytes)) else config["out_dir"]  # None: a write
        if (os.path.abspath(os.fsdecode(path)) + os.sep).startswith(os.path.abspath(config["out_dir"]) + os.sep):
            fix += " or choose another out_dir"  # (a path elsewhere, e.g. data_dir's, is not out_dir's fault)
        kept = os.path.exists(os.path.join(config["out_dir"], "ckpt.pt"))
        sys.exit(f"error: {e}; {fix}"
                 + (f" (the last checkpoint in {config['out_dir']} is intact: continue with --init_from=resume)"
                    if kept else ""))
    except TrainingPreempted:  # logged already; the status tells a scheduler to requeue it (common.py)
        sys.exit(EXIT_PREEMPTED)
    except KeyboardInterrupt:
        if os.path.exists(os.path.join(config["out_dir"], "ckpt.pt")):
            print(f"interrupted; the last checkpoint in {config['out_dir']} is intact: continue with "
                  f"--init_from=resume", file=sys.stderr)
        else:
            print("interrupted before the first checkpoint: there is nothing to resume; run the same command "
                  "again to start over", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
