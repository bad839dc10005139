"""
A training run's folder (out_dir) and its files:

    ckpt.pt        the whole training state at the last eval: weights, AdamW, every rank's RNG states, where the
                   run is (TrainState), its settings and its dataset's meta.json; written atomically
    config.json    the settings of this start, the model built and the code that built it
    metrics.jsonl  one JSON row per eval: iter, tokens, lr, train/val loss, ms/iter, tokens/s, MFU, elapsed_s
                   (also sent to Weights & Biases with wandb_log=True)

RunFolder is what train.py calls: it refuses a folder that holds another program's files, locks it for one
train.py, finds the checkpoint to resume (checked against the run's settings and data), and writes the three
files. load_checkpoint and model_from_checkpoint serve sample.py, eval.py and convert.py.
"""
import json
import math
import os
import shlex
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

from model import GPT, GPTConfig
from nlq.data import BIN_FILES
from nlq.distributed import full_state_dicts, gather_rng_states, load_full_state_dicts, restore_rng
from nlq.progress import clock
from nlq.settings import DEFAULTS, MODEL_KEYS, NOT_RESULTS, code_version, param_counts, upgrade

# Settings a resumed run must share with its checkpoint, besides the model's: they define the experiment (the
# optimizer's state would silently keep the old betas; a new seed would redraw the eval windows). What may
# change: the run's length, its batch layout, the processes, device, dtype, compile, evals and logging.
RESUME_FIXED = MODEL_KEYS + (
    "dataset", "lr_schedule", "decay_lr", "learning_rate", "min_lr", "warmup_iters", "beta1", "beta2",
    "weight_decay", "grad_clip", "seed")
LARGE_CHECKPOINT_BYTES = 100e6  # a line before and after each write of a larger checkpoint


class CheckpointNotWritten(RuntimeError):
    """The checkpoint could not be written (a full disk, a quota); the previous one is intact."""


# ------------------------------------------------------------------------------------------------ files
def replace_atomically(path, write):
    """write(tmp) to a temp file beside path, then rename it onto path: an interrupted write never leaves a
    broken file at path, nor the temp file. The temp name is this writer's own (pid and a random part)."""
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_text(path, text):
    """Write a small text file (config.json, a report) atomically (see replace_atomically)."""
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    replace_atomically(path, write)


def lock_file(path):
    """An exclusive lock on the file at path (made if missing), held until the returned file is closed or the
    process ends, however it ends (fcntl.flock). None where there are no locks (Windows, some file systems).
    BlockingIOError if another process holds it."""
    try:
        import fcntl
    except ImportError:
        return None
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
    if not os.path.isfile(path):
        return False
    try:
        f = lock_file(path)
    except BlockingIOError:
        return True
    if f is not None:
        f.close()
    return False


def read_metrics(out_dir):
    """The rows of out_dir/metrics.jsonl as dicts; [] for a run not started yet. A last line cut short by a
    killed process is dropped (it is rewritten when the run resumes); another bad line is a ValueError."""
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1:
                raise ValueError(f"{path}: line {i + 1} is not JSON; restore the log or delete that line") from None
    return rows


def read_saved_config(path):
    """A run's config.json as this nlq reads it (settings.upgrade), or None if there is none."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        try:
            saved = json.load(f)
        except ValueError:
            saved = None
    if not isinstance(saved, dict):
        raise ValueError(f"{path} is damaged (not a JSON object of settings); restore it from a copy, or "
                         f"delete its run folder to run the run again")
    return upgrade(saved)


# ------------------------------------------------------------------------------------------ checkpoints
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
    ckpt["config"] = upgrade(ckpt["config"])
    args.pop("fused_f", None)  # (see settings.upgrade)
    ckpt["model"] = {_upgrade_name(k): v for k, v in ckpt["model"].items()}
    first = ckpt["config"]["init_from"]  # where the weights started, for checkpoints that predate recording it
    ckpt.setdefault("initialised_from", None if first == "resume" else first)
    return ckpt


def _upgrade_name(name):
    """A parameter's name as nlq names it since the query modes became modules (2026-11-30): attn.q_proj held
    f (nonlinear), or W_Q itself (residual)."""
    if ".attn.q_proj." not in name:
        return name
    residual = name.endswith((".attn.q_proj.weight", ".attn.q_proj.bias"))
    return name.replace(".attn.q_proj.", ".attn.query.w_q." if residual else ".attn.query.")


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
    resumes: list = field(default_factory=list)  # [{iter, changed: {key: [before, after]}}]: see changed_settings
    init_settings: dict = field(default_factory=dict)  # the model keys init_from's weights fixed (a resume keeps)
    resumed_at: Optional[int] = None  # (not saved) the iter this start resumed at
    last_saved: Optional[int] = None  # (not saved) the iter of the last checkpoint


class RunFolder:
    """A training run's folder: train.py's checkpoint, config.json and metrics.jsonl (see the module's doc)."""

    def __init__(self, cfg, master):
        self.cfg, self.master, self.dir = cfg, master, cfg["out_dir"]
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
        if cfg["wandb_log"] and master:  # now: a missing package fails before anything starts
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
        it, needing no more flags than the first start did."""
        if self.cfg["init_from"] != "resume" or not os.path.isfile(self.ckpt_path):
            return {}
        return load_checkpoint(self.ckpt_path, mmap=True).get("init_settings", {})

    def open(self, model_cfg, meta, data_folder):
        """Lock the folder for this run (rank 0) and read the checkpoint a resume loads (self.ckpt; None for a
        new run). ValueError if the folder cannot be written, another train.py holds it, a new run would
        overwrite a checkpoint, or a resume asks for other data or RESUME_FIXED settings than its checkpoint's.
        eval_only: the folder is only read."""
        if self.cfg["init_from"] == "resume" and not os.path.isfile(self.ckpt_path):
            raise FileNotFoundError(f"init_from=resume but {self.ckpt_path} does not exist")
        if not self.cfg["eval_only"]:
            self.lock_folder()
        self.dataset_meta = meta
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
        ours = {**{k: self.cfg[k] for k in RESUME_FIXED}, **vars(model_cfg)}
        theirs = {**ckpt["config"], **vars(GPTConfig(**ckpt["model_args"]))}
        changed = {k: (ours[k], theirs[k]) for k in RESUME_FIXED if ours[k] != theirs[k]}
        if changed:
            flags = " ".join(f"--{k}={ckpt['config'][k]}" for k in changed if ckpt["config"][k] != self.cfg[k])
            raise ValueError(f"settings differ from the checkpoint's (yours, checkpoint's): {changed}; resume with "
                             f"the checkpoint's settings ({flags}) or start a new out_dir")
        self.ckpt = ckpt

    def lock_folder(self):
        """Make the folder and lock it for this train.py (rank 0); a folder that cannot be written fails now,
        not at the first checkpoint."""
        try:
            os.makedirs(self.dir, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.dir):
                pass
            self.lock = lock_file(os.path.join(self.dir, ".lock")) if self.master else None
        except BlockingIOError:
            raise ValueError(f"out_dir {self.dir} is in use by another train.py (it holds {self.dir}/.lock)") from None
        except OSError as e:
            raise ValueError(f"cannot write to out_dir {self.dir} ({e.strerror or e}); choose another") from e

    def resume(self, model, optimizer, scaler, train_gen, rank, device, log, init_settings):
        """Load the checkpoint open() read into the model, optimizer, scaler and RNGs -> its TrainState; a new
        run gets a fresh one, which records init_settings (the model keys init_from's weights fixed)."""
        ckpt, self.ckpt = self.ckpt, None  # (its memory is freed once loaded)
        if ckpt is None:
            return TrainState(initialised_from=self.cfg["init_from"], init_settings=init_settings)
        try:
            load_full_state_dicts(model, optimizer, ckpt["model"], ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise ValueError(f"{self.ckpt_path} does not fit the model of its own settings: "
                             f"{str(e).splitlines()[0]}") from e
        scaler.load_state_dict(ckpt["scaler"])
        restore_rng(ckpt["rng"], rank, train_gen, device, self.cfg["seed"], ckpt["iter_num"])
        c = ckpt["config"]
        it = ckpt["iter_num"]
        state = TrainState(
            iter_num=it, best_val_loss=ckpt["best_val_loss"], elapsed_s=ckpt.get("elapsed_s", 0.0),
            tokens=ckpt.get("tokens", it * c["gradient_accumulation_steps"] * c["batch_size"] * c["block_size"]),
            eval_pending=ckpt.get("eval_pending", False),
            lr_decay_iters=ckpt.get("lr_decay_iters") or c["lr_decay_iters"] or c["max_iters"],
            initialised_from=ckpt["initialised_from"], init_settings=ckpt.get("init_settings", {}),
            resumes=ckpt.get("resumes", []) + changed_settings(c, self.cfg, it), resumed_at=it, last_saved=it)
        log(f"resumed from {self.ckpt_path} at iter {it}, after {clock(state.elapsed_s)} of training"
            + (f"; max_iters={self.cfg['max_iters']} is reached already, nothing to train"
               if it >= self.cfg["max_iters"] else ""))
        return state

    def start(self, config, state):
        """Write config.json (the settings of this start, config: what else to record) and start the metrics
        log: a new run's anew, a resumed one's cut after its checkpoint (and the checkpoint's own iter when
        its eval is still to come)."""
        if not self.master:
            return
        atomic_write_text(os.path.join(self.dir, "config.json"), json.dumps(
            {**self.cfg, **config, "initialised_from": state.initialised_from, "resumes": state.resumes,
             "param_counts": param_counts(GPTConfig(**config["model_args"])), "code": code_version()}, indent=2))
        last = -1 if state.resumed_at is None else state.resumed_at - state.eval_pending
        rows = [r for r in read_metrics(self.dir) if r["iter"] <= last]
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
        """Append one eval's row to metrics.jsonl (NaN/inf written as null: JSON has no NaN), and to wandb."""
        if not self.master:
            return
        row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with open(os.path.join(self.dir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.wandb is not None:
            self.wandb.log(row)

    def save(self, model, optimizer, scaler, train_gen, state, world_size, device, log):
        """Checkpoint the whole training state at this step boundary. Every rank calls it (it gathers the RNG
        states, and FSDP's shards); rank 0 writes. CheckpointNotWritten if the file cannot be written."""
        rngs = gather_rng_states(train_gen, device, world_size)
        model_state, optimizer_state = full_state_dicts(model, optimizer)
        state.last_saved = state.iter_num
        if not self.master:
            return
        ckpt = dict(model=model_state, optimizer=optimizer_state, scaler=scaler.state_dict(), config=self.cfg,
                    model_args=vars(model.config), rng=rngs, dataset_meta=self.dataset_meta,
                    **{k: v for k, v in asdict(state).items() if k not in ("resumed_at", "last_saved")})
        size = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()  # tied weights once
                    for t in model_state.values()}.values())
        if size > LARGE_CHECKPOINT_BYTES:  # a 124M model's checkpoint is 0.5-1.5 GB
            log(f"writing checkpoint {self.ckpt_path} ({size / 1e6:,.0f} MB of weights) ...", flush=True)
        t0 = time.time()
        try:
            replace_atomically(self.ckpt_path, lambda tmp: torch.save(ckpt, tmp))
        except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
            raise CheckpointNotWritten(f"could not write the checkpoint at iter {state.iter_num} ({e}); the previous "
                                       f"one is intact: free space and continue with --init_from=resume") from e
        if size > LARGE_CHECKPOINT_BYTES:
            log(f"checkpoint written in {time.time() - t0:.1f} s")


def changed_settings(saved, cfg, iter_num):
    """What a resume at iter_num changes that can change the run's numbers (tokens per step, max_iters, the eval
    set, dtype...; not where it lives or how it logs) -> [{"iter": iter_num, "changed": {key: [before, now]}}]
    or []. Kept in the checkpoint and config.json ("resumes"): report.py shows such a setting as changed."""
    skip = NOT_RESULTS | {"data_dir"}
    step = lambda c: c["batch_size"] * c["gradient_accumulation_steps"]  # sequences a step
    if step(saved) == step(cfg):
        skip |= {"batch_size", "gradient_accumulation_steps"}  # the same step split into other micro-batches
    changed = {k: [saved[k], cfg[k]] for k in DEFAULTS if k not in skip and saved[k] != cfg[k]}
    return [dict(iter=iter_num, changed=changed)] if changed else []
