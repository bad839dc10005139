"""
The mechanism probe: at every eval, what attention does inside, on a small fixed batch of val windows.

Per layer, written into the eval's metrics row:
- attn_logit_max: the largest pre-softmax attention logit, scale · q·kᵀ over every head and every causal
  (query, key) pair. Logits that keep growing are the instability QK-norm cures (Wortsman et al. 2023, "Small-
  scale proxies for large-scale Transformer training instabilities"); f's output LayerNorm may bound them too,
  and this shows whether it does.
- f_ratio (nonlinear query only): the mean over tokens of ‖f(x)‖ / ‖x‖, with q = x + f(x): how much the
  nonlinear residual adds to the attention input.

One forward pass of the model, in eval mode and without gradients, with a hook on each attention's query
module: the hook sees the attention input x and the query q the attention itself computed, and recomputes the
keys with the attention's own c_k (and qk_norm, and RoPE at positions 0..T-1), as its forward does. The probe
reads no random numbers and changes no weights, so a run's other numbers are the same with it as without it.
Under FSDP every rank runs it (the forward gathers the weights).
"""
import functools
import math
from contextlib import nullcontext

import torch

from model import CausalSelfAttention, NonlinearQuery, rotate
from nlq.data import get_batch
from nlq.losses import eval_mode

PROBE_WINDOWS = 4  # the first eval windows of the val split: a batch fixed by the seed, the same at every eval


def probe_batch(data, device, n_windows=PROBE_WINDOWS):
    """The probe's input, (n, block_size) token ids: the first n fixed eval windows of a TrainData's val split."""
    val = data.splits["val"]
    return get_batch(val.path, val.dtype, val.windows[:n_windows], val.block_size, device, data.meta["vocab_size"])[0]


@torch.no_grad()
def attention_probe(model, idx, ctx=None):
    """A GPT (not compiled, not DDP-wrapped) and token ids (B, T) -> {"attn_logit_max": [per layer], and for a
    nonlinear query "f_ratio": [per layer]}, rounded to 6 significant digits (NaN/inf: None, as JSON has no
    NaN); ctx: the run's autocast."""
    layers = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    found = [None] * len(layers)

    def record(i, query, inputs, q):  # layer i's numbers from its input x and its query q, each (B, T, C)
        attn, x = layers[i], inputs[0]
        B, T, C = x.shape
        heads = lambda t: t.view(B, T, attn.n_head, C // attn.n_head).transpose(1, 2)  # (B, nh, T, hd)
        qh, kh = heads(q), heads(attn.c_k(x))
        if attn.qk_norm:
            qh, kh = attn.q_norm(qh), attn.k_norm(kh)
        if attn.rope:
            qh, kh = rotate(qh, attn.cos_sin[:, :T]), rotate(kh, attn.cos_sin[:, :T])
        logits = (qh.float() @ kh.float().transpose(-2, -1)) * attn.scale  # (B, nh, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        found[i] = dict(attn_logit_max=logits.masked_fill(~causal, float("-inf")).amax().item())
        if isinstance(attn.query, NonlinearQuery):  # q = x + f(x)
            found[i]["f_ratio"] = ((q - x).float().norm(dim=-1) / x.float().norm(dim=-1)).mean().item()
    handles = [attn.query.register_forward_hook(functools.partial(record, i)) for i, attn in enumerate(layers)]
    try:
        with eval_mode(model), ctx or nullcontext():
            model(idx)
    finally:
        for h in handles:
            h.remove()
    fmt = lambda v: float(f"{v:.6g}") if math.isfinite(v) else None
    return {key: [fmt(layer[key]) for layer in found] for key in found[0]}
