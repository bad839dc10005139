"""
Validation loss (nats/token), perplexity, bits per token and bits per byte of a train.py checkpoint.

    python eval.py --out_dir=out/enwiki_bytes         # train.py's fixed eval windows (= metrics.jsonl)
    python eval.py --out_dir=out/enwiki_bytes --full --json val.json   # every token of the val split once
    python eval.py --out_dir=out/owt --dataset=enwiki --full   # another dataset of the same tokenizer
    python eval.py --out_dir=out/owt --hellaswag=hellaswag_val.jsonl   # HellaSwag accuracy instead

Default: the fixed windows train.py draws from the checkpoint's seed, so the loss is the run's val_loss at the
checkpoint's iteration. --full: consecutive windows of block_size from offset 0, the last one shorter, so each of
a split's N tokens but the first is predicted once. Bits per byte = total nats / ln 2 / UTF-8 bytes of the target
text (gpt2's end-of-text token counts 0 bytes). HellaSwag (Zellers et al. 2019, arXiv 1905.07830) is scored
zero-shot with exactly lm-evaluation-harness's text and metrics. More: docs/evaluation.md.
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

from nlq.checkpoint import atomic_write_text, check_same_dataset, load_run, writable_folder
from nlq.data import eval_windows, get_batch, load_meta, open_split
from nlq.distributed import autocast, resolve_device
from nlq.losses import estimate_loss, full_split_loss, safe_exp
from nlq.preemption import exit_on_stop_signals
from nlq.settings import HelpFormatter, at_least
from nlq.tokenizers import get_codec, read_text, token_bytes

HELLASWAG_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"



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


# --------------------------------------------------------------------------------------------- HellaSwag
def harness_preprocess(text):
    """lm-evaluation-harness's HellaSwag text cleaning (lm_eval/tasks/hellaswag/utils.py, preprocess): strip,
    " [title]" -> ". ", drop every [...] marker, then double spaces -> one."""
    text = text.strip().replace(" [title]", ". ")
    return re.sub("\\[.*?\\]", "", text).replace("  ", " ")


def read_hellaswag(path, limit=None):
    """The examples of a HellaSwag .jsonl file as lm-evaluation-harness builds them: [(line number, context,
    [4 endings], label 0..3)], cleaned by harness_preprocess; blank lines skipped, only the first `limit` if
    given. label may be a string of a digit ('2', as in the Hugging Face copy). ValueError naming the line for
    anything malformed."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"HellaSwag file {path} {'is a folder' if os.path.isdir(path) else 'not found'}; "
                                f"download hellaswag_val.jsonl from {HELLASWAG_URL} and pass its path to --hellaswag")
    examples = []
    for n, line in enumerate(read_text(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            ex = json.loads(line)
            activity, ctx_a, ctx_b, endings, label = (ex[k] for k in ("activity_label", "ctx_a", "ctx_b",
                                                                      "endings", "label"))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: expected a JSON object with fields activity_label, ctx_a, ctx_b, endings, "
                             f"label ({type(e).__name__}: {e})") from None
        label = int(label) if isinstance(label, str) and label.isdigit() else label
        if not (isinstance(endings, list) and len(endings) == 4 and type(label) is int and 0 <= label < 4
                and all(isinstance(t, str) for t in (activity, ctx_a, ctx_b, *endings))):
            raise ValueError(f"{path}:{n}: expected strings, a list of 4 string endings and a label 0, 1, 2 or 3")
        ctx = harness_preprocess(activity + ": " + ctx_a + " " + ctx_b.capitalize())
        examples.append((n, ctx, [harness_preprocess(e) for e in endings], label))
        if len(examples) == limit:
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
    """Token rows of each example's 4 completions -> ([[(ids, n_scored) x 4], ...], number cropped). ids =
    context ids + ending ids of harness_pair(context, " " + ending), cropped from the left to block_size + 1
    tokens; the model reads ids[:-1] and is scored on its last n_scored predictions, the ending's."""
    rows, cropped = [], 0
    for n, ctx, endings, _ in examples:
        try:
            pairs = [harness_pair(encode, ctx, " " + e) for e in endings]
        except ValueError as e:
            raise ValueError(f"{path}:{n}: {e}; HellaSwag needs a tokenizer that encodes any text (gpt2 or "
                             f"byte)") from None
        full = [c + e for c, e in pairs]
        cropped += sum(len(ids) > block_size + 1 for ids in full)
        rows.append([(ids[-(block_size + 1):], min(len(e), len(ids) - 1, block_size))
                     for ids, (_, e) in zip(full, pairs)])
    return rows, cropped


@torch.no_grad()
def score_hellaswag(model, ctx, rows, batch_size, device):
    """Summed log-probabilities (nats) of each ending's scored tokens -> (N, 4) float64 array. batch_size
    examples (4 completions each) per forward pass, padded on the right (causal attention: padding never
    reaches the scored positions)."""
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
    tokenised before the model runs, so a bad line fails at once."""
    examples = read_hellaswag(path, limit)
    model, ckpt = load_run(out_dir)
    encode, _ = get_codec(ckpt["dataset_meta"], bpe_dir)
    rows, cropped = hellaswag_rows(examples, encode, model.config.block_size, path)
    device, device_type, ptdtype = resolve_device({"device": device, "dtype": dtype or ckpt["config"]["dtype"]})
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
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--out_dir", type=os.path.expanduser, default="out", help="a train.py out_dir, with ckpt.pt")
    p.add_argument("--split", choices=("train", "val"), default="val", help="the split to evaluate")
    p.add_argument("--full", action="store_true", help="the whole split in consecutive windows of block_size")
    p.add_argument("--batch_size", type=at_least(1), default=None, help="windows per forward pass with --full "
                   "(default: the checkpoint's batch_size); HellaSwag examples per forward pass (default 8)")
    p.add_argument("--hellaswag", type=os.path.expanduser, metavar="PATH", help="HellaSwag accuracy on this "
                   "hellaswag_val.jsonl instead of the loss")
    p.add_argument("--limit", type=at_least(1), default=None, help="HellaSwag: only the first N examples")
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
    if args.hellaswag and (args.full or args.split != "val" or args.dataset) or args.limit is not None \
            and not args.hellaswag:
        p.error("--hellaswag (with --limit) scores HellaSwag instead of the loss: --full, --split and --dataset "
                "are the loss's")
    if args.batch_size is not None and not (args.full or args.hellaswag):
        p.error("--batch_size sets the batches of --full or --hellaswag; the fixed windows use the checkpoint's")
    if args.json:  # before the scoring, which the file would hold
        if os.path.isdir(args.json):
            p.error(f"--json {args.json} is a folder; give a file name")
        writable_folder(os.path.dirname(os.path.abspath(args.json)), "--json's folder")
    if args.hellaswag:
        r = hellaswag(args.out_dir, args.hellaswag, args.device, args.dtype, args.batch_size or 8,
                      args.bpe_dir, args.limit)
        print(hellaswag_table(r))
    else:
        r = evaluate(args.out_dir, args.split, args.full, args.device, args.dtype, args.batch_size,
                     args.data_dir, args.bpe_dir, args.dataset)
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
