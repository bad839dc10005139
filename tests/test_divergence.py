"""Numbers that go bad and callers off the CLI's path (issue 9): a diverged run is recorded and stopped, and
it never replaces a finite checkpoint; sample.py/eval.py refuse non-finite weights; generate() validates its
arguments; crashes (SIGKILL, at any moment) never leave a checkpoint that cannot be resumed."""
import json
import math
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import ROOT

import eval as nlq_eval
import sample
import train
from model import GPT, QUERY_MODES, GPTConfig
from nlq import checkpoint, losses, preemption, settings
from research.study import final_row, final_val_loss, is_diverged, is_finished, load_study, plan, run_dir

# The tiny settings "T", on a char dataset like shakespeare_char (vocab 65 -> embedding 128).
T_SETTINGS = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=4, gradient_accumulation_steps=1,
                  max_iters=20, eval_interval=10, eval_windows=8, device="cpu", warmup_iters=5, compile=False,
                  log_interval=1)
BLOW_UP = dict(learning_rate=1e6, min_lr=1e5, warmup_iters=0, grad_clip=0.0, weight_decay=0.0)


@pytest.fixture(scope="module")
def char_data(tmp_path_factory):
    """A 65-symbol char dataset ('chars65'), so the model's embedding is padded from 65 to 128 rows."""
    root = tmp_path_factory.mktemp("data")
    (root / "chars65").mkdir()
    rng = np.random.default_rng(0)
    pattern = rng.integers(0, 65, 131)
    np.tile(pattern, 80).astype(np.uint16).tofile(root / "chars65" / "train.bin")
    np.tile(pattern, 10).astype(np.uint16).tofile(root / "chars65" / "val.bin")
    chars = ["\n"] + [chr(ord("!") + i) for i in range(64)]
    (root / "chars65" / "meta.json").write_text(json.dumps(dict(name="chars65", tokenizer="char",
                                                                vocab_size=65, dtype="uint16", chars=chars,
                                                                eot_token=None)))
    return root


def cfg_for(data, out_dir, **kw):
    return {**settings.DEFAULTS, **T_SETTINGS, "data_dir": str(data), "dataset": "chars65",
            "out_dir": str(out_dir), **kw}


def rows_of(out_dir):
    return checkpoint.read_metrics(str(out_dir))


# ------------------------------------------------------------------ 1. a diverging run never destroys ckpt.pt
def test_diverging_run_stops_and_keeps_the_finite_checkpoint(char_data, tmp_path):
    out = tmp_path / "nan"
    with pytest.raises(train.TrainingDiverged) as err:
        train.train(cfg_for(char_data, out, **BLOW_UP))
    message = str(err.value)
    assert "training diverged at iter" in message \
        and f"the last finite checkpoint is {out / 'ckpt.pt'} (iter 0)" in message \
        and "lower learning_rate" in message
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 0  # the iteration-0 checkpoint, untouched
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    rows = rows_of(out)
    assert rows[0]["iter"] == 0 and math.isfinite(rows[0]["val_loss"])
    last = rows[-1]
    assert last["diverged"] is True and 0 < last["iter"] <= 20
    assert last.get("val_loss") is None or last["val_loss"] is None  # written as null: JSON has no NaN
    # every line of the log is strict JSON
    for line in open(out / "metrics.jsonl"):
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert is_diverged(last) and final_val_loss(last) is None


def test_diverging_run_on_the_command_line_exits_3_and_sample_still_works(char_data, tmp_path, capsys):
    """sample.py then samples the last finite checkpoint, and says so."""
    out = tmp_path / "nan"
    args = [f"--{k}={v}" for k, v in {**T_SETTINGS, **BLOW_UP}.items()]
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), f"--data_dir={char_data}",
                             "--dataset=chars65", f"--out_dir={out}", *args],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == preemption.EXIT_DIVERGED, result.stderr[-2000:]
    assert "error: training diverged at iter" in result.stderr and "Traceback" not in result.stderr
    texts = sample.main(["--out_dir", str(out), "--max_new_tokens", "5"])
    assert len(texts) == 1 and len(texts[0]) == 1 + 5  # newline prompt + 5 characters
    saved, last = torch.load(out / "ckpt.pt", weights_only=True)["iter_num"], checkpoint.read_metrics(str(out))[-1]
    assert last["diverged"] and last["iter"] > saved
    assert f"sampling from {out / 'ckpt.pt'}, iter {saved}" in capsys.readouterr().err


def test_non_finite_checkpoint_gets_a_clear_error_in_sample_and_eval(char_data, tmp_path):
    out = tmp_path / "run"
    train.train(cfg_for(char_data, out, max_iters=2, eval_interval=2))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["model"]["lm_head.weight"][3, 5] = float("nan")  # as an old nlq would have saved a diverged run
    torch.save(ckpt, out / "ckpt.pt")
    for script in ("sample.py", "eval.py"):
        result = subprocess.run([sys.executable, str(ROOT / script), f"--out_dir={out}",
                                 *([f"--data_dir={char_data}"] if script == "eval.py" else [])],
                                capture_output=True, text=True, cwd=ROOT)
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert "the weights are not finite (training diverged)" in result.stderr


def test_huge_finite_and_non_finite_losses_give_figures_not_errors():
    assert losses.safe_exp(1e6) == math.inf and math.isnan(losses.safe_exp(math.nan))
    assert losses.safe_exp(math.log(7.0)) == pytest.approx(7.0)
    m = nlq_eval.metrics(nats=1e6 * 10, tokens=10, n_bytes=10)  # loss 1e6 nats/token: exp overflows
    assert m["ppl"] == math.inf and m["bits_per_byte"] == pytest.approx(1e6 / math.log(2))
    m = nlq_eval.metrics(nats=math.nan, tokens=10, n_bytes=0)
    assert math.isnan(m["loss"]) and math.isnan(m["ppl"]) and m["bits_per_byte"] is None


def test_divergence_rule_is_a_config_key(char_data, tmp_path, monkeypatch):
    """max_nonfinite_steps consecutive non-finite training losses stop the run at exactly that step."""
    real_forward = GPT.forward
    calls = {"n": 0}

    def nan_after_3_steps(self, idx, targets=None):
        logits, loss = real_forward(self, idx, targets)
        if self.training:
            calls["n"] += 1
            if calls["n"] > 3:  # steps 4, 5, 6, ... have a NaN loss
                loss = loss * math.nan
        return logits, loss

    monkeypatch.setattr(GPT, "forward", nan_after_3_steps)
    out = tmp_path / "patience"
    with pytest.raises(train.TrainingDiverged, match=r"at iter 5: the training loss was not finite for 2 "
                                                     r"consecutive steps"):
        train.train(cfg_for(char_data, out, max_nonfinite_steps=2, eval_interval=100, max_iters=50))
    assert rows_of(out)[-1] == dict(iter=5, tokens=5 * 4 * 32, lr=rows_of(out)[-1]["lr"], train_loss=None,
                                    diverged=True)
    with pytest.raises(ValueError, match="'max_nonfinite_steps' = 0 must be > 0"):
        settings.parse_config(["--max_nonfinite_steps=0"])


# --------------------------------------------------------------------- 2. generate() is safe to call directly
def padded_model(mode="nonlinear"):
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=32, vocab_size=128, data_vocab_size=65, n_layer=1, n_head=2, n_embd=32,
                         query_mode=mode)).eval()


def test_generate_never_returns_padding_ids_by_default():
    model = padded_model()
    head = torch.nn.Linear(32, 128)  # the same head plus a bias that makes the padding rows win by far
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[65:] = 100.0
    model.lm_head = head
    idx = torch.zeros(4, 1, dtype=torch.long)
    assert model(idx)[0][:, -1].argmax(-1).min() >= 65  # unmasked, a padding id would win
    torch.manual_seed(1)
    out = model.generate(idx, 20, temperature=1.0)
    assert out[:, 1:].max() < 65
    assert model.generate(idx, 2, temperature=0)[:, 1:].max() < 65
    # a caller who asks for padded ids gets them
    asked = model.generate(idx, 2, temperature=0, vocab_size=128)
    assert asked[:, 1:].min() >= 65
    assert model.config.data_vocab_size == 65


def test_tiny_temperature_is_greedy():
    model = padded_model()
    idx = torch.randint(0, 65, (3, 5), generator=torch.Generator().manual_seed(0))
    greedy = model.generate(idx, 4, temperature=0)
    assert torch.equal(model.generate(idx, 4, temperature=1e-30), greedy)
    assert torch.equal(model.generate(idx, 4, temperature=1e-30, top_k=1), greedy)
    for tiny in (1e-300, 5e-324):  # 0 in float32 (was a NaN from 0 / 0, then a RuntimeError in multinomial)
        assert torch.equal(model.generate(idx, 4, temperature=tiny), greedy)
    assert torch.equal(model.generate(idx, 0), idx)  # no new tokens: the prompt back


@pytest.mark.parametrize("kwargs, message", [
    (dict(top_k=-3), "top_k must be an integer >= 0 (0: no top-k filter), got -3"),
    (dict(top_k=2.5), "top_k must be an integer >= 0 (0: no top-k filter), got 2.5"),
    (dict(temperature=-1.0), "temperature must be a finite number >= 0 (0: greedy), got -1.0"),
    (dict(temperature=math.nan), "temperature must be a finite number >= 0 (0: greedy), got nan"),
    (dict(max_new_tokens=-5), "max_new_tokens must be an integer >= 0, got -5"),
    (dict(max_new_tokens=2.0), "max_new_tokens must be an integer >= 0, got 2.0"),
])
def test_generate_refuses_sampling_arguments_torch_would_misread(kwargs, message):
    """Was: an IndexError or RuntimeError from torch.topk, greedy sampling for a negative temperature, an empty
    result for a negative max_new_tokens."""
    kwargs = dict(dict(max_new_tokens=3), **kwargs)
    with pytest.raises(ValueError) as e:
        padded_model().generate(torch.zeros(1, 2, dtype=torch.long), **kwargs)
    assert str(e.value) == message


def test_top_k_zero_is_no_filter():
    """top_k=0 samples from every token, as top_k=None does (transformers' meaning; it was an IndexError)."""
    model, idx = padded_model(), torch.zeros(2, 1, dtype=torch.long)
    drawn = {}
    for top_k in (None, 0, 3):
        torch.manual_seed(5)
        drawn[top_k] = model.generate(idx, 30, temperature=2.0, top_k=top_k)
    assert torch.equal(drawn[0], drawn[None]) and not torch.equal(drawn[3], drawn[None])


# ------------------------------------------------------------------- 4. the schedule survives a longer resume
def test_resume_with_larger_max_iters_keeps_the_schedule(char_data, tmp_path, capsys):
    out = tmp_path / "sched"
    cfg = cfg_for(char_data, out, max_iters=10, eval_interval=10, learning_rate=2e-3, min_lr=2e-4,
                  warmup_iters=2)
    train.train(cfg)
    capsys.readouterr()
    train.train({**cfg, "max_iters": 20, "init_from": "resume"})
    printed = capsys.readouterr().out
    assert "keeping the checkpoint's schedule (decay to min_lr at iter 10), not max_iters=20" in printed
    lrs = [float(line.split("lr ")[1].split(",")[0]) for line in printed.splitlines()
           if line.startswith("iter ")]
    assert lrs == [2e-4] * 10  # it stays at min_lr; it does not jump back up the cosine
    assert rows_of(out)[-1]["iter"] == 20 and rows_of(out)[-1]["lr"] == pytest.approx(2e-4)
    train.train({**cfg, "max_iters": 15, "init_from": "resume"})  # nothing left: no note on untrained steps
    printed = capsys.readouterr().out
    assert "max_iters=15 is reached already, nothing to train" in printed
    assert "keeping the checkpoint's schedule" not in printed
    const = tmp_path / "const"  # a constant rate has no schedule to keep
    train.train({**cfg, "out_dir": str(const), "decay_lr": False})
    capsys.readouterr()
    train.train({**cfg, "out_dir": str(const), "decay_lr": False, "max_iters": 12, "init_from": "resume"})
    assert "keeping the checkpoint's schedule" not in capsys.readouterr().out


def test_resume_with_another_explicit_schedule_warns_with_both_values(char_data, tmp_path):
    out = tmp_path / "sched2"
    cfg = cfg_for(char_data, out, max_iters=10, eval_interval=10, learning_rate=2e-3, min_lr=2e-4,
                  warmup_iters=2)
    train.train(cfg)
    # by hand: at iter 10 with warmup 2 and decay to iter 20, progress = 8/18,
    # lr = 2e-4 + 0.5 (1 + cos(pi 8/18)) (2e-3 - 2e-4) = 2e-4 + 0.5868 * 1.8e-3 = 1.256e-3; the checkpoint's
    # schedule had reached min_lr = 2e-4
    with pytest.warns(UserWarning, match=r"lr_decay_iters=20 differs from the checkpoint's 10: the learning "
                                         r"rate at iter 10 changes from 2\.000e-04 to 1\.256e-03"):
        train.train({**cfg, "max_iters": 12, "lr_decay_iters": 20, "init_from": "resume"})
    with pytest.raises(ValueError, match="settings differ from the checkpoint's.*lr_schedule"):
        train.train({**cfg, "max_iters": 14, "lr_schedule": "linear", "init_from": "resume"})


# ---------------------------------------------------------------------------- crash safety: SIGKILL at random
def test_sigkill_at_random_moments_never_breaks_resume(char_data, tmp_path):
    """Kill a training process (SIGKILL) at random moments while it trains, many during checkpoint saves
    (eval_interval=1 saves every step); after each kill ckpt.pt loads and --init_from=resume goes on, and the
    run completes with every step logged once."""
    out = tmp_path / "killed"
    args = [sys.executable, str(ROOT / "train.py"), f"--data_dir={char_data}", "--dataset=chars65",
            f"--out_dir={out}", *(f"--{k}={v}" for k, v in {**T_SETTINGS, "max_iters": 100,
                                                            "eval_interval": 1, "log_interval": 1000,
                                                            "n_embd": 64}.items())]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(args + ["--max_iters=1"], check=True, capture_output=True, env=env)  # a first checkpoint
    rng = random.Random(0)
    kills = 0
    for attempt in range(6):  # each kill lands while it trains (most kills in start-up would test nothing)
        logged = len(checkpoint.read_metrics(str(out)))
        proc = subprocess.Popen(args + ["--init_from=resume"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 60
        while proc.poll() is None and len(checkpoint.read_metrics(str(out))) <= logged:  # start-up (imports)
            assert time.monotonic() < deadline, "the resumed run logged no step within 60 s"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))  # it trains now, saving every few ms: kill it anywhere in there
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        ckpt = checkpoint.load_checkpoint(str(out / "ckpt.pt"))  # loads after every kill
        rows = checkpoint.read_metrics(str(out))
        assert rows and rows[-1]["iter"] >= ckpt["iter_num"] - 1
        if ckpt["iter_num"] >= 100:
            break
    assert kills >= 4
    subprocess.run(args + ["--init_from=resume"], check=True, capture_output=True, env=env)  # finish
    rows = checkpoint.read_metrics(str(out))
    assert [r["iter"] for r in rows] == list(range(101)) and "val_loss_full" in rows[-1]
    assert torch.load(out / "ckpt.pt", weights_only=True)["iter_num"] == 100


# -------------------------------------------------------------------------- the sweep goes on past divergence
def test_sweep_with_a_diverging_learning_rate_finishes_the_rest(tmp_path):
    data = tmp_path / "data" / "tiny"
    data.mkdir(parents=True)
    np.tile(np.random.default_rng(0).integers(0, 64, 97), 40).astype(np.uint16).tofile(data / "train.bin")
    np.tile(np.random.default_rng(0).integers(0, 64, 97), 6).astype(np.uint16).tofile(data / "val.bin")
    (data / "meta.json").write_text(json.dumps(dict(vocab_size=64, dtype="uint16", tokenizer="char")))
    config = tmp_path / "cfg.py"
    config.write_text(f"data_dir = {str(tmp_path / 'data')!r}\ndataset = 'tiny'\nn_layer = 1\nn_head = 2\n"
                      "n_embd = 32\nblock_size = 16\nbatch_size = 4\ngradient_accumulation_steps = 1\n"
                      "max_iters = 12\nwarmup_iters = 0\neval_interval = 4\neval_windows = 8\n"
                      "log_interval = 4\ndevice = 'cpu'\ngrad_clip = 0.0\nweight_decay = 0.0\n")
    study = tmp_path / "study.py"
    study.write_text(f"name = 'div'\nconfig = {str(config)!r}\noverrides = {{}}\n"
                     f"runs_dir = {str(tmp_path / 'runs')!r}\n"
                     "arms = {'linear': {}}\nlearning_rates = [1e-2, 1e6]\nselection_seeds = [1]\n"
                     "seeds = [2]\nhalf_steps = False\n")
    result = subprocess.run([sys.executable, "-m", "research.sweep", str(study)], capture_output=True,
                            text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "diverged: linear lr=1e+06 seed=1 (recorded; the sweep goes on)" in result.stdout
    s = load_study(str(study))
    assert is_diverged(final_row(run_dir(s, "linear", 1e6, 1)))
    assert plan(s, "linear")["chosen"] == 1e-2 and is_finished(s, "linear", 1e-2, 2)
    from research import report
    text = report.main([str(study), "--out", str(tmp_path / "report")])
    assert "| 1e+06 | diverged (iter " in text and "| 0.01 | **" in text and "| linear | " in text


# ------------------------------------------------------------------- the GPU code path, exercised on the CPU
def test_compile_ddp_bf16_together_match_eager_fp32(char_data, tmp_path):
    """torchrun, 2 gloo ranks, compile=True and bf16 autocast for 3 steps vs one eager fp32 process: the
    logged losses agree within 0.03 nats (bf16 keeps 8 mantissa bits: ~0.4% relative error per op, on losses
    ~4.2)."""
    settings = {**T_SETTINGS, "max_iters": 3, "eval_interval": 3, "gradient_accumulation_steps": 2,
                "query_mode": "nonlinear", "eval_full_at_end": False}
    eager = tmp_path / "eager"
    train.train(cfg_for(char_data, eager, **settings))
    args = [f"--{k}={v}" for k, v in settings.items()] + [f"--data_dir={char_data}", "--dataset=chars65",
                                                           f"--out_dir={tmp_path / 'gpu_path'}",
                                                           "--compile=True", "--dtype=bfloat16"]
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc_per_node=2", str(ROOT / "train.py"), *args],
                            capture_output=True, text=True, cwd=ROOT, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[:6000]
    a, b = rows_of(eager), rows_of(tmp_path / "gpu_path")
    assert [r["iter"] for r in a] == [r["iter"] for r in b] == [0, 3]
    for ra, rb in zip(a, b):
        assert abs(ra["train_loss"] - rb["train_loss"]) < 0.03 and abs(ra["val_loss"] - rb["val_loss"]) < 0.03
    assert a[-1]["val_loss"] < a[0]["val_loss"]  # it trained
    config = json.loads((tmp_path / "gpu_path" / "config.json").read_text())
    assert (config["world_size"] == 2 and config["resolved_dtype"] == "torch.bfloat16"
            and config["compile"] is True)


def test_every_query_mode_is_registered_for_the_generic_tests():
    assert set(QUERY_MODES) >= {"linear", "identity", "linear_residual", "nonlinear"}
