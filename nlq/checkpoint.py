"""
A training run's folder (out_dir) and its files:

    ckpt.pt        the whole training state at the last eval: weights, the optimizer's state, every rank's RNG states,
                   where the run is (TrainState), its settings and its dataset's meta.json; written atomically
    config.json    the settings of this start, the model built and the code that built it
    metrics.jsonl  one JSON row per eval: iter, tokens, lr, train/val loss, ms/iter, tokens/s, MFU, elapsed_s;
                   and a train row every log_interval steps: iter, tokens, lr, train_loss (the step's loss)
                   (also sent to Weights & Biases with wandb_log=True)

RunFolder is what train.py calls: it refuses a folder that holds another program's files, locks it for one
train.py, finds the checkpoint to resume (checked against the run's settings and data), and writes the three
files. load_checkpoint and model_from_checkpoint serve sample.py, eval.py and convert.py.
"""
import errno
import fcntl
import json
import math
import os
import re
import shlex
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

import torch

from model import GPT, GPTConfig
from nlq.data import BIN_FILES
from nlq.distributed import full_state_dicts, gather_rng_states, load_full_state_dicts, restore_rng
from nlq.progress import clock
from nlq.settings import DEFAULTS, NOT_RESULTS, RESUME_FIXED, code_version, differing, param_counts, upgrade


class CheckpointNotWritten(RuntimeError):
    """The checkpoint could not be written (a full disk, a quota); the previous one is intact."""


# ------------------------------------------------------------------------------------------------ files
def replace_atomically(path, write):
    """write(tmp) to a temp file (or folder) beside path, then rename it onto path: an interrupted write never
    leaves a broken file at path, nor the temp one. The temp name is this writer's own (pid and a random part)."""
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_text(path, text):
    """Write a small text file (config.json, a report) atomically (see replace_atomically)."""
    replace_atomically(path, lambda tmp: Path(tmp).write_text(text))


def writable_folder(folder, what):
    """Make folder if it is missing and write a scratch file in it, before the work whose output goes there:
    ValueError (one line naming what and folder) if that fails: a file in its path, a read-only disk, no
    permission."""
    try:
        if not os.path.lexists(folder):
            os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ValueError(f"cannot write to {what} {folder} ({e.strerror or e}); choose another") from None


def fix_for(e):
    """What to do about e, an error while writing a file: free space for a full disk or quota (torch.save and
    safetensors report one as their own errors, not as an OSError), else make the folder writable."""
    full = not isinstance(e, OSError) or e.errno in (errno.ENOSPC, errno.EDQUOT)
    return "free space" if full else "make the folder writable"


def lock_file(path):
    """An exclusive lock on the file at path (made if missing), held until the returned file is closed or the
    process ends, however it ends (fcntl.flock). None on a file system without locks. BlockingIOError if another
    process holds it."""
    f = open(path, "a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise
    except OSError:  # a file system without locks: go on unlocked
        f.close()
        return None
    return f


def is_locked(path):
    """Whether another process holds the lock_file lock on path (False if there is no such file)."""
    try:
        f = lock_file(path) if os.path.isfile(path) else None
    except BlockingIOError:
        return True
    if f is not None:
        f.close()
    return False


def read_metrics(out_dir, train_rows=False):
    """The eval rows of out_dir/metrics.jsonl as dicts (and a diverged run's last row), with its train rows too
    (they have no val_loss) where train_rows; [] for a run not started yet. A last line cut short by a killed
    process is dropped (it is rewritten when the run resumes); another bad line is a ValueError."""
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise ValueError(f"{path}: line {i + 1} is not JSON; restore the log or delete that line") from None
    return [r for r in rows if train_rows or "val_loss" in r or r.get("diverged")]


def read_saved_config(path):
    """A run's config.json as this nlq reads it (settings.upgrade), or None if there is none."""
    if not os.path.exists(path):
        return None
    try:
        saved = json.loads(Path(path).read_text())
    except ValueError:  # not JSON (or not text)
        saved = None
    if not isinstance(saved, dict):
        raise ValueError(f"{path} is damaged (not a JSON object of settings); restore it from a copy, or "
                         f"delete its run folder to run the run again")
    return upgrade(saved)


# ------------------------------------------------------------------------------------------ checkpoints
def split_c_attn(sd, n_embd):
    """A state dict whose attention has one fused c_attn (nanoGPT's, GPT-2's, the official code's, nlq's older
    checkpoints) -> model.py's names: its rows [W_Q;] W_K; W_V go to c_k, c_v and, where there are 3C of them,
    the query's c_q. Every other entry as it is, in its place (a new dict)."""
    out = {}
    for name, t in sd.items():
        if ".attn.c_attn." not in name:
            out[name] = t
            continue
        head, tail = name.split(".c_attn.")
        *q, out[f"{head}.c_k.{tail}"], out[f"{head}.c_v.{tail}"] = t.split(n_embd)
        if q:
            out[f"{head}.query.c_q.{tail}"] = q[0]
    return out


def load_checkpoint(path, mmap=False):
    """A train.py checkpoint, on the CPU (weights_only=True), its config as this nlq reads it (upgrade).
    mmap=True maps the file: its settings at once, tensors read only when touched. ValueError if it is not a
    train.py checkpoint."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:
        raise ValueError(f"{path} is corrupt or not a train.py checkpoint ({type(e).__name__})") from e
    args = ckpt.get("model_args") if isinstance(ckpt, dict) else None
    if (not isinstance(args, dict) or not {"model", "config", "iter_num"} <= set(ckpt) or "n_head" not in args
            or "query_mode" not in args):  # (the official format has num_heads, nanoGPT's no query_mode)
        raise ValueError(f"{path} is not a train.py checkpoint" + (
            " (it is the paper's official format: convert it with python -m interop.convert official)"
            if "num_heads" in (args or {}) else f" (it is nanoGPT's: start an nlq run from its weights with "
            f"--init_from={path} and a new out_dir)" if "n_head" in (args or {}) else ""))
    cfg = ckpt["config"] = upgrade(ckpt["config"])
    args.pop("fused_f", None)  # (see settings.upgrade)
    # nlq's older checkpoints (tests/fixtures/legacy_*) held f (nonlinear) or W_Q itself (residual) in attn.q_proj
    w_q = lambda k: k.endswith((".attn.q_proj.weight", ".attn.q_proj.bias"))  # residual's W_Q, not f's layers
    ckpt["model"] = {k.replace(".attn.q_proj.", ".attn.query.w_q." if w_q(k) else ".attn.query."): v
                     for k, v in ckpt["model"].items()}
    if any(".attn.c_attn." in k for k in ckpt["model"]):  # one fused c_attn: c_k, c_v (and c_q) now
        ckpt["optimizer"] = _split_adamw_state(ckpt["optimizer"], ckpt["model"], args)
        ckpt["model"] = split_c_attn(ckpt["model"], args["n_embd"])
    # what checkpoints older than their record held: where the weights started, the tokens trained on, where the
    # decay ends
    ckpt.setdefault("initialised_from", None if cfg["init_from"] == "resume" else cfg["init_from"])
    ckpt.setdefault("tokens", ckpt["iter_num"] * cfg["gradient_accumulation_steps"] * cfg["batch_size"]
                    * cfg["block_size"])
    ckpt["lr_decay_iters"] = ckpt.get("lr_decay_iters") or cfg["lr_decay_iters"] or cfg["max_iters"]
    return ckpt


def _split_adamw_state(opt, weights, args):
    """AdamW's state of a checkpoint with a fused c_attn (weights: its state dict), split as split_c_attn splits
    the weights. AdamW numbers the parameters group by group (≥2-D, then <2-D: configure_optimizers), each in
    the model's order, which is the state dict's (less a tied LM head); the split ones take c_attn's place."""
    C, tied = args["n_embd"], args.get("tie_weights", True)
    order = lambda sd: ([k for k in sd if sd[k].dim() >= 2 and not (tied and k == "lm_head.weight")]
                        + [k for k in sd if sd[k].dim() < 2])
    state = {name: opt["state"][i] for i, name in enumerate(order(weights)) if i in opt["state"]}
    moments = {m: split_c_attn({k: s[m] for k, s in state.items()}, C) for m in ("exp_avg", "exp_avg_sq")}
    split = split_c_attn(weights, C)
    fused = lambda k: re.sub(r"\.(c_k|c_v|query\.c_q)\.", ".c_attn.", k)  # where a split parameter's state was
    new = order(split)
    matrices = sum(split[k].dim() >= 2 for k in new)
    groups = [{**g, "params": list(ids)} for g, ids in zip(opt["param_groups"], (range(matrices),
                                                                                range(matrices, len(new))))]
    return dict(param_groups=groups, state={i: {"step": state[fused(k)]["step"], **{m: moments[m][k] for m in moments}}
                                            for i, k in enumerate(new) if fused(k) in state})


def check_same_dataset(trained, meta, folder):
    """ValueError if a dataset's meta.json is not the one a checkpoint was trained on (tokenizer, vocabulary,
    the bins' sha256). A checkpoint that recorded only its tokenizer (convert.py) is checked on that alone."""
    diffs = [f"{key}: {trained.get(key)!r} at training, {meta.get(key)!r} now"
             for key in ("tokenizer", "vocab_size") if trained.get(key) != meta.get(key)]
    if not trained.get("tokenizer_only") and trained.get("sha256") != meta.get("sha256"):
        diffs.append("the bins' sha256 differ")
    if diffs:
        raise ValueError(f"dataset {folder} is not the data this checkpoint was trained on ({'; '.join(diffs)}); "
                         f"pass --data_dir with the data it was trained on")


def check_finite(weights, path):
    """ValueError if a state dict holds NaN or inf: a run that diverged wrote it."""
    bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"{path}: the weights are not finite (training diverged), e.g. {bad[0]}")


def model_from_checkpoint(ckpt, path):
    """The GPT of a loaded checkpoint (CPU, eval mode). ValueError if its weights are not finite (the run
    diverged) or do not fit its settings."""
    check_finite(ckpt["model"], path)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise ValueError(f"{path} does not fit the model of its own settings: {str(e).splitlines()[0]}") from e
    return model.eval()


def load_run(out_dir, device="cpu"):
    """The model of out_dir/ckpt.pt, in eval mode on device, and the checkpoint -> (model, ckpt).
    ckpt["dataset_meta"] is the meta.json of the data it was trained on: its tokenizer."""
    path = os.path.join(out_dir, "ckpt.pt")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}; train one first (python train.py CONFIG "
                                f"--out_dir={out_dir})")
    ckpt = load_checkpoint(path)
    return model_from_checkpoint(ckpt, path).to(device), ckpt


# ------------------------------------------------------------------------------------------- the run folder
@dataclass
class TrainState:
    """Where a run is: what its checkpoint holds besides weights, optimizer and RNG states."""
    iter_num: int = 0
    tokens: int = 0
    best_val_loss: float = math.inf
    elapsed_s: float = 0.0          # seconds of training before this start
    eval_pending: bool = False      # a stop signal came before iter_num's eval ran
    lr_decay_iters: Optional[int] = None
    initialised_from: Optional[str] = "scratch"  # None: a checkpoint older than this record, resumed
    resumes: list = field(default_factory=list)  # [{iter, changed: {key: [before, after]}}]: see RunFolder.resume
    init_settings: dict = field(default_factory=dict)  # the model keys init_from's weights fixed (a resume keeps)
    resumed_at: Optional[int] = None  # (not saved) the iter this start resumed at
    last_saved: Optional[int] = None  # (not saved) the iter of the last checkpoint


class RunFolder:
    """A training run's folder: train.py's checkpoint, config.json and metrics.jsonl (see the module's doc).

    A run meets it in this order, each step one call from train.py: RunFolder(cfg, job) refuses another program's
    folder; kept_settings() -> the model keys a resumed run keeps; open() locks the folder and reads the checkpoint
    to resume, checked against the settings and the data; resume() restores the weights, optimizer, RNGs and
    TrainState from it (or starts a fresh state); start() writes config.json and trims metrics.jsonl back to the
    checkpoint; then log_metrics() at every log line and eval, save() at every eval, close() at the end."""

    def __init__(self, cfg, job):
        self.cfg, self.job, self.master, self.dir = cfg, job, job.master, cfg["out_dir"]
        self.ckpt_path = os.path.join(self.dir, "ckpt.pt")
        self.lock = self.ckpt = None
        found = [f for f in ("model.safetensors", *BIN_FILES) if os.path.lexists(os.path.join(self.dir, f))]
        saved = read_saved_config(os.path.join(self.dir, "config.json"))
        if found or (saved is not None and "model_args" not in saved):
            raise ValueError(f"out_dir {self.dir} holds another program's files (a Hugging Face export or a "
                             f"dataset): give the run a new out_dir")
        rows = read_metrics(self.dir) if cfg["init_from"] != "resume" and not cfg["eval_only"] else []
        if rows and not os.path.exists(self.ckpt_path) and (
                rows[-1].get("diverged") or rows[-1]["iter"] >= (saved or {}).get("max_iters", math.inf)):
            raise ValueError(f"out_dir {self.dir} holds a finished run (metrics up to iter {rows[-1]['iter']}, no "
                             f"checkpoint): a new run would replace its results; give the run a new out_dir")
        self.wandb = None
        if cfg["wandb_log"] and self.master:  # now: a missing package fails before anything starts
            try:
                import wandb
            except ImportError:
                raise ValueError("wandb_log=True needs the wandb package: pip install wandb") from None
            self.wandb = wandb

    def close(self):
        """Release the folder's lock (the process's end releases it too, however it ends)."""
        if self.lock is not None:
            self.lock.close()

    def kept_settings(self):
        """Settings a resume takes from its checkpoint rather than its config: a run started from pretrained
        weights (GPT-2, a nanoGPT checkpoint) got its shape from them, recorded as init_settings, and keeps
        it, needing no more flags than the first start did. FileNotFoundError for a resume with no checkpoint."""
        if self.cfg["init_from"] != "resume":
            return {}
        if not os.path.isfile(self.ckpt_path):
            raise FileNotFoundError(f"init_from=resume but {self.ckpt_path} does not exist")
        return load_checkpoint(self.ckpt_path, mmap=True).get("init_settings", {})

    def open(self, model_cfg, meta, data_folder, init_settings):
        """Lock the folder for this run (rank 0; eval_only only reads it) and read the checkpoint a resume loads
        (self.ckpt; a new run records init_settings, the model keys init_from's weights fixed). ValueError where
        the run would lose or mix up work (see each message)."""
        if not self.cfg["eval_only"]:  # a folder that cannot be written fails now, not at the first checkpoint
            writable_folder(self.dir, "out_dir")
            try:
                self.lock = lock_file(os.path.join(self.dir, ".lock")) if self.master else None
            except BlockingIOError:
                raise ValueError(f"out_dir {self.dir} is in use by another train.py (it holds its .lock)") from None
        self.dataset_meta, self.init_settings = meta, init_settings
        if self.cfg["init_from"] != "resume":
            if os.path.exists(self.ckpt_path) and not self.cfg["eval_only"]:  # never overwrite a trained model
                raise ValueError(f"{self.ckpt_path} exists; continue it with --init_from=resume, or start the "
                                 f"new run in another out_dir")
            return
        ckpt = load_checkpoint(self.ckpt_path)
        if "dataset_meta" in ckpt and self.cfg["dataset"] == ckpt["config"]["dataset"]:
            check_same_dataset(ckpt["dataset_meta"], meta, data_folder)
        # the model as built (None resolved: a mode's attn_scale, the data's vocabulary), so that attn_scale=0.1
        # at training and None now is a difference, not a silent change
        theirs = {**ckpt["config"], **vars(GPTConfig(**ckpt["model_args"]))}
        changed = differing({**self.cfg, **vars(model_cfg)}, theirs, ignore=set(DEFAULTS) - set(RESUME_FIXED))
        if changed:
            flags = " ".join(f"--{k}={ckpt['config'][k]}" for k in changed if ckpt["config"][k] != self.cfg[k])
            raise ValueError(f"settings differ from the checkpoint's (yours, checkpoint's): {changed}; resume with "
                             f"the checkpoint's settings ({flags}) or start a new out_dir")
        self.ckpt = ckpt

    def resume(self, model, optimizer, scaler, train_gen):
        """Load the checkpoint open() read into the model, optimizer, scaler and RNGs -> its TrainState; a new
        run gets a fresh one."""
        ckpt, self.ckpt = self.ckpt, None  # (its memory is freed once loaded)
        if ckpt is None:
            return TrainState(initialised_from=self.cfg["init_from"], init_settings=self.init_settings)
        try:
            load_full_state_dicts(model, optimizer, ckpt["model"], ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise ValueError(f"{self.ckpt_path} does not fit the model of its own settings: "
                             f"{str(e).splitlines()[0]}") from e
        scaler.load_state_dict(ckpt["scaler"])
        restore_rng(ckpt["rng"], self.job.rank, train_gen, self.job.device, self.cfg["seed"], ckpt["iter_num"])
        state = TrainState(**{f.name: ckpt[f.name] for f in fields(TrainState) if f.name in ckpt})
        it = state.resumed_at = state.last_saved = state.iter_num
        # what this resume changes that can change the run's numbers (tokens per step, max_iters, the eval set,
        # dtype...; not where it lives or how it logs): report.py shows such a setting as changed
        changed = {k: list(v) for k, v in differing(ckpt["config"], self.cfg, NOT_RESULTS | {"data_dir"}).items()}
        state.resumes = state.resumes + ([dict(iter=it, changed=changed)] if changed else [])
        self.job.log(f"resumed from {self.ckpt_path} at iter {it}, after {clock(state.elapsed_s)} of training"
            + (f"; max_iters={self.cfg['max_iters']} is reached already, nothing to train"
               if it >= self.cfg["max_iters"] else ""))
        return state

    def start(self, config, state):
        """Write config.json (the settings of this start, config: what else to record) and start the metrics
        log: a new run's anew, a resumed one's cut after its checkpoint (its eval row too when that eval is
        still to come)."""
        if not self.master:
            return
        atomic_write_text(os.path.join(self.dir, "config.json"), json.dumps(
            {**self.cfg, **config, "initialised_from": state.initialised_from, "resumes": state.resumes,
             "param_counts": param_counts(GPTConfig(**config["model_args"])), "code": code_version()}, indent=2))
        trained = -1 if state.resumed_at is None else state.resumed_at
        rows = [r for r in read_metrics(self.dir, train_rows=True)
                if r["iter"] <= trained - ("val_loss" in r and state.eval_pending)]
        atomic_write_text(os.path.join(self.dir, "metrics.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
        if self.wandb is not None:
            self.wandb.init(project=self.cfg["wandb_project"], name=self.cfg["wandb_run_name"], config=self.cfg)

    def summary(self, state):
        """A finished run's last log lines: its checkpoint and metrics, and the commands that read them."""
        kept = "no checkpoint" if state.last_saved is None else f"checkpoint {self.ckpt_path}"
        if state.last_saved not in (None, state.iter_num):  # always_save_checkpoint=False keeps the best
            kept += f" (iter {state.last_saved}, its lowest val loss)"
        out = shlex.quote(self.dir)
        return (f"done: {state.iter_num} iterations; {kept}, metrics {self.dir}/metrics.jsonl\n"
                f"next: text: python sample.py --out_dir={out}; loss: python eval.py --out_dir={out} --full; "
                f"compare: python -m research.report {out} OTHER_RUN")

    def log_metrics(self, row):
        """Append one row to metrics.jsonl (NaN/inf written as null: JSON has no NaN), and to wandb."""
        if not self.master:
            return
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with open(os.path.join(self.dir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.wandb is not None:
            self.wandb.log(row)

    def save(self, model, optimizer, scaler, train_gen, state):
        """Checkpoint the whole training state at this step boundary. Every rank calls it (it gathers the RNG
        states, and FSDP's shards); rank 0 writes. CheckpointNotWritten if the file cannot be written."""
        rngs = gather_rng_states(train_gen, self.job.device, self.job.world_size)
        model_state, optimizer_state = full_state_dicts(model, optimizer)
        state.last_saved = state.iter_num
        if not self.master:
            return
        ckpt = dict(model=model_state, optimizer=optimizer_state, scaler=scaler.state_dict(), config=self.cfg,
                    model_args=vars(model.config), rng=rngs, dataset_meta=self.dataset_meta,
                    **{k: v for k, v in asdict(state).items() if k not in ("resumed_at", "last_saved")})
        print(f"saving checkpoint to {self.ckpt_path}", flush=True)  # (a 124M model's: 0.5-1.5 GB)
        try:
            replace_atomically(self.ckpt_path, lambda tmp: torch.save(ckpt, tmp))
        except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
            raise CheckpointNotWritten(f"could not write the checkpoint at iter {state.iter_num} ({e}); the previous "
                                       f"one is intact: {fix_for(e)} and continue with --init_from=resume") from e
