"""
Train a GPT (model.py) with a linear, identity or nonlinear attention query.

    python train.py config/shakespeare_char.py --query_mode=nonlinear       # one process (CPU, one GPU, MPS)
    torchrun --standalone --nproc_per_node=8 train.py config/nlq_small.py   # DDP on 8 GPUs

Configuration: the defaults below, then a config file (plain Python assignments), then --key=value overrides.
Unknown keys and values of the wrong type are errors. gradient_accumulation_steps is the global number of
micro-batches per optimizer step; under DDP each rank does its share, and every rank draws the same global
stream of windows, so the data order does not depend on the number of processes.
"""
import ast
import json
import math
import os
import sys
import time
import warnings
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT, GPTConfig
from prepare_data import load_meta

DEFAULTS = dict(
    # I/O
    out_dir="out", eval_interval=1000, log_interval=10, eval_iters=200, always_save_checkpoint=True,
    init_from="scratch",  # scratch | resume (from out_dir/ckpt.pt)
    wandb_log=False, wandb_project="nlq", wandb_run_name="run",
    # data: <data_dir>/<dataset>/{train,val}.bin and meta.json, written by prepare_data.py
    data_dir="data", dataset="openwebtext", batch_size=12, block_size=1024, gradient_accumulation_steps=40,
    # model (GPTConfig); vocab_size None = the dataset's vocabulary rounded up to a multiple of 64
    n_layer=12, n_head=12, n_embd=768, dropout=0.0, bias=False, tie_weights=True, vocab_size=None,
    query_mode="linear", query_hidden=None, mlp_hidden=None, attn_scale=None, qk_norm=False, flash=True,
    # AdamW and the learning-rate schedule: linear warmup, then cosine down to min_lr at lr_decay_iters
    learning_rate=6e-4, max_iters=60000, weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0,
    decay_lr=True, warmup_iters=2000, lr_decay_iters=None, min_lr=6e-5,  # lr_decay_iters None = max_iters
    # system
    device="auto",  # auto | cpu | cuda | cuda:N | mps
    dtype="auto",   # auto (bfloat16 on CUDA if supported, else float16; float32 elsewhere) | float32 | bfloat16 | float16
    compile=None,   # None = on for CUDA, off elsewhere
    seed=1337,
)
# Keys whose default is None, and the type they take otherwise.
OPTIONAL_TYPES = dict(vocab_size=int, query_hidden=int, mlp_hidden=int, attn_scale=float, lr_decay_iters=int,
                      compile=bool)
MODEL_KEYS = ("n_layer", "n_head", "n_embd", "dropout", "bias", "tie_weights", "vocab_size", "block_size",
              "query_mode", "query_hidden", "mlp_hidden", "attn_scale", "qk_norm", "flash")


# ----------------------------------------------------------------------------------------------- configuration
def check_value(key, value):
    """Return value if it fits key's type (ints are accepted for floats); raise ValueError naming the key."""
    if key not in DEFAULTS:
        raise ValueError(f"unknown config key {key!r}; valid keys: {', '.join(sorted(DEFAULTS))}")
    want = OPTIONAL_TYPES.get(key, type(DEFAULTS[key]))
    if value is None and key in OPTIONAL_TYPES:
        return None
    if want is float and type(value) is int:
        return float(value)
    if type(value) is not want:
        raise ValueError(f"config key {key!r} needs a {want.__name__}, got {value!r} ({type(value).__name__})")
    return value


def parse_override(arg):
    """'--key=value' -> (key, value). Values are Python literals; anything else is taken as a string."""
    if not arg.startswith("--") or "=" not in arg:
        raise ValueError(f"cannot parse argument {arg!r}; write overrides as --key=value")
    key, text = arg[2:].split("=", 1)
    text = {"true": "True", "false": "False", "none": "None"}.get(text, text)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    if isinstance(DEFAULTS.get(key), str) and not isinstance(value, str):
        value = text  # e.g. --wandb_run_name=123 stays a string
    return key, value


def read_config_file(path):
    """The settings a config file assigns (plain Python; names starting with _ and imported modules skipped)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path} not found")
    namespace = {}
    try:
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), namespace)
    except Exception as e:  # a syntax error or a failing line: say which file, not a traceback
        raise ValueError(f"config file {path} failed: {type(e).__name__}: {e}") from e
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and not callable(v) and type(v).__name__ != "module"}


def parse_config(argv):
    """DEFAULTS, then an optional config file (the first argument, ending in .py), then --key=value overrides.

    Returns the resolved config dict; ValueError for an unknown key, a wrong type or an invalid setting.
    """
    cfg = dict(DEFAULTS)
    for i, arg in enumerate(argv):
        if arg.endswith(".py") and not arg.startswith("--"):
            if i > 0:
                raise ValueError(f"config file {arg} must be the first argument, before the --key=value overrides "
                                 f"(which apply on top of it)")
            updates = read_config_file(arg)
        else:
            updates = dict([parse_override(arg)])
        for key, value in updates.items():
            cfg[key] = check_value(key, value)
    validate(cfg)
    return cfg


POSITIVE = ("batch_size", "block_size", "gradient_accumulation_steps", "eval_iters", "eval_interval",
            "log_interval", "learning_rate", "lr_decay_iters")
NON_NEGATIVE = ("max_iters", "warmup_iters", "min_lr", "weight_decay", "grad_clip", "beta1", "beta2")


def validate(cfg):
    """ValueError naming the first setting out of range, including the model's (via GPTConfig)."""
    for key in POSITIVE + NON_NEGATIVE:
        if cfg[key] is not None and not (cfg[key] > 0 if key in POSITIVE else cfg[key] >= 0):
            raise ValueError(f"config key {key!r} = {cfg[key]} must be {'> 0' if key in POSITIVE else '>= 0'}")
    if cfg["init_from"] not in ("scratch", "resume"):
        raise ValueError(f"init_from={cfg['init_from']!r}; use scratch or resume")
    GPTConfig(**{**{k: cfg[k] for k in MODEL_KEYS}, "vocab_size": cfg["vocab_size"] or 1})


# ----------------------------------------------------------------------------------------------------- system
def setup_distributed(cfg):
    """Returns (rank, local_rank, world_size); starts the process group under torchrun (RANK set)."""
    if "RANK" not in os.environ:
        return 0, 0, 1
    rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    use_cuda = cfg["device"] != "cpu" and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return rank, local_rank, world


def resolve_device(cfg, local_rank, world_size):
    """-> (device str, device_type, torch dtype); turns TF32 on for CUDA. Never touches CUDA on a machine
    without it. ValueError for an unknown or unavailable device or dtype."""
    device = cfg["device"]
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if device.split(":")[0] not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device={device!r}; use auto, cpu, cuda, cuda:N or mps")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device} but CUDA is not available here; use --device=cpu (or auto)")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device=mps but MPS is not available here; use --device=cpu (or auto)")
    if device == "cuda" and world_size > 1:
        device = f"cuda:{local_rank}"
    device_type = device.split(":")[0]
    dtype = cfg["dtype"]
    if dtype == "auto":
        dtype = "float32" if device_type != "cuda" else "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype {dtype!r} is not one of auto, float32, bfloat16, float16")
    if dtype == "float16" and device_type != "cuda":
        raise ValueError("dtype float16 needs CUDA (its GradScaler); use bfloat16 or float32 on this device")
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device, device_type, getattr(torch, dtype)


def autocast(device_type, ptdtype):
    """The mixed-precision context for forward passes: none for float32."""
    return nullcontext() if ptdtype == torch.float32 else torch.autocast(device_type=device_type, dtype=ptdtype)


# ------------------------------------------------------------------------------------------------------- data
def open_split(data_dir, split, dtype, block_size):
    """A read-only np.memmap of <split>.bin; ValueError if it holds fewer than block_size + 1 tokens."""
    path = os.path.join(data_dir, f"{split}.bin")
    data = np.memmap(path, dtype=dtype, mode="r")
    if len(data) < block_size + 1:
        raise ValueError(f"{path} holds {len(data)} tokens, fewer than block_size + 1 = {block_size + 1}; "
                         f"use a smaller block_size or a larger {split} split (prepare_data.py --val_fraction)")
    return data


def padded_vocab(vocab_size):
    """A dataset's vocabulary size rounded up to a multiple of 64 (faster matmuls; the extra rows go unused)."""
    return -(-vocab_size // 64) * 64


def window_starts(n_tokens, block_size, shape, generator):
    """Random window offsets in [0, n_tokens - block_size), as an int64 tensor of the given shape."""
    return torch.randint(n_tokens - block_size, shape, generator=generator)


def eval_windows(n_tokens, block_size, batch_size, eval_iters, seed):
    """The fixed eval windows, (eval_iters, batch_size) offsets: the same for every run with the same seed,
    data, batch_size and block_size, so all query modes are evaluated on identical batches."""
    return window_starts(n_tokens, block_size, (eval_iters, batch_size), torch.Generator().manual_seed(seed))


def get_batch(data_path, dtype, starts, block_size, device):
    """Windows at the given offsets (B,) -> x, y (B, block_size) int64 on device; y is x shifted by one.
    The memmap is re-opened per batch so pages do not pile up in the process's memory."""
    data = np.memmap(data_path, dtype=dtype, mode="r")
    windows = np.stack([data[i:i + block_size + 1] for i in starts.tolist()]).astype(np.int64)
    x, y = torch.from_numpy(windows[:, :-1].copy()), torch.from_numpy(windows[:, 1:].copy())
    if device.startswith("cuda"):
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


# ------------------------------------------------------------------------------------------------ the job
def get_lr(it, cfg):
    """Learning rate at iteration it: linear warmup (lr(0) > 0), cosine to min_lr at lr_decay_iters, then flat."""
    if not cfg["decay_lr"]:
        return cfg["learning_rate"]
    decay_iters = cfg["lr_decay_iters"] or cfg["max_iters"]
    if it < cfg["warmup_iters"]:
        return cfg["learning_rate"] * (it + 1) / (cfg["warmup_iters"] + 1)
    if it >= decay_iters:
        return cfg["min_lr"]
    progress = (it - cfg["warmup_iters"]) / max(1, decay_iters - cfg["warmup_iters"])
    return cfg["min_lr"] + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg["learning_rate"] - cfg["min_lr"])


@torch.no_grad()
def estimate_loss(model, splits, ctx, rank, world_size, device):
    """Mean cross-entropy (nats/token) per split over its fixed eval windows, sharded over ranks."""
    model.eval()
    out = {}
    for split, (path, dtype, windows, block_size) in splits.items():
        total = torch.zeros(2, device=device)  # loss sum, batch count
        for k in range(rank, len(windows), world_size):
            x, y = get_batch(path, dtype, windows[k], block_size, device)
            with ctx:
                _, loss = model(x, y)
            total += torch.stack([loss.float(), torch.ones((), device=device)])
        if world_size > 1:
            dist.all_reduce(total)
        out[split] = (total[0] / total[1]).item()
    model.train()
    return out


def load_checkpoint(path):
    """A train.py checkpoint, loaded onto the CPU; ValueError if it is missing keys or cannot be read."""
    try:
        ckpt = torch.load(path, map_location="cpu")  # CPU first: resume peaks at a fresh start's memory
    except Exception as e:
        raise ValueError(f"{path} is corrupt or not a train.py checkpoint ({type(e).__name__}); "
                         f"restore a copy, or delete it to start again") from e
    missing = {"model", "optimizer", "iter_num", "config", "model_args", "rng"} - set(ckpt)
    if missing:
        raise ValueError(f"{path} is not a train.py checkpoint (no {', '.join(sorted(missing))})")
    return ckpt


def save_checkpoint(path, state):
    """torch.save to a temp file, then rename: an interrupted save never leaves a broken ckpt.pt."""
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def rng_state(train_gen, device_type):
    state = dict(train=train_gen.get_state(), torch=torch.get_rng_state())
    if device_type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state, train_gen, device_type):
    train_gen.set_state(state["train"])
    torch.set_rng_state(state["torch"])
    if device_type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def append_metrics(out_dir, row, truncate_after=None):
    """Append one JSON line to out_dir/metrics.jsonl. With truncate_after, first drop lines with iter > it
    (written after the checkpoint a run resumes from), so the log matches the resumed run."""
    path = os.path.join(out_dir, "metrics.jsonl")
    if truncate_after is not None and os.path.exists(path):
        with open(path) as f:
            keep = [line for line in f if line.strip() and json.loads(line)["iter"] <= truncate_after]
        with open(path + ".tmp", "w") as f:
            f.writelines(keep)
        os.replace(path + ".tmp", path)
    if row is not None:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def model_args_and_checkpoint(cfg, meta, ckpt_path):
    """GPTConfig arguments for this run, and the checkpoint to resume from (None for init_from=scratch).

    ValueError if out_dir is a file, vocab_size is too small for the data, a scratch run would overwrite a
    checkpoint, or a resumed run asks for other model settings or another dataset than its checkpoint's.
    """
    if os.path.exists(cfg["out_dir"]) and not os.path.isdir(cfg["out_dir"]):
        raise ValueError(f"out_dir {cfg['out_dir']} is a file; choose a folder")
    model_args = {k: cfg[k] for k in MODEL_KEYS}
    model_args["vocab_size"] = cfg["vocab_size"] or padded_vocab(meta["vocab_size"])
    if meta["vocab_size"] > model_args["vocab_size"]:
        raise ValueError(f"vocab_size={model_args['vocab_size']} is smaller than the dataset's vocabulary "
                         f"({meta['vocab_size']}); leave vocab_size unset (None) to size it from the data")
    if cfg["init_from"] == "scratch":
        if os.path.exists(ckpt_path):  # never overwrite a trained model by accident
            raise ValueError(f"{ckpt_path} exists; continue it with --init_from=resume, or pick a new out_dir "
                             f"(or delete the old run) to start from scratch")
        return model_args, None
    if not os.path.isfile(ckpt_path):
        raise FileNotFoundError(f"init_from=resume but {ckpt_path} does not exist; use init_from=scratch")
    ckpt = load_checkpoint(ckpt_path)
    changed = {k: (v, ckpt["model_args"][k]) for k, v in model_args.items()
               if ckpt["model_args"][k] != v and cfg[k] is not None}
    if ckpt["config"]["dataset"] != cfg["dataset"]:
        changed["dataset"] = (cfg["dataset"], ckpt["config"]["dataset"])
    if changed:
        raise ValueError(f"settings differ from the checkpoint's (yours, checkpoint's): {changed}; "
                         f"resume with the checkpoint's settings or start a new out_dir")
    return ckpt["model_args"], ckpt


def train(cfg):
    """Run one training job from a resolved config dict (see DEFAULTS). Returns the last eval's losses.

    Raises ValueError / FileNotFoundError for invalid settings, data or checkpoints, before anything is written.
    """
    validate(cfg)
    rank, local_rank, world_size = setup_distributed(cfg)
    master = rank == 0
    log = print if master else (lambda *a, **k: None)
    accum = cfg["gradient_accumulation_steps"]
    if accum % world_size:
        raise ValueError(f"gradient_accumulation_steps={accum} is not divisible by the {world_size} processes; "
                         f"make it a multiple of {world_size}")
    local_accum = accum // world_size
    device, device_type, ptdtype = resolve_device(cfg, local_rank, world_size)
    ctx = autocast(device_type, ptdtype)
    tokens_per_iter = accum * cfg["batch_size"] * cfg["block_size"]

    data_dir = os.path.join(cfg["data_dir"], cfg["dataset"])
    meta = load_meta(data_dir)
    bs, T = cfg["batch_size"], cfg["block_size"]
    splits, n_tokens = {}, {}
    for split in ("train", "val"):
        n_tokens[split] = len(open_split(data_dir, split, meta["dtype"], T))
        windows = eval_windows(n_tokens[split], T, bs, cfg["eval_iters"], cfg["seed"])
        splits[split] = (os.path.join(data_dir, f"{split}.bin"), meta["dtype"], windows, T)

    ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
    model_args, ckpt = model_args_and_checkpoint(cfg, meta, ckpt_path)

    torch.manual_seed(cfg["seed"])  # the same initial weights for every rank and every run with this seed
    model = GPT(GPTConfig(**model_args))
    log(model.param_table())
    model.to(device)
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"],
                                           (cfg["beta1"], cfg["beta2"]), device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=(ptdtype == torch.float16))
    train_gen = torch.Generator().manual_seed(cfg["seed"] + 1)  # the training stream of windows
    torch.manual_seed(cfg["seed"] + rank)  # dropout differs per rank
    iter_num, best_val = 0, float("inf")
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        restore_rng(ckpt["rng"][rank] if rank < len(ckpt["rng"]) else ckpt["rng"][0], train_gen, device_type)
        iter_num, best_val = ckpt["iter_num"], ckpt["best_val_loss"]
        log(f"resumed from {ckpt_path} at iter {iter_num}" + (f"; max_iters={cfg['max_iters']} is reached already, "
            "nothing to train (raise max_iters to go on)" if iter_num >= cfg["max_iters"] else ""))
        del ckpt

    if master:
        os.makedirs(cfg["out_dir"], exist_ok=True)
        with open(os.path.join(cfg["out_dir"], "config.json"), "w") as f:
            json.dump({**cfg, "model_args": model_args, "world_size": world_size, "resolved_device": device,
                       "resolved_dtype": str(ptdtype), "tokens_per_iter": tokens_per_iter}, f, indent=2)
        # a fresh run starts a fresh log; a resumed one drops lines written after its checkpoint
        append_metrics(cfg["out_dir"], None, truncate_after=iter_num if cfg["init_from"] == "resume" else -1)
    log(json.dumps(cfg))
    log(f"tokens per iteration: {tokens_per_iter:,} ({accum} micro-batches of {bs} x {T}, {world_size} processes)")

    raw_model = model
    use_compile = cfg["compile"] if cfg["compile"] is not None else device_type == "cuda"
    if use_compile:
        if torch._dynamo.is_dynamo_supported():
            model = torch.compile(model)
        else:
            warnings.warn("torch.compile is not supported on this platform; running eager")
    if world_size > 1:
        model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)
    if cfg["wandb_log"] and master:
        import wandb
        wandb.init(project=cfg["wandb_project"], name=cfg["wandb_run_name"], config=cfg)

    losses, steps_timed, time_timed = {}, 0, 0.0

    def evaluate_and_save():
        """Eval on the fixed windows, append a metrics line, checkpoint. Called by every rank (collectives)."""
        nonlocal best_val, losses, steps_timed, time_timed
        losses = estimate_loss(model, splits, ctx, rank, world_size, device)
        rngs = [rng_state(train_gen, device_type)]  # each rank's RNG, so a resume continues every stream
        if world_size > 1:
            rngs = [None] * world_size
            dist.all_gather_object(rngs, rng_state(train_gen, device_type))
        if not master:
            return
        dt = time_timed / steps_timed if steps_timed else None
        row = dict(iter=iter_num, tokens=iter_num * tokens_per_iter, lr=get_lr(max(iter_num - 1, 0), cfg),
                   train_loss=losses["train"], val_loss=losses["val"], val_ppl=math.exp(losses["val"]),
                   ms_per_iter=dt and 1000 * dt, tokens_per_s=dt and tokens_per_iter / dt,
                   mfu=dt and raw_model.estimate_mfu(bs * local_accum, dt))
        append_metrics(cfg["out_dir"], row)
        log(f"eval iter {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, "
            f"val ppl {row['val_ppl']:.2f}")
        if cfg["wandb_log"]:
            wandb.log(row)
        steps_timed, time_timed = 0, 0.0
        if losses["val"] < best_val or cfg["always_save_checkpoint"]:
            best_val = min(best_val, losses["val"])
            save_checkpoint(ckpt_path, dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(),
                                            scaler=scaler.state_dict(), iter_num=iter_num, best_val_loss=best_val,
                                            config=cfg, model_args=model_args, rng=rngs, dataset_meta=meta))

    if iter_num == 0:
        evaluate_and_save()
    first_step, t0 = True, time.time()
    while iter_num < cfg["max_iters"]:
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        # every rank draws the whole step's windows, then takes its own micro-batches
        starts = window_starts(n_tokens["train"], T, (accum, bs), train_gen)[rank * local_accum:(rank + 1) * local_accum]
        loss_sum = torch.zeros((), device=device)
        for micro in range(local_accum):
            x, y = get_batch(splits["train"][0], meta["dtype"], starts[micro], T, device)
            sync = world_size == 1 or micro == local_accum - 1  # all-reduce gradients on the last micro-step only
            with (nullcontext() if sync else model.no_sync()), ctx:
                _, loss = model(x, y)
                loss = loss / local_accum
            scaler.scale(loss).backward()
            loss_sum += loss.detach()
        if cfg["grad_clip"] > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1

        if device_type == "cuda":
            torch.cuda.synchronize()
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if not first_step:  # the first step pays for compilation and warm-up
            steps_timed, time_timed = steps_timed + 1, time_timed + dt
        first_step = False
        if iter_num % cfg["log_interval"] == 0 and master:
            mfu = raw_model.estimate_mfu(bs * local_accum, dt)
            log(f"iter {iter_num}: loss {loss_sum.item():.4f}, lr {lr:.2e}, {1000 * dt:.1f} ms, "
                f"{tokens_per_iter / dt:,.0f} tokens/s" + (f", MFU {100 * mfu:.1f}%" if mfu else ""))
        if iter_num % cfg["eval_interval"] == 0 or iter_num == cfg["max_iters"]:
            evaluate_and_save()
            t0 = time.time()  # eval time is not step time

    log(f"done: {iter_num} iterations; checkpoint {ckpt_path}, metrics {cfg['out_dir']}/metrics.jsonl")
    if world_size > 1:
        dist.destroy_process_group()
    return losses


def usage():
    """The module docstring and every config key with its default, for --help."""
    keys = "\n".join(f"  --{k}={v!r}" for k, v in DEFAULTS.items())
    return f"{__doc__}\nConfig keys and their defaults:\n{keys}"


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        sys.exit(print(usage()))
    try:
        config = parse_config(sys.argv[1:])
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"config error: {e}")
    try:
        train(config)
    except (ValueError, FileNotFoundError) as e:  # bad data, settings or paths: the message says what to do
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit(f"interrupted; the last checkpoint in {config['out_dir']} is intact: continue with "
                 f"--init_from=resume")
