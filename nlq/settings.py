"""
A run's settings: every key once, with its default and meaning (python train.py --help prints them), and how a
run reads them: the defaults, then a config file (plain Python assignments), then --key=value overrides.

    cfg = parse_config(["config/shakespeare_char.py", "--query_mode=linear"])   # a dict, checked
    model_cfg = model_config(cfg, data_vocab_size)                              # its model.GPTConfig

The model's keys, their defaults, meanings and checks are GPTConfig's (model.py). The same dict is saved as a
run's config.json and in its checkpoint; upgrade() reads the ones older nlq versions wrote.
"""
import argparse
import ast
import dataclasses
import difflib
import functools
import inspect
import math
import os
import re
import subprocess
import typing

import torch

from model import GPT, QUERY_MODE_ALIASES, QUERY_MODES, GPTConfig

# The model's keys: GPTConfig's fields but data_vocab_size, which the dataset sets
MODEL_FIELDS = {f.name: f for f in dataclasses.fields(GPTConfig) if f.name != "data_vocab_size"}
MODEL_KEYS = tuple(MODEL_FIELDS)
# A model key's meaning: the comment beside its field in GPTConfig (model.py)
MODEL_MEANINGS = dict(re.findall(r"^ {4}(\w+): .+?  # (.+)$", inspect.getsource(GPTConfig), re.M))
MODEL_MEANINGS["query_mode"] += (f": {', '.join(QUERY_MODES)} (aliases: "
                                 f"{', '.join(f'{a} = {m}' for a, m in QUERY_MODE_ALIASES.items())})")

# What changing a key does to a run, its kind:
FIXED = "fixed"      # another experiment; a resume must keep the checkpoint's (the model, data, optimizer, seed)
RUN = "run"          # another experiment's numbers, but a run may resume with it changed (its length, batches, evals)
MACHINE = "machine"  # where and how it computes: the same run, made otherwise (device, dtype, compile, processes)
LOG = "log"          # no number changes: where the run's files go and how it logs

# Every config key once: (default, kind, allowed values, meaning); python train.py --help prints them. Allowed:
# None (any of its type), ">0", ">=0", "[0,1)" or a tuple of choices. A key whose default is None takes an int
# (">0") or one of its choices. The model's keys come from GPTConfig (model.py: defaults, meanings, checks).
SETTINGS = dict(
    # I/O
    out_dir=("out", LOG, None, "this run's folder: ckpt.pt, metrics.jsonl, config.json"),
    eval_interval=(1000, RUN, ">0", "evaluate and checkpoint every N steps (and at max_iters)"),
    log_interval=(10, LOG, ">0", "print the training loss, ms/iter, elapsed time and ETA every N steps"),
    eval_windows=(2400, RUN, ">0", "fixed eval windows per split, drawn from the seed alone: the same eval set for "
                                   "every query mode, micro-batch and number of processes"),
    eval_iters=(None, LOG, ">0", "nanoGPT's eval set: eval_iters x batch_size fixed windows per split (sets "
                                 "eval_windows)"),
    eval_only=(False, LOG, None, "evaluate on the fixed eval windows, print the losses and exit; writes nothing "
                                 "(nanoGPT's)"),
    always_save_checkpoint=(True, RUN, None, "checkpoint at every eval; False: only when the val loss improves"),
    eval_full_at_end=(True, RUN, None, "after the last step, also the val loss over every val token once "
                                       "(val_loss_full)"),
    init_from=("scratch", LOG, None, "scratch: a new run; resume: continue from out_dir/ckpt.pt; gpt2, gpt2-medium, "
                                     "gpt2-large, gpt2-xl, a local Hugging Face GPT-2 folder, an nlq export or a "
                                     "nanoGPT ckpt.pt: start from its weights"),
    wandb_log=(False, LOG, None, "log to Weights & Biases (the wandb package is needed only then)"),
    wandb_project=("nlq", LOG, None, "wandb project name"),
    wandb_run_name=("run", LOG, None, "wandb run name"),
    # data: <data_dir>/<dataset>/{train,val}.bin and meta.json, written by prepare_data.py
    data_dir=("data", RUN, None, "parent folder of the datasets prepare_data.py writes"),
    dataset=("openwebtext", FIXED, None, "the dataset: data_dir/dataset/{train,val}.bin and meta.json"),
    batch_size=(12, RUN, ">0", "windows of block_size tokens per micro-batch, per process"),
    gradient_accumulation_steps=(40, RUN, ">0", "micro-batches per optimizer step, over all processes together"),
    # the model: GPTConfig's fields (model.py)
    **{k: (None if k == "vocab_size" else f.default, FIXED, None, MODEL_MEANINGS.get(k, "see GPTConfig"))
       for k, f in MODEL_FIELDS.items()},
    # the optimizer and the learning-rate schedule: linear warmup, then a cosine, linear or wsd decay to min_lr
    optimizer=("adamw", FIXED, ("adamw", "muon"), "adamw: AdamW for every tensor (GPT-2's); muon: torch.optim.Muon "
                                                  "for the 2-D weights inside the blocks, AdamW for the rest "
                                                  "(embedding_lr, unembedding_lr; nanochat's groups)"),
    learning_rate=(6e-4, FIXED, ">0", "peak learning rate, reached after warmup_iters (muon: Muon's, the matrices')"),
    embedding_lr=(0.2, FIXED, ">0", "muon: AdamW's peak rate for the embeddings (nanochat's 0.2 at n_embd 768; it "
                                    "scales its AdamW rates by (n_embd/768)^-0.5: 0.49 at 128)"),
    unembedding_lr=(0.004, FIXED, ">0", "muon: AdamW's peak rate for the LM head (a tied one too), norms and biases "
                                        "(nanochat's 0.004 at n_embd 768; 0.0098 at 128)"),
    max_iters=(60000, RUN, ">=0", "optimizer steps to train"),
    weight_decay=(0.1, FIXED, ">=0", "weight decay of the tensors of 2 or more dimensions (muon: of Muon's matrices; "
                                     "its AdamW groups get none, as nanochat's)"),
    beta1=(0.9, FIXED, "[0,1)", "AdamW beta1 (muon: of its AdamW groups; Muon's momentum is 0.95, Nesterov)"),
    beta2=(0.95, FIXED, "[0,1)", "AdamW beta2"),
    grad_clip=(1.0, FIXED, ">=0", "clip the gradient norm to this; 0 = no clipping"),
    decay_lr=(True, FIXED, None, "warmup, then decay to min_lr; False: learning_rate throughout, no warmup"),
    lr_schedule=("cosine", FIXED, ("cosine", "linear", "wsd"), "the decay's shape after warmup: cosine, linear or wsd "
                 "(warmup-stable-decay: constant, then linear over the last warmdown_ratio; a cool-down branched from "
                 "a stable-phase checkpoint: docs/training.md#cool-downs)"),
    warmdown_ratio=(0.2, FIXED, "[0,1)", "wsd: the decay's share of lr_decay_iters (nanochat's name)"),
    warmup_iters=(2000, FIXED, ">=0", "steps of linear warmup up to learning_rate"),
    lr_decay_iters=(None, RUN, ">0", "the step at which the decay reaches min_lr; None = max_iters (a resumed run: "
                                     "its checkpoint's)"),
    min_lr=(6e-5, FIXED, ">=0", "the learning rate at the end of the decay"),
    max_nonfinite_steps=(10, RUN, ">0", "stop (exit status 3) after this many consecutive steps with a NaN/inf loss"),
    # system
    device=("auto", MACHINE, None, "auto (CUDA, else MPS, else CPU) | cpu | cuda | cuda:N | mps"),
    dtype=("auto", MACHINE, None, "auto (bfloat16 on CUDA if supported, else float16; float32 elsewhere) | float32 "
                                  "| bfloat16 | float16"),
    compile=(None, MACHINE, (True, False, None), "torch.compile the model; None = on for CUDA, off elsewhere"),
    fsdp=(False, MACHINE, None, "under torchrun: shard weights, gradients and AdamW states over the processes "
                                "(FSDP2)"),
    backend=(None, MACHINE, ("nccl", "gloo", None), "torchrun's process-group backend: nccl | gloo; None = nccl on "
                                                    "CUDA, gloo on the CPU"),
    seed=(1337, FIXED, None, "the initial weights, the training stream of windows and the eval windows"),
)
DEFAULTS = {key: default for key, (default, *_) in SETTINGS.items()}
RESUME_FIXED = tuple(k for k, (_, kind, *_) in SETTINGS.items() if kind == FIXED)
NOT_RESULTS = {k for k, (_, kind, *_) in SETTINGS.items() if kind == LOG}  # the same numbers whatever they are
NOT_EXPERIMENT = NOT_RESULTS | {k for k, (_, kind, *_) in SETTINGS.items() if kind == MACHINE}
_MODEL_TYPES = {k: (typing.get_args(f.type) or (f.type,))[0] for k, f in MODEL_FIELDS.items()}
TYPES = {k: _MODEL_TYPES.get(k) or (type(d) if d is not None else int if rule == ">0" else type(rule[0]))
         for k, (d, _, rule, _) in SETTINGS.items()}
DEVICE_NAME = re.compile(r"auto|cpu|(cuda|mps)(:\d+)?")
GPT2_HUB = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # init_from names of OpenAI's GPT-2 on the Hub


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """argparse help that keeps a script's docstring as written and shows each option's default (unless its
    help says what the default means)."""

    def _get_help_string(self, action):
        return action.help if "(default" in (action.help or "") else super()._get_help_string(action)


def at_least(low):
    """An argparse type: an int >= low (prepare_data.py --max_docs=0 refused in argparse's one-line error)."""
    def parse(text):
        value = int(text)  # ValueError: argparse says "invalid int value"
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
        return value
    parse.__name__ = "int"
    return parse


def settings_help():
    """Every config key as '--key=default  meaning', one line each, in SETTINGS' order (train.py --help)."""
    width = max(len(f"--{k}={d!r}") for k, d in DEFAULTS.items())
    return "\n".join(f"  {f'--{key}={default!r}':<{width}}  {meaning}"
                     for key, (default, _, _, meaning) in SETTINGS.items())


def format_config(cfg, width=110):
    """A config as an aligned block of key = value cells, for train.py's start-up log."""
    cells = [f"{k} = {v!r}" for k, v in cfg.items()]
    cell = max(len(c) for c in cells) + 2
    per_line = max(1, width // cell)
    rows = [cells[i:i + per_line] for i in range(0, len(cells), per_line)]
    return "\n".join("  " + "".join(c.ljust(cell) for c in row).rstrip() for row in rows)


def describe(cfg, world_size):
    """train.py's start-up block: every setting, then the tokens of one step and the eval set."""
    accum, batch, block = cfg["gradient_accumulation_steps"], cfg["batch_size"], cfg["block_size"]
    return (f"config:\n{format_config(cfg)}\ntokens per iteration: {accum * batch * block:,} ({accum} micro-batches "
            f"of {batch} x {block}, {world_size} process(es){', FSDP' if cfg['fsdp'] else ''}); eval set: "
            f"{cfg['eval_windows']:,} fixed windows per split" + (
                f" (eval_iters={cfg['eval_iters']} x batch_size={batch}, nanoGPT's eval_iters as fixed windows)"
                if cfg["eval_iters"] is not None else ""))


def check_value(key, value):
    """value if it fits key's type (an int is accepted for a float); ValueError naming the key otherwise."""
    if key not in DEFAULTS:
        match = difflib.get_close_matches(key, DEFAULTS, n=1, cutoff=0.8)  # a typo, not another key
        raise ValueError(f"unknown config key {key!r}" + (f", did you mean {match[0]!r}?" if match else ""))
    want = TYPES[key]
    if value is None and DEFAULTS[key] is None:
        return None
    if want is float and type(value) is int:
        return float(value)
    if type(value) is not want:
        article = "an" if want.__name__[0] in "aeiou" else "a"
        raise ValueError(f"config key {key!r} needs {article} {want.__name__}, got {value!r}")
    return value


def parse_override(arg):
    """'--key=value' -> (key, value). Values are Python literals; anything else is taken as a string."""
    if not arg.startswith("--") or "=" not in arg:
        raise ValueError(f"cannot parse argument {arg!r}: a config file ends in .py, an override is --key=value")
    key, raw = arg[2:].split("=", 1)
    text = {"true": "True", "false": "False", "none": "None"}.get(raw, raw)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    if isinstance(DEFAULTS.get(key), str) and not isinstance(value, str):
        value = raw  # e.g. --wandb_run_name=123 or --out_dir=none stays the string given
    return key, value


def read_config_file(path):
    """The names a config (or study) file assigns: plain Python; names starting with _, modules and functions
    skipped. FileNotFoundError or ValueError naming the file."""
    if not os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        near = difflib.get_close_matches(os.path.basename(path), os.listdir(folder) if os.path.isdir(folder) else [],
                                         n=1, cutoff=0.7)  # nanoGPT's train_shakespeare_char.py: shakespeare_char.py
        raise FileNotFoundError(f"{path} not found" + (f"; did you mean {os.path.join(folder, near[0])}?" if near
                                                       else ""))
    namespace = {}
    try:
        with open(path, "rb") as f:  # bytes: read as Python reads a .py file (a byte-order mark, # -*- coding)
            exec(compile(f.read(), path, "exec"), namespace)
    except Exception as e:  # a failing line: say which file, not a traceback
        raise ValueError(f"{path} failed: {type(e).__name__}: {e}") from e
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and not callable(v) and type(v).__name__ != "module"}


def parse_config(argv):
    """DEFAULTS, then an optional config file (the first argument, ending in .py), then --key=value overrides.
    Returns the checked config dict; ValueError for an unknown key, a wrong type or a value out of range."""
    cfg, eval_set = dict(DEFAULTS), None
    for i, arg in enumerate(argv):
        if arg.endswith(".py") and not arg.startswith("--"):
            if i > 0:
                raise ValueError(f"config file {arg} must be the first argument, before the --key=value overrides")
            updates = read_config_file(arg)
        else:
            updates = dict([parse_override(arg)])
        for key, value in updates.items():
            cfg[key] = check_value(key, value)
            eval_set = key if key in ("eval_windows", "eval_iters") else eval_set  # the one given last wins
    if eval_set == "eval_windows":
        cfg["eval_iters"] = None
    elif cfg["eval_iters"] is not None:  # nanoGPT's eval_iters batches, as fixed windows
        cfg["eval_windows"] = cfg["eval_iters"] * cfg["batch_size"]
    for key in ("out_dir", "data_dir"):  # --out_dir=~/runs: the shell leaves a ~ after = as it is
        cfg[key] = os.path.expanduser(cfg[key])
    validate(cfg)
    return cfg


def validate(cfg):
    """ValueError naming the first setting out of range, the model's included (GPTConfig)."""
    for key, (_, _, rule, _) in SETTINGS.items():
        value = cfg[key]
        if isinstance(rule, tuple) and value not in rule:
            raise ValueError(f"{key}={value!r}; use {' or '.join(map(str, rule))}")
        if rule in (">0", ">=0", "[0,1)") and value is not None:
            if not (math.isfinite(value) and (value > 0 if rule == ">0" else value >= 0)):
                raise ValueError(f"config key {key!r} = {value} must be {'> 0' if rule == '>0' else '>= 0'}")
            if rule == "[0,1)" and not value < 1:
                raise ValueError(f"config key {key!r} = {value} must be < 1")
    if cfg["fsdp"] and cfg["optimizer"] == "muon":
        raise ValueError("fsdp=True with optimizer=muon: Muon orthogonalises whole matrices, which FSDP shards; "
                         "train with DDP (fsdp=False) or optimizer=adamw")
    if cfg["decay_lr"] and cfg["min_lr"] > cfg["learning_rate"]:
        raise ValueError(f"min_lr={cfg['min_lr']:g} is above learning_rate={cfg['learning_rate']:g}: the schedule "
                         f"would rise instead of decay")
    # or pretrained weights (interop/pretrained.py): a GPT-2 name, a folder with a transformers config.json, or
    # a checkpoint file (a nanoGPT ckpt.pt) or a folder holding one
    source = cfg["init_from"]
    if source not in ("scratch", "resume", *GPT2_HUB) and not os.path.isfile(source) and not any(
            os.path.isfile(os.path.join(source, f)) for f in ("config.json", "ckpt.pt")):
        raise ValueError(f"init_from={source!r}; use scratch, resume, a GPT-2 name "
                         f"({', '.join(GPT2_HUB)}), a local transformers GPT-2 folder, an nlq export or a "
                         f"nanoGPT ckpt.pt")
    if not DEVICE_NAME.fullmatch(cfg["device"]):
        raise ValueError(f"device={cfg['device']!r}; use auto, cpu, cuda, cuda:N or mps")
    model_config(cfg, data_vocab_size=cfg["vocab_size"] or 1)


def differing(before, after, ignore):
    """{key: (before's, after's)} for every setting not in ignore that differs between two config dicts. Not
    differences: a query mode and its alias, and one step's windows split into other micro-batches."""
    named = lambda k, v: QUERY_MODE_ALIASES.get(v, v) if k == "query_mode" else v
    step = lambda c: c["batch_size"] * c["gradient_accumulation_steps"]  # windows a step
    if step(before) == step(after):
        ignore = ignore | {"batch_size", "gradient_accumulation_steps"}
    return {k: (before[k], after[k]) for k in DEFAULTS
            if k not in ignore and named(k, before[k]) != named(k, after[k])}


def model_config(cfg, data_vocab_size=None):
    """The GPTConfig of a config dict, its embedding sized for the data.

    data_vocab_size: the tokenizer's vocabulary (meta.json's vocab_size); None when no dataset is at hand
    (parameter counts, benchmarks), which means the config's vocab_size, else GPT-2's 50257. vocab_size: the
    config's, else data_vocab_size rounded up to a multiple of 64 (faster matmuls; the extra rows go unused).
    """
    data_vocab_size = data_vocab_size or cfg["vocab_size"] or 50257
    vocab_size = -(-data_vocab_size // 64) * 64 if cfg["vocab_size"] is None else cfg["vocab_size"]
    model_cfg = GPTConfig(**{**{k: cfg[k] for k in MODEL_KEYS}, "vocab_size": vocab_size,
                             "data_vocab_size": data_vocab_size})  # ValueError for a size out of range
    if data_vocab_size > vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the dataset's vocabulary ({data_vocab_size})")
    return model_cfg


def upgrade(saved):
    """A config dict as this nlq reads it, from a config.json or checkpoint any nlq version wrote: keys added
    since take their defaults, and eval_iters x batch_size (the eval set before eval_windows) becomes
    eval_windows."""
    saved = dict(saved)
    saved.pop("fused_f", None)  # how f was computed (FusedF or as written), once a setting: the same numbers
    if saved.get("eval_windows") is None and saved.get("eval_iters") is not None:
        saved["eval_windows"] = saved["eval_iters"] * saved["batch_size"]
    return {**DEFAULTS, **saved}


def param_counts(model_cfg):
    """GPT(model_cfg).param_breakdown() (counts by role), the model built on the meta device (no memory);
    cached per config, so checking many runs of one arm builds it once."""
    return dict(_meta_model(tuple(sorted(vars(model_cfg).items())))[0])


def flops_per_token(model_cfg):
    """GPT(model_cfg).flops_per_token(): training FLOPs per token at block_size; cached per config."""
    return _meta_model(tuple(sorted(vars(model_cfg).items())))[1]


@functools.lru_cache(maxsize=64)
def _meta_model(items):
    with torch.device("meta"):
        gpt = GPT(GPTConfig(**dict(items)))
    return tuple(gpt.param_breakdown().items()), gpt.flops_per_token()


def code_version():
    """The git commit of this code -> dict(commit, edited: whether tracked .py files differ from it), or None
    outside a git checkout. Saved in each run's config.json: runs made with other code can be told apart."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        git = lambda *a: subprocess.run(["git", "-C", root, *a], capture_output=True, text=True, timeout=10, check=True)
        commit, edited = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no", "--", "*.py")
    except (OSError, subprocess.SubprocessError):  # no git, or not a checkout (CalledProcessError)
        return None
    return dict(commit=commit.stdout.strip(), edited=bool(edited.stdout.strip()))
