"""model.py: the query modes are the maths the paper states, and the GPT around them is sound."""
import math

import pytest
import torch

from model import GPT, QUERY_MODES, CausalSelfAttention, GPTConfig, peak_flops

SMALL = dict(block_size=32, vocab_size=96, n_layer=2, n_head=4, n_embd=64)


def build(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**SMALL, **kw})).eval()


def copy_shared(src, dst):
    """Copy every parameter that exists with the same name and shape in both models."""
    dst_params = dict(dst.named_parameters())
    with torch.no_grad():
        for name, p in src.named_parameters():
            if name in dst_params and dst_params[name].shape == p.shape:
                dst_params[name].copy_(p)


def random_idx(B=3, T=32, seed=1):
    return torch.randint(0, SMALL["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def all_logits(model, idx):
    return model(idx, targets=idx)[0]  # with targets the model returns logits at every position


def test_identity_equals_linear_with_identity_wq():
    identity = build(query_mode="identity")
    linear = build(seed=5, query_mode="linear", attn_scale=identity.config.attn_scale)
    copy_shared(identity, linear)
    C = SMALL["n_embd"]
    with torch.no_grad():
        for b_lin, b_id in zip(linear.transformer.h, identity.transformer.h):
            b_lin.attn.query.c_q.weight.copy_(torch.eye(C))  # W_Q = I
            b_lin.attn.c_k.weight.copy_(b_id.attn.c_k.weight)  # same W_K, W_V
            b_lin.attn.c_v.weight.copy_(b_id.attn.c_v.weight)
    idx = random_idx()
    diff = (all_logits(linear, idx) - all_logits(identity, idx)).abs().max().item()
    assert diff < 1e-5


@pytest.mark.parametrize("mode,zeroed", [("nonlinear", "query.w2.weight"), ("linear_residual", "query.w_q.weight")])
def test_zeroed_query_residual_equals_identity(mode, zeroed):
    """nonlinear with W2 = 0: f(x) = LayerNorm(0) = 0; linear_residual with W_Q = 0: x + 0. Both leave q = x."""
    model = build(query_mode=mode)
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.get_parameter(zeroed).zero_()
    identity = build(seed=9, query_mode="identity")
    copy_shared(model, identity)
    idx = random_idx()
    out = all_logits(model, idx)
    assert (out - all_logits(identity, idx)).abs().max().item() < 1e-5
    assert out.abs().max().item() > 1e-2  # not trivially zero


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("mode", QUERY_MODES)
def test_causality(mode, flash):
    model = build(query_mode=mode, flash=flash, qk_norm=(mode == "linear"))
    idx = random_idx()
    t = 17
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % SMALL["vocab_size"]
    a, b = all_logits(model, idx), all_logits(model, changed)
    assert torch.equal(a[:, :t], b[:, :t])
    assert (a[:, t:] - b[:, t:]).abs().max() > 1e-4  # the change is seen from t on


@pytest.mark.parametrize("scale", [None, 0.37])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("mode", QUERY_MODES)
def test_sdpa_matches_plain_attention(mode, qk_norm, scale):
    fast = build(query_mode=mode, qk_norm=qk_norm, attn_scale=scale, flash=True)
    plain = build(query_mode=mode, qk_norm=qk_norm, attn_scale=scale, flash=False)
    assert fast.config.attn_scale == plain.config.attn_scale
    idx = random_idx()
    assert (all_logits(fast, idx) - all_logits(plain, idx)).abs().max().item() < 1e-5


def test_default_attention_scales():
    hd = SMALL["n_embd"] // SMALL["n_head"]
    assert GPTConfig(**SMALL, query_mode="linear").attn_scale == pytest.approx(1 / math.sqrt(hd))
    for mode in ("identity", "linear_residual", "nonlinear"):
        assert GPTConfig(**SMALL, query_mode=mode).attn_scale == pytest.approx(1 / (2 * math.sqrt(hd)))


def test_official_aliases():
    assert GPTConfig(query_mode="original").query_mode == "linear"
    assert GPTConfig(query_mode="residual_gelu").query_mode == "nonlinear"


def gpt3_small(**kw):
    """12×768 GPT-3 small as in the paper, on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        return GPT(GPTConfig(block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_embd=768, **kw))


def test_param_counts():
    d, L, V, T = 768, 12, 50304, 1024
    counts = {m: gpt3_small(query_mode=m).param_breakdown() for m in QUERY_MODES}
    # f adds exactly d² + 2d per block over identity (W1, W2, and the weights of its RMSNorm and LayerNorm)
    assert counts["nonlinear"]["total"] - counts["identity"]["total"] == L * (d * d + 2 * d)
    assert counts["nonlinear"]["attn_q"] == L * (d * d + 2 * d)
    assert counts["identity"]["attn_q"] == 0
    assert counts["linear"]["attn_q"] == L * d * d
    # the 124M linear GPT by hand: embeddings (tied head) + per block 2 LayerNorms, 4d² attention,
    # 8d² MLP + ln_f
    by_hand = V * d + T * d + L * (2 * d + 4 * d * d + 2 * d * 4 * d) + d
    assert by_hand == 124_373_760  # 38,633,472 + 786,432 + 12 × 7,079,424 + 768
    assert counts["linear"]["total"] == by_hand
    assert counts["linear"]["non_embedding"] == by_hand - V * d - T * d
    # the paper's larger baseline: mlp_hidden 3648 = 4.75 d -> +12.5% non-embedding matrix parameters
    wide = gpt3_small(query_mode="linear", mlp_hidden=3648).param_breakdown()
    assert (wide["non_embedding_matrix"] / counts["linear"]["non_embedding_matrix"]
            == pytest.approx(1.125, abs=1e-12))
    # the nonlinear arm matches the linear one's matrix budget
    assert counts["nonlinear"]["non_embedding_matrix"] == counts["linear"]["non_embedding_matrix"]


@pytest.mark.parametrize("mode", QUERY_MODES)
def test_param_accounting(mode):
    """Any query mode (a new one too: pytest -k MODE selects this): its parts sum to the total; attn_q is all
    the mode adds over identity, its own parameters (linear's W_Q is c_q); the FLOPs count every matmul weight
    it adds."""
    model, identity = build(query_mode=mode), build(query_mode="identity")
    c, base = model.param_breakdown(), identity.param_breakdown()
    parts = ("embedding", "lm_head", "attn_q", "attn_kv", "attn_out", "mlp", "norms")
    assert sum(c[k] for k in parts) == c["total"] == sum(p.numel() for p in model.parameters())
    C, L = model.config.n_embd, model.config.n_layer
    queries = [block.attn.query for block in model.transformer.h]
    own = sum(p.numel() for q in queries for p in q.parameters())
    assert c["attn_q"] == own == c["total"] - base["total"]
    assert c["attn_kv"] == L * 2 * C * (C + model.config.bias)
    assert c["non_embedding"] - base["non_embedding"] == c["attn_q"]
    matmul = sum(m.weight.numel() for q in queries for m in q.modules() if isinstance(m, torch.nn.Linear))
    assert model.flops_per_token() - identity.flops_per_token() == 6 * matmul


def test_flops_and_mfu():
    lin, ident, nl = (gpt3_small(query_mode=m) for m in ("linear", "identity", "nonlinear"))
    d, L = 768, 12
    assert lin.flops_per_token() - ident.flops_per_token() == 6 * L * d * d
    assert nl.flops_per_token() == lin.flops_per_token()  # W1 and W2 are d²/2 each
    assert build().estimate_mfu(fwdbwd_per_iter=4, dt=0.1) is None  # CPU: no made-up MFU
    assert peak_flops("cpu") is None


@pytest.mark.parametrize("mode", QUERY_MODES)
def test_each_mode_overfits_a_batch(mode):
    model = build(query_mode=mode).train()
    opt = model.configure_optimizers(weight_decay=0.0, learning_rate=3e-3, betas=(0.9, 0.95),
                                     device_type="cpu")
    x, y = random_idx(B=4, seed=2), random_idx(B=4, seed=3)
    losses = []
    for _ in range(50):
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_bad_config_and_input_errors():
    with pytest.raises(ValueError,
                       match="unknown query_mode 'quadratic'.*linear, identity, linear_residual, nonlinear"):
        GPTConfig(query_mode="quadratic")
    with pytest.raises(ValueError, match="n_embd=100 is not divisible by n_head=12"):
        GPTConfig(n_embd=100, n_head=12)
    with pytest.raises(ValueError, match="33 positions exceed block_size 32"):
        build()(torch.zeros(1, 33, dtype=torch.long))


def test_forward_shapes_and_ignore_index():
    model = build()
    idx = random_idx(B=2)
    logits, loss = model(idx)
    assert logits.shape == (2, 1, SMALL["vocab_size"]) and loss is None
    targets = idx.clone()
    targets[:, :16] = -1  # ignored positions do not count
    _, loss_half = model(idx, targets)
    logits_all = all_logits(model, idx)
    expected = torch.nn.functional.cross_entropy(logits_all[:, 16:].reshape(-1, 96), idx[:, 16:].reshape(-1))
    assert loss_half.item() == pytest.approx(expected.item(), rel=1e-6)


def test_generate_crops_context_and_respects_vocab():
    model = build(query_mode="nonlinear")
    prompt = random_idx(B=2, T=30)
    out = model.generate(prompt, max_new_tokens=10, temperature=0.8, top_k=5, vocab_size=50)
    assert out.shape == (2, 40) and torch.equal(out[:, :30], prompt)
    assert out[:, 30:].max() < 50
    greedy = model.generate(prompt, max_new_tokens=3, temperature=0)
    expected = model(prompt[:, -32:])[0][:, -1].argmax(-1)
    assert torch.equal(greedy[:, 30], expected)


def test_init_statistics():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=512, n_layer=8, n_head=4, n_embd=256,
                          query_mode="nonlinear"))
    h0 = model.transformer.h[0]
    assert h0.attn.c_k.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert h0.attn.query.w1.weight.std().item() == pytest.approx(0.02, rel=0.05)
    for proj in (h0.attn.c_proj, h0.mlp.c_proj):
        assert proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert torch.equal(h0.attn.query.norm_out.weight, torch.ones(256))
    assert model.lm_head.weight is model.transformer.wte.weight


def test_weight_decay_groups():
    model = build(query_mode="nonlinear", qk_norm=True)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    decay, no_decay = opt.param_groups
    assert all(p.dim() >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.dim() < 2 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("mode", ["linear", "nonlinear"])
def test_cpu_optimizer_is_foreach_and_bit_identical_to_the_loop(mode):
    """Off CUDA, configure_optimizers gives foreach AdamW (one call for all tensors); 10 steps of it give the
    same weights, bit for bit, as torch's per-tensor loop with the same groups, so switching to it changed no
    CPU run."""
    models = [build(query_mode=mode).train() for _ in range(2)]
    opts = [models[0].configure_optimizers(0.1, 3e-3, (0.9, 0.95), "cpu")]
    assert opts[0].defaults["foreach"] is True and not opts[0].defaults["fused"]
    groups = [{k: v for k, v in g.items() if k in ("params", "weight_decay")} for g in
              models[1].configure_optimizers(0.1, 3e-3, (0.9, 0.95), "cpu").param_groups]
    opts.append(torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), foreach=False))
    for step in range(10):
        idx = random_idx(seed=step)
        for model, opt in zip(models, opts):
            model(idx, targets=idx)[1].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
    for p, q in zip(*(m.parameters() for m in models)):
        assert torch.equal(p, q)


def attention(X, Wq, Wk, Wv, scale):
    """Single-head causal softmax attention, written out: softmax(mask(XWq (XWk)ᵀ · scale)) XWv."""
    T = X.size(0)
    scores = (X @ Wq) @ (X @ Wk).T * scale
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return scores.softmax(-1) @ (X @ Wv)


def test_basis_change_invariance_the_paper_builds_on():
    """Attention sees X only through XW_Q, XW_K, XW_V (the paper's introduction; Karbevski & Mijoski 2024).

    1. For any invertible Θ (d×d): (XΘ)(Θ⁻¹W) = X(ΘΘ⁻¹)W = XW for each of W_Q, W_K, W_V, so one attention
       layer fed XΘ with projections Θ⁻¹W_Q, Θ⁻¹W_K, Θ⁻¹W_V gives exactly the output of X with W_Q, W_K, W_V.
    2. Hence W_Q is redundant when a linear map A precedes attention: with invertible W_Q, take A' = A·W_Q
       (fold W_Q into A) and W_K' = W_Q⁻¹W_K, W_V' = W_Q⁻¹W_V. Then
           q' = XA' = XAW_Q = q,   k' = XA'W_Q⁻¹W_K = XAW_K = k,   v' = XAW_V = v,
       so an `identity` layer (q = its input) after A' equals the `linear` layer after A. In a real GPT the
       pre-attention LayerNorm sits between, which is why the paper trains rather than folds.
    """
    torch.manual_seed(0)
    T, d = 10, 16
    X = torch.randn(T, d, dtype=torch.float64)
    Wq, Wk, Wv = (torch.randn(d, d, dtype=torch.float64) / math.sqrt(d) for _ in range(3))
    theta = torch.randn(d, d, dtype=torch.float64) + 3 * torch.eye(d, dtype=torch.float64)
    inv = torch.linalg.inv(theta)
    ref = attention(X, Wq, Wk, Wv, 0.25)
    torch.testing.assert_close(attention(X @ theta, inv @ Wq, inv @ Wk, inv @ Wv, 0.25), ref,
                               rtol=1e-9, atol=1e-9)

    # 2. with the real attention modules of model.py (4 heads): linear after A == identity after A·W_Q
    cfg = dict(block_size=T, n_head=4, n_embd=d)
    linear = CausalSelfAttention(GPTConfig(**cfg, query_mode="linear")).double()
    identity = CausalSelfAttention(GPTConfig(**cfg, query_mode="identity", attn_scale=linear.scale)).double()
    A = torch.randn(d, d, dtype=torch.float64)
    with torch.no_grad():
        Wq_t, Wk_t, Wv_t = linear.query.c_q.weight, linear.c_k.weight, linear.c_v.weight  # nn.Linear stores Wᵀ
        Wq_inv = torch.linalg.inv(Wq_t.T)
        identity.c_k.weight.copy_((Wq_inv @ Wk_t.T).T)
        identity.c_v.weight.copy_((Wq_inv @ Wv_t.T).T)
        identity.c_proj.weight.copy_(linear.c_proj.weight)
        X3 = X.unsqueeze(0)
        torch.testing.assert_close(identity(X3 @ A @ Wq_t.T), linear(X3 @ A), rtol=1e-9, atol=1e-9)
