"""
What nlq's scripts share, and nothing else: settings, devices, data windows, losses and checkpoints.

train.py trains; sample.py, eval.py, bench.py, sweep.py, report.py and convert.py read the same config keys,
the same data windows and the same checkpoints through the functions here, so a change made here changes all
of them alike. Everything else lives in the script that uses it.

    settings     SETTINGS (every key's default and meaning), DEFAULTS, NOT_RESULTS, NOT_EXPERIMENT, settings_help,
                 parse_config, validate, model_config, format_config, HelpFormatter    (defaults from GPTConfig)
    devices      resolve_device, check_model_fits, autocast, use_compile
    processes    setup_distributed (torchrun), end_distributed, check_fsdp_support, shard_model (FSDP2)
    data         load_meta, open_split, window_starts, eval_window_count, split_otherwise, eval_windows,
                 get_batch
    losses       estimate_loss (fixed windows), full_split_loss (every token once), safe_exp
    checkpoints  load_checkpoint, check_same_dataset, model_from_checkpoint, save_checkpoint,
                 atomic_write_text, replace_atomically, check_output_file, make_writable_folder, read_metrics
"""
import argparse
import ast
import dataclasses
import difflib
import functools
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import typing
import uuid
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from model import GPT, QUERY_MODE_ALIASES, QUERY_MODES, GPTConfig
from prepare_data import GPT2_VOCAB, not_a_folder
from prepare_data import load_meta  # noqa: F401  (load_meta is part of this module's interface)

# ----------------------------------------------------------------------------------------------- settings
# The model's keys and defaults are GPTConfig's fields (model.py); data_vocab_size is set from the dataset.
DERIVED_MODEL_FIELDS = ("data_vocab_size",)
MODEL_KEYS = tuple(f.name for f in dataclasses.fields(GPTConfig) if f.name not in DERIVED_MODEL_FIELDS)
MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GPTConfig) if f.name in MODEL_KEYS}
MODEL_DEFAULTS["vocab_size"] = None  # None = the dataset's vocabulary rounded up to a multiple of 64

# Every config key once: (default, one-line meaning). DEFAULTS and train.py --help both come from this table.
# The model's keys take their defaults from GPTConfig (model.py); their meanings are written here.
SETTINGS = dict(
    # I/O
    out_dir=("out", "this run's folder: ckpt.pt, metrics.jsonl, config.json"),
    eval_interval=(1000, "evaluate and checkpoint every N steps (and at max_iters)"),
    log_interval=(10, "print the training loss, ms/iter, elapsed time and ETA every N steps"),
    eval_iters=(200, "with eval_windows unset: eval_iters x batch_size windows per split in each fixed-window "
                     "eval"),
    eval_windows=(None, "fixed eval windows per split, drawn from the seed alone, so the eval set does not "
                        "change with the micro-batch or the number of processes; None = eval_iters x "
                        "batch_size"),
    always_save_checkpoint=(True, "checkpoint at every eval; False: only when the val loss improves"),
    eval_full_at_end=(True, "after the last step, also the val loss over every val token once "
                            "(val_loss_full); hours for a 124M model on a CPU"),
    init_from=("scratch", "scratch: a new run; resume: continue from out_dir/ckpt.pt; gpt2, gpt2-medium, "
                          "gpt2-large, gpt2-xl or a local Hugging Face GPT-2 folder: start from its weights"),
    wandb_log=(False, "log to Weights & Biases (the wandb package is needed only then)"),
    wandb_project=("nlq", "wandb project name"),
    wandb_run_name=("run", "wandb run name"),
    # data: <data_dir>/<dataset>/{train,val}.bin and meta.json, written by prepare_data.py
    data_dir=("data", "parent folder of the datasets prepare_data.py writes"),
    dataset=("openwebtext", "the dataset: data_dir/dataset/{train,val}.bin and meta.json"),
    batch_size=(12, "windows of block_size tokens per micro-batch, per process"),
    gradient_accumulation_steps=(40, "micro-batches per optimizer step, over all processes together"),
    # model: every GPTConfig field, defaults from model.py
    **{key: (MODEL_DEFAULTS[key], meaning) for key, meaning in dict(
        block_size="context length in tokens",
        vocab_size="embedding rows; None = the dataset's vocabulary rounded up to a multiple of 64",
        n_layer="transformer blocks",
        n_head="attention heads (n_embd must be a multiple of it)",
        n_embd="model width d",
        mlp_hidden="MLP hidden width; None = 4 * n_embd",
        query_mode="how attention makes its query q from x (see model.py)",
        query_hidden="width of f's hidden layer (nonlinear); None = n_embd // 2",
        query_norm_in="nonlinear: f's input RMSNorm (False: an ablation)",
        query_norm_out="nonlinear: f's output LayerNorm (False: an ablation)",
        attn_scale="attention scale; None = the mode's default, 1/sqrt(head_dim) (linear) or half that",
        qk_norm="RMS-normalise each head's q and k before their dot product",
        dropout="dropout probability, in [0, 1)",
        bias="biases in the Linear and LayerNorm layers",
        tie_weights="share the token embedding with the LM head",
        flash="F.scaled_dot_product_attention; False: plain matmul-softmax (same maths)",
        activation="the MLP's GELU: gelu (exact, erf) or gelu_tanh (GPT-2's tanh "
                   "approximation; init_from=gpt2 sets it)",
    ).items()},
    # AdamW and the learning-rate schedule: linear warmup, then cosine (or linear) decay to min_lr
    learning_rate=(6e-4, "peak AdamW learning rate, reached after warmup_iters"),
    max_iters=(60000, "optimizer steps to train"),
    weight_decay=(0.1, "AdamW weight decay (on tensors of 2 or more dimensions only)"),
    beta1=(0.9, "AdamW beta1"),
    beta2=(0.95, "AdamW beta2"),
    grad_clip=(1.0, "clip the gradient norm to this; 0 = no clipping"),
    decay_lr=(True, "warmup, then decay to min_lr; False: learning_rate throughout, no warmup"),
    lr_schedule=("cosine", "the decay's shape after warmup (linear with min_lr=0 decays to zero)"),
    warmup_iters=(2000, "steps of linear warmup up to learning_rate"),
    lr_decay_iters=(None, "the step at which the decay reaches min_lr; None = max_iters (a resumed run: "
                          "its checkpoint's)"),
    min_lr=(6e-5, "the learning rate at the end of the decay"),
    # divergence
    max_nonfinite_steps=(10, "stop (exit status 3) after this many consecutive steps with a NaN/inf "
                             "training loss"),
    # system
    device=("auto", "auto (CUDA, else MPS, else CPU) | cpu | cuda | cuda:N | mps"),
    dtype=("auto", "auto (bfloat16 on CUDA if supported, else float16; float32 elsewhere) | float32 | "
                   "bfloat16 | float16"),
    compile=(None, "torch.compile the model; None = on for CUDA, off elsewhere"),
    fsdp=(False, "under torchrun: shard weights, gradients and AdamW states over the processes (FSDP2)"),
    seed=(1337, "the initial weights, the training stream of windows and the eval windows"),
)
_unexplained = [k for k in MODEL_KEYS if k not in SETTINGS]
if _unexplained:  # a new GPTConfig field needs its line above, or it could not be set from a config
    raise RuntimeError(f"GPTConfig fields {_unexplained} have no line in common.SETTINGS; add one "
                       f"(key=(MODEL_DEFAULTS[key], 'its meaning'))")
DEFAULTS = {key: default for key, (default, _) in SETTINGS.items()}
# Keys that do not change a run's results; any other difference means another experiment (sweep.py, report.py)
NOT_RESULTS = {"init_from", "log_interval", "wandb_log", "wandb_project", "wandb_run_name"}
# ... and keys a run may change between starts (a resume on other hardware): the same run, made otherwise
NOT_EXPERIMENT = NOT_RESULTS | {"device", "dtype", "compile", "fsdp"}


def _optional_types():
    """{key: type} for the keys whose default is None: GPTConfig's Optional[...] hints, and train.py's own."""
    hints = typing.get_type_hints(GPTConfig)
    out = {k: typing.get_args(hints[k])[0] for k in MODEL_KEYS if typing.get_origin(hints[k]) is typing.Union}
    return {**out, "vocab_size": int, "lr_decay_iters": int, "compile": bool, "eval_windows": int}


OPTIONAL_TYPES = _optional_types()
CHOICES = dict(init_from=("scratch", "resume"), lr_schedule=("cosine", "linear"))


def allowed_values(key):
    """The values a key accepts, as text for --help ("" when any value of its type will do). query_mode's
    are read from model.QUERY_MODES when asked, so a mode registered later (e.g. from a test) is listed."""
    if key == "query_mode":
        return (f"one of {', '.join(QUERY_MODES)} "
                f"(aliases: {', '.join(f'{a} = {m}' for a, m in QUERY_MODE_ALIASES.items())})")
    if key == "activation":
        return "gelu or gelu_tanh"
    if key in CHOICES:
        return f"one of {', '.join(CHOICES[key])}" + (", a GPT-2 name or a local GPT-2 folder"
                                                      if key == "init_from" else "")
    if type(DEFAULTS[key]) is bool or OPTIONAL_TYPES.get(key) is bool:
        return "True or False" + (" or None" if key in OPTIONAL_TYPES else "")
    return ""


def settings_help():
    """Every config key as '--key=default  meaning [allowed values]', one line each, in SETTINGS' order."""
    width = max(len(f"--{k}={d!r}") for k, d in DEFAULTS.items())
    lines = []
    for key, (default, meaning) in SETTINGS.items():
        allowed = allowed_values(key)
        lines.append(f"  {f'--{key}={default!r}':<{width}}  {meaning}" + (f" [{allowed}]" if allowed else ""))
    return "\n".join(lines)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse help that keeps the script's docstring as written and adds each option's default,
    "(default: X)", unless the option's help already names its default or the default is None, False or ""
    (nothing to show)."""

    def _get_help_string(self, action):
        help_text = action.help or ""
        if (action.default not in (None, False, "", argparse.SUPPRESS) and "default" not in help_text
                and (action.option_strings or action.nargs in ("?", "*"))):
            help_text += " (default: %(default)s)"
        return help_text


def format_config(cfg, width=110):
    """A resolved config as an aligned block, key = value cells in columns, for train.py's start-up log."""
    cells = [f"{k} = {v!r}" for k, v in cfg.items()]
    cell = max(len(c) for c in cells) + 2
    per_line = max(1, width // cell)
    rows = [cells[i:i + per_line] for i in range(0, len(cells), per_line)]
    return "\n".join("  " + "".join(c.ljust(cell) for c in row).rstrip() for row in rows)
POSITIVE = ("batch_size", "block_size", "gradient_accumulation_steps", "eval_iters", "eval_windows",
            "eval_interval",
            "log_interval", "learning_rate", "lr_decay_iters", "max_nonfinite_steps", "vocab_size")
NON_NEGATIVE = ("max_iters", "warmup_iters", "min_lr", "weight_decay", "grad_clip", "beta1", "beta2")
MAX_SEED = 2 ** 62  # |seed| below it: torch's generators take 64-bit seeds, and train.py adds the rank


def check_value(key, value):
    """Return value if it fits key's type (ints are accepted for floats); raise ValueError naming the key."""
    if key not in DEFAULTS:
        match = difflib.get_close_matches(key.lower(), DEFAULTS, n=1)
        raise ValueError(f"unknown config key {key!r}" + (f", did you mean {match[0]!r}?" if match else ".")
                         + f" Valid keys: {', '.join(sorted(DEFAULTS))}")
    want = OPTIONAL_TYPES.get(key, type(DEFAULTS[key]))
    if value is None and key in OPTIONAL_TYPES:
        return None
    if want is float and type(value) is int:
        return float(value)
    if type(value) is not want:
        article = "an" if want.__name__[0] in "aeiou" else "a"
        raise ValueError(f"config key {key!r} needs {article} {want.__name__}, got {value!r} "
                         f"({type(value).__name__})")
    return value


def parse_override(arg):
    """'--key=value' -> (key, value). Values are Python literals; anything else is taken as a string."""
    if not arg.startswith("--") or "=" not in arg:
        hint = ("" if arg.startswith("-") else
                f" (a config file is a .py file: did you mean {arg}.py?)" if os.path.isfile(arg + ".py") else
                f" ({arg} is a folder; a config file is a .py file, e.g. config/shakespeare_char.py)"
                if os.path.isdir(arg) else " (a config file is a .py file)")
        raise ValueError(f"cannot parse argument {arg!r}; write overrides as --key=value{hint}")
    key, raw = arg[2:].split("=", 1)
    text = {"true": "True", "false": "False", "none": "None"}.get(raw, raw)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    if isinstance(DEFAULTS.get(key), str) and not isinstance(value, str):
        value = raw  # e.g. --wandb_run_name=123 or --out_dir=none stays the string given
    return key, value


def read_config_file(path, kind="config file"):
    """The settings a config file (or, kind="study file", a study file) assigns (plain Python; names starting
    with _ and imported modules skipped). ValueError for a file that fails, exits, or writes a dict with a key
    twice (Python keeps the last silently: two arms with one name would be one arm)."""
    if os.path.isdir(path):
        raise FileNotFoundError(f"{kind} {path} is a folder, not a file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{kind} {path} not found")
    namespace, failed = {}, lambda e: ValueError(f"{kind} {path} failed: {type(e).__name__}: {e}")
    try:
        with open(path) as f:
            tree = ast.parse(f.read(), path)
    except (SyntaxError, ValueError, UnicodeDecodeError) as e:  # not Python: say which file, not a traceback
        raise failed(e) from e
    check_repeated_keys(tree, path, kind)
    try:
        exec(compile(tree, path, "exec"), namespace)
    except (Exception, SystemExit) as e:  # a failing line, or sys.exit (which would end the run as a success)
        raise failed(e) from e
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and not callable(v) and type(v).__name__ != "module"}


def check_repeated_keys(tree, path, kind):
    """ValueError if a dict written out in the file (ast tree) repeats a key (one written as a literal: 'a',
    -1, (1, 2); a key computed when the file runs is not checked)."""
    def literal(key):
        try:
            value = ast.literal_eval(key)
            hash(value)
            return value
        except (ValueError, TypeError):  # a name or an expression (a value only when the file runs), a list
            return object()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [literal(k) for k in node.keys if k is not None]  # None: a **mapping spread into it
            repeated = sorted({k for k in keys if keys.count(k) > 1}, key=str)
            if repeated:
                raise ValueError(f"{kind} {path}, line {node.lineno}: a dict repeats the key(s) "
                                 f"{', '.join(map(repr, repeated))}; Python keeps only the last value of each, "
                                 f"so give each entry its own key")


def parse_config(argv):
    """DEFAULTS, then an optional config file (the first argument, ending in .py), then --key=value overrides.

    Returns the resolved config dict; ValueError for an unknown key, a wrong type or an invalid setting.
    """
    cfg = dict(DEFAULTS)
    for i, arg in enumerate(argv):
        if arg.endswith(".py") and not arg.startswith("--"):
            if i > 0:
                raise ValueError(f"config file {arg} must be the first argument, before the --key=value "
                                 f"overrides (which apply on top of it); one config file per run")
            updates = read_config_file(arg)
        else:
            updates = dict([parse_override(arg)])
        for key, value in updates.items():
            cfg[key] = check_value(key, value)
    for key in ("out_dir", "data_dir"):  # --out_dir=~/runs: the shell leaves a ~ after = as it is
        cfg[key] = os.path.expanduser(cfg[key])
    validate(cfg)
    return cfg


DEVICE_NAME = re.compile(r"auto|cpu|(cuda|mps)(:\d+)?")  # no cpu:N: torch would ignore the index


def validate(cfg):
    """ValueError naming the first setting out of range, including the model's (via GPTConfig)."""
    for key in POSITIVE + NON_NEGATIVE:
        value = cfg[key]
        if value is not None and not (math.isfinite(value)
                                      and (value > 0 if key in POSITIVE else value >= 0)):
            raise ValueError(f"config key {key!r} = {value} must be {'> 0' if key in POSITIVE else '>= 0'}"
                             + (" and finite" if value in (math.inf, -math.inf) or value != value else ""))
    for key in ("beta1", "beta2"):  # AdamW's moment decays: an average needs a decay below 1
        if not cfg[key] < 1:
            raise ValueError(f"config key {key!r} = {cfg[key]} must be < 1 (AdamW's moving-average decay; "
                             f"usual: beta1 0.9, beta2 0.95-0.999)")
    if cfg["decay_lr"] and cfg["min_lr"] > cfg["learning_rate"]:
        raise ValueError(f"min_lr={cfg['min_lr']:g} is above learning_rate={cfg['learning_rate']:g}: the "
                         f"schedule would rise instead of decay; lower min_lr (or set decay_lr=False for a "
                         f"constant rate)")
    if not abs(cfg["seed"]) < MAX_SEED:
        raise ValueError(f"config key 'seed' = {cfg['seed']} is too large; use |seed| < 2**62 (torch's "
                         f"generators take 64-bit seeds, and train.py adds the rank to it)")
    for key, choices in CHOICES.items():
        if cfg[key] not in choices and not (key == "init_from" and is_gpt2_source(cfg[key])):
            more = ", a GPT-2 (gpt2, gpt2-medium, gpt2-large, gpt2-xl) or a local transformers GPT-2 folder" \
                if key == "init_from" else ""
            if key == "init_from" and os.sep in cfg[key] and not os.path.exists(cfg[key]):
                more += f" (no folder {cfg[key]} exists)"
            raise ValueError(f"{key}={cfg[key]!r}; use {' or '.join(choices)}{more}")
    if not DEVICE_NAME.fullmatch(cfg["device"]):  # a name no machine has (whether this one has it: resolve_device)
        raise ValueError(f"device={cfg['device']!r}; use auto, cpu, cuda, cuda:N or mps")
    for key in ("out_dir", "data_dir", "dataset"):
        if not cfg[key].strip():
            raise ValueError(f"config key {key!r} is empty; give a folder name, e.g. --{key}={DEFAULTS[key]}")
        if cfg[key] != cfg[key].strip():  # "shakespeare_char ": a folder no one meant
            raise ValueError(f"{key}={cfg[key]!r} begins or ends with white space; drop it "
                             f"(--{key}={cfg[key].strip()})")
    model_config(cfg, data_vocab_size=cfg["vocab_size"] or 1)


GPT2_HUB = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # init_from names of OpenAI's GPT-2 on the Hub


def is_gpt2_source(init_from):
    """Whether init_from names GPT-2 weights (hf.py imports them): a GPT2_HUB name or a local folder with a
    transformers config.json."""
    return init_from in GPT2_HUB or os.path.isfile(os.path.join(init_from, "config.json"))


def padded_vocab(vocab_size):
    """A dataset's vocabulary size rounded up to a multiple of 64 (faster matmuls; the extra rows go
    unused)."""
    return -(-vocab_size // 64) * 64


def model_config(cfg, data_vocab_size=None):
    """The GPTConfig of a config dict: its model keys, with the embedding sized for the data.

    data_vocab_size: the tokenizer's vocabulary (meta.json's vocab_size); None when no dataset is at hand
    (parameter counts, benchmarks on random ids), which means the config's vocab_size, else GPT-2's 50257.
    vocab_size = the config's, else data_vocab_size rounded up to a multiple of 64. ValueError if the config's
    vocab_size is smaller than the data's vocabulary.
    """
    data_vocab_size = data_vocab_size or cfg["vocab_size"] or GPT2_VOCAB
    vocab_size = cfg["vocab_size"] or padded_vocab(data_vocab_size)
    if data_vocab_size > vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the dataset's vocabulary "
                         f"({data_vocab_size}); leave vocab_size unset (None) to size it from the data")
    return GPTConfig(**{**{k: cfg[k] for k in MODEL_KEYS}, "vocab_size": vocab_size,
                        "data_vocab_size": data_vocab_size})


def param_counts(model_cfg):
    """GPT(model_cfg).param_breakdown() (model.py: counts by role, ints), the model built on the meta device
    (no memory, no weights); cached per config, so checking many runs of one arm builds it once."""
    return dict(_param_counts(tuple(sorted(vars(model_cfg).items()))))


@functools.lru_cache(maxsize=64)
def _param_counts(items):
    with torch.device("meta"):
        return tuple(GPT(GPTConfig(**dict(items))).param_breakdown().items())


def flops_per_token(model_cfg):
    """GPT(model_cfg).flops_per_token() (model.py: training FLOPs per token at block_size, an int), the model
    built on the meta device; cached per config."""
    return _flops_per_token(tuple(sorted(vars(model_cfg).items())))


@functools.lru_cache(maxsize=64)
def _flops_per_token(items):
    with torch.device("meta"):
        return GPT(GPTConfig(**dict(items))).flops_per_token()


def code_version():
    """The git commit of the code this runs (the repository holding common.py) -> dict(commit: 40 hex digits,
    edited: whether tracked .py files differ from it), or None outside a git checkout (a copy, no git). Saved
    in each run's config.json, so that runs made with other code can be told apart."""
    root = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10)
        edited = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--",
                                 "*.py"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return None
    if commit.returncode or edited.returncode:
        return None
    return dict(commit=commit.stdout.strip(), edited=bool(edited.stdout.strip()))


# ------------------------------------------------------------------------------------------------ devices
def resolve_device(cfg, local_rank=0, world_size=1):
    """-> (device str, device_type, torch dtype) from cfg's device and dtype; turns TF32 on for CUDA.

    Never touches CUDA on a machine without it. ValueError for an unknown or unavailable device or dtype.
    """
    device = cfg["device"]
    if device == "auto":
        device = ("cuda" if torch.cuda.is_available()
                  else "mps" if torch.backends.mps.is_available() else "cpu")
    if not DEVICE_NAME.fullmatch(device):
        raise ValueError(f"device={device!r}; use auto, cpu, cuda, cuda:N or mps")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device} but CUDA is not available here; use --device=cpu (or auto)")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise ValueError(f"device={device} but this machine has {torch.cuda.device_count()} GPU(s), "
                         f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    if device.startswith("mps") and not torch.backends.mps.is_available():
        raise ValueError(f"device={device} but MPS is not available here; use --device=cpu (or auto)")
    if device == "cuda" and world_size > 1:
        device = f"cuda:{local_rank}"
    device_type = device.split(":")[0]
    dtype = cfg["dtype"]
    if dtype == "auto":
        dtype = ("float32" if device_type != "cuda"
                 else "bfloat16" if torch.cuda.is_bf16_supported() else "float16")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype {dtype!r} is not one of auto, float32, bfloat16, float16")
    if dtype == "float16" and device_type != "cuda":
        raise ValueError(f"dtype float16 is supported on CUDA only, not on {device_type}; use bfloat16 or "
                         f"float32 on this device")
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device, device_type, getattr(torch, dtype)


def available_memory(device):
    """Bytes free for a new model on device (a resolved device string): CUDA's free memory, the CPU's
    MemAvailable (Linux: /proc/meminfo); None where it is not known (MPS, other systems)."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    if device == "cpu":
        try:
            with open("/proc/meminfo") as f:
                kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
            return 1024 * kib
        except (OSError, StopIteration, ValueError, IndexError):
            pass
    return None


def check_model_fits(n_params, device, shards=1):
    """ValueError, before the model is built, if its float32 weights, gradients and AdamW's two moments (16
    bytes a parameter, over `shards` FSDP ranks) alone exceed the memory free on device: a size typed wrong
    (mlp_hidden=100000000) would otherwise be killed by the system, or take other jobs' memory with it.
    Activations come on top, so passing says nothing about fitting; an unknown amount of memory is not
    checked."""
    need, free = 16 * n_params / shards, available_memory(device)
    if free is not None and need > free:
        raise ValueError(f"the model has {n_params:,} parameters: their weights, gradients and AdamW state need "
                         f"{need / 2**30:,.1f} GiB{' per rank' if shards > 1 else ''} before any activation, "
                         f"and {device} has {free / 2**30:,.1f} GiB free; make the model smaller (n_layer, "
                         f"n_embd, mlp_hidden, query_hidden, vocab_size)")


def autocast(device_type, ptdtype):
    """The mixed-precision context for forward passes: none for float32."""
    return (nullcontext() if ptdtype == torch.float32
            else torch.autocast(device_type=device_type, dtype=ptdtype))


def use_compile(cfg, device_type):
    """Whether to torch.compile: the config's compile, or None = on for CUDA only."""
    return cfg["compile"] if cfg["compile"] is not None else device_type == "cuda"


# ---------------------------------------------------------------------------------------------- processes
def setup_distributed(cfg):
    """Returns (rank, local_rank, world_size); starts the process group under torchrun (RANK set): NCCL on
    CUDA, gloo on the CPU. ValueError for fsdp=True outside torchrun (there would be nothing to shard
    over)."""
    if "RANK" not in os.environ:
        if cfg["fsdp"]:
            raise ValueError("fsdp=True shards over the processes that torchrun starts; launch with torchrun "
                             "--standalone --nproc_per_node=N (N=1 runs but shards nothing), or drop --fsdp")
        return 0, 0, 1
    launch = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    try:
        rank, local_rank, world = (int(launch[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    except (TypeError, ValueError):  # one of them missing (None) or not an integer
        rank = local_rank = world = -1
    if not (0 <= rank < world and 0 <= local_rank < world and launch["MASTER_ADDR"] and launch["MASTER_PORT"]):
        raise ValueError(f"RANK is set in the environment, but not as torchrun sets it ("
                         f"{', '.join(f'{k}={v}' if v is not None else f'{k} unset' for k, v in launch.items())}"
                         f"): for one process, unset RANK, LOCAL_RANK and WORLD_SIZE; for several, launch with "
                         f"torchrun")
    use_cuda = cfg["device"] != "cpu" and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():  # (tests/torchrun_many.py starts one group for several runs)
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return rank, local_rank, world


def end_distributed():
    """Destroy the process group, if any, after a barrier and a pause. gloo's worker thread frees each
    finished collective (the barrier too) after the ranks return from it, and needs the GIL for that; the
    pause (time.sleep releases the GIL) lets it. Without it, torch 2.13 deadlocked now and then (1 run in 5
    or so of tests/test_train.py's DDP test): DDP's reducer, freed with the GIL held when train() returned,
    dropped the last reference to the process group and joined the worker thread, which waited for the GIL."""
    if dist.is_initialized():
        dist.barrier()
        time.sleep(0.2)
        dist.destroy_process_group()


def check_fsdp_support(device_type, ptdtype):
    """ValueError for the settings fsdp=True does not support: MPS (no process-group backend for it) and
    float16 (its GradScaler would have to agree on inf/NaN across the gradient shards; train.py's does
    not)."""
    if device_type == "mps":
        raise ValueError("fsdp=True needs CUDA (NCCL) or the CPU (gloo); MPS has no process-group backend: "
                         "use --device=cpu, or train on MPS without --fsdp")
    if ptdtype == torch.float16:
        raise ValueError("fsdp=True does not support float16 (its GradScaler would need an inf check across "
                         "the gradient shards); use --dtype=bfloat16 (Ampere or newer) or --dtype=float32")


def is_fsdp(model):
    """True if model is sharded by FSDP2 (shard_model). A model can be only once torch.distributed.fsdp is
    imported (shard_model imports it), so its class is looked up in sys.modules, not imported here."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def shard_model(model, device_type, ptdtype):
    """FSDP2, in place: fully_shard each Block, then the whole GPT, over all processes of the process group.

    Every rank then keeps 1/world_size of each parameter (a DTensor sharded on dim 0), of its gradient and of
    its AdamW moments. The root unit owns the embeddings, ln_f and the LM head, so a tied wte/lm_head weight
    stays one parameter. For bfloat16 the blocks compute with bf16 copies gathered one block at a time and
    gradients are reduced in float32; float32 keeps everything in float32. Parameters move to the device unit
    by unit, so the whole fp32 model never has to fit on one GPU. Returns the model (now also an FSDPModule).
    """
    # imported here, not at the top: FSDP's modules add over a second to the start of sample.py, eval.py,
    # report.py, sweep.py and every --help (a training run's optimizer imports them later anyway)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = DeviceMesh.from_group(dist.group.WORLD, device_type)  # every rank of the process group
    low = ptdtype if ptdtype != torch.float32 else None  # None: parameters keep their float32
    policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


# --------------------------------------------------------------------------------------------------- data
def open_split(data_dir, split, meta, block_size):
    """A read-only np.memmap of <split>.bin, meta the dataset's meta.json (load_meta); FileNotFoundError if it
    is missing, ValueError if it is not a whole number of meta["dtype"] ids (cut short), holds another number
    of tokens than meta.json's <split>_tokens (changed since it was prepared; a same-length edit is not
    caught: hashing every bin at every start would take minutes on OpenWebText), or fewer than
    block_size + 1."""
    path, dtype = os.path.join(data_dir, f"{split}.bin"), meta["dtype"]
    fix = "prepare the dataset again (python prepare_data.py DATASET --overwrite)"
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing (or not a file); {fix}")
    size, itemsize = os.path.getsize(path), np.dtype(dtype).itemsize
    if size % itemsize:
        raise ValueError(f"{path} is {size} bytes, not a whole number of {dtype} token ids ({itemsize} bytes "
                         f"each): it was cut short or does not match meta.json's dtype; {fix}")
    if size == 0:
        raise ValueError(f"{path} is empty; {fix}")
    data = np.memmap(path, dtype=dtype, mode="r")
    prepared = meta.get(f"{split}_tokens")  # None in meta.json files written before the counts
    if prepared is not None and len(data) != prepared:
        raise ValueError(f"{path} holds {len(data)} tokens, but meta.json says {prepared}: the file changed "
                         f"since the dataset was prepared; {fix}")
    if len(data) < block_size + 1:
        raise ValueError(f"{path} holds {len(data)} tokens, fewer than block_size + 1 = {block_size + 1}; "
                         f"use a smaller block_size or a larger {split} split "
                         f"(prepare_data.py --val_fraction)")
    return data


def window_starts(n_tokens, block_size, shape, generator):
    """Random window offsets in [0, n_tokens - block_size), as an int64 tensor of the given shape."""
    return torch.randint(n_tokens - block_size, shape, generator=generator)


def eval_window_count(cfg):
    """The number of fixed eval windows per split: eval_windows, or eval_iters x batch_size when it is unset."""
    return cfg.get("eval_windows") or cfg["eval_iters"] * cfg["batch_size"]  # .get: configs saved before it


def split_otherwise(a, b):
    """The batch-shape keys in which configs a and b (whole config dicts) may differ and still make the same
    run, the same work split into other batches (train.py draws a step's windows and the eval windows from the
    seed alone; more processes split a step). A tuple: eval_iters and eval_windows where the eval set has as
    many windows (eval_window_count), and then also batch_size and gradient_accumulation_steps where a step has
    as many sequences (with eval_windows unset, batch_size sizes the eval set too); () otherwise."""
    if eval_window_count(a) != eval_window_count(b):
        return ()
    step = lambda c: c["batch_size"] * c["gradient_accumulation_steps"]  # sequences a step
    return ("eval_iters", "eval_windows") + (("batch_size", "gradient_accumulation_steps") if step(a) == step(b)
                                             else ())


def eval_windows(n_tokens, block_size, n_windows, seed):
    """The fixed eval windows of a split, (n_windows,) offsets drawn from the seed alone: the same for every run
    with the same seed, data, block_size and number of windows, whatever its micro-batch, accumulation or number
    of processes, so every query mode and every layout of a run is evaluated on identical windows. (They are
    the windows nlq drew as (eval_iters, batch_size) before 2026-12, in the same order.)"""
    return window_starts(n_tokens, block_size, (n_windows,), torch.Generator().manual_seed(seed))


def get_batch(data_path, dtype, starts, block_size, device, vocab_size=None):
    """Windows at the given offsets (B,) -> x, y (B, block_size) int64 on device; y is x shifted by one.
    data_path: a bin's path, or the bin opened in binary mode (train.py holds its bins open: see there). The
    memmap is made per batch so pages do not pile up in the process's memory. ValueError if an id is >=
    vocab_size (when given: meta.json's): the bin does not belong to its meta.json."""
    data = np.memmap(data_path, dtype=dtype, mode="r")
    windows = np.stack([data[i:i + block_size + 1] for i in starts.tolist()]).astype(np.int64)  # (B, T + 1)
    if vocab_size is not None and windows.max() >= vocab_size:
        name = getattr(data_path, "name", data_path)  # an open file: its path
        raise ValueError(f"{name} holds token id {windows.max()}, but meta.json's vocab_size is {vocab_size}: "
                         f"the bin and meta.json do not belong together; prepare the dataset again "
                         f"(python prepare_data.py DATASET --overwrite)")
    x, y = torch.from_numpy(windows[:, :-1].copy()), torch.from_numpy(windows[:, 1:].copy())
    if device.startswith("cuda"):
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


# ------------------------------------------------------------------------------------------------- losses
def safe_exp(x):
    """exp(x) for a loss in nats -> perplexity; inf instead of OverflowError, nan for nan."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def my_share(n, rank, world_size):
    """This rank's batches of n, as (index, counts) pairs: indices rank, rank + world_size, ... < n, each
    counting, then, if n is not a multiple of world_size, one repeat of batch n - 1 that does not count, so
    that every rank runs ceil(n / world_size) forward passes (under FSDP a rank that stopped early would
    leave the others waiting for its all-gathers forever)."""
    indices = range(rank, -(-n // world_size) * world_size, world_size)
    return [(min(k, n - 1), k < n) for k in indices]


def progress_bar(items, show, desc):
    """items under a tqdm bar (on stderr) if show, and only where stderr is a terminal: a log file stays
    clean."""
    return tqdm(items, desc=desc, unit="batch", leave=False, disable=None if show else True)


class EvalStopped(Exception):
    """An evaluation abandoned because its stop() said so (train.py: a stop signal reached a rank)."""


@torch.no_grad()
def estimate_loss(model, splits, ctx, rank=0, world_size=1, device="cpu", vocab_size=None, batch_size=12,
                  progress=False, stop=None):
    """Mean cross-entropy (nats/token) per split over its fixed eval windows, sharded over ranks.

    splits: {name: (bin path or open file, dtype, windows (N,) offsets, block_size)}, evaluated batch_size
    windows at a time (the last batch may be smaller; every window weighs the same); vocab_size: see get_batch.
    Returns {name: float}; a diverged model gives nan or inf, never an error. The model's train/eval mode is
    restored.
    Every rank runs the same number of forward passes (see my_share), as FSDP's collective forward needs.
    progress: a tqdm bar per split (see progress_bar). stop: None, or a function called before every batch,
    on every rank at the same batch: True raises EvalStopped (an eval of many windows ends at a stop signal).
    """
    was_training = model.training
    model.eval()
    out = {}
    try:
        for split, (path, dtype, windows, block_size) in splits.items():
            n_batches = -(-len(windows) // batch_size)  # batch k: windows[k * batch_size : (k + 1) * batch_size]
            total = torch.zeros(2, device=device)  # loss sum over windows, window count
            for k, counts in progress_bar(my_share(n_batches, rank, world_size), progress, f"eval {split}"):
                if stop is not None and stop():
                    raise EvalStopped
                starts = windows[k * batch_size:(k + 1) * batch_size]
                x, y = get_batch(path, dtype, starts, block_size, device, vocab_size)
                with ctx:
                    _, loss = model(x, y)
                if counts:
                    total += len(starts) * torch.stack([loss.float(), torch.ones((), device=device)])
            if world_size > 1:
                dist.all_reduce(total)
            out[split] = (total[0] / total[1]).item()
    finally:
        model.train(was_training)
    return out


def full_split_windows(n_tokens, block_size, batch_size):
    """Consecutive windows covering every target of a split of n_tokens once: [(starts (B,), length), ...].

    Windows start at 0, T, 2T, ...; the last one is shorter, so targets 1..n_tokens-1 are each predicted once.
    """
    starts = torch.arange(0, n_tokens - 1, block_size)
    full = starts[starts + block_size <= n_tokens - 1]  # y = data[s + 1 : s + T + 1] needs s + T + 1 <= n
    batches = [(full[i:i + batch_size], block_size) for i in range(0, len(full), batch_size)]
    if len(full) < len(starts):  # the last, shorter window: targets up to the split's last token
        batches.append((starts[len(full):], n_tokens - 1 - int(starts[-1])))
    return batches


@torch.no_grad()
def full_split_loss(model, ctx, path, dtype, block_size, batch_size, device, rank=0, world_size=1,
                    on_batch=None, vocab_size=None, progress=False, stop=None):
    """Summed cross-entropy over every target of a split once -> (total nats, tokens, windows).

    Batches are sharded over ranks (see my_share) and the sums all-reduced. on_batch(y) is called with each
    batch's targets (B, T) on the CPU (eval.py counts bytes with it). vocab_size: see get_batch. The model's
    train/eval mode is restored. progress: a tqdm bar (see progress_bar). stop: as in estimate_loss.
    """
    was_training = model.training
    model.eval()
    n = len(np.memmap(path, dtype=dtype, mode="r"))
    batches = full_split_windows(n, block_size, batch_size)
    total = torch.zeros(2, dtype=torch.float64, device=device)  # nats, tokens
    try:
        for k, counts in progress_bar(my_share(len(batches), rank, world_size), progress, "whole-split eval"):
            if stop is not None and stop():
                raise EvalStopped
            starts, length = batches[k]
            x, y = get_batch(path, dtype, starts, length, device, vocab_size)
            with ctx:
                _, loss = model(x, y)
            if not counts:
                continue
            total += torch.stack([loss.double() * y.numel(), torch.tensor(y.numel(), dtype=torch.float64,
                                                                          device=device)])
            if on_batch is not None:
                on_batch(y.cpu())
        if world_size > 1:
            dist.all_reduce(total)
    finally:
        model.train(was_training)
    return total[0].item(), int(total[1].item()), sum(len(s) for s, _ in batches)


# -------------------------------------------------------------------------------------------- checkpoints
# train.py's exit status for a run stopped because its loss went NaN/inf (sweep.py reads it)
EXIT_DIVERGED = 3
# train.py's exit status for a run stopped by SIGTERM, SIGUSR1 or SIGUSR2 (SLURM's warnings before a preemption
# or a time limit) after it saved a checkpoint at a step boundary: continue it with --init_from=resume.
# 144 is the status submitit's job controller reads as "requeue me" (submitit.local.local.
# LOCAL_REQUEUE_RETURN_CODE); on SLURM submitit requeues through `scontrol requeue` from its USR2 handler, whatever
# the status, and an admin can name 144 in slurm.conf's RequeueExit to requeue plain sbatch jobs that exit with
# it. It is none of the statuses a run ends with otherwise (0 done, 1 an error, 3 diverged, 128 + N killed by
# signal N: 143 for a SIGTERM that was not caught), so a sweep can tell "stopped cleanly, resumable" apart.
EXIT_PREEMPTED = 144
# train.py's exit status for a run stopped by Ctrl-C (SIGINT), the shell's 128 + 2: sweep.py reports such a run as
# interrupted, not failed (it resumes from its last checkpoint when the sweep runs again)
EXIT_INTERRUPTED = 130
# the entries every train.py checkpoint has, and their types (rng: one dict of RNG states per rank)
CHECKPOINT_TYPES = {"model": dict, "optimizer": dict, "iter_num": int, "config": dict, "model_args": dict,
                    "rng": list}
CHECKPOINT_KEYS = set(CHECKPOINT_TYPES)


def upgrade_state_dict(state_dict):
    """Parameter names of checkpoints written before the query modes became modules (nlq before 2026-11-30):
    attn.q_proj.* held f (nonlinear) or W_Q (residual); now attn.query.* and attn.query.w_q.* do."""
    renamed = {}
    for k, v in state_dict.items():
        if ".attn.q_proj." in k:
            residual = k.endswith((".attn.q_proj.weight", ".attn.q_proj.bias"))
            k = k.replace(".attn.q_proj.", ".attn.query.w_q." if residual else ".attn.query.")
        renamed[k] = v
    return renamed


def load_checkpoint(path, mmap=False):
    """A train.py checkpoint, loaded onto the CPU with weights_only=True.

    mmap=True maps the file instead of reading it: its settings (config, model_args) at once, the tensors read
    only when touched (sample.py and eval.py check the dataset and the tokenizer that way before a long read).
    ValueError if it cannot be read (corrupt, truncated, or another program's format) or lacks train.py's
    keys.
    """
    try:  # CPU first: resume peaks lower
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:
        raise ValueError(f"{path} is corrupt or not a train.py checkpoint ({type(e).__name__}); "
                         f"restore a copy, or delete it to start again") from e
    if not isinstance(ckpt, dict) or CHECKPOINT_KEYS - set(ckpt):
        missing = CHECKPOINT_KEYS - set(ckpt) if isinstance(ckpt, dict) else CHECKPOINT_KEYS
        args = ckpt.get("model_args") if isinstance(ckpt, dict) else None
        official = isinstance(args, dict) and "num_heads" in args
        hint = (" (it is in the paper's official format: convert it into a new run folder with python "
                f"convert.py official {path} --out_dir=NEW_DIR --dataset=NAME)" if official else "")
        raise ValueError(f"{path} is not a train.py checkpoint (no {', '.join(sorted(missing))}){hint}")
    wrong = [f"{key} is {type(ckpt[key]).__name__}, not {kind.__name__}" for key, kind in CHECKPOINT_TYPES.items()
             if not isinstance(ckpt[key], kind)]
    rng = ckpt["rng"]  # a dict per rank ([] in a checkpoint made by hand for sample.py and eval.py)
    if isinstance(rng, list) and not all(isinstance(r, dict) for r in rng):
        wrong.append(f"rng is {rng!r:.60}, not a dict of RNG states per rank")
    if wrong:  # e.g. edited by hand: it would fail later with a TypeError deep in a resume
        raise ValueError(f"{path} is damaged or was edited ({'; '.join(wrong)}); restore a copy, or delete it to "
                         f"start again")
    ckpt["model"] = upgrade_state_dict(ckpt["model"])
    return ckpt


def check_finite_weights(ckpt, path):
    """ValueError if a checkpoint's model weights hold NaN or inf (written by a run that diverged)."""
    bad = [k for k, v in ckpt["model"].items()
           if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"checkpoint weights are not finite (training diverged at iter {ckpt['iter_num']}): "
                         f"{path}, e.g. {bad[0]}; retrain with a lower learning_rate, or use an earlier "
                         f"checkpoint")


def check_same_dataset(trained, meta, data):
    """ValueError if the dataset's meta.json differs from the one at training time
    (tokenizer, vocab, hashes). A checkpoint that recorded only its tokenizer (tokenizer_only: convert.py
    --tokenizer, which read no dataset) is checked on tokenizer and vocabulary only."""
    diffs = [f"{key}: {trained.get(key)!r} at training, {meta.get(key)!r} now"
             for key in ("tokenizer", "vocab_size") if trained.get(key) != meta.get(key)]
    old, new = trained.get("sha256") or {}, meta.get("sha256") or {}
    if not trained.get("tokenizer_only"):
        diffs += [f"sha256 of {f} differs" for f in sorted(old.keys() | new.keys()) if old.get(f) != new.get(f)]
    if diffs:
        raise ValueError(f"dataset {data} is not the data this checkpoint was trained on "
                         f"({'; '.join(diffs)}): the data changed since training; "
                         "pass --data_dir pointing to the data it was trained on "
                         "(or re-prepare it identically)")


def damaged_checkpoint(path, error):
    """The ValueError for a checkpoint whose weights or optimizer state do not fit its own settings."""
    return ValueError(f"{path} does not fit the model of its own settings ({' '.join(str(error).split())}): "
                      f"it is damaged or was edited; restore a copy, or start a new out_dir")


def model_from_checkpoint(ckpt, path):
    """The GPT of a loaded checkpoint (on the CPU, eval mode). ValueError if its weights are not finite or do
    not fit its model_args."""
    check_finite_weights(ckpt, path)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    try:  # train.py saves the unwrapped model: no _orig_mod./module. prefixes
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise damaged_checkpoint(path, e) from e
    return model.eval()


def lock_file(path):
    """An exclusive lock on the file at path (made if missing), held by this process until it closes the
    returned file or ends, however it ends (fcntl.flock). Returns the open file, or None where there are no
    locks (no fcntl, or a file system without them). BlockingIOError if another process holds the lock."""
    try:
        import fcntl
    except ImportError:  # Windows
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


def replace_atomically(path, write):
    """write(tmp) to a temp file beside path, then rename it onto path: an interrupted write (Ctrl-C included)
    never leaves a broken file at path, nor the temp file. The temp name is this writer's own (pid and a random
    part), so two processes writing one path never rename each other's half-written file."""
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_checkpoint(path, state):
    """torch.save, atomically (see replace_atomically)."""
    replace_atomically(path, lambda tmp: torch.save(state, tmp))


def atomic_write_text(path, text):
    """Write a small text file (config.json, a metrics log) atomically (see replace_atomically)."""
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    replace_atomically(path, write)


def check_output_file(path, option, ours):
    """ValueError unless path can be written as a JSON file of results (its folder is made if missing);
    called before a long job, so that a bad path cannot lose its result. option: the command-line option,
    for the message. ours(parsed JSON) -> True if an existing file at path is this command's own output, which
    may be replaced (a note on stderr says so); any other file (a checkpoint, a metrics log, a dataset's
    meta.json) is refused."""
    if os.path.isdir(path):
        raise ValueError(f"{option} {path} is a folder; give a file path, "
                         f"e.g. {os.path.join(path, 'out.json')}")
    if os.path.lexists(path):
        try:  # results are a few kB: a larger file (a checkpoint) is not read
            with open(path, encoding="utf-8") as f:
                mine = os.path.getsize(path) < 2**20 and ours(json.load(f))
        except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
            mine = False
        if not mine:
            raise ValueError(f"{option} {path} exists and is not a results file this command wrote: it would "
                             f"be overwritten; give a new file, e.g. {os.path.splitext(path)[0]}_results.json")
        print(f"note: {option} {path} holds an earlier result of this command; it will be replaced",
              file=sys.stderr)
    try:
        make_writable_folder(os.path.dirname(os.path.abspath(path)))
    except OSError as e:
        raise ValueError(f"{option} {path}: cannot create its folder or write in it ({e.strerror or e}); "
                         f"choose a writable path") from e


def check_creatable_folder(folder, option, example):
    """ValueError unless folder is a folder already or can be made: a non-empty path with no file at it or
    above it, under a folder this process may write in. Creates nothing, so a command can check its output
    path before its work and still write nothing when it fails. option, example: the command-line option
    and a sample value, for the message (e.g. "--out_dir", "out/NAME")."""
    if not str(folder).strip():
        raise ValueError(f"{option} is empty; give the folder to create, e.g. {option}={example}")
    path = os.path.abspath(folder)
    while not os.path.lexists(path):  # the nearest part of the path that exists ("/" at worst)
        path = os.path.dirname(path)
    if not os.path.isdir(path):  # a file, or a link to nothing
        what = not_a_folder(path)[1]
        where = f"is {what}" if path == os.path.abspath(folder) else f"cannot be made: {path} is {what}"
        raise ValueError(f"{option} {folder} {where}; choose another path, e.g. {option}={example}")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {folder}: no permission to write in {path}; choose a writable path")


def make_writable_folder(folder):
    """Make folder if it is missing and create (and drop) a file in it: OSError now, before a long job, if
    it cannot be made or written (a file in the way, a read-only disk, no permission)."""
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
        pass


METRIC_NUMBERS = ("train_loss", "val_loss", "val_loss_full", "ms_per_iter")  # numbers, or null (NaN/inf)


def read_metrics(out_dir):
    """The rows of out_dir/metrics.jsonl as dicts; [] for a run not started yet. A last line cut short by a
    killed process is ignored (it is rewritten when the run resumes). ValueError naming the line for any
    other line that is not a JSON object with an int iter and numbers (or null) as losses."""
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    rows = []
    try:
        with open(path) as f:
            lines = [line for line in f if line.strip()]
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not text (byte {e.start} is not UTF-8): the log is damaged; restore it from "
                         f"a copy") from None
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                continue
            row = None
        numbers = isinstance(row, dict) and all(isinstance(row.get(k), (int, float, type(None)))
                                                 for k in METRIC_NUMBERS)
        if not (numbers and type(row.get("iter")) is int):
            raise ValueError(f"{path}: line {i + 1} is not a metrics row (a JSON object with an int iter and "
                             f"numbers as losses); the log is damaged: restore it from a copy, or delete "
                             f"that line")
        rows.append(row)
    return rows
