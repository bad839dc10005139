"""The controls of issue 15 as config keys: each changes exactly what it says, and a resume refuses a
change."""
import math

import pytest
import torch
import torch.nn.functional as F
from test_train import data_dir, tiny_cfg  # noqa: F401  (data_dir is a fixture)

import train
from model import GPT, GPTConfig
from nlq import checkpoint, settings
from nlq.schedule import get_lr

SMALL = dict(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=32, query_mode="nonlinear")


def query_of(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**SMALL, **kw)).transformer.h[0].attn.query


def test_without_both_norms_f_is_the_bare_mlp():
    q = query_of(query_norm_in=False, query_norm_out=False)
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(q.f(x), F.gelu(x @ q.w1.weight.T) @ q.w2.weight.T, rtol=0, atol=1e-6)
    assert not any(isinstance(m, (torch.nn.RMSNorm, torch.nn.LayerNorm)) for m in q.modules())


@pytest.mark.parametrize("norm_in,norm_out", [(False, True), (True, False)])
def test_each_norm_drops_alone(norm_in, norm_out):
    q = query_of(query_norm_in=norm_in, query_norm_out=norm_out)
    x = 3 * torch.randn(2, 5, 32) + 1
    h = F.rms_norm(x, (32,), q.norm_in.weight, eps=1e-5) if norm_in else x
    y = F.gelu(h @ q.w1.weight.T) @ q.w2.weight.T
    y = F.layer_norm(y, (32,), q.norm_out.weight, None, eps=1e-5) if norm_out else y
    torch.testing.assert_close(q(x), x + y, rtol=0, atol=1e-5)
    full = query_of()
    params = sum(p.numel() for p in full.parameters()) - sum(p.numel() for p in q.parameters())
    assert params == 32  # the dropped norm's weight (bias=False)


def test_query_hidden_sets_the_width_of_f():
    for r in (8, 32):
        q = query_of(query_hidden=r)
        assert q.w1.weight.shape == (r, 32) and q.w2.weight.shape == (32, r)


def test_linear_schedule_reaches_min_lr_at_lr_decay_iters():
    cfg = dict(settings.DEFAULTS, learning_rate=1e-3, min_lr=0.0, warmup_iters=10, lr_decay_iters=110,
               lr_schedule="linear")
    lrs = [get_lr(i, cfg, 110) for i in range(130)]
    assert lrs[10] == pytest.approx(1e-3) and lrs[110] == lrs[129] == 0.0
    assert lrs[60] == pytest.approx(0.5e-3)  # half way: half the peak
    steps = [lrs[i] - lrs[i + 1] for i in range(10, 110)]
    assert all(s == pytest.approx(1e-5) for s in steps)  # straight: 1e-3 / 100 per step
    cosine = get_lr(60, {**cfg, "lr_schedule": "cosine"}, 110)
    assert cosine == pytest.approx(0.5e-3)  # both pass through the middle; in between they differ
    assert (get_lr(35, cfg, 110) == pytest.approx(0.75e-3)
            != pytest.approx(get_lr(35, {**cfg, "lr_schedule": "cosine"}, 110)))
    with pytest.raises(ValueError, match="lr_schedule='step'; use cosine or linear or wsd"):
        settings.parse_config(["--lr_schedule=step"])


def test_keys_reach_help_config_json_and_are_refused_on_resume(data_dir, tmp_path):  # noqa: F811
    assert all(f"--{k}=" in train.usage() for k in ("query_norm_in", "query_norm_out", "lr_schedule"))
    out = tmp_path / "run"
    train.train(tiny_cfg(data_dir, out, query_mode="nonlinear", query_norm_in=False, lr_schedule="linear",
                         min_lr=0.0, max_iters=2, eval_interval=2))
    saved = __import__("json").loads((out / "config.json").read_text())
    assert saved["query_norm_in"] is False and saved["lr_schedule"] == "linear"
    assert saved["model_args"]["query_norm_in"] is False and saved["model_args"]["query_norm_out"] is True
    same = dict(query_mode="nonlinear", query_norm_in=False, lr_schedule="linear", min_lr=0.0, max_iters=4,
                init_from="resume")
    for change in (dict(query_norm_in=True), dict(query_norm_out=False), dict(lr_schedule="cosine")):
        key = next(iter(change))
        with pytest.raises(ValueError, match=f"settings differ from the checkpoint's.*'{key}'"):
            train.train(tiny_cfg(data_dir, out, **{**same, **change}))
    assert math.isfinite(checkpoint.read_metrics(str(out))[-1]["val_loss"])
