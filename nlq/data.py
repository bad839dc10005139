"""
The data a run reads: a dataset folder that prepare_data.py writes, holding train.bin and val.bin (flat arrays
of token ids, read through np.memmap) and meta.json (the tokenizer, vocab_size, the ids' dtype, the bins'
sha256).

A window is block_size + 1 consecutive tokens at an offset: x its first block_size, y the same shifted by one.
Training windows are drawn at random offsets from the run's generator; the eval windows of a split are drawn
from the seed alone (eval_windows), so every query mode, micro-batch and number of processes is evaluated on
the same windows.
"""
import json
import os
import subprocess
import sys
from collections import namedtuple

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN_FILES = ("train.bin", "val.bin", "meta.json")  # a dataset folder, as prepare_data.py writes it
SHIPPED_DATASETS = ("shakespeare_char", "shakespeare")  # Tiny Shakespeare ships in tests/data: train.py prepares it
PREPARE_AGAIN = "prepare the dataset again (python prepare_data.py DATASET --overwrite)"


def prepare_if_missing(data_dir, name, log):
    """train.py's first use of a shipped dataset whose folder holds none of its files: run python
    prepare_data.py NAME --data_dir DATA_DIR and log one line. ValueError with prepare_data.py's message if it
    fails."""
    folder = os.path.join(data_dir, name)
    if name not in SHIPPED_DATASETS or any(os.path.exists(os.path.join(folder, f)) for f in BIN_FILES):
        return
    done = subprocess.run([sys.executable, os.path.join(REPO, "prepare_data.py"), name, "--data_dir", data_dir],
                          capture_output=True, text=True)
    if done.returncode:
        raise ValueError((done.stderr.strip().splitlines() or ["prepare_data.py failed"])[-1].removeprefix("error: "))
    meta = load_meta(folder)
    log(f"{folder} was missing: prepared it from {meta['source']}: {meta['train_tokens']:,} train + "
        f"{meta['val_tokens']:,} val tokens ({meta['tokenizer']})")


def load_meta(folder):
    """meta.json of a prepared dataset as a dict. FileNotFoundError saying how to make one; ValueError if it is
    damaged."""
    path = os.path.join(folder, "meta.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: {folder} is not a prepared dataset; prepare it (python "
                                f"prepare_data.py --help: openwebtext, shakespeare_char, your own text with local)")
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
        if meta["dtype"] not in ("uint16", "uint32") or meta["vocab_size"] > np.iinfo(meta["dtype"]).max + 1:
            raise ValueError(f"dtype {meta['dtype']} for vocab_size {meta['vocab_size']}")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is damaged ({type(e).__name__}: {e}); {PREPARE_AGAIN}") from None
    return meta


def open_split(folder, split, meta, block_size):
    """A read-only np.memmap of <split>.bin. FileNotFoundError if it is missing; ValueError if it does not hold
    meta.json's count of tokens (cut short or changed since it was prepared) or holds fewer than
    block_size + 1."""
    path = os.path.join(folder, f"{split}.bin")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing; {PREPARE_AGAIN}")
    size, itemsize = os.path.getsize(path), np.dtype(meta["dtype"]).itemsize
    prepared = meta.get(f"{split}_tokens")
    if size % itemsize or (prepared is not None and size // itemsize != prepared):
        raise ValueError(f"{path} holds {size} bytes, not meta.json's {prepared} {meta['dtype']} token ids: it "
                         f"changed since the dataset was prepared; {PREPARE_AGAIN}")
    if size // itemsize < block_size + 1:
        raise ValueError(f"{path} holds {size // itemsize} tokens, fewer than block_size + 1 = {block_size + 1}")
    return np.memmap(path, dtype=meta["dtype"], mode="r")


def window_starts(n_tokens, block_size, shape, generator):
    """Random window offsets in [0, n_tokens - block_size), as an int64 tensor of the given shape."""
    return torch.randint(n_tokens - block_size, shape, generator=generator)


def eval_windows(n_tokens, block_size, n_windows, seed):
    """The fixed eval windows of a split, (n_windows,) offsets drawn from the seed alone."""
    return window_starts(n_tokens, block_size, (n_windows,), torch.Generator().manual_seed(seed))


def full_split_windows(n_tokens, block_size, batch_size):
    """Consecutive windows covering every target of a split of n_tokens once: [(starts (B,), length), ...].
    Windows start at 0, T, 2T, ...; the last one is shorter, so targets 1..n_tokens-1 are each predicted once."""
    starts = torch.arange(0, n_tokens - 1, block_size)
    full = starts[starts + block_size <= n_tokens - 1]  # y = data[s + 1 : s + T + 1] needs s + T + 1 <= n
    batches = [(full[i:i + batch_size], block_size) for i in range(0, len(full), batch_size)]
    if len(full) < len(starts):  # the last, shorter window: targets up to the split's last token
        batches.append((starts[len(full):], n_tokens - 1 - int(starts[-1])))
    return batches


def get_batch(data_path, dtype, starts, block_size, device, vocab_size=None):
    """Windows at the given offsets (B,) -> x, y (B, block_size) int64 on device; y is x shifted by one.

    data_path: a bin's path, or the bin opened in binary mode (train.py holds its bins open, so a dataset
    prepared again while it trains leaves the data it reads as it was). The memmap is made per batch so pages
    do not pile up in the process's memory. ValueError if an id is >= vocab_size (when given: meta.json's).
    """
    data = np.memmap(data_path, dtype=dtype, mode="r")
    windows = np.stack([data[i:i + block_size + 1] for i in starts.tolist()]).astype(np.int64)  # (B, T + 1)
    if vocab_size is not None and windows.max() >= vocab_size:
        raise ValueError(f"{getattr(data_path, 'name', data_path)} holds token id {windows.max()}, but meta.json's "
                         f"vocab_size is {vocab_size}; {PREPARE_AGAIN}")
    x, y = torch.from_numpy(windows[:, :-1].copy()), torch.from_numpy(windows[:, 1:].copy())
    if device.startswith("cuda"):
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


# What losses.estimate_loss reads of a split: its bin (a path or an open file), the ids' dtype, the offsets of its
# fixed eval windows (N,) and their length
EvalSplit = namedtuple("EvalSplit", "path dtype windows block_size")


class TrainData:
    """A dataset opened for a training run: its meta.json, and train.bin and val.bin held open until close().

    splits[split]: the split's EvalSplit. batch_starts(generator, accum, B) draws one optimizer step's windows.
    """

    def __init__(self, folder, block_size, n_eval_windows, seed):
        self.block_size = block_size
        self.meta = load_meta(folder)
        self.tokens = {s: len(open_split(folder, s, self.meta, block_size)) for s in ("train", "val")}
        self.files = {s: open(os.path.join(folder, f"{s}.bin"), "rb") for s in self.tokens}
        self.splits = {s: EvalSplit(self.files[s], self.meta["dtype"],
                                    eval_windows(self.tokens[s], block_size, n_eval_windows, seed), block_size)
                       for s in self.tokens}

    def batch_starts(self, generator, accum, batch_size):
        """One optimizer step's window offsets, (accum, batch_size): every rank draws the same."""
        return window_starts(self.tokens["train"], self.block_size, (accum, batch_size), generator)

    def batch(self, starts, device):
        """Training windows at offsets starts (B,) -> x, y (B, block_size) on device."""
        return get_batch(self.files["train"], self.meta["dtype"], starts, self.block_size, device,
                         self.meta["vocab_size"])

    def close(self):
        for f in self.files.values():
            f.close()
