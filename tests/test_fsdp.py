"""fsdp=True (issue 13) on the CPU: FSDP2 with gloo, 2 ranks under torchrun. It trains like one process, its
checkpoints are plain single files that resume on any number of processes with or without FSDP, and what it
does not support stops with a message.

The 2-rank runs are made once for the module, in two torchrun launches of tests/torchrun_many.py: the first
trains, the second resumes checkpoints of the first. The one-process runs they are compared with run in
pytest.
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import ROOT

import eval as nlq_eval
import sample
import train
from model import GPT, GPTConfig
from nlq import checkpoint, distributed, losses, settings

pytestmark = pytest.mark.xdist_group("fsdp")  # one worker makes the module's shared runs once

# A tiny nonlinear-query GPT. eval_windows=12: the 2 ranks share the 3 eval batches 2 + 1 (losses.my_share).
BASE = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=4, query_mode="nonlinear", max_iters=6,
            eval_interval=3, eval_windows=12, log_interval=1, warmup_iters=2, lr_decay_iters=10,
            learning_rate=1e-2, min_lr=1e-3, dropout=0.0, device="cpu", compile=False,
            gradient_accumulation_steps=4)
# 2-rank runs of the first launch: name -> settings on top of BASE. accum 4 = 2 micro-batches per rank.
FIRST = {"fsdp_accum1": dict(fsdp=True, gradient_accumulation_steps=2, max_iters=3),  # 1 micro-batch per rank
         "fsdp_accum2": dict(fsdp=True),
         "fsdp_half": dict(fsdp=True, max_iters=3),
         "ddp_half": dict(max_iters=3),
         "dropout_straight": dict(fsdp=True, dropout=0.1),
         "dropout_resumed": dict(fsdp=True, dropout=0.1, max_iters=3),
         "bf16": dict(fsdp=True, dtype="bfloat16", max_iters=3),
         "diverged": dict(fsdp=True, learning_rate=1e6, min_lr=1e5, warmup_iters=0, grad_clip=0.0,
                          weight_decay=0.0, max_iters=20, eval_interval=10)}
SECOND = {"dropout_resumed": dict(fsdp=True, dropout=0.1, init_from="resume"),
          "ddp_half": dict(fsdp=True, init_from="resume")}  # a DDP checkpoint, resumed under FSDP


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A char dataset 'tiny' (vocab 64 -> embedding 64) with a learnable repeating pattern."""
    root = tmp_path_factory.mktemp("data")
    (root / "tiny").mkdir()
    pattern = np.random.default_rng(0).integers(0, 64, 97)
    np.tile(pattern, 60).astype(np.uint16).tofile(root / "tiny" / "train.bin")
    np.tile(pattern, 8).astype(np.uint16).tofile(root / "tiny" / "val.bin")
    (root / "tiny" / "meta.json").write_text(json.dumps(dict(
        name="tiny", vocab_size=64, dtype="uint16", tokenizer="char", chars=[chr(48 + i) for i in range(64)],
        eot_token=None)))
    return root


def run_settings(data, out_dir, **kw):
    """The settings of a run, on top of the defaults (train_args makes them command-line arguments)."""
    return {**BASE, "data_dir": str(data), "dataset": "tiny", "out_dir": str(out_dir), **kw}


def train_here(cfg):
    """A one-process run in pytest's process."""
    return train.train({**settings.DEFAULTS, **cfg})


def torchrun_many(commands):
    """Run [script, args...] commands one after another in one 2-rank torchrun launch -> CompletedProcess."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "tests" / "torchrun_many.py"), *(json.dumps(c) for c in commands)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def train_args(cfg):
    return ["train.py"] + [f"--{k}={v}" for k, v in cfg.items()]


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    """{name: out_dir} of the 2-rank runs (FIRST, then SECOND) and the one-process references; 'launches'
    holds the two torchrun results, 'bench' the rows bench.py wrote under FSDP."""
    root = tmp_path_factory.mktemp("runs")
    out = {name: root / name for name in FIRST}
    bench_json = root / "bench.json"
    bench = ["bench.py", "--fsdp=True", "--query_modes=linear,nonlinear", "--warmup=1", "--steps=2",
             "--rounds=1", f"--json={bench_json}", "--n_layer=2", "--n_head=2", "--n_embd=32",
             "--block_size=16", "--batch_size=2", "--device=cpu", "--vocab_size=64", "--compile=False"]
    first = torchrun_many([train_args(run_settings(data, out[n], **kw)) for n, kw in FIRST.items()] + [bench])
    assert first.returncode == 0, first.stderr[-4000:]
    second = torchrun_many([train_args(run_settings(data, out[n], **kw)) for n, kw in SECOND.items()])
    assert second.returncode == 0, second.stderr[-4000:]
    singles = {"single_accum1": dict(gradient_accumulation_steps=2, max_iters=3), "single_accum2": {}}
    for name, kw in singles.items():
        out[name] = root / name
        train_here(run_settings(data, out[name], **kw))
    return {**out, "launches": (first, second), "bench": json.loads(bench_json.read_text())}


def ckpt(out_dir):
    return torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu", weights_only=True)


def max_abs_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def assert_losses_close(out_a, out_b, tol):
    """The two runs logged evals at the same iterations with train/val losses within tol, and the same loss
    over the whole val split at the end. (A run resumed at iter 3 keeps the val_loss_full it logged there.)"""
    rows_a, rows_b = checkpoint.read_metrics(out_a), checkpoint.read_metrics(out_b)
    assert [r["iter"] for r in rows_a] == [r["iter"] for r in rows_b]
    assert "val_loss_full" in rows_a[-1] and "val_loss_full" in rows_b[-1]
    for ra, rb in zip(rows_a, rows_b):
        for key in ("train_loss", "val_loss", "val_loss_full"):
            if key in ra and key in rb:
                assert abs(ra[key] - rb[key]) < tol, (key, ra, rb)


@pytest.mark.parametrize("fsdp_run,single_run",
                         [("fsdp_accum1", "single_accum1"), ("fsdp_accum2", "single_accum2")],
                         ids=["one_micro_batch_per_rank", "two_micro_batches_per_rank"])
def test_fsdp_matches_one_process(runs, fsdp_run, single_run):
    """2 FSDP ranks == one process with the same seed and global batch: weights and losses within 1e-5 after
    3 and 6 steps, with and without gradient accumulation (and eval batches shared 2 + 1 by the ranks)."""
    a, b = ckpt(runs[fsdp_run]), ckpt(runs[single_run])
    assert a["iter_num"] == b["iter_num"] == (3 if fsdp_run == "fsdp_accum1" else 6)
    assert max_abs_diff(a["model"], b["model"]) < 1e-5
    assert_losses_close(runs[fsdp_run], runs[single_run], 1e-5)
    config = json.loads((runs[fsdp_run] / "config.json").read_text())
    assert config["fsdp"] is True and config["world_size"] == 2


def test_fsdp_resume_is_bit_exact_on_two_ranks(runs):
    """3 + 3 steps with a resume in between == 6 straight, bit for bit: weights, AdamW moments, losses
    (dropout on, so both ranks' RNG states are restored)."""
    a, b = ckpt(runs["dropout_straight"]), ckpt(runs["dropout_resumed"])
    assert a["iter_num"] == b["iter_num"] == 6
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    state_a, state_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert state_a.keys() == state_b.keys() == set(range(sum(len(g["params"]) for g in
                                                              a["optimizer"]["param_groups"])))
    assert all(torch.equal(state_a[i][k], state_b[i][k]) for i in state_a for k in state_a[i])
    rows_a = checkpoint.read_metrics(runs["dropout_straight"])
    rows_b = checkpoint.read_metrics(runs["dropout_resumed"])
    assert [r["iter"] for r in rows_b] == [0, 3, 6]
    assert [r["val_loss"] for r in rows_a] == [r["val_loss"] for r in rows_b]
    assert rows_b[-1]["val_loss"] < rows_b[0]["val_loss"]


def test_fsdp_checkpoint_is_a_plain_file_that_one_process_resumes(runs, data):
    """The checkpoint 2 FSDP ranks wrote at iter 3 has the one-process layout (same keys, no prefixes, plain
    CPU tensors, optimizer state by index), eval.py and sample.py read it, and one process resumes it to
    iter 6 within 1e-5 of the one-process run."""
    fsdp, single = ckpt(runs["fsdp_half"]), ckpt(runs["single_accum2"])
    assert fsdp["iter_num"] == 3 and len(fsdp["rng"]) == 2
    assert fsdp["model"].keys() == single["model"].keys()
    for k, v in fsdp["model"].items():
        assert type(v) is torch.Tensor and v.device.type == "cpu" and v.shape == single["model"][k].shape
    assert [g["params"] for g in fsdp["optimizer"]["param_groups"]] == \
        [g["params"] for g in single["optimizer"]["param_groups"]]
    for i, state in single["optimizer"]["state"].items():
        assert {k: (type(v), v.shape, v.dtype) for k, v in fsdp["optimizer"]["state"][i].items()} == \
            {k: (type(v), v.shape, v.dtype) for k, v in state.items()}
    iter3 = checkpoint.read_metrics(runs["fsdp_half"])[-1]
    assert nlq_eval.evaluate(str(runs["fsdp_half"]))["loss"] == pytest.approx(iter3["val_loss"], abs=1e-6)
    texts = sample.main(["--out_dir", str(runs["fsdp_half"]), "--start=123", "--max_new_tokens=5"])
    assert len(texts) == 1 and texts[0].startswith("123") and len(texts[0]) == 3 + 5

    train_here(run_settings(data, runs["fsdp_half"], init_from="resume"))  # one process, no FSDP
    assert max_abs_diff(ckpt(runs["fsdp_half"])["model"], single["model"]) < 1e-5
    assert_losses_close(runs["fsdp_half"], runs["single_accum2"], 1e-5)


def test_ddp_checkpoint_resumes_under_fsdp(runs):
    """2 DDP ranks for 3 steps, then 2 FSDP ranks resuming to 6 == FSDP for 6 == one process for 6, within
    1e-5."""
    resumed = ckpt(runs["ddp_half"])
    assert resumed["iter_num"] == 6 and resumed["config"]["fsdp"] is True
    assert max_abs_diff(resumed["model"], ckpt(runs["fsdp_accum2"])["model"]) < 1e-5
    assert max_abs_diff(resumed["model"], ckpt(runs["single_accum2"])["model"]) < 1e-5
    assert_losses_close(runs["ddp_half"], runs["single_accum2"], 1e-5)


def test_fsdp_bf16_mixed_precision_path_trains_like_fp32(runs):
    """dtype=bfloat16: bf16 parameters gathered per block, fp32 gradient reduction (the GPU's settings), here
    on gloo: the losses stay within 0.03 nats of one fp32 process (bf16 keeps 8 mantissa bits) and fall."""
    bf16, fp32 = checkpoint.read_metrics(runs["bf16"]), checkpoint.read_metrics(runs["single_accum2"])[:2]
    assert [r["iter"] for r in bf16] == [r["iter"] for r in fp32] == [0, 3]
    for a, b in zip(bf16, fp32):
        assert abs(a["train_loss"] - b["train_loss"]) < 0.03 and abs(a["val_loss"] - b["val_loss"]) < 0.03
    assert bf16[-1]["val_loss"] < bf16[0]["val_loss"] - 0.1
    assert ckpt(runs["bf16"])["model"]["lm_head.weight"].dtype == torch.float32  # fp32 master weights


def test_fsdp_divergence_stops_every_rank_and_keeps_the_finite_checkpoint(runs):
    """Sharded weights go NaN: both ranks stop together (the launch went on to its next run, no hang), the log
    says diverged and the iteration-0 checkpoint is kept."""
    first, _ = runs["launches"]
    assert first.stdout.count("diverged: training diverged at iter") == 2  # one line per rank
    rows = checkpoint.read_metrics(runs["diverged"])
    assert rows[-1]["diverged"] is True and rows[0]["iter"] == 0 and math.isfinite(rows[0]["val_loss"])
    kept = ckpt(runs["diverged"])
    assert kept["iter_num"] == 0 and all(torch.isfinite(v).all() for v in kept["model"].values())


def test_bench_under_torchrun_reports_peak_memory_per_rank(runs):
    rows = runs["bench"]
    assert [r["query_mode"] for r in rows] == ["linear", "nonlinear"]
    for r in rows:
        assert r["parallel"] == "fsdp" and r["world_size"] == 2 and len(r["peak_mem_mb_per_rank"]) == 2
        peaks = r["peak_mem_mb_per_rank"]
        assert all(m > 0 for m in peaks) and r["peak_mem_mb"] == max(peaks)
        assert r["ms_per_iter"] > 0


def test_unsupported_fsdp_settings_fail_with_a_message(data, tmp_path):
    with pytest.raises(ValueError, match="fsdp=True shards over the processes that torchrun starts; launch"):
        train_here(run_settings(data, tmp_path / "out", fsdp=True))
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="MPS has no process-group backend"):
        distributed.check_fsdp_support("mps", torch.float32)
    with pytest.raises(ValueError, match="does not support float16.*use --dtype=bfloat16"):
        distributed.check_fsdp_support("cuda", torch.float16)
    distributed.check_fsdp_support("cuda", torch.bfloat16)
    distributed.check_fsdp_support("cpu", torch.float32)


def test_every_rank_runs_as_many_eval_batches():
    """5 batches over 2 ranks: rank 0 takes 0, 2, 4; rank 1 takes 1, 3 and repeats 4 without counting it."""
    assert losses.my_share(5, 0, 2) == [(0, True), (2, True), (4, True)]
    assert losses.my_share(5, 1, 2) == [(1, True), (3, True), (4, False)]
    assert losses.my_share(4, 1, 2) == [(1, True), (3, True)]
    assert losses.my_share(3, 0, 1) == [(0, True), (1, True), (2, True)]


def test_all_finite_checks_the_shards_of_fsdp_parameters(tmp_path):
    """all_finite on sharded (DTensor) parameters, in a one-process gloo group: True, then False once one
    element of one shard is NaN."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = distributed.shard_model(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64,
                                                 query_mode="nonlinear")), "cpu", torch.float32)
        weight = model.transformer.h[1].attn.query.w2.weight
        assert type(weight).__name__ == "DTensor" and distributed.all_finite(model)
        with torch.no_grad():
            weight.to_local()[3, 5] = float("nan")
        assert not distributed.all_finite(model)
    finally:
        dist.destroy_process_group()


def test_large_config_is_gpt3_large_with_the_nonlinear_query_and_fsdp():
    """config/nlq_large.py: the shape, the parameter counts of docs/fsdp.md's table (meta device), and a global
    batch that 8, 16 and 32 GPUs share evenly."""
    cfg = settings.parse_config([str(ROOT / "config" / "nlq_large.py")])
    assert (cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["block_size"]) == (24, 16, 1536, 1024)
    assert cfg["fsdp"] is True and cfg["query_mode"] == "nonlinear" and cfg["out_dir"] == "out/nlq_large"
    assert cfg["batch_size"] * cfg["gradient_accumulation_steps"] * cfg["block_size"] == 491_520
    assert all(cfg["gradient_accumulation_steps"] % gpus == 0 for gpus in (8, 16, 32))
    with torch.device("meta"):
        counts = GPT(settings.model_config(cfg)).param_breakdown()
    assert (counts["total"], counts["non_embedding"], counts["non_embedding_matrix"], counts["attn_q"]) == \
        (758_466_048, 679_626_240, 679_477_248, 56_696_832)
