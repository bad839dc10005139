"""The mechanism probe (nlq/probe.py): its numbers against the attention computed by hand, its columns in a run's
metrics.jsonl, and a run's other numbers the same with it as without it."""
import json

import pytest
import torch
from test_train import data_dir, tiny_cfg  # noqa: F401  (the module-scoped tiny dataset)

import train
from model import GPT, GPTConfig
from nlq import probe


def by_hand(model, idx):
    """Every layer's largest scale · q·kᵀ over heads and causal pairs, and mean ‖f(x)‖ / ‖x‖, written out:
    q = x·W_Q (c_q) or x + f(x), k = x·W_K (c_k), layer by layer."""
    cfg, T = model.config, idx.size(1)
    C, nh = cfg.n_embd, cfg.n_head
    h = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(T))
    logit_max, ratios = [], []
    for block in model.transformer.h:
        attn, x = block.attn, block.ln_1(h)
        w, b = attn.c_k.weight, attn.c_k.bias
        k = x @ w.T + (0 if b is None else b)
        if cfg.query_mode == "linear":
            w, b = attn.query.c_q.weight, attn.query.c_q.bias
            q = x @ w.T + (0 if b is None else b)
        else:
            fx = attn.query.f(x)
            q = x + fx
            ratios.append((fx.norm(dim=-1) / x.norm(dim=-1)).mean().item())
        q, k = (t.view(*t.shape[:2], nh, C // nh).transpose(1, 2) for t in (q, k))
        if cfg.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        logits = (q @ k.transpose(-2, -1)) * cfg.attn_scale
        logit_max.append(logits.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -1e9).max().item())
        h = block(h)
    return logit_max, ratios


@pytest.mark.parametrize("mode,extra", [("linear", {}), ("linear", dict(qk_norm=True, bias=True)),
                                        ("nonlinear", {})])
@torch.no_grad()
def test_the_probe_against_attention_by_hand(mode, extra):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=3, n_head=2, n_embd=32, query_mode=mode, **extra))
    for p in model.parameters():  # trained-looking weights: logits well away from 0
        p.add_(torch.randn_like(p) * 0.3)
    idx = torch.randint(0, 64, (4, 16))
    found = probe.attention_probe(model, idx)
    logit_max, ratios = by_hand(model, idx)
    assert found["attn_logit_max"] == pytest.approx(logit_max, rel=1e-5) and len(logit_max) == 3
    assert max(logit_max) > 1  # (a test of numbers that are not all near zero)
    if mode == "nonlinear":  # q - x as the attention computed it (fused or not) is the paper's f(x)
        assert found["f_ratio"] == pytest.approx(ratios, rel=1e-5)
    else:
        assert "f_ratio" not in found
    assert model.training  # left as it was found


def test_the_probe_writes_its_columns_and_changes_no_other_number(data_dir, tmp_path, monkeypatch):  # noqa: F811
    """Every eval row gets a value per layer; the training RNG, data stream and every other column are as a run
    without the probe writes them (dropout on: a probe that drew random numbers would shift the run)."""
    train.train(tiny_cfg(data_dir, tmp_path / "with", query_mode="nonlinear"))
    monkeypatch.setattr(train, "attention_probe", lambda *a, **k: {})
    train.train(tiny_cfg(data_dir, tmp_path / "without", query_mode="nonlinear"))
    read = lambda name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    with_probe, without = read("with"), read("without")  # every row: the train rows too must not move
    evals = [r for r in with_probe if "val_loss" in r]
    assert [r["iter"] for r in evals] == [0, 3, 6]
    for row in evals:
        assert len(row["attn_logit_max"]) == len(row["f_ratio"]) == 2 and all(v > 0 for v in row["f_ratio"])
    timing = {"ms_per_iter", "tokens_per_s", "mfu", "elapsed_s", "attn_logit_max", "f_ratio"}
    same = lambda rows: [{k: v for k, v in r.items() if k not in timing} for r in rows]
    assert same(with_probe) == same(without)
    assert evals[-1]["attn_logit_max"] != evals[0]["attn_logit_max"]  # it follows training
