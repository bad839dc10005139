"""
Validation loss (nats/token), perplexity, bits per token and bits per byte of a train.py checkpoint.

    python eval.py --out_dir=out/enwiki_bytes         # train.py's fixed eval windows (= metrics.jsonl)
    python eval.py --out_dir=out/enwiki_bytes --full --json val.json   # every token of the val split once
    python eval.py --out_dir=out/owt --split=train     # GPT-2 BPE: tests/data/gpt2, or --bpe_dir=DIR
    python eval.py --out_dir=out/owt --dataset=enwiki --full   # another dataset of the same tokenizer

Default: the fixed random windows train.py draws from the checkpoint's seed (eval_windows of them), so the loss
is the run's val_loss at the checkpoint's iteration (windows may overlap; tokens are counted with multiplicity).
--full: consecutive non-overlapping windows of block_size from offset 0, the last one shorter, so each of the
split's tokens 1..N-1 is predicted exactly once: N - 1 targets for a split of N tokens.
Bits per byte = total nats / ln 2 / UTF-8 bytes of the target text; gpt2's end-of-text token counts 0 bytes.
Deterministic: no sampling, fixed windows. Precision: the checkpoint's dtype setting unless --dtype is given, on
any device: a run trained with dtype=auto is evaluated in float32 on the CPU, one trained with dtype=bfloat16 in
bf16 autocast, on the CPU too (--dtype=float32 for full precision there).

HellaSwag (Zellers et al. 2019, arXiv 1905.07830), instead of the loss:

    python eval.py --out_dir=out/owt --hellaswag=hellaswag_val.jsonl     # 10,042 examples

Zero-shot, completion-style scoring of exactly lm-evaluation-harness's text and metrics (its hellaswag task,
lm_eval/tasks/hellaswag/utils.py; tests/test_lm_eval.py checks that both give the same numbers): the context is
activity_label + ": " + ctx_a + " " + ctx_b.capitalize(), and it and the 4 endings are cleaned of the WikiHow
markers ([title], [header], [step], ...) by harness_preprocess. Each ending, with a space before it, is scored
by the summed log-probability of its tokens given everything before them, tokenised as the harness does
(context + ending encoded whole, the ending's tokens = what follows the context's own encoding). acc counts
the examples whose highest score is the labelled ending; acc_norm does the same with each score divided by
the length of the cleaned ending in characters. A context plus ending longer than block_size + 1 tokens loses
context tokens from the left; an ending longer than block_size is scored on its last block_size tokens. The
file is the public hellaswag_val.jsonl (Zellers et al.'s
https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl).
"""
import argparse
import json
import math
import os
import re
import sys

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from checkpoint import atomic_write_text, check_same_dataset, load_run
from data import eval_windows, get_batch, load_meta, open_split
from distributed import autocast, resolve_device
from losses import estimate_loss, full_split_loss, safe_exp
from prepare_data import GPT2_EOT, get_codec, gpt2_encoding
from settings import HelpFormatter

HELLASWAG_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"


def token_bytes(meta, bpe_dir=None):
    """UTF-8 byte length of each token id's text, an int64 array indexed by id.

    byte: 1 each; char: the character's length; gpt2: the token's bytes, 0 for end-of-text (a document
    boundary, not text). Summing over target ids gives the bytes of their decoded text exactly, also where a
    window cuts a character or a token's bytes in two (decoding a window piecewise would not).
    """
    kind = meta.get("tokenizer")
    if kind == "byte":
        return np.ones(256, np.int64)
    if kind == "char":
        get_codec(meta)  # a clear error if meta.json lacks the characters
        return np.array([len(c.encode("utf-8")) for c in meta["chars"]], np.int64)
    if kind == "gpt2":
        enc = gpt2_encoding(bpe_dir)
        return np.array([len(enc.decode_single_token_bytes(i)) for i in range(GPT2_EOT)] + [0], np.int64)
    raise ValueError(f"unknown tokenizer {kind!r} in meta.json")


def fixed_windows(model, ctx, cfg, data, meta, split, device, nbytes):
    """train.py's eval on its fixed windows -> (total nats, tokens, bytes, windows)."""
    T, dtype, path = cfg["block_size"], meta["dtype"], os.path.join(data, f"{split}.bin")
    n = len(open_split(data, split, meta, T))
    windows = eval_windows(n, T, cfg["eval_windows"], cfg["seed"])  # (N,)
    loss = estimate_loss(model, {split: (path, dtype, windows, T)}, ctx, 0, 1, device,
                         meta["vocab_size"], cfg["batch_size"], progress=True)[split]
    n_bytes = sum(int(nbytes[get_batch(path, dtype, w, T, "cpu")[1].numpy()].sum())
                  for w in windows.split(cfg["batch_size"]))
    return loss * windows.numel() * T, windows.numel() * T, n_bytes, windows.numel()


def full_split(model, ctx, cfg, data, meta, split, device, nbytes, batch_size):
    """Every target of the split once: windows at 0, T, 2T, ... -> (total nats, tokens, bytes, windows)."""
    path = os.path.join(data, f"{split}.bin")
    open_split(data, split, meta, 1)  # a clear error for a split of < 2 tokens
    n_bytes = []
    nats, tokens, windows = full_split_loss(model, ctx, path, meta["dtype"], cfg["block_size"],
                                            batch_size, device,
                                            on_batch=lambda y: n_bytes.append(int(nbytes[y.numpy()].sum())),
                                            vocab_size=meta["vocab_size"], progress=True)
    return nats, tokens, sum(n_bytes), windows


def metrics(nats, tokens, n_bytes):
    """Total nats over tokens and bytes -> loss (nats/token), ppl, bits_per_token, bits_per_byte.
    Never raises: a diverged model's nan/inf loss gives nan/inf figures."""
    loss = nats / tokens
    return dict(loss=loss, ppl=safe_exp(loss), bits_per_token=loss / math.log(2),
                bits_per_byte=nats / math.log(2) / n_bytes if n_bytes else None)


def dataset_of(ckpt, data_dir=None, dataset=None):
    """The folder and meta.json of the dataset to evaluate a checkpoint on: its own (data_dir: where it is now,
    if it moved), checked to be the data it was trained on, or another prepared dataset of the same tokenizer."""
    cfg, trained = ckpt["config"], ckpt["dataset_meta"]
    folder = os.path.join(data_dir or cfg["data_dir"], dataset or cfg["dataset"])
    meta = load_meta(folder)
    if dataset is None:
        check_same_dataset(trained, meta, folder)
    elif any(trained.get(k) != meta.get(k) for k in ("tokenizer", "vocab_size", "chars")):
        raise ValueError(f"dataset {folder} is not tokenized as the checkpoint's training data was: its token ids "
                         f"would mean other tokens to the model")
    return folder, meta


def evaluate(out_dir, split="val", full=False, device="cpu", dtype=None, batch_size=None, data_dir=None,
             bpe_dir=None, dataset=None):
    """Evaluate out_dir/ckpt.pt on its dataset's split, or on another prepared dataset of the same tokenizer;
    returns a dict of the numbers (see metrics) and what was evaluated."""
    model, ckpt = load_run(out_dir)
    data, meta = dataset_of(ckpt, data_dir, dataset)
    nbytes = token_bytes(meta, bpe_dir)
    cfg = ckpt["config"]
    device, device_type, ptdtype = resolve_device({"device": device, "dtype": dtype or cfg["dtype"]})
    model.to(device)
    ctx = autocast(device_type, ptdtype)
    if full:
        res = full_split(model, ctx, cfg, data, meta, split, device, nbytes, batch_size or cfg["batch_size"])
    else:
        res = fixed_windows(model, ctx, cfg, data, meta, split, device, nbytes)
    nats, tokens, n_bytes, windows = res
    return dict(out_dir=out_dir, iter=ckpt["iter_num"], dataset=os.path.basename(os.path.normpath(data)),
                split=split, mode="full" if full else "fixed_windows",
                windows=windows, tokens=tokens, bytes=n_bytes, nats=nats, **metrics(nats, tokens, n_bytes),
                dtype=str(ptdtype).replace("torch.", ""))


def table(r):
    """A small markdown table of an evaluate() result (the whole split of N tokens scores N - 1: the first
    token has no context)."""
    bpb = "n/a" if r["bits_per_byte"] is None else f"{r['bits_per_byte']:.4f}"
    return ("| dataset | split | mode | iter | tokens scored | bytes | loss (nats/token) | perplexity "
            "| bits/token | bits/byte |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
            f"| {r['dataset']} | {r['split']} | {r['mode']} | {r['iter']} | {r['tokens']:,} | {r['bytes']:,} "
            f"| {r['loss']:.4f} | {r['ppl']:.3f} | {r['bits_per_token']:.4f} | {bpb} |")


# --------------------------------------------------------------------------------------------- HellaSwag
def harness_preprocess(text):
    """lm-evaluation-harness's HellaSwag text cleaning (lm_eval/tasks/hellaswag/utils.py, preprocess): strip,
    " [title]" -> ". ", drop every [...] marker, then double spaces -> one."""
    text = text.strip().replace(" [title]", ". ")
    return re.sub("\\[.*?\\]", "", text).replace("  ", " ")


HELLASWAG_FIELDS = ("activity_label", "ctx_a", "ctx_b", "endings", "label")


def read_hellaswag(path, limit=None):
    """The examples of a HellaSwag .jsonl file, as lm-evaluation-harness builds them from the fields
    activity_label, ctx_a, ctx_b, endings and label (others are ignored).

    Returns [(line number, context, [4 endings], label 0..3)] with context = harness_preprocess(activity_label
    + ": " + ctx_a + " " + ctx_b.capitalize()) and the endings harness_preprocess-ed; blank lines skipped, only
    the first `limit` if given. label may be an int or a string of one ('2', as in the Hugging Face copy).
    FileNotFoundError (with the download address) if the file is missing or a folder; ValueError naming the
    line for anything malformed (text that is not UTF-8 included), or for a file of no examples.
    """
    if not os.path.isfile(path):
        problem = "is a folder" if os.path.isdir(path) else "not found"
        raise FileNotFoundError(f"HellaSwag file {path} {problem}; download hellaswag_val.jsonl from "
                                f"{HELLASWAG_URL} and pass its path to --hellaswag")
    with open(path, "rb") as f:
        data = f.read()
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        n = data.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}:{n}: not UTF-8 text (byte {e.start}); it should be hellaswag_val.jsonl "
                         f"from {HELLASWAG_URL}") from None
    examples = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ex = json.loads(line)
            activity, ctx_a, ctx_b, endings, label = (ex[k] for k in HELLASWAG_FIELDS)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: expected a JSON object with fields {', '.join(HELLASWAG_FIELDS)} "
                             f"({type(e).__name__}: {e})") from None
        label = int(label) if isinstance(label, str) and label.isdigit() else label
        if not all(isinstance(t, str) for t in (activity, ctx_a, ctx_b)):
            raise ValueError(f"{path}:{n}: activity_label, ctx_a and ctx_b must be strings")
        ctx = harness_preprocess(activity + ": " + ctx_a + " " + ctx_b.capitalize())
        if not (isinstance(endings, list) and len(endings) == 4
                and all(isinstance(e, str) for e in endings)):
            raise ValueError(f"{path}:{n}: endings must be a list of 4 strings, got {endings!r}")
        if type(label) is not int or not 0 <= label < 4:
            raise ValueError(f"{path}:{n}: label must be 0, 1, 2 or 3 (the correct ending), "
                             f"got {label!r}")
        examples.append((n, ctx, [harness_preprocess(e) for e in endings], label))
        if limit is not None and len(examples) == limit:
            break
    if not examples:
        raise ValueError(f"{path} holds no examples; it should be hellaswag_val.jsonl from {HELLASWAG_URL}")
    return examples


def harness_pair(encode, context, continuation):
    """(context ids, continuation ids) as lm-evaluation-harness splits them (lm_eval/api/model.py,
    _encode_pair): trailing spaces of the context move to the continuation, the two are encoded as one text,
    and the continuation's ids are what follows the context's own encoding."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    context_ids = list(encode(context))
    return context_ids, list(encode(context + continuation))[len(context_ids):]


def hellaswag_rows(examples, encode, block_size, path=""):
    """Token rows of each example's 4 completions -> ([[(ids, n_scored) x 4], ...], number cropped).

    ids = context ids + ending ids of harness_pair(context, " " + ending), cropped from the left to
    block_size + 1 tokens (counted as cropped); the model reads ids[:-1] and is scored on its predictions of
    the last n_scored tokens, the ending's (at most block_size). ValueError naming the line if the tokenizer
    cannot encode the text.
    """
    rows, cropped = [], 0
    for n, ctx, endings, _ in examples:
        try:
            pairs = [harness_pair(encode, ctx, " " + e) for e in endings]
            ctx_ids, ending_ids = pairs[0][0], [e for _, e in pairs]
        except ValueError as e:
            raise ValueError(f"{path}:{n}: {e}; HellaSwag needs a tokenizer that encodes any text "
                             f"(gpt2 or byte)") from None
        full = [ctx_ids + e for e in ending_ids]
        cropped += sum(len(ids) > block_size + 1 for ids in full)
        rows.append([(ids[-(block_size + 1):], min(len(e), len(ids) - 1, block_size))
                     for ids, e in zip(full, ending_ids)])
    return rows, cropped


@torch.no_grad()
def score_hellaswag(model, ctx, rows, batch_size, device):
    """Summed log-probabilities (nats) of each ending's scored tokens -> (N, 4) float64 array.

    rows: hellaswag_rows' output. batch_size examples (4 completions each) per forward pass, padded on the
    right (causal attention: padding never reaches the scored positions). Shows a tqdm bar.
    """
    scores = []
    for i in tqdm(range(0, len(rows), batch_size), desc="hellaswag", unit="batch"):
        batch = [completion for example in rows[i:i + batch_size] for completion in example]
        T = max(len(ids) for ids, _ in batch) - 1
        x = torch.zeros(len(batch), T, dtype=torch.long)
        y = torch.full((len(batch), T), -1, dtype=torch.long)  # -1: not scored
        for r, (ids, n_scored) in enumerate(batch):
            x[r, :len(ids) - 1] = torch.tensor(ids[:-1])
            y[r, len(ids) - 1 - n_scored:len(ids) - 1] = torch.tensor(ids[-n_scored:])
        x, y = x.to(device), y.to(device)
        with ctx:
            logits, _ = model(x, targets=y)
        logp = -F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=-1, reduction="none")
        scores.append(logp.view(len(batch), T).double().sum(dim=1).view(-1, 4).cpu())  # 0 where y = -1
    return torch.cat(scores).numpy()


def hellaswag_metrics(scores, counts, labels):
    """acc and acc_norm (scores / counts: the endings' lengths in characters, as lm-evaluation-harness
    normalises) with their standard errors, the sample std of the 0/1 outcomes over sqrt(n) as the harness
    reports it: sqrt(p (1 - p) / (n - 1)), nan for n = 1."""
    n, out = len(labels), {"examples": len(labels)}
    for name, s in (("acc", scores), ("acc_norm", scores / counts)):
        p = float(np.mean(np.argmax(s, axis=1) == labels))
        out[name], out[f"{name}_stderr"] = p, math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else math.nan
    return out


def hellaswag(out_dir, path, device="cpu", dtype=None, batch_size=8, bpe_dir=None, limit=None):
    """HellaSwag accuracy of out_dir/ckpt.pt on the file at path: a dict with examples, acc, acc_norm, their
    stderrs and `cropped` (completions that lost context tokens to block_size). The file is read and
    tokenised completely before the model runs, so a bad line fails at once."""
    examples = read_hellaswag(path, limit)
    model, ckpt = load_run(out_dir)
    encode, _ = get_codec(ckpt["dataset_meta"], bpe_dir)
    rows, cropped = hellaswag_rows(examples, encode, model.config.block_size, path)
    device, device_type, ptdtype = resolve_device({"device": device,
                                                   "dtype": dtype or ckpt["config"]["dtype"]})
    scores = score_hellaswag(model.to(device), autocast(device_type, ptdtype), rows, batch_size, device)
    counts = np.array([[len(e) for e in endings] for _, _, endings, _ in examples], dtype=np.float64)
    labels = np.array([label for *_, label in examples])
    return dict(out_dir=out_dir, iter=ckpt["iter_num"], hellaswag=path, cropped=cropped,
                **hellaswag_metrics(scores, counts, labels), dtype=str(ptdtype).replace("torch.", ""))


def hellaswag_table(r):
    """A small markdown table of a hellaswag() result."""
    return (f"HellaSwag: {r['examples']:,} examples of {r['hellaswag']} (iter {r['iter']}; {r['cropped']} "
            f"completions cropped to block_size)\n| metric | value | stderr |\n|---|---:|---:|\n"
            f"| acc | {r['acc']:.4f} | {r['acc_stderr']:.4f} |\n"
            f"| acc_norm | {r['acc_norm']:.4f} | {r['acc_norm_stderr']:.4f} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--out_dir", type=os.path.expanduser,
                   default="out", help="folder with ckpt.pt (a train.py out_dir)")
    p.add_argument("--split", choices=("train", "val"), default="val", help="the split to evaluate")
    p.add_argument("--full", action="store_true", help="the whole split in consecutive windows of block_size")
    p.add_argument("--batch_size", type=int, default=None, help="windows per forward pass with --full "
                   "(default: the checkpoint's batch_size); HellaSwag examples per forward pass (default 8)")
    p.add_argument("--hellaswag", type=os.path.expanduser,
                   default=None, metavar="PATH", help="HellaSwag accuracy on this "
                   "hellaswag_val.jsonl instead of the loss")
    p.add_argument("--limit", type=int, default=None, help="HellaSwag: only the first N examples")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | mps")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 | auto "
                   "(default: the checkpoint's)")
    p.add_argument("--data_dir", type=os.path.expanduser,
                   default=None, help="override the checkpoint's data_dir "
                   "(parent of the dataset; default: the checkpoint's)")
    p.add_argument("--dataset", default=None, metavar="NAME", help="evaluate on this prepared dataset "
                   "(in --data_dir) instead of the checkpoint's own; it must have the same tokenizer")
    p.add_argument("--bpe_dir", type=os.path.expanduser, default=None, help="GPT-2 encoder.json + vocab.bpe "
                   "(gpt2 data, bytes per token; default: the copy shipped in tests/data/gpt2)")
    p.add_argument("--json", type=os.path.expanduser,
                   default=None, metavar="PATH", help="also write the numbers to this JSON file")
    args = p.parse_args(argv)
    if args.batch_size is not None and args.batch_size < 1:
        p.error("--batch_size must be >= 1")
    if args.batch_size is not None and not (args.full or args.hellaswag):
        p.error("--batch_size sets the batches of --full or --hellaswag; train.py's fixed windows (the "
                "default) always use the checkpoint's batch_size")
    if args.limit is not None and (args.limit < 1 or not args.hellaswag):
        p.error("--limit N needs N >= 1 and --hellaswag PATH")
    if args.hellaswag and (args.full or args.split != "val" or args.dataset):
        p.error("--hellaswag scores HellaSwag instead of the loss: leave out --full, --split and --dataset")
    if args.hellaswag:
        r = hellaswag(args.out_dir, args.hellaswag, args.device, args.dtype, args.batch_size or 8,
                      args.bpe_dir, args.limit)
        print(hellaswag_table(r))
    else:
        r = evaluate(args.out_dir, args.split, args.full, args.device, args.dtype, args.batch_size,
                     args.data_dir, args.bpe_dir, args.dataset)
        print(table(r))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        atomic_write_text(args.json, json.dumps(r, indent=2))
    return r


if __name__ == "__main__":
    try:
        main()
    except (FileNotFoundError, ValueError, RuntimeError) as e:  # RuntimeError includes prepare_data.DataError
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit("interrupted; nothing was written")
