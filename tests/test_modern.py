"""Today's recipe beside the paper's (issue 57): rotary positions, relu2, Muon for the block matrices, the wsd
schedule and its cool-down branches, and the fused c_attn of older checkpoints read into c_q, c_k, c_v."""
import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, write_tiny_dataset
from test_layouts import args as layout_args

import eval as nlq_eval
import train
from model import GPT, QUERY_MODES, GPTConfig, rotary, rotate
from nlq import checkpoint, data, settings
from nlq.schedule import get_lr

SMALL = dict(block_size=32, vocab_size=64, n_layer=2, n_head=4, n_embd=32)
MODERN = dict(pos_embedding="rope", activation="relu2", optimizer="muon", lr_schedule="wsd", learning_rate=0.02,
              embedding_lr=0.05, unembedding_lr=0.01, qk_norm=True, tie_weights=False, min_lr=0.0)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    write_tiny_dataset(root / "tiny")
    return root


def run(data_dir, out, **kw):
    return train.train(settings.parse_config(layout_args(data_dir, out, **{"dropout": 0.1, **kw})))


def rows(out, train_rows=True):
    return checkpoint.read_metrics(str(out), train_rows=train_rows)


# ----------------------------------------------------------------------------------------------------- RoPE
def test_rotary_scores_depend_on_positions_only_through_their_difference():
    """From the definition: q at position m and k at position n, each pair (i, i + hd/2) turned by m·θ_i and
    n·θ_i, θ_i = 10000^(-2i/hd); the dot product is the same for (m + s, n + s) and changes with m - n."""
    hd = 16
    q, k = torch.randn(2, hd, generator=torch.Generator().manual_seed(0))
    theta = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)

    def by_hand(x, m):  # the rotation of the pairs (x_i, x_{i+hd/2}) by m·θ_i
        a, b, angle = x[:hd // 2].double(), x[hd // 2:].double(), m * theta
        return torch.cat((a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()))

    def score(m, n):
        cos_sin = rotary(torch.tensor([m, n]), hd)  # (2, 2 positions, hd/2)
        rq, rk = rotate(q.view(1, 1, 1, hd), cos_sin[:, :1]), rotate(k.view(1, 1, 1, hd), cos_sin[:, 1:])
        torch.testing.assert_close(rq.flatten().double(), by_hand(q, m), rtol=0, atol=1e-5)
        torch.testing.assert_close(rk.flatten().double(), by_hand(k, n), rtol=0, atol=1e-5)
        return (rq.flatten().double() @ rk.flatten().double()).item()

    for m, n in ((5, 2), (9, 9), (3, 11)):
        for shift in (1, 7, 20):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-4)
    assert len({round(score(m, 0), 3) for m in range(8)}) == 8  # and they do depend on m - n


@pytest.mark.parametrize("mode", QUERY_MODES)
def test_rope_kv_cache_generation_equals_recomputing_everything(mode):
    """With rope, in every query mode: the cached forward in pieces gives the full forward's logits, and
    generation with the KV cache gives the tokens of recomputing everything, past block_size too."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, query_mode=mode, pos_embedding="rope", qk_norm=True)).eval()
    assert not hasattr(model.transformer, "wpe")
    with torch.no_grad():
        for p in model.parameters():  # away from the init, so that greedy decoding does not repeat one token
            if p.dim() == 2:
                p.mul_(5)
        idx = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(1))
        full, cache, start = model(idx, targets=idx)[0], model.new_kv_cache(), 0
        for end in (7, 8, 20, 32):
            logits, _ = model(idx[:, start:end], cache=cache)
            torch.testing.assert_close(logits[:, 0], full[:, end - 1], rtol=1e-5, atol=1e-5)
            start = end
    generated = []
    for use_cache in (True, False):  # sampled from the same RNG state: the same draws, the same tokens
        torch.manual_seed(3)
        generated.append(model.generate(idx[:, :20], 30, temperature=1.0, use_cache=use_cache))
    assert torch.equal(*generated) and len(set(generated[0][0, 20:].tolist())) >= 3


# ---------------------------------------------------------------------------------------------------- Muon
@pytest.mark.parametrize("mode", ["linear", "nonlinear"])
def test_muon_groups(mode):
    """Muon gets every 2-D weight inside the blocks, W_Q (c_q), W_K, W_V and f's W1, W2 each its own matrix;
    AdamW, without weight decay, the embeddings at embedding_lr and the LM head, norms and biases at
    unembedding_lr; every group's lr_scale is its rate over learning_rate."""
    model = GPT(GPTConfig(**SMALL, query_mode=mode, bias=True, tie_weights=False, pos_embedding="learned"))
    opt = model.configure_optimizers(0.1, 0.02, (0.8, 0.95), "cpu", "muon", 0.2, 0.004)
    muon, adamw = opt.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    name = {p: n for n, p in model.named_parameters()}
    got = [(name[p].removeprefix("transformer.h.0."), tuple(p.shape)) for p in muon.param_groups[0]["params"]
           if name[p].startswith("transformer.h.0.")]
    query = ([("attn.query.c_q.weight", (32, 32))] if mode == "linear" else
             [("attn.query.w1.weight", (16, 32)), ("attn.query.w2.weight", (32, 16))])
    assert got == [("attn.c_k.weight", (32, 32)), ("attn.c_v.weight", (32, 32)), *query,
                   ("attn.c_proj.weight", (32, 32)), ("mlp.c_fc.weight", (128, 32)), ("mlp.c_proj.weight", (32, 128))]
    assert len(muon.param_groups[0]["params"]) == 2 * len(got) and muon.param_groups[0]["weight_decay"] == 0.1
    embeddings, rest = adamw.param_groups
    assert [name[p] for p in embeddings["params"]] == ["transformer.wte.weight", "transformer.wpe.weight"]
    assert "lm_head.weight" in [name[p] for p in rest["params"]] and all(
        p.dim() == 1 or name[p] == "lm_head.weight" for p in rest["params"])
    assert (embeddings["lr"], rest["lr"], embeddings["weight_decay"], rest["weight_decay"]) == (0.2, 0.004, 0, 0)
    assert [g["lr_scale"] for g in opt.param_groups] == [1.0, 0.2 / 0.02, 0.004 / 0.02]
    every = [p for g in opt.param_groups for p in g["params"]]
    assert len(every) == len(set(every)) == len(list(model.parameters()))


def test_fsdp_with_muon_is_refused_when_the_settings_are_read():
    with pytest.raises(ValueError, match="fsdp=True with optimizer=muon: .*train with DDP"):
        settings.parse_config(["--fsdp=True", "--optimizer=muon"])


def stop_at(monkeypatch, step):
    """SIGUSR1 as train.py draws the windows of step `step`: the run checkpoints after it and stops."""
    real, steps = data.TrainData.batch_starts, []

    def batch_starts(*a, **kw):
        steps.append(1)
        if len(steps) == step:
            signal.raise_signal(signal.SIGUSR1)
        return real(*a, **kw)
    monkeypatch.setattr(data.TrainData, "batch_starts", batch_starts)


@pytest.mark.parametrize("recipe", [dict(optimizer="muon", learning_rate=0.02, embedding_lr=0.05,
                                         unembedding_lr=0.01), dict(lr_schedule="wsd", warmdown_ratio=0.5), MODERN])
def test_exact_resume_of_an_interrupted_run(recipe, data_dir, tmp_path, monkeypatch):
    """A run stopped by a signal after step 4 of 6 and resumed: the straight run's losses and weights, bit for
    bit (Muon's momentum and AdamW's moments in the checkpoint; the wsd rate from the schedule)."""
    run(data_dir, tmp_path / "straight", **recipe)
    stop_at(monkeypatch, 4)
    with pytest.raises(train.TrainingPreempted):
        run(data_dir, tmp_path / "stopped", **recipe)
    monkeypatch.undo()
    run(data_dir, tmp_path / "stopped", init_from="resume", **recipe)
    losses = lambda out: [(r["iter"], r["lr"], r["train_loss"], r.get("val_loss")) for r in rows(out)]
    assert losses(tmp_path / "stopped") == losses(tmp_path / "straight")  # every step's, and the evals'
    a, b = (torch.load(tmp_path / o / "ckpt.pt", weights_only=False) for o in ("straight", "stopped"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_ddp_with_muon_equals_one_process(data_dir, tmp_path):
    """2 gloo ranks under torchrun, Muon on the all-reduced gradients: one process's losses and weights (up to
    float rounding: the gradients are summed in another order)."""
    recipe = dict(optimizer="muon", learning_rate=0.02, embedding_lr=0.05, unembedding_lr=0.01, dropout=0.0)
    run(data_dir, tmp_path / "one", **recipe)
    launch = [["train.py", *layout_args(data_dir, tmp_path / "two", **recipe)]]
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(ROOT / "tests" / "torchrun_many.py"), *(json.dumps(c) for c in launch)],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = rows(tmp_path / "one", False), rows(tmp_path / "two", False)
    assert [r["iter"] for r in two] == [0, 3, 6] and two[-1]["val_loss"] < two[0]["val_loss"]
    for a, b in zip(one, two, strict=True):
        assert b["val_loss"] == pytest.approx(a["val_loss"], abs=1e-5)
    a, b = (torch.load(tmp_path / o / "ckpt.pt", weights_only=False)["model"] for o in ("one", "two"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


# ----------------------------------------------------------------------------------------------------- wsd
def test_wsd_rate_at_warmup_plateau_decay_and_end():
    """warmup 10, horizon 100, warmdown_ratio 0.2: linear warmup, learning_rate until step 80, then linearly
    to min_lr at step 100, and min_lr after it."""
    cfg = dict(settings.DEFAULTS, learning_rate=1e-2, min_lr=1e-3, warmup_iters=10, lr_schedule="wsd",
               warmdown_ratio=0.2)
    lr = lambda it: get_lr(it, cfg, 100)
    assert lr(0) == pytest.approx(1e-2 / 11) and lr(9) == pytest.approx(1e-2 * 10 / 11)
    assert lr(10) == lr(50) == lr(80) == pytest.approx(1e-2, rel=1e-12)
    assert lr(90) == pytest.approx(1e-3 + 0.5 * 9e-3) and lr(99) == pytest.approx(1e-3 + 0.05 * 9e-3)
    assert lr(100) == lr(150) == 1e-3


def test_a_cool_down_branched_from_the_stable_phase(data_dir, tmp_path, recwarn):
    """A wsd run to iter 40 whose decay would start at 32 (horizon 40), checkpointed at 20: its copy resumed
    with max_iters=lr_decay_iters=30 holds the rate to 24, then decays to min_lr at 30, exactly the schedule
    of a straight 30-iter run. A branch from inside a decay is refused before training."""
    recipe = dict(lr_schedule="wsd", warmdown_ratio=0.2, warmup_iters=2, eval_interval=10, dropout=0.0)
    run(data_dir, tmp_path / "long", max_iters=20, lr_decay_iters=40, **recipe)  # the long run, stopped at 20
    run(data_dir, tmp_path / "straight30", max_iters=30, lr_decay_iters=30, **recipe)
    os.makedirs(tmp_path / "branch")
    for f in ("ckpt.pt", "config.json", "metrics.jsonl"):
        (tmp_path / "branch" / f).write_bytes((tmp_path / "long" / f).read_bytes())
    run(data_dir, tmp_path / "branch", max_iters=30, lr_decay_iters=30, init_from="resume", **recipe)
    assert not [w for w in recwarn if "differs from the checkpoint's" in str(w.message)]  # the same rate at 20
    lrs = lambda out: [r["lr"] for r in rows(out) if "val_loss" not in r]
    assert lrs(tmp_path / "branch") == lrs(tmp_path / "straight30")
    assert lrs(tmp_path / "branch")[23] == pytest.approx(1e-2)
    assert lrs(tmp_path / "branch")[-1] == pytest.approx(1e-3 + 9e-3 / 6)
    with pytest.raises(ValueError, match="the checkpoint at iter 30 is inside a wsd decay .*from a stable-phase "
                                         "checkpoint"):
        run(data_dir, tmp_path / "branch", max_iters=60, lr_decay_iters=60, init_from="resume", **recipe)


# ------------------------------------------------------------------------------------- fused c_attn, loaded
def test_an_older_linear_checkpoint_with_a_fused_c_attn_loads_and_resumes(tmp_path):
    """tests/fixtures/fused_linear_ckpt.pt was written by nlq at 7f7de89 (one c_attn of 3C rows, biases, an
    untied head) for 3 steps; that code, resumed to iter 5, reached val loss 4.103604. Read through the real
    load path its c_attn splits into c_q, c_k, c_v, and AdamW's moments with it (the fixture numbers c_attn's
    weight 2 and its bias 9): the same val loss at 3, and at 5 after the resume up to float rounding (three
    matmuls for one, amplified by AdamW on K's bias, whose gradient is zero in exact arithmetic)."""
    data = write_tiny_dataset(tmp_path / "data" / "tiny")
    (data / "meta.json").write_text(json.dumps(dict(name="tiny", vocab_size=64, dtype="uint16", tokenizer="char",
                                                    chars=[chr(48 + i) for i in range(64)], eot_token=None)))
    out = tmp_path / "out"
    out.mkdir()
    old = torch.load(ROOT / "tests" / "fixtures" / "fused_linear_ckpt.pt", weights_only=True)
    assert old["model"]["transformer.h.0.attn.c_attn.weight"].shape == (48, 16)
    (out / "ckpt.pt").write_bytes((ROOT / "tests" / "fixtures" / "fused_linear_ckpt.pt").read_bytes())
    ckpt = checkpoint.load_checkpoint(str(out / "ckpt.pt"))
    model = checkpoint.model_from_checkpoint(ckpt, "fixture")
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    opt.load_state_dict(ckpt["optimizer"])
    attn = model.transformer.h[0].attn
    for rows, layer in enumerate((attn.query.c_q, attn.c_k, attn.c_v)):
        for p, i in ((layer.weight, 2), (layer.bias, 9)):
            assert torch.equal(p, old["model"][f"transformer.h.0.attn.c_attn.{'weight' if i == 2 else 'bias'}"]
                               [16 * rows:16 * (rows + 1)])
            for m in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(opt.state[p][m], old["optimizer"]["state"][i][m][16 * rows:16 * (rows + 1)])
    r = nlq_eval.evaluate(str(out), data_dir=str(tmp_path / "data"))
    assert r["iter"] == 3 and r["loss"] == pytest.approx(old["best_val_loss"], abs=1e-6)
    cfg = {**settings.upgrade(old["config"]), "data_dir": str(tmp_path / "data"), "out_dir": str(out),
           "init_from": "resume", "max_iters": 5, "eval_interval": 5}
    assert train.train(cfg)["val"] == pytest.approx(4.103604316711426, abs=1e-4)
