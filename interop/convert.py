"""
Turn a checkpoint of the paper's official code (MarkoKarbevski/beyond_query_linearity, saved by its
train.py) into an nlq run folder, which sample.py, eval.py and train.py then use like one of nlq's own runs;
and turn an nlq run folder into a Hugging Face transformers folder (hf.py).

    python -m interop.convert official PATH/ckpt.pt --out_dir=out/paper_nlq             # GPT-2 BPE, no dataset needed
    python sample.py --out_dir=out/paper_nlq
    python train.py out/paper_nlq/train_config.py --max_iters=70000     # goes on training (needs the dataset)
    python -m interop.convert hf out/paper_nlq --out=hf/paper_nlq

official writes ckpt.pt (train.py's format: weights, AdamW's state and settings converted exactly) and
train_config.py (every setting, init_from="resume"); the model computes the official model's function (logits
within 1e-6, tests/test_convert.py) in the nlq query mode of its official one (MODES). docs/conversions.md has
the details. Nothing is written unless the whole conversion succeeds.
"""
import argparse
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from model import GPT
from nlq.checkpoint import check_finite, fix_for, load_run, replace_atomically
from nlq.data import load_meta
from nlq.settings import DEFAULTS, HelpFormatter, check_value, model_config, validate
from nlq.tokenizers import GPT2_EOT, GPT2_VOCAB, DataError

# ------------------------------------------------------------------------------------- the official format
OFFICIAL_KEYS = ("model", "optimizer", "model_args", "iter_num", "best_val_loss", "config")
# official query_mode -> nlq's: c_attn's rows [W_Q;] W_K; W_V become attn.query.c_q (original) or attn.query.w_q
# (residual), attn.c_k, attn.c_v; residual_gelu's f (attn.residual_*) attn.query.* (F_NAMES)
MODES = {"original": "linear", "identity": "identity", "residual": "linear_residual", "residual_gelu": "nonlinear"}
# model_args fields that define the network, and the nlq GPTConfig field each becomes (its others: query_mode,
# mapped below; head_size, unused: the official model splits heads as n_embd // num_heads; training settings)
MODEL_FIELDS = dict(block_size="block_size", vocab_size="vocab_size", n_layer="n_layer", num_heads="n_head",
                    n_embd="n_embd", mlp_hidden_size="mlp_hidden", scale="attn_scale", bias="bias",
                    tie_weights="tie_weights", dropout="dropout")
# settings of the official train.py (its saved config) that mean the same in nlq
CARRIED_SETTINGS = ("batch_size", "gradient_accumulation_steps", "learning_rate", "min_lr", "warmup_iters",
                    "lr_decay_iters", "max_iters", "decay_lr", "grad_clip", "eval_interval", "log_interval",
                    "always_save_checkpoint")
# f's parameters: official name -> nlq name (residual_gelu)
F_NAMES = {"attn.residual_rmsnorm_input.": "attn.query.norm_in.", "attn.residual_in.": "attn.query.w1.",
           "attn.residual_out.": "attn.query.w2.", "attn.residual_layernorm_output.": "attn.query.norm_out."}


def read_official(path):
    """An official checkpoint (weights_only=True, on the CPU), its model's names without "_orig_mod.".
    FileNotFoundError or ValueError (naming what is missing) for a file that is not one."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is not a file; give the path of the official ckpt.pt")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, another kind of file, Python objects (torch's text would advise running them)
        raise ValueError(f"cannot read {path} with torch.load(weights_only=True) ({type(e).__name__}); it is not "
                         f"the official train.py's ckpt.pt, or it is truncated: download it again") from None
    if isinstance(ckpt, dict) and "rng" in ckpt and "n_head" in ckpt.get("model_args", {}):
        raise ValueError(f"{path} is an nlq checkpoint (train.py's format) already: use its folder directly "
                         f"with sample.py, eval.py or train.py --init_from=resume; no conversion needed")
    missing = [k for k in OFFICIAL_KEYS if k not in ckpt] if isinstance(ckpt, dict) else OFFICIAL_KEYS
    if missing:
        raise ValueError(f"{path} is not an official checkpoint: it lacks {', '.join(missing)} (the official "
                         f"train.py saves {', '.join(OFFICIAL_KEYS)})")
    ckpt["model"] = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    return ckpt


def nlq_model_config(model_args, data_vocab_size):
    """The official model_args -> dict of nlq GPTConfig fields (data_vocab_size: the tokenizer's vocabulary).
    ValueError for what does not fit: a query mode or the vocabulary."""
    mode = model_args["query_mode"]
    if mode not in MODES:
        raise ValueError(f"unknown official query_mode {mode!r}; known: {', '.join(MODES)}")
    args = {nlq: check_value(nlq, model_args[official]) for official, nlq in MODEL_FIELDS.items()}
    args.update(query_mode=MODES[mode], query_hidden=args["n_embd"] // 2,  # the official f is d -> d/2 -> d
                query_norm_in=True, query_norm_out=True, qk_norm=False, flash=True, activation="gelu")
    if data_vocab_size > args["vocab_size"]:
        raise ValueError(f"the vocabulary ({data_vocab_size} tokens) does not fit the checkpoint's "
                         f"embedding ({args['vocab_size']} rows): it is not the tokenizer the model was "
                         f"trained with; name that tokenizer (--tokenizer) or a dataset prepared with it "
                         f"(--dataset, --data_dir)")
    return args


# ------------------------------------------------------------------------------------------ the parameters
def official_source(name, query_mode, C):
    """Where the nlq tensor `name` comes from -> (official name, rows): rows is None (the whole tensor) or a
    slice of its first dimension (W_Q, W_K, W_V, split out of the official c_attn: [W_Q;] W_K; W_V)."""
    first = int(query_mode in ("linear", "linear_residual"))  # the official c_attn has W_Q's rows first
    for part, i in ((".attn.query.c_q.", 0), (".attn.query.w_q.", 0), (".attn.c_k.", first), (".attn.c_v.", first + 1)):
        if part in name:
            return name.replace(part, ".attn.c_attn."), slice(i * C, (i + 1) * C)
    for official, ours in F_NAMES.items():
        name = name.replace(ours, official)
    return name, None


def map_tensors(official, targets, query_mode, C):
    """Official tensors by name -> nlq tensors by name, for the nlq names and shapes in targets {name: shape}.
    Differentiable (renames and row slices), so a test can take gradients through it. ValueError naming
    official tensors that are missing, left over, or of the wrong shape."""
    sources = {name: official_source(name, query_mode, C) for name in targets}
    used = {src for src, _ in sources.values()}
    missing, extra = sorted(used - set(official)), sorted(set(official) - used)
    if missing or extra:
        raise ValueError(f"the official state dict does not match a {query_mode!r} model of its model_args: "
                         + "; ".join(f"{what} {', '.join(keys[:4])}" + (" ..." if len(keys) > 4 else "")
                                     for what, keys in (("missing", missing), ("unexpected", extra)) if keys))
    out = {}
    for name, (src, rows) in sources.items():
        t = official[src] if rows is None else official[src][rows]
        if tuple(t.shape) != tuple(targets[name]):
            raise ValueError(f"{src}{'' if rows is None else f' rows {rows.start}:{rows.stop}'} has shape "
                             f"{tuple(t.shape)}; the model_args give {name} the shape {tuple(targets[name])}")
        out[name] = t if rows is None else t.clone()  # a clone: the parts of c_attn are saved separately
    return out


def split_by_decay(named):
    """[(name, shape)] in parameter order -> AdamW's two groups of names: (≥2-D, decayed), (<2-D, not decayed)."""
    return [n for n, s in named if len(s) >= 2], [n for n, s in named if len(s) < 2]


def convert_optimizer(opt, official_params, nlq_params, query_mode, C):
    """The official AdamW state dict -> nlq's, exactly. official_params / nlq_params: [(name, shape)] in each
    model's named_parameters() order. AdamW numbers parameters group by group, the groups being split_by_decay;
    each nlq parameter gets the state of its official source (official_source), sliced by rows where the weight
    was. Group settings are kept. ValueError if its groups do not fit the model."""
    groups, off_groups = opt["param_groups"], split_by_decay(official_params)
    for g, names, what in zip(groups, off_groups, ("decayed (≥2-D)", "not decayed (<2-D)")):
        if len(g["params"]) != len(names):
            raise ValueError(f"the optimizer's {what} group has {len(g['params'])} parameters; the model has "
                             f"{len(names)}: the optimizer belongs to another model")
    official_id = {name: i for g, names in zip(groups, off_groups) for name, i in zip(names, g["params"])}
    state, new_groups, j = {}, [], 0
    for g, names in zip(groups, split_by_decay(nlq_params)):
        new_groups.append({**{k: v for k, v in g.items() if k not in ("params", "param_names")},
                           "params": list(range(j, j + len(names)))})
        for name in names:
            src, rows = official_source(name, query_mode, C)
            if official_id[src] in opt["state"]:  # step; exp_avg, exp_avg_sq: the parameter's shape, sliced as it
                state[j] = {k: (v[rows] if rows is not None and v.dim() else v).clone()  # W_Q's own step: AdamW
                            for k, v in opt["state"][official_id[src]].items()}      # adds to it in place
            j += 1
    return dict(state=state, param_groups=new_groups)


# ------------------------------------------------------------------------------------------- the run folder
def convert(official, meta, dataset, data_dir, out_dir, source="?"):
    """An official checkpoint (read_official) -> (nlq checkpoint dict, notes: list of str for the user).
    meta: the meta.json of the dataset the converted run will use (dataset, data_dir). ValueError for anything
    that does not fit, and for weights that are not finite (a diverged run)."""
    margs = nlq_model_config(official["model_args"], meta["vocab_size"])
    cfg = dict(DEFAULTS, out_dir=out_dir, dataset=dataset, data_dir=data_dir, init_from="resume", **margs)
    settings = official["config"]
    defaulted = [k for k in CARRIED_SETTINGS if k not in settings]
    cfg.update({k: check_value(k, settings[k]) for k in CARRIED_SETTINGS if k in settings})
    if "eval_iters" in settings:  # its eval set: eval_iters batches of batch_size windows
        cfg["eval_windows"] = check_value("eval_windows", settings["eval_iters"] * cfg["batch_size"])
    group = official["optimizer"]["param_groups"][0]  # what AdamW used; a resume keeps the groups' settings
    beta1, beta2 = map(float, group["betas"])
    cfg.update(weight_decay=float(group["weight_decay"]), beta1=beta1, beta2=beta2)
    validate(cfg)
    model_cfg = model_config(cfg, meta["vocab_size"])
    with torch.device("meta"):  # names and shapes only: no memory, no init
        model = GPT(model_cfg)
    C, mode = model_cfg.n_embd, model_cfg.query_mode

    # the official model without flash attention keeps its causal mask as a buffer, attn.bias: not a weight
    weights = {k: v for k, v in official["model"].items() if not k.endswith(".attn.bias")}
    state_dict = map_tensors(weights, {k: v.shape for k, v in model.state_dict().items()}, mode, C)
    check_finite(weights, source)  # a diverged run: sample.py and eval.py would refuse it
    # the official named_parameters() order: the state dict's order without the tied lm_head.weight
    official_params = [(k, tuple(v.shape)) for k, v in weights.items()
                       if not (model_cfg.tie_weights and k == "lm_head.weight")]
    nlq_params = [(k, tuple(p.shape)) for k, p in model.named_parameters()]
    optimizer = convert_optimizer(official["optimizer"], official_params, nlq_params, mode, C)

    seed = cfg["seed"]  # a fresh run's RNG streams: the official data order cannot be continued
    rng = [dict(train=torch.Generator().manual_seed(seed + 1).get_state(),
                torch=torch.Generator().manual_seed(seed).get_state())]
    path = os.path.abspath(source)
    ckpt = dict(model=state_dict, optimizer=optimizer, scaler=torch.amp.GradScaler("cpu").state_dict(),
                iter_num=int(official["iter_num"]), best_val_loss=float(official["best_val_loss"]), config=cfg,
                model_args=vars(model_cfg), rng=rng, dataset_meta=meta, initialised_from=f"convert.py: {path}",
                lr_decay_iters=cfg["lr_decay_iters"] or cfg["max_iters"],
                converted_from=dict(format="official", path=path, query_mode=official["model_args"]["query_mode"]))
    notes = [f"optimizer: AdamW state of {len(optimizer['state'])} tensors converted exactly; group settings "
             f"kept (weight_decay {cfg['weight_decay']}, betas ({cfg['beta1']}, {cfg['beta2']}))",
             f"not carried: the data order (nlq draws windows from seed {seed}), the GradScaler (fresh)"]
    if defaulted:
        notes.append("not in the checkpoint, nlq's defaults used: "
                     + ", ".join(f"{k}={cfg[k]}" for k in defaulted))
    return ckpt, notes


def tokenizer_meta(tokenizer, dataset):
    """The meta.json fields sample.py and an export need for a tokenizer known without a dataset
    (gpt2 or byte); tokenizer_only=True says no dataset was read (train.py checks no hashes against it)."""
    vocab = {"gpt2": GPT2_VOCAB, "byte": 256}[tokenizer]
    return dict(name=dataset, tokenizer=tokenizer, vocab_size=vocab, dtype="uint16",
                eot_token=GPT2_EOT if tokenizer == "gpt2" else None, tokenizer_only=True)


def export_hf(args):
    """convert.py hf: an nlq run folder -> a transformers folder (hf.export); returns its notes."""
    from interop import hf  # imports transformers
    hf.check_new_folder(args.out)  # before the checkpoint is read
    model, ckpt = load_run(args.run)
    notes = hf.export(model, ckpt["dataset_meta"], args.out, args.bpe_dir, args.code, source=args.run)
    print("\n".join(notes))
    remote = os.path.isfile(os.path.join(args.out, hf.MODELING_FILE))
    trust = ", trust_remote_code=True" if remote else ""  # AutoTokenizer reads config.json too: it needs it
    print(f"load: AutoModelForCausalLM.from_pretrained({args.out!r}{trust}), "
          f"AutoTokenizer.from_pretrained({args.out!r}{trust})")
    return notes


def main(argv=None):
    """Parse the command line and convert. official: write out_dir/{train_config.py, ckpt.pt} and return the
    checkpoint dict; hf: write the transformers folder and return notes. Nothing is written on an error."""
    p = argparse.ArgumentParser(prog="python -m interop.convert", description=__doc__, formatter_class=HelpFormatter,
                                allow_abbrev=False)
    sub = p.add_subparsers(dest="format", required=True)
    o = sub.add_parser("official", help="the paper's train.py checkpoint -> an nlq run folder",
                       formatter_class=HelpFormatter)
    o.add_argument("path", type=os.path.expanduser, help="the checkpoint to convert (ckpt.pt)")
    o.add_argument("--out_dir", type=os.path.expanduser, required=True, help="the nlq run folder to create")
    data = o.add_mutually_exclusive_group()
    data.add_argument("--tokenizer", choices=("gpt2", "byte"), default=None, help="the model's tokenizer, with no "
                      "dataset (default: gpt2 for a checkpoint trained on openwebtext)")
    data.add_argument("--dataset", default=None, help="bind the run to this prepared dataset now: "
                   "data_dir/dataset/meta.json, from prepare_data.py (default: the checkpoint's config's "
                   "dataset, unless --tokenizer applies)")
    o.add_argument("--data_dir", type=os.path.expanduser,
                   default="data", help="parent folder of the dataset (default: data)")
    h = sub.add_parser("hf", help="an nlq run folder -> a Hugging Face transformers folder",
                       formatter_class=HelpFormatter)
    h.add_argument("run", type=os.path.expanduser, help="the nlq run folder (train.py's out_dir, with ckpt.pt)")
    h.add_argument("--out", type=os.path.expanduser, required=True, help="the transformers folder to create")
    h.add_argument("--bpe_dir", type=os.path.expanduser, default=None, help="GPT-2's encoder.json + vocab.bpe "
                   "for the tokenizer (default: the copy shipped in tests/data/gpt2)")
    h.add_argument("--code", choices=("auto", "gpt2", "nlq"), default="auto", help="auto: a plain "
                   "GPT2LMHeadModel where GPT-2 can compute the model, else nlq's modeling code; gpt2: plain or "
                   "an error; nlq: always nlq's modeling code")
    args = p.parse_args(argv)
    if args.format == "hf":
        return export_hf(args)

    # a new run folder, or an empty one: another run's checkpoint, log or settings would pass for this run's
    # (a resume keeps metrics rows up to its iter), and a user's own train_config.py would be replaced
    held = sorted(os.listdir(args.out_dir)) if os.path.isdir(args.out_dir) else []
    if held:
        raise ValueError(f"--out_dir {args.out_dir} is not empty (it holds {', '.join(held[:3])}"
                         f"{' ...' if len(held) > 3 else ''}); convert.py official makes a "
                         f"new run folder: choose a new --out_dir (or empty that one)")
    official = read_official(args.path)
    dataset = args.dataset or official["config"]["dataset"]  # (the official train.py's config names it)
    tokenizer = args.tokenizer or ("gpt2" if dataset == "openwebtext" and not args.dataset else None)
    meta = tokenizer_meta(tokenizer, dataset) if tokenizer else load_meta(os.path.join(args.data_dir, dataset))
    ckpt, notes = convert(official, meta, dataset, args.data_dir, args.out_dir, args.path)

    def write(tmp):  # a folder beside out_dir, then renamed onto it (an empty out_dir is replaced)
        os.makedirs(tmp)
        config_py = [f"# nlq settings of {args.path}, converted by convert.py on "  # every setting, for train.py
                     f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
                     f"# Continue training: python train.py {os.path.join(args.out_dir, 'train_config.py')} "
                     f"[--max_iters=N ...]", *(f"{k} = {v!r}" for k, v in ckpt["config"].items())]
        Path(tmp, "train_config.py").write_text("\n".join(config_py) + "\n")
        torch.save(ckpt, os.path.join(tmp, "ckpt.pt"))
    try:  # a full disk, Ctrl-C: nothing half-done stays
        replace_atomically(os.path.abspath(args.out_dir), write)
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
        raise ValueError(f"cannot write {args.out_dir} ({getattr(e, 'strerror', None) or e}); {fix_for(e)} or "
                         f"choose another --out_dir") from e
    m = ckpt["model_args"]
    print(f"converted {args.path} (official {ckpt['converted_from']['query_mode']}, iter {ckpt['iter_num']}) "
          f"-> {os.path.join(args.out_dir, 'ckpt.pt')} (nlq {m['query_mode']}, {m['n_layer']} layers x "
          f"{m['n_embd']}, {m['n_head']} heads, attn_scale {m['attn_scale']:.6g})")
    print(f"tokenizer {meta['tokenizer']}, vocab {meta['vocab_size']} in an embedding of {m['vocab_size']}; "
          f"dataset {os.path.join(args.data_dir, dataset)}" + (" (not read: to train or score)" if tokenizer else ""))
    print("\n".join(notes))
    print(f"next: python sample.py --out_dir={args.out_dir}\n"
          f"      python eval.py --out_dir={args.out_dir}\n"
          f"      python train.py {os.path.join(args.out_dir, 'train_config.py')} --max_iters=N")
    return ckpt


if __name__ == "__main__":
    try:
        main()
    except (FileNotFoundError, ValueError, DataError) as e:  # DataError: GPT-2's BPE files (--bpe_dir)
        sys.exit(f"error: {e}; nothing was written")
    except KeyboardInterrupt:
        sys.exit("interrupted; nothing was written")
