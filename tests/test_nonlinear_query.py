"""The nonlinear query's f (NonlinearQuery.f, the only f) against the paper's f written out op by op, on the paths
it runs: plainly (a CPU, eager) and under torch.utils.checkpoint (autograd recording on a GPU or under
torch.compile), in one process, under DDP and under FSDP2 (2 gloo ranks); and the activations each query mode
saves, counted exactly."""
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import model as nlq
from model import GPT, GPTConfig

from saved_activations import compiled_saved_bytes, saved_bytes_per_layer_token

ROOT = Path(__file__).resolve().parents[1]

C, NH = 32, 4


class ReferenceNonlinearQuery(nlq.NonlinearQuery):
    """q = x + LayerNorm(W2 · GELU(W1 · RMSNorm(x))), every step written out from the paper's definition, with
    the same parameters (names and shapes) as NonlinearQuery, and nothing fused or recomputed."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.config = cfg

    def forward(self, x):
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
    """(nonlinear GPT, reference GPT with the same weights), in float32, with random biases and gains (not the
    init's zeros and ones, which would hide a misplaced bias or gain)."""
    cfg = dict(n_layer=2, n_head=NH, n_embd=C, block_size=16, vocab_size=50, **keys)
    torch.manual_seed(0)
    model = GPT(GPTConfig(query_mode="nonlinear", **cfg))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("norm_in.weight")
                                                     or name.endswith("norm_out.weight") else 0.0))
    reference = GPT(GPTConfig(query_mode="nonlinear_reference", **cfg))
    reference.load_state_dict(model.state_dict())
    return model, reference


def step(model, idx):
    """One training forward and backward on idx (B, 16) -> (logits, loss, {name: gradient}), names as in the
    model (without a compiled or DDP wrapper's prefix)."""
    logits, loss = model(idx, idx)
    loss.backward()
    return logits, loss, {n.removeprefix("module.").removeprefix("_orig_mod."): p.grad
                          for n, p in model.named_parameters()}


def assert_same(a, b, atol=1e-5):
    """Two step() results agree: logits, loss and every gradient within atol."""
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=atol)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=atol)
    assert a[2].keys() == b[2].keys()
    for name in a[2]:
        torch.testing.assert_close(a[2][name], b[2][name], rtol=0, atol=atol, msg=name)


OPTIONS = list(itertools.product([True, False], [True, False], [True, False], [8, 32]))  # norms, bias, r


@pytest.mark.parametrize("norm_in,norm_out,bias,hidden", OPTIONS)
@pytest.mark.parametrize("qk_norm,dropout", [(False, 0.0), (True, 0.1)])
@pytest.mark.parametrize("recomputed", [False, True])
def test_f_equals_the_paper_f(norm_in, norm_out, bias, hidden, qk_norm, dropout, recomputed, monkeypatch):
    """The query, the logits, the loss and every parameter's gradient agree with the written-out f within 1e-5
    (float32) in every combination of f's options (r = d/4, d), with and without QK-norm and dropout: run plainly
    (a CPU, eager), and recomputed, as a training step on a GPU or under torch.compile runs it (is_compiling stands
    in for those here): under torch.utils.checkpoint, once a layer. Without gradients f always runs plainly."""
    model, reference = pair(query_norm_in=norm_in, query_norm_out=norm_out, bias=bias, query_hidden=hidden,
                            qk_norm=qk_norm, dropout=dropout)
    calls = []
    monkeypatch.setattr(nlq, "checkpoint", lambda *a, **k: calls.append(1) or checkpoint(*a, **k))
    if recomputed:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x = torch.randn(3, 16, C)
    with torch.no_grad():
        q = model.transformer.h[0].attn.query(x)
    torch.testing.assert_close(q, reference.transformer.h[0].attn.query(x), rtol=0, atol=1e-5)
    assert calls == []
    idx = torch.randint(50, (3, 16))
    torch.manual_seed(1)  # the same dropout masks: both draw them in the same order
    ours = step(model, idx)
    assert len(calls) == (2 if recomputed else 0)  # one checkpoint a layer
    torch.manual_seed(1)
    assert_same(ours, step(reference, idx))


@pytest.mark.parametrize("norm_in,norm_out,bias,hidden", OPTIONS[::3])
def test_f_with_the_kv_cache(norm_in, norm_out, bias, hidden):
    """Cached decoding gives the reference's logits (no cache) and its greedy tokens."""
    model, reference = pair(query_norm_in=norm_in, query_norm_out=norm_out, bias=bias, query_hidden=hidden,
                            qk_norm=hidden == 8)
    model.eval(), reference.eval()
    idx = torch.randint(50, (2, 12))
    with torch.no_grad():
        cache = model.new_kv_cache()
        model(idx[:, :8], cache=cache)
        for t in range(8, 12):
            logits, _ = model(idx[:, t:t + 1], cache=cache)
            ref_logits, _ = reference(idx[:, :t + 1])
            torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-5)
    assert torch.equal(model.generate(idx[:, :4], 10, temperature=0),
                       reference.generate(idx[:, :4], 10, temperature=0, use_cache=False))


def test_parameters_and_state_dict_keys():
    """f's parameters and their names, which checkpoints and exports carry: W_K and W_V are c_k and c_v, made
    before f (the initial weights' order of the fused c_attn they replaced)."""
    model, reference = pair()
    assert list(model.state_dict()) == list(reference.state_dict())
    names = [n for n, _ in model.transformer.h[0].attn.named_parameters()]
    assert names == ["c_k.weight", "c_v.weight", "query.norm_in.weight", "query.w1.weight", "query.w2.weight",
                     "query.norm_out.weight", "c_proj.weight"]
    assert model.transformer.h[0].attn.c_k.weight.shape == (C, C)


def test_a_compiled_training_step_of_the_nonlinear_query_has_no_graph_break():
    """torch.compile sees the whole forward pass of a training step (the loss included) as one graph: f under
    its checkpoint traces without a graph break."""
    torch._dynamo.reset()
    model = GPT(GPTConfig(n_layer=2, n_head=NH, n_embd=C, block_size=16, vocab_size=50, query_mode="nonlinear",
                          dropout=0.1)).train()
    idx = torch.randint(50, (2, 16))
    explained = torch._dynamo.explain(model)(idx, idx)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.parametrize("keys", [dict(), dict(query_norm_in=False, query_norm_out=False, bias=True)])
def test_compiled_path_equals_the_paper_f(keys):
    """Under torch.compile (traced by dynamo and AOTAutograd; backend aot_eager, no code generation) f runs under
    its checkpoint: logits, loss and every gradient equal the written-out f's, eager, within 1e-5."""
    torch._dynamo.reset()
    model, reference = pair(**keys)
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    assert_same(step(torch.compile(model, backend="aot_eager", dynamic=False), idx), step(reference, idx))


def two_rank_gradients(out):
    """Under torchrun, 2 gloo ranks: one training step of pair()'s nonlinear GPT compiled (aot_eager) under DDP,
    then under FSDP2 (as train.py wraps and shards it), each rank on 2 of the batch's 4 sequences; rank 0 saves
    {wrap: {name: gradient}}."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from nlq.distributed import shard_model
    dist.init_process_group("gloo")
    rank, grads = dist.get_rank(), {}
    idx = torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(1))[2 * rank:2 * rank + 2]
    for wrap in ("ddp", "fsdp"):
        model, _ = pair()
        if wrap == "ddp":
            net = DDP(torch.compile(model, backend="aot_eager"))
        else:
            net = torch.compile(shard_model(model, "cpu", torch.float32), backend="aot_eager")
        _, loss, found = step(net, idx)
        grads[wrap] = {n: g.full_tensor() if wrap == "fsdp" else g for n, g in found.items()}
    if rank == 0:
        torch.save(grads, out)
    dist.destroy_process_group()


def test_ddp_and_fsdp2_gradients_equal_one_process(tmp_path):
    """f under DDP and under FSDP2, compiled as the main job runs it (2 gloo ranks, half the batch each, f under
    its checkpoint): every gradient of one training step equals one process's, eager, on the whole batch within
    1e-6."""
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          __file__, str(tmp_path / "grads.pt")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-3000:]
    model, _ = pair()
    _, _, want = step(model, torch.randint(0, 50, (4, 16), generator=torch.Generator().manual_seed(1)))
    for wrap, grads in torch.load(tmp_path / "grads.pt", weights_only=True).items():
        assert grads.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(grads[name], want[name], rtol=0, atol=1e-6, msg=f"{wrap}: {name}")


def test_a_checkpoint_that_carries_fused_f_loads_and_resumes(tmp_path):
    """tests/fixtures/fused_f_nonlinear_ckpt.pt was written by nlq at 28072b1 (fused_f=True: FusedF, the f this
    one replaced) for a 1 x 16 nonlinear GPT after 3 steps on the data below. fused_f, a setting then, is read
    past: the checkpoint evaluates to its own val loss (f as written: the same numbers) and resumes."""
    import numpy as np

    import eval as nlq_eval
    import train
    from nlq import settings
    data = tmp_path / "data" / "tiny"
    data.mkdir(parents=True)
    pattern = np.random.default_rng(0).integers(0, 64, 97)
    np.tile(pattern, 60).astype(np.uint16).tofile(data / "train.bin")
    np.tile(pattern, 8).astype(np.uint16).tofile(data / "val.bin")
    (data / "meta.json").write_text(json.dumps(dict(name="tiny", vocab_size=64, dtype="uint16", tokenizer="char",
                                                    chars=[chr(48 + i) for i in range(64)], eot_token=None)))
    out = tmp_path / "out"
    out.mkdir()
    old = torch.load(ROOT / "tests" / "fixtures" / "fused_f_nonlinear_ckpt.pt", weights_only=True)
    assert old["model_args"]["fused_f"] is True and old["config"]["fused_f"] is True
    torch.save(old, out / "ckpt.pt")
    r = nlq_eval.evaluate(str(out), data_dir=str(tmp_path / "data"))
    assert r["iter"] == 3 and r["loss"] == pytest.approx(old["best_val_loss"], abs=1e-5)
    cfg = {**settings.upgrade(old["config"]), "data_dir": str(tmp_path / "data"), "out_dir": str(out),
           "init_from": "resume", "max_iters": 5, "eval_interval": 5}
    assert train.train(cfg)["val"] < old["best_val_loss"]


# ----------------------------------------------------------------------------------- saved activations
# Per layer and per token, counted exactly with saved_tensors_hooks (tests/saved_activations.py) at a small
# shape: n_embd 64, 4 heads. linear keeps, in float32: LN1's input, x, the q/k/v matmul output (3C), the
# attention output, LN2's input and output, the MLP's hidden layer before and after GELU (4C + 4C): 16C floats,
# plus the attention's log-sum-exp (one per head) and the two LayerNorms' mean and rstd (4).
SHAPE = dict(n_embd=64, n_head=4, block_size=16)


@pytest.mark.parametrize("dtype,size", [(None, 4), (torch.bfloat16, 2)])
def test_saved_activation_bytes_per_layer(dtype, size, monkeypatch):
    """Where f is recomputed (a training step on a GPU or under torch.compile; here is_compiling stands in),
    nonlinear keeps exactly what linear keeps, for any r: x, which the attention keeps anyway, and its own q
    instead of linear's C rows of the q/k/v matmul. Run plainly (a CPU, eager) f keeps its intermediates: 3C + 2r
    floats and 3 statistics a token in float32. identity keeps C fewer than linear (q = x)."""
    c = SHAPE["n_embd"]
    linear = saved_bytes_per_layer_token("linear", dtype, **SHAPE)
    if dtype is None:
        assert linear == 4 * (16 * c + 4 + 4)
    assert saved_bytes_per_layer_token("identity", dtype, **SHAPE) == linear - size * c
    assert saved_bytes_per_layer_token("linear_residual", dtype, **SHAPE) == linear
    plain = {r: saved_bytes_per_layer_token("nonlinear", dtype, query_hidden=r, **SHAPE) for r in (c // 4, c)}
    assert all(plain[r] == linear + 4 * (3 * c + 2 * r + 3) if dtype is None else plain[r] > linear for r in plain)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for r in (c // 4, c // 2, c):
        assert saved_bytes_per_layer_token("nonlinear", dtype, query_hidden=r, **SHAPE) == linear


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_saved_activation_bytes_under_torch_compile(dtype):
    """What torch.compile's partitioner saves (tests/saved_activations.py, compiled): f under its checkpoint is
    recomputed there too, so nonlinear keeps what linear keeps; identity no more. One layer and the difference
    over sequences (1, 2): the modes differ only in that layer, so their difference per token is the per-layer
    one that saved_bytes_per_layer_token's double difference gives (half the compiles)."""
    def count(mode):  # bytes per token of a one-layer model: its layer plus the embeddings and the LM head
        cfg = GPTConfig(n_layer=1, vocab_size=256, query_mode=mode, **SHAPE)
        return (compiled_saved_bytes(cfg, 2, dtype) - compiled_saved_bytes(cfg, 1, dtype)) / SHAPE["block_size"]
    linear = count("linear")
    assert count("nonlinear") == linear
    assert count("identity") <= linear


if __name__ == "__main__":  # the 2-rank half of test_ddp_and_fsdp2_gradients_equal_one_process
    nlq.QUERY_MODES["nonlinear_reference"] = ReferenceNonlinearQuery  # (pair() builds one)
    two_rank_gradients(sys.argv[1])
