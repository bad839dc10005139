"""
The val loss, two ways: estimate_loss on a split's fixed eval windows (train.py's evals, eval.py's default),
and full_split_loss over every token of a split once (the final figure of a study run, eval.py --full).

Both shard their batches over the ranks of a torchrun job and all-reduce the sums. Every rank runs the same
number of forward passes (my_share): under FSDP a rank that stopped early would leave the others waiting for
its all-gathers forever.
"""
import math
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from nlq.data import full_split_windows, get_batch


class EvalStopped(Exception):
    """An evaluation abandoned because its stop() said so (train.py: a stop signal reached a rank)."""


def safe_exp(x):
    """exp(x) for a loss in nats -> perplexity; inf instead of OverflowError, nan for nan."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def my_share(n, rank, world_size):
    """This rank's batches of n, as (index, counts) pairs: indices rank, rank + world_size, ... < n, each
    counting, then, if n is not a multiple of world_size, one repeat of batch n - 1 that does not count."""
    indices = range(rank, -(-n // world_size) * world_size, world_size)
    return [(min(k, n - 1), k < n) for k in indices]


@contextmanager
def eval_mode(model):
    """The model in eval mode (no dropout) inside the block, in the mode it had after it."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def estimate_loss(model, splits, ctx, rank=0, world_size=1, device="cpu", vocab_size=None, batch_size=12,
                  progress=False, stop=None):
    """Mean cross-entropy (nats/token) per split over its fixed eval windows -> {split: float}.

    splits: {name: data.EvalSplit (or the same 4-tuple: its bin, dtype, windows (N,), block_size)}, evaluated
    batch_size windows at a time (every window weighs the same). A diverged model gives nan or inf, never an error.
    stop: None, or a function called before every batch on every rank: True raises EvalStopped.
    """
    out = {}
    with eval_mode(model):
        for split, (path, dtype, windows, block_size) in splits.items():
            batches = [(starts, block_size) for starts in windows.split(batch_size)]
            total = loss_sum(model, ctx, path, dtype, batches, device, rank, world_size, vocab_size, progress, stop,
                             f"eval {split}", per_token=False)
            out[split] = (total[0] / total[1]).item()
    return out


def full_split_loss(model, ctx, path, dtype, block_size, batch_size, device, rank=0, world_size=1,
                    on_batch=None, vocab_size=None, progress=False, stop=None):
    """Summed cross-entropy over every target of a split once -> (total nats, tokens, windows).

    on_batch(y) is called with each batch's targets (B, T) on the CPU (eval.py counts bytes with it).
    stop: as in estimate_loss.
    """
    batches = full_split_windows(len(np.memmap(path, dtype=dtype, mode="r")), block_size, batch_size)
    with eval_mode(model):
        total = loss_sum(model, ctx, path, dtype, batches, device, rank, world_size, vocab_size, progress, stop,
                         "whole-split eval", per_token=True, on_batch=on_batch)
    return total[0].item(), int(total[1].item()), sum(len(s) for s, _ in batches)


@torch.no_grad()
def loss_sum(model, ctx, path, dtype, batches, device, rank, world_size, vocab_size, progress, stop, desc,
             per_token, on_batch=None):
    """(Σ w·loss, Σ w) over batches [(starts (B,), length), ...], this rank's share (my_share), all-reduced.
    w: a batch's windows, or with per_token its targets, summed in float64 (a whole split's nats)."""
    total = torch.zeros(2, dtype=torch.float64 if per_token else torch.float32, device=device)
    # a tqdm bar on stderr where progress and stderr is a terminal (disable=None): a log file stays clean
    for k, counts in tqdm(my_share(len(batches), rank, world_size), desc=desc, unit="batch", leave=False,
                          disable=None if progress else True):
        if stop is not None and stop():
            raise EvalStopped
        starts, length = batches[k]
        x, y = get_batch(path, dtype, starts, length, device, vocab_size)
        with ctx:
            _, loss = model(x, y)
        if counts:
            weight = y.numel() if per_token else len(starts)
            total += weight * torch.stack([loss.to(total.dtype), torch.ones((), dtype=total.dtype, device=device)])
            if on_batch is not None:
                on_batch(y.cpu())
    if world_size > 1:
        dist.all_reduce(total)
    return total
