"""
Validation loss (nats/token), perplexity, bits per token and bits per byte of a train.py checkpoint.

    python eval.py --out_dir=out/enwiki_bytes                 # train.py's fixed eval windows (= metrics.jsonl)
    python eval.py --out_dir=out/enwiki_bytes --full --json val.json   # every token of the val split once
    python eval.py --out_dir=out/owt --split=train --bpe_dir=../shared/data/gpt2

Default: the eval_iters x batch_size random windows train.py draws from the checkpoint's seed, so the loss is
the run's val_loss at the checkpoint's iteration (windows may overlap; tokens are counted with multiplicity).
--full: consecutive non-overlapping windows of block_size from offset 0, the last one shorter, so each of the
split's tokens 1..N-1 is predicted exactly once: N - 1 targets for a split of N tokens.
Bits per byte = total nats / ln 2 / UTF-8 bytes of the target text; gpt2's end-of-text token counts 0 bytes.
Deterministic: no sampling, fixed windows; float32 on CPU (the checkpoint's dtype setting elsewhere).
"""
import argparse
import json
import math
import os
import sys

import numpy as np

from common import (autocast, estimate_loss, eval_windows, full_split_loss, get_batch, open_split, resolve_device,
                    safe_exp)
from prepare_data import GPT2_EOT, gpt2_encoding
from sample import load_checkpoint


def token_bytes(meta, bpe_dir=None):
    """UTF-8 byte length of each token id's text, an int64 array indexed by id.

    byte: 1 each; char: the character's length; gpt2: the token's bytes, 0 for end-of-text (a document
    boundary, not text). Summing over target ids gives the bytes of their decoded text exactly, also where a
    window cuts a character or a token's bytes in two (decoding a window piecewise would not).
    """
    kind = meta["tokenizer"]
    if kind == "byte":
        return np.ones(256, np.int64)
    if kind == "char":
        return np.array([len(c.encode("utf-8")) for c in meta["chars"]], np.int64)
    if kind == "gpt2":
        enc = gpt2_encoding(bpe_dir)
        return np.array([len(enc.decode_single_token_bytes(i)) for i in range(GPT2_EOT)] + [0], np.int64)
    raise ValueError(f"unknown tokenizer {kind!r} in meta.json")


def fixed_windows(model, ctx, cfg, data, meta, split, device, nbytes):
    """train.py's eval on its fixed windows -> (total nats, tokens, bytes, windows)."""
    T, dtype, path = cfg["block_size"], meta["dtype"], os.path.join(data, f"{split}.bin")
    n = len(open_split(data, split, dtype, T))
    windows = eval_windows(n, T, cfg["batch_size"], cfg["eval_iters"], cfg["seed"])
    loss = estimate_loss(model, {split: (path, dtype, windows, T)}, ctx, 0, 1, device)[split]
    n_bytes = sum(int(nbytes[get_batch(path, dtype, w, T, "cpu")[1].numpy()].sum()) for w in windows)
    return loss * windows.numel() * T, windows.numel() * T, n_bytes, windows.numel()


def full_split(model, ctx, cfg, data, meta, split, device, nbytes, batch_size):
    """Every target of the split once: windows at 0, T, 2T, ... -> (total nats, tokens, bytes, windows)."""
    path = os.path.join(data, f"{split}.bin")
    open_split(data, split, meta["dtype"], 1)  # a clear error for a split of < 2 tokens
    n_bytes = []
    nats, tokens, windows = full_split_loss(model, ctx, path, meta["dtype"], cfg["block_size"], batch_size, device,
                                            on_batch=lambda y: n_bytes.append(int(nbytes[y.numpy()].sum())))
    return nats, tokens, sum(n_bytes), windows


def metrics(nats, tokens, n_bytes):
    """Total nats over tokens and bytes -> loss (nats/token), ppl, bits_per_token, bits_per_byte.
    Never raises: a diverged model's nan/inf loss gives nan/inf figures."""
    loss = nats / tokens
    return dict(loss=loss, ppl=safe_exp(loss), bits_per_token=loss / math.log(2),
                bits_per_byte=nats / math.log(2) / n_bytes if n_bytes else None)


def evaluate(out_dir, split="val", full=False, device="cpu", dtype=None, batch_size=None, data_dir=None,
             bpe_dir=None):
    """Evaluate out_dir/ckpt.pt; returns a dict of the numbers (see metrics) and what was evaluated."""
    model, ckpt, meta, data = load_checkpoint(out_dir, "cpu", data_dir)
    cfg = ckpt["config"]
    device, device_type, ptdtype = resolve_device({"device": device, "dtype": dtype or cfg["dtype"]})
    model.to(device)
    ctx = autocast(device_type, ptdtype)
    nbytes = token_bytes(meta, bpe_dir)
    if full:
        res = full_split(model, ctx, cfg, data, meta, split, device, nbytes, batch_size or cfg["batch_size"])
    else:
        res = fixed_windows(model, ctx, cfg, data, meta, split, device, nbytes)
    nats, tokens, n_bytes, windows = res
    return dict(out_dir=out_dir, iter=ckpt["iter_num"], split=split, mode="full" if full else "fixed_windows",
                windows=windows, tokens=tokens, bytes=n_bytes, nats=nats, **metrics(nats, tokens, n_bytes),
                dtype=str(ptdtype).replace("torch.", ""))


def table(r):
    """A small markdown table of an evaluate() result."""
    bpb = "n/a" if r["bits_per_byte"] is None else f"{r['bits_per_byte']:.4f}"
    return ("| split | mode | iter | tokens | bytes | loss (nats/token) | perplexity | bits/token | bits/byte |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
            f"| {r['split']} | {r['mode']} | {r['iter']} | {r['tokens']:,} | {r['bytes']:,} | {r['loss']:.4f} | "
            f"{r['ppl']:.3f} | {r['bits_per_token']:.4f} | {bpb} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", default="out", help="folder with ckpt.pt (a train.py out_dir)")
    p.add_argument("--split", choices=("train", "val"), default="val")
    p.add_argument("--full", action="store_true", help="the whole split in consecutive windows of block_size")
    p.add_argument("--batch_size", type=int, default=None, help="windows per forward pass with --full "
                   "(default: the checkpoint's batch_size)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | mps")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 | auto (default: the checkpoint's)")
    p.add_argument("--data_dir", default=None, help="override the checkpoint's data_dir (parent of the dataset)")
    p.add_argument("--bpe_dir", default=None, help="GPT-2 encoder.json + vocab.bpe (gpt2 data, bytes per token)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the numbers to this JSON file")
    args = p.parse_args(argv)
    if args.batch_size is not None and args.batch_size < 1:
        p.error("--batch_size must be >= 1")
    if args.json:  # before the evaluation, so a bad path cannot lose its result
        if os.path.isdir(args.json):
            p.error(f"--json {args.json} is a folder; give a file path, e.g. {os.path.join(args.json, 'eval.json')}")
        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        except OSError as e:
            p.error(f"--json {args.json}: cannot create its folder ({e.strerror or e})")
    r = evaluate(args.out_dir, args.split, args.full, args.device, args.dtype, args.batch_size, args.data_dir,
                 args.bpe_dir)
    print(table(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    return r


if __name__ == "__main__":
    try:
        main()
    except (FileNotFoundError, ValueError, RuntimeError) as e:  # RuntimeError includes prepare_data.DataError
        sys.exit(f"error: {e}")
