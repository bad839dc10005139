"""
The whole GPT in one file: a GPT-2-style decoder whose attention query can be nonlinear.

Paper: Karbevski, "Beyond Linearity in Attention Projections: The Case for Nonlinear Queries",
arXiv 2603.13381. Attention sees its input X only through XW_Q, XW_K, XW_V. The layers around it can absorb
any invertible basis change Θ of X (XΘ with Θ⁻¹W), so W_Q can be fixed to the identity at no loss of
expressivity. The paper spends the freed d² parameters on a nonlinear residual instead:

    Q(X) = (X + f(X)) / 2,    f(X) = LayerNorm(W2 · GELU(W1 · RMSNorm(X))),    W1: d×d/2, W2: d/2×d

The halving is folded into the attention scale, 1/(2·sqrt(head_dim)). Keys and values stay linear.
`GPTConfig.query_mode` picks the arm from QUERY_MODES, one small class per mode:

    linear           q = x W_Q           (standard GPT; scale 1/sqrt(hd))
    identity         q = x               (no W_Q; scale 1/(2 sqrt(hd)))
    linear_residual  q = x + x W_Q       (the official code's "residual" ablation; scale 1/(2 sqrt(hd)))
    nonlinear        q = x + f(x)        (the paper's method; scale 1/(2 sqrt(hd)))

Read in order: GPTConfig, the query modes, attention, the GPT.

Shapes: B batch, T time (≤ block_size), C = n_embd, nh = n_head, hd = C // nh.
"""
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# GPTConfig.activation -> the MLP's nonlinearity: exact erf GELU, GPT-2's tanh approximation, or ReLU squared
ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
               "relu2": lambda x: F.relu(x).square()}


@dataclass
class GPTConfig:
    """The model's settings. Each is a config key of train.py too: its --help prints the comment beside it."""
    block_size: int = 1024            # context length in tokens
    vocab_size: int = 50304           # embedding rows (train.py: None = the data's vocabulary, rounded up to 64s)
    n_layer: int = 12                 # transformer blocks
    n_head: int = 12                  # attention heads (n_embd must be a multiple of it)
    n_embd: int = 768                 # model width d
    mlp_hidden: Optional[int] = None  # MLP hidden width; None = 4 * n_embd (4.75 * n_embd: the paper's +12.5%)
    query_mode: str = "linear"        # how attention makes its query q from x, a key of QUERY_MODES or an alias
    query_hidden: Optional[int] = None  # width r of f's hidden layer (nonlinear); None = n_embd // 2 (f: d² + 2d)
    query_norm_in: bool = True        # nonlinear: f's input RMSNorm (False: f(x) = LN(W2 GELU(W1 x)), an ablation)
    query_norm_out: bool = True       # nonlinear: f's output LayerNorm (False: f(x) = W2 GELU(W1 RMSNorm(x)))
    attn_scale: Optional[float] = None  # attention scale; None = the mode's default, 1/sqrt(head_dim) or half that
    qk_norm: bool = False             # RMS-normalise each head's q and k before their dot product
    dropout: float = 0.0              # dropout probability
    bias: bool = False                # biases in the Linear and LayerNorm layers
    tie_weights: bool = True          # share the token embedding with the LM head
    flash: bool = True                # F.scaled_dot_product_attention; False: plain matmul-softmax (same maths)
    activation: str = "gelu"          # the MLP's: gelu (exact), gelu_tanh (GPT-2's; init_from=gpt2 sets it), relu2
    pos_embedding: str = "learned"    # positions: learned (GPT-2's wpe) or rope (rotary, on each head's q and k)
    data_vocab_size: Optional[int] = None  # the tokenizer's vocabulary (the data's); generate() never returns more

    def __post_init__(self):
        """Check the sizes and resolve aliases and defaults (None -> the value the comment above names)."""
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "mlp_hidden", "query_hidden"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"config key {name!r} = {getattr(self, name)} must be > 0")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"config key 'dropout' = {self.dropout} must be >= 0 and < 1")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r}; use {' or '.join(ACTIVATIONS)}")
        if self.pos_embedding not in ("learned", "rope"):
            raise ValueError(f"pos_embedding={self.pos_embedding!r}; use learned or rope")
        self.query_mode = QUERY_MODE_ALIASES.get(self.query_mode, self.query_mode)
        if self.query_mode not in QUERY_MODES:
            raise ValueError(f"unknown query_mode {self.query_mode!r}; valid modes: {', '.join(QUERY_MODES)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        self.mlp_hidden = 4 * self.n_embd if self.mlp_hidden is None else self.mlp_hidden
        self.query_hidden = self.n_embd // 2 if self.query_hidden is None else self.query_hidden
        self.data_vocab_size = self.vocab_size if self.data_vocab_size is None else self.data_vocab_size
        if self.attn_scale is None:
            self.attn_scale = QUERY_MODES[self.query_mode].scale_factor / math.sqrt(self.n_embd // self.n_head)


# ------------------------------------------------------------------------------------------ the query modes
# A query mode is one nn.Module class: it owns its parameters, computes q from the attention input x, and says
# which attention scale it wants by default. Adding a mode = writing a class and adding it to QUERY_MODES;
# every mode-generic test (causality, SDPA = plain attention, resume, parameter accounting) picks it up.

class QueryMode(nn.Module):
    """Base class of the query modes: forward(x) -> q, each (B, T, C); x is the attention input LN1(h).

    scale_factor: the default attention scale is scale_factor / sqrt(head_dim): 1.0 is the standard GPT, 0.5
    folds the paper's Q = (X + f(X)) / 2 into the scale.
    """
    scale_factor = 1.0

    def __init__(self, cfg: GPTConfig):
        super().__init__()


class LinearQuery(QueryMode):
    """q = x·W_Q, the standard GPT query."""

    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg)
        self.c_q = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x):
        return self.c_q(x)


class IdentityQuery(QueryMode):
    """q = x: W_Q fixed to the identity (the paper's basis-change argument: no loss of expressivity)."""
    scale_factor = 0.5

    def forward(self, x):
        return x


class LinearResidualQuery(QueryMode):
    """q = x + x·W_Q, a linear residual query (the official code's "residual" ablation). C² (+ C) parameters."""
    scale_factor = 0.5

    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg)
        self.w_q = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x):
        return x + self.w_q(x)


class NonlinearQuery(QueryMode):
    """q = x + f(x), f(x) = LayerNorm(W2 · GELU(W1 · RMSNorm(x))): the paper's nonlinear query.

    With scale_factor 0.5 the attention computes softmax(((x + f(x)) / 2) kᵀ / sqrt(hd)), the paper's Q.
    W1: C -> r, W2: r -> C with r = query_hidden (C/2 in the paper): 2·C·r + 2·C parameters with bias=False,
    d² + 2d for r = d/2, what W_Q has. query_norm_in / query_norm_out = False drop a norm (ablations).

    Memory: where memory limits a run (training on a GPU, or compiled), f runs under torch.utils.checkpoint:
    the backward pass keeps only x (which the attention keeps anyway), not f's 3C + 2r floats a token, and
    computes f again (2C² FLOPs a token). The same numbers either way (bench/RESULTS.md measures both).
    """
    scale_factor = 0.5

    def __init__(self, cfg: GPTConfig):
        super().__init__(cfg)
        self.norm_in = nn.RMSNorm(cfg.n_embd, eps=1e-5) if cfg.query_norm_in else nn.Identity()
        self.w1 = nn.Linear(cfg.n_embd, cfg.query_hidden, bias=cfg.bias)
        self.w2 = nn.Linear(cfg.query_hidden, cfg.n_embd, bias=cfg.bias)
        self.norm_out = nn.LayerNorm(cfg.n_embd, eps=1e-5, bias=cfg.bias) if cfg.query_norm_out else nn.Identity()

    def f(self, x):
        """The residual f as the paper defines it: (B, T, C) -> (B, T, C)."""
        return self.norm_out(self.w2(F.gelu(self.w1(self.norm_in(x)))))

    def forward(self, x):
        """x (B, T, C) -> q = x + f(x), (B, T, C)."""
        if torch.is_grad_enabled() and (x.is_cuda or torch.compiler.is_compiling()):
            return x + checkpoint(self.f, x, use_reentrant=False, preserve_rng_state=False)  # f draws no RNG
        return x + self.f(x)


QUERY_MODES = {"linear": LinearQuery, "identity": IdentityQuery, "linear_residual": LinearResidualQuery,
               "nonlinear": NonlinearQuery}
# the official code's names for them
QUERY_MODE_ALIASES = {"original": "linear", "residual": "linear_residual", "residual_gelu": "nonlinear"}


# ------------------------------------------------------------------------------------------------ attention
def rotary(positions, head_dim, base=10000.0):
    """RoPE (Su et al. 2021): position m turns the pair (i, i + hd/2) of each head's q and k by the angle m·θ_i,
    θ_i = base^(-2i/hd), so that q_m·k_n depends on m - n only. positions (..., T) -> cos, sin: (2, ..., T, hd/2),
    float32."""
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.float()[..., None] * theta
    return torch.stack((angles.cos(), angles.sin()))


def rotate(x, cos_sin):
    """x (B, nh, T, hd) turned by rotary's angles (2, T, hd/2), computed in float32."""
    (x1, x2), (cos, sin) = x.float().chunk(2, dim=-1), cos_sin
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).type_as(x)


class KVCache:
    """One attention layer's keys and values for positions 0..length-1 of a batch (GPT.generate's cache).
    The buffers, (B, nh, size, hd) each, are allocated on the first append with the keys' batch size, dtype and
    device. Keys are stored as made at their positions, so a full cache cannot slide: generate starts anew."""

    def __init__(self, size):
        self.size, self.length = size, 0
        self.k = self.v = None

    def append(self, k, v):
        """Store k, v (B, nh, T, hd) at positions length..length+T-1 -> the keys and values of positions
        0..L-1, (B, nh, L, hd) each, L = length + T."""
        start, end = self.length, self.length + k.size(2)  # (GPT.forward checks that end <= block_size)
        if self.k is None:
            self.k = k.new_empty(*k.shape[:2], self.size, k.size(3))  # only positions < length are read
            self.v = torch.empty_like(self.k)
        self.k[:, :, start:end], self.v[:, :, start:end] = k, v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention whose query comes from the config's query mode.
    (B, T, C) -> (B, T, C)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        C, self.n_head = cfg.n_embd, cfg.n_head
        self.c_k = nn.Linear(C, C, bias=cfg.bias)  # W_K, W_V: made before the query's weights (the init's order)
        self.c_v = nn.Linear(C, C, bias=cfg.bias)
        self.query = QUERY_MODES[cfg.query_mode](cfg)
        self.c_proj = nn.Linear(C, C, bias=cfg.bias)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(C // cfg.n_head, eps=1e-5)
            self.k_norm = nn.RMSNorm(C // cfg.n_head, eps=1e-5)
        self.rope = cfg.pos_embedding == "rope"
        if self.rope:  # cos, sin of every position: (2, block_size, hd/2)
            self.register_buffer("cos_sin", rotary(torch.arange(cfg.block_size), C // cfg.n_head), persistent=False)
        self.scale, self.flash, self.dropout = cfg.attn_scale, cfg.flash, cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, cache=None):
        """x: (B, T, C), the block's LN1 output -> (B, T, C), before the residual add.

        cache: a KVCache holding the keys and values of the L - T tokens before these T, or None (L = T). The
        query is per token (any query mode), so only keys and values need a cache. RoPE turns q and k at their
        positions, L - T onward, after the query mode (and qk_norm).
        """
        B, T, C = x.shape
        if torch.is_autocast_enabled(x.device.type):
            # autocast would cast x for every matmul that reads it and keep each copy for the backward pass:
            # cast it once, so that the query, the keys and the values read (and keep) one copy
            x = x.to(torch.get_autocast_dtype(x.device.type))
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in (self.query(x), self.c_k(x), self.c_v(x)))  # (B, nh, T, hd)
        if self.qk_norm:  # before RoPE: the norms' weights act per dimension, and the rotation mixes pairs of them
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            start = cache.length if cache is not None else 0
            angles = self.cos_sin[:, start:start + T]  # positions start .. start + T - 1
            q, k = rotate(q, angles), rotate(k, angles)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, nh, L, hd)
        L = k.size(2)  # the L - T cached keys, then these T
        p_drop = self.dropout if self.training else 0.0
        if self.flash and L == T:  # no cache: SDPA's own causal mask (its fastest kernels)
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop, is_causal=True, scale=self.scale)
        else:
            # query i sits at position L - T + i and sees keys 0..L - T + i: the lower triangle, shifted right
            causal = torch.ones(T, L, dtype=torch.bool, device=x.device).tril(L - T)
            if self.flash:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal, dropout_p=p_drop,
                                                   scale=self.scale)
            else:  # the same maths written out, with the same scale
                att = (q @ k.transpose(-2, -1)) * self.scale
                att = F.dropout(att.masked_fill(~causal, float("-inf")).softmax(dim=-1), p_drop)
                y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


# ------------------------------------------------------------------------------------------------ the GPT
class MLP(nn.Module):
    """Position-wise MLP, C -> mlp_hidden -> C, with the config's activation. (B, T, C) -> (B, T, C)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, cfg.mlp_hidden, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.mlp_hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)
        self.activation = ACTIVATIONS[cfg.activation]

    def forward(self, x):
        return self.dropout(self.c_proj(self.activation(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: h + attn(LN1(h)), then + mlp(LN2(h)). The query sees x = LN1(h)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, h, cache=None):
        """The residual stream h: (B, T, C) -> (B, T, C); cache: this layer's KVCache or None."""
        h = h + self.attn(self.ln_1(h), cache)
        return h + self.mlp(self.ln_2(h))


def check_sampling(max_new_tokens, temperature, top_k):
    """ValueError, one line, for GPT.generate's arguments that torch would fail on or misread (a negative
    temperature would sample greedily, a negative top_k fail in torch.topk)."""
    if not (isinstance(max_new_tokens, int) and max_new_tokens >= 0):
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not 0 <= temperature < math.inf:  # (also refuses nan)
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if not (top_k is None or isinstance(top_k, int) and top_k >= 0):
        raise ValueError(f"top_k must be an integer >= 0 (0: no top-k filter), got {top_k!r}")


class GPT(nn.Module):
    """Token (+ learned position) embeddings, n_layer Blocks, a final LayerNorm and the LM head (tied to wte by
    default)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            **({"wpe": nn.Embedding(cfg.block_size, cfg.n_embd)} if cfg.pos_embedding == "learned" else {}),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=nn.LayerNorm(cfg.n_embd, bias=cfg.bias),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # The two residual output projections per block get a smaller std (GPT-2 paper, §2.3).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None, cache=None):
        """idx: (B, T) token ids; targets: (B, T) ids or None (-1 = ignore).

        Returns (logits, loss): with targets, logits (B, T, vocab) and the mean cross-entropy in nats/token;
        without, logits of the last position only, (B, 1, vocab), and loss None.
        cache: None, or new_kv_cache()'s list holding the keys and values of the tokens before idx, which then
        sit at positions cache[0].length onward; idx's keys and values are added to it.
        """
        B, T = idx.shape
        start = cache[0].length if cache else 0
        if start + T > self.config.block_size:
            raise ValueError(f"{start + T} positions exceed block_size {self.config.block_size}; crop the input")
        h = self.transformer.wte(idx)
        if "wpe" in self.transformer:
            h = h + self.transformer.wpe(torch.arange(start, start + T, device=idx.device))
        h = self.transformer.drop(h)
        for i, block in enumerate(self.transformer.h):
            h = block(h, cache[i] if cache else None)
        h = self.transformer.ln_f(h)
        if targets is None:
            return self.lm_head(h[:, [-1], :]), None
        logits = self.lm_head(h)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss

    def new_kv_cache(self):
        """An empty KV cache for forward(..., cache=): one KVCache of block_size positions per layer."""
        return [KVCache(self.config.block_size) for _ in range(self.config.n_layer)]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, vocab_size=None, use_cache=True,
                 on_token=None):
        """Autoregressive sampling. idx: (B, T) prompt ids -> (B, T + max_new_tokens) ids (docs/evaluation.md).

        Each token is predicted from the last block_size tokens before it. temperature 0 is greedy; top_k keeps
        the k most likely tokens (0 or None: all). Only ids < vocab_size are sampled (default: the tokenizer's,
        config.data_vocab_size: never a padding row of the embedding). use_cache: run the model on the new token
        only, after the cached keys and values of the past ones. on_token: called with each new token's ids,
        (B, 1), as it is drawn (sample.py's progress bar).
        """
        check_sampling(max_new_tokens, temperature, top_k)
        vocab_size = vocab_size or self.config.data_vocab_size
        block_size, cache = self.config.block_size, None
        for _ in range(max_new_tokens):
            if not use_cache:
                logits, _ = self(idx[:, -block_size:])
            elif cache is None or cache[0].length == block_size:  # first step, or the window slid: (re)fill
                cache = self.new_kv_cache()
                logits, _ = self(idx[:, -block_size:], cache=cache)
            else:  # the newest token only, after the cached ones
                logits, _ = self(idx[:, -1:], cache=cache)
            logits = logits[:, -1, :vocab_size].float()  # (B, vocab_size)
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)
            else:
                # subtract the max first: the best logit becomes 0 and the rest ≤ 0, so a tiny temperature sends
                # them to -inf (greedy) instead of overflowing to inf - inf = NaN
                tiny = torch.finfo(logits.dtype).tiny
                logits = (logits - logits.amax(dim=-1, keepdim=True)) / max(temperature, tiny)
                if top_k and top_k < logits.size(-1):
                    kth = torch.topk(logits, top_k).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                next_id = torch.multinomial(logits.softmax(dim=-1), num_samples=1)
            idx = torch.cat((idx, next_id), dim=1)
            if on_token:
                on_token(next_id)
        return idx

    def param_breakdown(self):
        """Parameter counts by role (ints).

        Keys: embedding (wte + wpe), lm_head (0 when tied), attn_q, attn_kv, attn_out, mlp, norms, total,
        non_embedding (total minus embeddings and an untied LM head, Kaplan et al.'s convention) and
        non_embedding_matrix (weights of the Linear layers inside the blocks only). The paper's "+12.5%" for
        mlp_hidden = 4.75·d is in non_embedding_matrix: 13.5d² vs 12d² per block. attn_q is everything the
        query mode owns (linear's W_Q in c_q): the whole of f in nonlinear mode (d² + 2d per block); identity has
        attn_q = 0.
        """
        n = lambda m: sum(p.numel() for p in m.parameters()) if m is not None else 0
        c = dict(embedding=n(self.transformer.wte) + n(getattr(self.transformer, "wpe", None)),
                 lm_head=0 if self.config.tie_weights else n(self.lm_head),
                 attn_q=0, attn_kv=0, attn_out=0, mlp=0, norms=n(self.transformer.ln_f),
                 non_embedding_matrix=0)
        for block in self.transformer.h:
            a = block.attn
            c["attn_kv"] += n(a.c_k) + n(a.c_v)
            c["attn_q"] += n(a.query)
            c["attn_out"] += n(a.c_proj)
            c["mlp"] += n(block.mlp)
            c["norms"] += (n(block.ln_1) + n(block.ln_2) + n(getattr(a, "q_norm", None))
                           + n(getattr(a, "k_norm", None)))
            c["non_embedding_matrix"] += sum(m.weight.numel() for m in block.modules()
                                             if isinstance(m, nn.Linear))
        c["total"] = sum(p.numel() for p in self.parameters())
        c["non_embedding"] = c["total"] - c["embedding"] - c["lm_head"]
        return c

    def param_table(self):
        """The parameter breakdown as a small markdown table (str), printed at start-up."""
        rows = "\n".join(f"| {k} | {v:,} |" for k, v in self.param_breakdown().items())
        return f"| parameters ({self.config.query_mode}) | count |\n|---|---:|\n{rows}"

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, optimizer="adamw",
                             embedding_lr=None, unembedding_lr=None):
        """The optimizer, its groups' "lr_scale" (a group's rate / learning_rate; the schedule scales them all).

        adamw: AdamW, weight decay on ≥2-D tensors (matmul weights, embeddings) only. Fused on CUDA; elsewhere
        foreach (one call per step for all tensors, bit-identical to the plain loop).
        muon: torch.optim.Muon at learning_rate, with weight decay, for every 2-D weight inside the blocks (the
        query's, W_K, W_V, c_proj and the MLP's, each its own matrix); AdamW, no weight decay, for the rest: the
        embeddings at embedding_lr, and the LM head (a tied one too), every norm and bias at unembedding_lr
        (nanochat's groups).
        """
        params = [p for p in self.parameters() if p.requires_grad]
        adamw = dict(betas=betas, fused=(device_type == "cuda"), foreach=(device_type != "cuda"))
        if optimizer == "adamw":
            groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                      {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
            return torch.optim.AdamW(groups, lr=learning_rate, **adamw)
        matrices = [p for p in self.transformer.h.parameters() if p.requires_grad and p.dim() == 2]
        embeddings = [m.weight for m in self.transformer.values() if isinstance(m, nn.Embedding)
                      and m.weight is not self.lm_head.weight]
        rest = [p for p in params if not any(p is q for q in matrices + embeddings)]
        groups = [{"params": ps, "lr": lr, "lr_scale": lr / learning_rate, "weight_decay": 0.0}
                  for ps, lr in ((embeddings, embedding_lr), (rest, unembedding_lr)) if ps]
        muon = torch.optim.Muon([{"params": matrices, "lr_scale": 1.0}], lr=learning_rate, weight_decay=weight_decay)
        return Optimizers(muon, torch.optim.AdamW(groups, lr=learning_rate, **adamw))

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward): 6·N + 12·L·H·Q·T (PaLM, Chowdhery et al. 2022,
        app. B). N: the weights of every Linear layer, LM head included (f counts; identity has fewer), L layers,
        H heads, Q head dim, T length."""
        cfg, T = self.config, seq_len or self.config.block_size
        N = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        return 6 * N + 12 * cfg.n_layer * cfg.n_head * (cfg.n_embd // cfg.n_head) * T

    def estimate_mfu(self, fwdbwd_per_iter, dt, seq_len=None):
        """Model FLOPs utilisation in [0, 1] of one device, or None if its peak is unknown (CPU, other GPUs).
        fwdbwd_per_iter: sequences processed per iteration on this device; dt: seconds per iteration."""
        peak = peak_flops(next(self.parameters()).device)
        if peak is None:
            return None
        T = seq_len or self.config.block_size
        return self.flops_per_token(T) * T * fwdbwd_per_iter / dt / peak


class Optimizers:
    """Several optimizers stepped as one (muon: Muon and AdamW): what train.py, GradScaler and a checkpoint use
    of torch.optim.Optimizer."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers

    @property
    def param_groups(self):
        return [g for o in self.optimizers for g in o.param_groups]

    def step(self):
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state):
        for o, s in zip(self.optimizers, state["optimizers"]):
            o.load_state_dict(s)


# Dense bf16 peak FLOP/s by device-name substring, most specific first. Unknown devices get no MFU at all.
PEAK_FLOPS = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("H800", 989e12),
              ("A100", 312e12), ("A800", 312e12))


def peak_flops(device):
    """Dense bf16 peak FLOP/s of a torch.device from PEAK_FLOPS, or None for CPU, MPS and unknown GPUs."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_FLOPS if key in name), None)
