"""The same numbers on any layout of a run: eval windows that do not depend on the micro-batch, schedule notes
that are true, token counts and RNG streams that survive a resume on another batch size or number of processes
or GPUs. The 2-rank runs share one torchrun launch (tests/torchrun_many.py)."""
import json
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import ROOT, write_tiny_dataset

import train
from nlq import checkpoint, distributed, settings
from nlq.schedule import decay_horizon, get_lr

pytestmark = pytest.mark.xdist_group("layouts")  # one worker makes the module's shared runs once


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    write_tiny_dataset(root / "tiny")
    return root


def args(data_dir, out, **kw):
    """train.py arguments of a tiny run: 8 windows of 16 tokens per step (4 x 2), 8 eval windows per split."""
    keys = dict(data_dir=str(data_dir), dataset="tiny", out_dir=str(out), n_layer=2, n_head=2, n_embd=32,
                block_size=16, batch_size=4, gradient_accumulation_steps=2, max_iters=6, eval_interval=3,
                eval_windows=8, log_interval=1, warmup_iters=2, lr_decay_iters=10, learning_rate=1e-2,
                min_lr=1e-3, dropout=0.0, device="cpu", compile=False, eval_full_at_end=False)
    keys.update(kw)
    return [f"--{k}={v}" for k, v in keys.items()]


def rows(out):
    return checkpoint.read_metrics(str(out))  # the eval rows


def weights(out):
    return torch.load(out / "ckpt.pt", map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    """One-process runs, then one 2-rank torchrun launch of the same recipes and of resumes."""
    tmp = tmp_path_factory.mktemp("layouts")
    one = lambda out, **kw: train.train(settings.parse_config(args(data_dir, tmp / out, **kw)))
    one("a")                                              # recipe A: 4 windows x 2 micro-batches
    one("b", batch_size=2, gradient_accumulation_steps=4)  # recipe B: 2 x 4, the same 8 windows per step
    one("half", max_iters=3)                              # 3 steps on one process, resumed on 2 ranks below
    one("half_dropout", max_iters=3, dropout=0.1)
    one("tokens", max_iters=3)                            # resumed with another batch size below
    one("tokens", max_iters=6, batch_size=2, init_from="resume")
    launch = [["train.py", *args(data_dir, tmp / "a2")],
              ["train.py", *args(data_dir, tmp / "b2", batch_size=2, gradient_accumulation_steps=4)],
              ["train.py", *args(data_dir, tmp / "half", init_from="resume")],
              ["train.py", *args(data_dir, tmp / "half_dropout", init_from="resume", dropout=0.1)]]
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(ROOT / "tests" / "torchrun_many.py"), *(json.dumps(c) for c in launch)],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp


def test_two_recipes_give_the_same_evals_on_one_process_and_two_ranks(runs):
    """4 x 2 and 2 x 4 windows per step (the README's 12 x 40 vs 6 x 80, scaled down): the same training
    windows and, with eval_windows set, the same eval windows, so the same val and train loss at every eval,
    on one process and on 2 gloo ranks (up to float rounding: the gradients are summed in another order)."""
    reference = rows(runs / "a")
    assert [r["iter"] for r in reference] == [0, 3, 6]
    for other in ("b", "a2", "b2"):
        for r, o in zip(reference, rows(runs / other), strict=True):
            assert r["iter"] == o["iter"] and r["tokens"] == o["tokens"]
            assert o["val_loss"] == pytest.approx(r["val_loss"], abs=1e-5)
            assert o["train_loss"] == pytest.approx(r["train_loss"], abs=1e-5)
    # untrained, one process: the same windows in batches of 4 and of 2 (means summed in another order)
    assert rows(runs / "a")[0]["val_loss"] == pytest.approx(rows(runs / "b")[0]["val_loss"], abs=1e-6)


def test_resume_with_another_batch_size_carries_the_true_token_count(runs):
    """3 steps of 128 tokens, then 3 of 64 (batch_size 4 -> 2): the tokens axis says 384, then 576."""
    assert [(r["iter"], r["tokens"]) for r in rows(runs / "tokens")] == [(0, 0), (3, 384), (6, 576)]
    assert weights(runs / "tokens")["tokens"] == 576


def test_one_process_checkpoint_resumed_on_two_ranks(runs):
    """Without dropout the maths says a 1-process run resumed on 2 ranks equals a straight 2-rank run (the
    window stream is global); with dropout each rank gets its own stream after the resume."""
    straight, resumed = weights(runs / "a2")["model"], weights(runs / "half")["model"]
    assert max((straight[k] - resumed[k]).abs().max().item() for k in straight) < 1e-5
    rng = weights(runs / "half_dropout")["rng"]
    assert len(rng) == 2 and not torch.equal(rng[0]["torch"], rng[1]["torch"])
    assert torch.equal(rng[0]["train"], rng[1]["train"])  # the window stream is one, global


def test_restore_rng_on_cuda_and_on_more_ranks(monkeypatch):
    """A rank's CUDA RNG state (faked on the CPU) goes back to its device. A rank beyond the saved ones gets a
    fresh dropout stream, unlike any saved one."""
    calls = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: calls.append((state, device)))
    gen = torch.Generator().manual_seed(5)
    cuda_state = torch.full((16,), 3, dtype=torch.uint8)
    saved = [dict(train=gen.get_state(), torch=torch.get_rng_state(), cuda=cuda_state)]
    distributed.restore_rng(saved, 0, torch.Generator(), "cuda:0", seed=1, iter_num=3)
    assert len(calls) == 1 and torch.equal(calls[0][0], cuda_state) and calls[0][1] == "cuda:0"
    distributed.restore_rng(saved, 0, torch.Generator(), "cpu", seed=1, iter_num=3)
    after_rank0 = torch.get_rng_state()
    other = torch.Generator()
    distributed.restore_rng(saved, 1, other, "cpu", seed=1, iter_num=3)  # rank 1 of a run saved on 1 process
    assert torch.equal(other.get_state(), saved[0]["train"])
    assert not torch.equal(torch.get_rng_state(), after_rank0)


# ------------------------------------------------------------------------------------------- the schedule
def schedule(**kw):
    return dict(settings.DEFAULTS, learning_rate=6e-4, min_lr=6e-5, **kw)


def notes(cfg):
    """decay_horizon's warnings and notes for a new run of cfg -> (decay_iters, [text])."""
    printed = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decay_iters = decay_horizon(cfg, None, 0, printed.append)
    return decay_iters, [str(w.message) for w in caught] + printed


def test_a_run_that_is_all_warmup_is_warned_about():
    """--max_iters=5 with the default warmup_iters=2000: the rate never passes 1.5e-6 (peak 6e-4)."""
    cfg = schedule(max_iters=5)
    lrs = [get_lr(i, cfg, 5) for i in range(5)]
    assert lrs[0] == pytest.approx(6e-4 / 2001) and max(lrs) == pytest.approx(6e-4 * 5 / 2001)
    assert notes(cfg) == (5, ["the whole run is warmup (warmup_iters=2000 >= max_iters=5): the learning rate "
                              "never reaches learning_rate=0.0006; lower warmup_iters"])


def test_a_warmup_longer_than_the_decay_is_warned_about_and_the_notes_are_true():
    """warmup 4, lr_decay_iters 2, max_iters 5: steps 1-4 warm up, step 5 runs at min_lr; no decay at all."""
    cfg = schedule(warmup_iters=4, lr_decay_iters=2, max_iters=5)
    lrs = [get_lr(i, cfg, 2) for i in range(5)]
    assert lrs[:4] == pytest.approx([6e-4 * k / 5 for k in (1, 2, 3, 4)]) and lrs[4] == 6e-5
    assert notes(cfg) == (2, ["the warmup (warmup_iters=4) does not end before the decay does (lr_decay_iters=2): "
                              "the rate drops from its warmup straight to min_lr; set lr_decay_iters above "
                              "warmup_iters"])


def test_the_early_stop_note_is_true():
    cfg = schedule(warmup_iters=2, max_iters=10, lr_decay_iters=20)
    assert notes(cfg) == (20, ["note: the run stops at max_iters=10, before the learning rate has decayed to min_lr "
                               "(at lr_decay_iters=20); --lr_decay_iters=10 decays to min_lr by the last step"])
    assert get_lr(9, cfg, 20) > 6e-5 and not math.isclose(get_lr(9, cfg, 20), 6e-5)
    assert notes(schedule(warmup_iters=2, max_iters=10)) == (10, [])  # the ordinary case
    assert notes(schedule(warmup_iters=2, max_iters=20, lr_decay_iters=10)) == (10, [])  # a flat tail, as asked
