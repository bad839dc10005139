"""
Validation loss (nats/token), perplexity, bits per token and bits per byte of a train.py checkpoint.

    python eval.py --out_dir=out/enwiki_bytes         # train.py's fixed eval windows (= metrics.jsonl)
    python eval.py --out_dir=out/enwiki_bytes --full --json val.json   # every token of the val split once
    python eval.py --out_dir=out/owt --dataset=enwiki --full   # another dataset of the same tokenizer

Default: the fixed windows train.py draws from the checkpoint's seed, so the loss is the run's val_loss at the
checkpoint's iteration. --full: consecutive windows of block_size from offset 0, the last one shorter, so each of
a split's N tokens but the first is predicted once. Bits per byte = total nats / ln 2 / UTF-8 bytes of the target
text (gpt2's end-of-text token counts 0 bytes). Downstream benchmarks: export the checkpoint and run
lm-evaluation-harness on it (docs/huggingface.md). More: docs/evaluation.md.
"""
import argparse
import json
import math
import os
import sys

from nlq.checkpoint import atomic_write_text, check_same_dataset, load_run, writable_folder
from nlq.data import eval_windows, get_batch, load_meta, open_split
from nlq.distributed import autocast, resolve_device
from nlq.losses import estimate_loss, full_split_loss, safe_exp
from nlq.preemption import exit_on_stop_signals
from nlq.settings import HelpFormatter, at_least
from nlq.tokenizers import token_bytes


def metrics(nats, tokens, n_bytes):
    """Total nats over tokens and bytes -> loss (nats/token), ppl, bits_per_token, bits_per_byte (a diverged
    model's nan/inf loss gives nan/inf figures)."""
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
    nbytes, cfg = token_bytes(meta, bpe_dir), ckpt["config"]
    device, device_type, ptdtype = resolve_device({"device": device, "dtype": dtype or cfg["dtype"]})
    model.to(device)
    ctx, T, path = autocast(device_type, ptdtype), cfg["block_size"], os.path.join(data, f"{split}.bin")
    if full:  # every target of the split once: windows at 0, T, 2T, ...
        open_split(data, split, meta, 1)  # a clear error for a split of < 2 tokens
        n_bytes = []
        nats, tokens, windows = full_split_loss(model, ctx, path, meta["dtype"], T, batch_size or cfg["batch_size"],
                                                device, vocab_size=meta["vocab_size"], progress=True,
                                                on_batch=lambda y: n_bytes.append(int(nbytes[y.numpy()].sum())))
        n_bytes = sum(n_bytes)
    else:  # train.py's eval on its fixed windows
        starts = eval_windows(len(open_split(data, split, meta, T)), T, cfg["eval_windows"], cfg["seed"])
        loss = estimate_loss(model, {split: (path, meta["dtype"], starts, T)}, ctx, 0, 1, device,
                             meta["vocab_size"], cfg["batch_size"], progress=True)[split]
        n_bytes = sum(int(nbytes[get_batch(path, meta["dtype"], w, T, "cpu")[1].numpy()].sum())
                      for w in starts.split(cfg["batch_size"]))
        windows = starts.numel()
        nats, tokens = loss * windows * T, windows * T
    return dict(out_dir=out_dir, iter=ckpt["iter_num"], dataset=os.path.basename(os.path.normpath(data)),
                split=split, mode="full" if full else "fixed_windows",
                windows=windows, tokens=tokens, bytes=n_bytes, nats=nats, **metrics(nats, tokens, n_bytes),
                dtype=str(ptdtype).replace("torch.", ""))


def table(r):
    """A small markdown table of an evaluate() result."""
    bpb = "n/a" if r["bits_per_byte"] is None else f"{r['bits_per_byte']:.4f}"
    return ("| dataset | split | mode | iter | tokens scored | bytes | loss (nats/token) | perplexity "
            "| bits/token | bits/byte |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
            f"| {r['dataset']} | {r['split']} | {r['mode']} | {r['iter']} | {r['tokens']:,} | {r['bytes']:,} "
            f"| {r['loss']:.4f} | {r['ppl']:.3f} | {r['bits_per_token']:.4f} | {bpb} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--out_dir", type=os.path.expanduser, default="out", help="a train.py out_dir, with ckpt.pt")
    p.add_argument("--split", choices=("train", "val"), default="val", help="the split to evaluate")
    p.add_argument("--full", action="store_true", help="the whole split in consecutive windows of block_size")
    p.add_argument("--batch_size", type=at_least(1), default=None, help="windows per forward pass with --full "
                   "(default: the checkpoint's batch_size)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | mps")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 | auto (default: the checkpoint's)")
    p.add_argument("--data_dir", type=os.path.expanduser, default=None, help="the parent of the dataset, if it "
                   "moved (default: the checkpoint's)")
    p.add_argument("--dataset", default=None, metavar="NAME", help="evaluate on this prepared dataset (in "
                   "--data_dir) instead of the checkpoint's own; it must have the same tokenizer")
    p.add_argument("--bpe_dir", type=os.path.expanduser, default=None, help="GPT-2 encoder.json + vocab.bpe "
                   "(default: the copy shipped in tests/data/gpt2)")
    p.add_argument("--json", type=os.path.expanduser, metavar="PATH", help="also write the numbers to this file")
    args = p.parse_args(argv)
    if args.batch_size is not None and not args.full:
        p.error("--batch_size sets the batches of --full; the fixed windows use the checkpoint's")
    if args.json:  # before the scoring, which the file would hold
        if os.path.isdir(args.json):
            p.error(f"--json {args.json} is a folder; give a file name")
        writable_folder(os.path.dirname(os.path.abspath(args.json)), "--json's folder")
    r = evaluate(args.out_dir, args.split, args.full, args.device, args.dtype, args.batch_size, args.data_dir,
                 args.bpe_dir, args.dataset)
    print(table(r))
    if args.json:
        atomic_write_text(args.json, json.dumps(r, indent=2))
    return r


if __name__ == "__main__":
    exit_on_stop_signals()  # SIGTERM, SIGUSR1, SIGUSR2: one line and status 144, as train.py
    try:
        main()
    except (FileNotFoundError, ValueError, RuntimeError) as e:  # ValueError includes prepare_data.DataError
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit("interrupted; nothing was written")
