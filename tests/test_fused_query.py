"""The fused nonlinear query (W1 inside the attention's input matmul, rstd per token, f recomputed in FusedF's
backward pass) against the paper's f written out plainly, and the activations each query mode saves, counted exactly."""
import itertools
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import model as nlq
from model import GPT, GPTConfig
from nlq import settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from saved_activations import compiled_saved_bytes, saved_bytes_per_layer_token  # noqa: E402

C, NH = 32, 4


class ReferenceNonlinearQuery(nlq.NonlinearQuery):
    """q = x + LayerNorm(W2 · GELU(W1 · RMSNorm(x))), every step written out from the paper's definition, with
    the same parameters (names and shapes) as NonlinearQuery, and nothing fused or recomputed."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.config = cfg

    def input_weight(self):
        return None

    def forward(self, x, xw):
        h = x
        if self.config.query_norm_in:  # RMSNorm: x / sqrt(mean(x²) + eps) · γ
            h = h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-5) * self.norm_in.weight
        h = h @ self.w1.weight.T + (self.w1.bias if self.config.bias else 0)
        h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))  # GELU, exact (erf) form
        h = h @ self.w2.weight.T + (self.w2.bias if self.config.bias else 0)
        if self.config.query_norm_out:  # LayerNorm: (z - mean) / sqrt(var + eps) · γ + β
            mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
            h = (h - mean) / torch.sqrt(var + 1e-5) * self.norm_out.weight
            h = h + (self.norm_out.bias if self.config.bias else 0)
        return x + h


@pytest.fixture(autouse=True)
def reference_mode(monkeypatch):
    monkeypatch.setitem(nlq.QUERY_MODES, "nonlinear_reference", ReferenceNonlinearQuery)


def pair(**keys):
    """(fused nonlinear GPT, reference GPT with the same weights), in float32, with random biases and
    gains (not the init's zeros and ones, which would hide a misplaced bias or gain)."""
    cfg = dict(n_layer=2, n_head=NH, n_embd=C, block_size=16, vocab_size=50, **keys)
    torch.manual_seed(0)
    fused = GPT(GPTConfig(query_mode="nonlinear", fused_f=True, **cfg))
    with torch.no_grad():
        for name, p in fused.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("norm_in.weight")
                                                     or name.endswith("norm_out.weight") else 0.0))
    reference = GPT(GPTConfig(query_mode="nonlinear_reference", **cfg))
    reference.load_state_dict(fused.state_dict())
    return fused, reference


FUNCTION_OPTIONS = list(itertools.product([True, False], [True, False], [True, False], [8, 16, 32]))


@pytest.mark.parametrize("norm_in,norm_out,bias,hidden", FUNCTION_OPTIONS)
@pytest.mark.parametrize("qk_norm,dropout", [(False, 0.0), (True, 0.0), (False, 0.1), (True, 0.1)])
def test_fused_query_equals_the_paper_f(norm_in, norm_out, bias, hidden, qk_norm, dropout):
    """The query, the logits, the loss and every parameter's gradient agree within 1e-5 (float32), in every
    combination of f's options (hidden = d/4, d/2, d), with and without QK-norm and dropout."""
    fused, reference = pair(query_norm_in=norm_in, query_norm_out=norm_out, bias=bias, query_hidden=hidden,
                            qk_norm=qk_norm, dropout=dropout)
    x = torch.randn(3, 16, C)
    query = fused.transformer.h[0].attn.query
    q = query(x, F.linear(x, query.input_weight()))
    torch.testing.assert_close(q, reference.transformer.h[0].attn.query(x, None), rtol=0, atol=1e-5)
    torch.testing.assert_close(q, x + query.f(x), rtol=0, atol=1e-5)  # the module's own unfused definition
    idx = torch.randint(50, (3, 16))
    results = []
    for model in (fused, reference):
        torch.manual_seed(1)  # the same dropout masks: both draw them in the same order
        logits, loss = model(idx, idx)
        loss.backward()
        results.append((logits, loss, {n: p.grad for n, p in model.named_parameters()}))
    (logits, loss, grads), (ref_logits, ref_loss, ref_grads) = results
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("norm_in,norm_out,bias,hidden", FUNCTION_OPTIONS[::4])
def test_f_as_written_computes_what_the_fused_f_computes(norm_in, norm_out, bias, hidden, monkeypatch):
    """fused_f=False, the path a reader follows (q = x + f(x), module by module, no FusedF), has the same
    parameters and gives the fused model's logits, loss and every gradient within 1e-5."""
    fused, _ = pair(query_norm_in=norm_in, query_norm_out=norm_out, bias=bias, query_hidden=hidden)
    plain = GPT(GPTConfig(**{**vars(fused.config), "fused_f": False}))
    plain.load_state_dict(fused.state_dict())
    idx = torch.randint(50, (3, 16))
    results = []
    for model in (fused, plain):
        logits, loss = model(idx, idx)
        loss.backward()
        results.append((logits, {n: p.grad for n, p in model.named_parameters()}))
        monkeypatch.setattr(nlq.FusedF, "apply", lambda *a: pytest.fail("fused_f=False ran FusedF"))
    (logits, grads), (plain_logits, plain_grads) = results
    torch.testing.assert_close(logits, plain_logits, rtol=0, atol=1e-5)
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("norm_in,norm_out,bias,hidden", FUNCTION_OPTIONS[::3])
def test_fused_query_with_the_kv_cache(norm_in, norm_out, bias, hidden):
    """Cached decoding with the fused query gives the reference's logits (no cache) and its greedy tokens."""
    fused, reference = pair(query_norm_in=norm_in, query_norm_out=norm_out, bias=bias, query_hidden=hidden,
                            qk_norm=hidden == 16)
    fused.eval(), reference.eval()
    idx = torch.randint(50, (2, 12))
    with torch.no_grad():
        cache = fused.new_kv_cache()
        fused(idx[:, :8], cache=cache)
        for t in range(8, 12):
            logits, _ = fused(idx[:, t:t + 1], cache=cache)
            ref_logits, _ = reference(idx[:, :t + 1])
            torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-5)
    assert torch.equal(fused.generate(idx[:, :4], 10, temperature=0),
                       reference.generate(idx[:, :4], 10, temperature=0, use_cache=False))


def test_fused_query_under_bf16_autocast_stays_close():
    """Under bf16 autocast (rstd from the bf16 copy of x that the matmul reads) the loss and gradients stay
    within bf16 rounding of the reference's."""
    fused, reference = pair()
    idx = torch.randint(50, (3, 16))
    out = []
    for model in (fused, reference):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(idx, idx)
        loss.backward()
        out.append((loss, model.transformer.h[0].attn.query.w1.weight.grad))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=0, atol=2e-2)
    torch.testing.assert_close(out[0][1], out[1][1], rtol=0.1, atol=2e-3)


def test_parameters_and_state_dict_keys_do_not_change():
    """The fused path adds no parameter and renames none: checkpoints of the unfused model load as they are."""
    fused, reference = pair()
    assert list(fused.state_dict()) == list(reference.state_dict())
    names = [n for n, _ in fused.transformer.h[0].attn.named_parameters()]
    assert names == ["c_attn.weight", "query.norm_in.weight", "query.w1.weight", "query.w2.weight",
                     "query.norm_out.weight", "c_proj.weight"]
    assert fused.transformer.h[0].attn.c_attn.weight.shape == (2 * C, C)  # K and V only; W1 joins in forward


def test_a_compiled_training_step_of_the_nonlinear_query_has_no_graph_break():
    """torch.compile sees the whole forward pass of a training step (the loss included) as one graph: the
    fused f (its checkpoint, FusedF's forward and backward) traces without a graph break."""
    torch._dynamo.reset()
    model = GPT(GPTConfig(n_layer=2, n_head=NH, n_embd=C, block_size=16, vocab_size=50, query_mode="nonlinear",
                          dropout=0.1)).train()
    idx = torch.randint(50, (2, 16))
    explained = torch._dynamo.explain(model)(idx, idx)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


# ----------------------------------------------------------------------------------- saved activations
# Per layer and per token, counted exactly with saved_tensors_hooks (bench/saved_activations.py) at a small
# shape: n_embd 64, 4 heads. linear keeps, in float32: LN1's input, x, the q/k/v matmul output (3C), the
# attention output, LN2's input and output, the MLP's hidden layer before and after GELU (4C + 4C): 16C floats,
# plus the attention's log-sum-exp (one per head) and the two LayerNorms' mean and rstd (4).
SHAPE = dict(n_embd=64, n_head=4, block_size=16)


@pytest.mark.parametrize("dtype,size", [(None, 4), (torch.bfloat16, 2)])
def test_saved_activation_bytes_per_layer(dtype, size):
    """identity keeps no more than linear and nonlinear at most 5% more, exactly as itemised: identity drops
    the query's C (q = x, the copy the matmul keeps), nonlinear keeps r more matmul outputs (W1's) and its own
    q (C) instead of linear's (C), plus the input RMSNorm's rstd and the output LayerNorm's mean and 1/std
    (float32, 3 numbers)."""
    c, r = SHAPE["n_embd"], SHAPE["n_embd"] // 2
    linear = saved_bytes_per_layer_token("linear", dtype, **SHAPE)
    if dtype is None:
        assert linear == 4 * (16 * c + 4 + 4)
    identity = saved_bytes_per_layer_token("identity", dtype, **SHAPE)
    assert identity == linear - size * c
    for hidden in (r // 2, r, 2 * r):
        nonlinear = saved_bytes_per_layer_token("nonlinear", dtype, query_hidden=hidden, **SHAPE)
        assert nonlinear == linear + size * hidden + 3 * 4
    assert saved_bytes_per_layer_token("linear_residual", dtype, **SHAPE) == linear
    assert saved_bytes_per_layer_token("nonlinear", dtype, **SHAPE) <= 1.05 * linear


def test_query_cost_variants_compute_what_they_say(monkeypatch):
    """bench/query_cost.py's diagnostic modes: f_autograd and f_checkpoint compute the whole f (the nonlinear
    query's logits and gradients), f_matmuls and f_gelu do not (they drop f's pieces); bench.py runs each."""
    import query_cost

    import bench
    for name, cls in query_cost.VARIANTS.items():
        monkeypatch.setitem(nlq.QUERY_MODES, name, cls)
    cfg = dict(n_layer=2, n_head=NH, n_embd=C, block_size=16, vocab_size=50)
    torch.manual_seed(0)
    ref = GPT(GPTConfig(query_mode="nonlinear", **cfg))
    idx = torch.randint(0, 50, (2, 16))
    logits, loss = ref(idx, idx)
    loss.backward()
    for name, whole_f in (("f_autograd", True), ("f_checkpoint", True), ("f_as_written", True), ("f_matmuls", False),
                          ("f_gelu", False)):
        m = GPT(GPTConfig(query_mode=name, **cfg))
        m.load_state_dict(ref.state_dict())
        out, loss = m(idx, idx)
        assert torch.allclose(out, logits, atol=1e-5) == whole_f, name
        if whole_f:
            loss.backward()
            for (n, p), q in zip(m.named_parameters(), ref.parameters()):
                assert torch.allclose(p.grad, q.grad, atol=1e-5), (name, n)
    opts, rest = bench.split_args(["--query_modes=" + ",".join(query_cost.VARIANTS), "--warmup=1", "--steps=1",
                                     "--rounds=1"])
    cfg = settings.parse_config(rest + ["--n_layer=1", "--n_head=2", "--n_embd=32", "--block_size=16",
                                      "--batch_size=2", "--device=cpu", "--vocab_size=64", "--compile=False"])
    rows, _ = bench.bench(cfg, opts)
    assert [r["query_mode"] for r in rows] == list(query_cost.VARIANTS) and all(r["ms_per_iter"] > 0 for r in rows)


@pytest.mark.parametrize("norm_in,norm_out,bias", list(itertools.product([True, False], repeat=3)))
def test_fused_f_backward_passes_gradcheck_and_gradgradcheck_in_float64(norm_in, norm_out, bias):
    """FusedF's written-out backward against finite differences (torch.autograd.gradcheck and gradgradcheck,
    float64): every input's gradient, x, xw = x·W1ᵀ, b1, W2, b2 and the output LayerNorm's gain and bias, and
    their second derivatives, in every combination of the input RMSNorm, the output LayerNorm and biases."""
    torch.manual_seed(0)
    B, T, c, r = 2, 3, 8, 4
    def t(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, dtype=torch.float64) * scale + shift).requires_grad_()
    x, xw, w2 = t(B, T, c), t(B, T, r), t(c, r, scale=0.5)
    b1, b2 = (t(r, scale=0.3), t(c, scale=0.3)) if bias else (None, None)
    ln_w = t(c, scale=0.3, shift=1.0) if norm_out else None
    ln_b = t(c, scale=0.3) if norm_out and bias else None
    inputs = (x, xw, b1, w2, b2, 1e-5 if norm_in else None, ln_w, ln_b, 1e-5 if norm_out else None)
    assert torch.autograd.gradcheck(nlq.FusedF.apply, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)
    # second derivatives too (a gradient penalty, create_graph=True): the backward is itself differentiable
    assert torch.autograd.gradgradcheck(nlq.FusedF.apply, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("dtype,size", [(None, 4), (torch.bfloat16, 2)])
def test_saved_activation_bytes_under_torch_compile(dtype, size):
    """What torch.compile's partitioner saves (bench/saved_activations.py --compile): f's intermediates are
    recomputed there too (NonlinearQuery.forward wraps FusedF in torch.utils.checkpoint under compile), so
    nonlinear keeps exactly W1's r outputs per token more than linear; identity keeps no more than linear.
    One layer and the difference over sequences (1, 2): the modes differ only in that layer, so their
    difference per token is the per-layer one that saved_bytes_per_layer_token's double difference gives
    (half the compiles)."""
    r = SHAPE["n_embd"] // 2
    def count(mode):  # bytes per token of a one-layer model: its layer plus the embeddings and the LM head
        cfg = GPTConfig(n_layer=1, vocab_size=256, query_mode=mode, fused_f=True, **SHAPE)  # FusedF, as on CUDA
        return (compiled_saved_bytes(cfg, 2, dtype) - compiled_saved_bytes(cfg, 1, dtype)) / SHAPE["block_size"]
    linear = count("linear")
    assert count("nonlinear") == linear + size * r
    assert count("identity") <= linear


@pytest.mark.parametrize("keys", [dict(), dict(query_norm_in=False, query_norm_out=False, bias=True)])
def test_compiled_path_equals_eager(keys):
    """Under torch.compile (traced by dynamo and AOTAutograd; backend aot_eager, no code generation) the
    nonlinear query takes its checkpointed path: logits and every gradient equal eager FusedF's within 1e-5."""
    torch._dynamo.reset()
    fused, _ = pair(**keys)
    compiled = GPT(fused.config)
    compiled.load_state_dict(fused.state_dict())
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    outs = []
    for model in (fused, torch.compile(compiled, backend="aot_eager", dynamic=False)):
        logits, loss = model(idx, idx)
        loss.backward()
        outs.append(logits)
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    for (name, p), q in zip(fused.named_parameters(), compiled.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5), name
