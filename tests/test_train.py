"""train.py: configuration, data windows, exact resume, gradient accumulation, DDP equivalence, paper
configs."""
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import ROOT, run_offline

import prepare_data
import train
from model import GPT, QUERY_MODES
from nlq import checkpoint, data, losses, progress, settings
from nlq.schedule import decay_horizon, get_lr


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A tiny prepared dataset 'tiny' (vocab 64, uint16) with a learnable repeating pattern."""
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    pattern = rng.integers(0, 64, 97)
    (root / "tiny").mkdir()
    np.tile(pattern, 60).astype(np.uint16).tofile(root / "tiny" / "train.bin")
    np.tile(pattern, 8).astype(np.uint16).tofile(root / "tiny" / "val.bin")
    (root / "tiny" / "meta.json").write_text(json.dumps(dict(vocab_size=64, dtype="uint16",
                                                             tokenizer="char")))
    return root


def tiny_cfg(data_dir, out_dir, **kw):
    cfg = dict(settings.DEFAULTS)
    cfg.update(data_dir=str(data_dir), dataset="tiny", out_dir=str(out_dir), n_layer=2, n_head=2, n_embd=32,
               block_size=16, batch_size=4, gradient_accumulation_steps=2, max_iters=6, eval_interval=3,
               eval_windows=8, log_interval=1, warmup_iters=2, lr_decay_iters=10, learning_rate=1e-2,
               min_lr=1e-3, dropout=0.1, device="cpu", compile=False)
    cfg.update(kw)
    return cfg


def load_weights(out_dir):
    return torch.load(os.path.join(out_dir, "ckpt.pt"), map_location="cpu")["model"]


def max_abs_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("mode", QUERY_MODES)
def test_exact_resume(mode, data_dir, tmp_path):
    """3 + 3 iterations with a resume in between == 6 straight, bit for bit (dropout on, so RNG state
    matters)."""
    train.train(tiny_cfg(data_dir, tmp_path / "straight", query_mode=mode))
    train.train(tiny_cfg(data_dir, tmp_path / "resumed", query_mode=mode, max_iters=3))
    train.train(tiny_cfg(data_dir, tmp_path / "resumed", query_mode=mode, init_from="resume"))
    a, b = load_weights(tmp_path / "straight"), load_weights(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in a)
    rows = [json.loads(line) for line in open(tmp_path / "resumed" / "metrics.jsonl")]
    straight = [json.loads(line) for line in open(tmp_path / "straight" / "metrics.jsonl")]
    # a train row every step (log_interval=1: iter, tokens, lr and the step's loss), an eval row every 3
    assert [(r["iter"], "val_loss" in r) for r in rows] == [(0, True), (1, False), (2, False), (3, False), (3, True),
                                                           (4, False), (5, False), (6, False), (6, True)]
    train_rows = lambda rows: [r for r in rows if "val_loss" not in r]
    assert train_rows(rows) == train_rows(straight) and set(rows[1]) == {"iter", "tokens", "lr", "train_loss"}
    assert [r["val_loss"] for r in rows if "val_loss" in r] == [r["val_loss"] for r in straight if "val_loss" in r]
    assert checkpoint.read_metrics(str(tmp_path / "resumed")) == [r for r in rows if "val_loss" in r]
    assert rows[-1]["val_loss"] < rows[0]["val_loss"]
    assert set(rows[-1]) >= {"iter", "tokens", "lr", "train_loss", "val_loss", "ms_per_iter", "tokens_per_s",
                             "mfu"}
    assert rows[-1]["tokens"] == 6 * 2 * 4 * 16 and rows[-1]["mfu"] is None  # CPU: no peak, no MFU


def test_resume_drops_metrics_written_after_the_checkpoint(data_dir, tmp_path):
    cfg = tiny_cfg(data_dir, tmp_path, max_iters=3)
    train.train(cfg)
    with open(tmp_path / "metrics.jsonl", "a") as f:  # as if the run had gone on to iter 4 and crashed
        f.write(json.dumps(dict(iter=4, val_loss=9.0)) + "\n")
    train.train({**cfg, "max_iters": 6, "init_from": "resume"})
    assert [r["iter"] for r in checkpoint.read_metrics(str(tmp_path))] == [0, 3, 6]


def test_without_always_save_checkpoint_the_last_line_names_the_checkpoints_iter(data_dir, tmp_path, capsys,
                                                                                monkeypatch):
    """always_save_checkpoint=False keeps the checkpoint of the lowest val loss; the last line said only
    'checkpoint PATH' after 6 iterations, as if it held iter 6 (an adversarial trial)."""
    real, evals = train.estimate_loss, []
    def worse_each_time(*a, **k):  # every eval after iter 0 looks worse: the checkpoint stays at iter 0
        evals.append(1)
        return {split: loss + len(evals) for split, loss in real(*a, **k).items()}
    monkeypatch.setattr(train, "estimate_loss", worse_each_time)
    train.train(tiny_cfg(data_dir, tmp_path, always_save_checkpoint=False, eval_full_at_end=False))
    assert torch.load(tmp_path / "ckpt.pt", map_location="cpu")["iter_num"] == 0 and len(evals) == 3
    assert (f"done: 6 iterations; checkpoint {tmp_path / 'ckpt.pt'} (iter 0, its lowest val loss), metrics"
            in capsys.readouterr().out)


def test_gradient_accumulation_equivalence(data_dir, tmp_path):
    """batch 8 x 1 micro-step and batch 4 x 2 micro-steps take the same first step."""
    common = dict(max_iters=1, eval_interval=1, dropout=0.0)
    train.train(tiny_cfg(data_dir, tmp_path / "a", batch_size=8, gradient_accumulation_steps=1, **common))
    train.train(tiny_cfg(data_dir, tmp_path / "b", batch_size=4, gradient_accumulation_steps=2, **common))
    a, b = load_weights(tmp_path / "a"), load_weights(tmp_path / "b")
    assert max_abs_diff(a, b) < 1e-6


def run_torchrun(args, nproc=2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(ROOT / "train.py"), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


def logged_losses(stdout):
    """The per-iteration 'iter N: loss X' values a run printed."""
    return [float(line.split("loss ")[1].split(",")[0]) for line in stdout.splitlines()
            if line.startswith("iter ")]


def test_ddp_matches_single_process(data_dir, tmp_path, capsys):
    """torchrun with 2 gloo processes (1 micro-batch each) == one process with 2 micro-batches, first steps;
    the logged loss is the mean over both ranks (not rank 0's share), as one process logs it."""
    cfg = tiny_cfg(data_dir, tmp_path / "single", max_iters=2, eval_interval=1, dropout=0.0)
    capsys.readouterr()
    train.train(cfg)
    single_log = logged_losses(capsys.readouterr().out)
    overrides = [f"--{k}={v}" for k, v in cfg.items() if v != settings.DEFAULTS[k] and k != "out_dir"]
    result = run_torchrun(overrides + [f"--out_dir={tmp_path / 'ddp'}"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert max_abs_diff(load_weights(tmp_path / "single"), load_weights(tmp_path / "ddp")) < 1e-6
    assert len(single_log) == 2 and logged_losses(result.stdout) == pytest.approx(single_log, abs=1e-4)
    assert result.stderr.count("the whole run is warmup") == 1  # a settings warning: rank 0's, not each rank's
    assert any(line.startswith("warning: the whole run is warmup (warmup_iters=")  # one line, no file name
               for line in result.stderr.splitlines())
    assert "warnings.warn" not in result.stderr  # not the source line that raised it


def test_ddp_rejects_indivisible_accumulation(data_dir, tmp_path):
    result = run_torchrun([f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={tmp_path}",
                           "--device=cpu", "--gradient_accumulation_steps=3", "--n_layer=1", "--n_embd=32",
                           "--n_head=2"])
    assert result.returncode != 0
    message = ("error: gradient_accumulation_steps=3 does not split over the 2 processes (each runs an equal share "
               "of every step's micro-batches): use --gradient_accumulation_steps=4 --batch_size=9 (the same 36 "
               "windows a step)")
    assert result.stderr.count(message) == 1 and "Traceback" not in result.stderr.split("error:")[0]


def test_config_layers_and_errors(tmp_path):
    cfg_file = tmp_path / "my.py"
    cfg_file.write_text("n_layer = 3\nlearning_rate = 1\nimport math\n_private = 5\n")
    cfg = settings.parse_config([str(cfg_file), "--n_layer=5", "--query_mode=nonlinear", "--compile=false"])
    assert cfg["n_layer"] == 5 and cfg["learning_rate"] == 1.0 and isinstance(cfg["learning_rate"], float)
    assert cfg["query_mode"] == "nonlinear" and cfg["compile"] is False
    with pytest.raises(ValueError, match="unknown config key 'n_layers'"):
        settings.parse_config(["--n_layers=4"])
    with pytest.raises(ValueError, match="device='gpu'; use auto, cpu, cuda, cuda:N or mps"):  # on any machine
        settings.parse_config(["--device=gpu"])
    with pytest.raises(ValueError, match="config key 'batch_size' needs an int, got 'big'"):
        settings.parse_config(["--batch_size=big"])
    with pytest.raises(ValueError, match="config key 'bias' needs a bool"):
        settings.parse_config(["--bias=1"])
    (tmp_path / "bad.py").write_text("lerning_rate = 1e-3\n")
    with pytest.raises(ValueError, match="unknown config key 'lerning_rate', did you mean 'learning_rate'\\?"):
        settings.parse_config([str(tmp_path / "bad.py")])
    with pytest.raises(ValueError, match="an override is --key=value"):
        settings.parse_config(["--n_layer", "4"])
    with pytest.raises(ValueError, match="must be the first argument"):
        settings.parse_config([str(cfg_file), str(cfg_file)])
    assert settings.parse_override("--out_dir=none") == ("out_dir", "none")  # was None -> a folder named 'None'
    assert settings.parse_override("--wandb_run_name=true") == ("wandb_run_name", "true")
    assert settings.parse_override("--compile=true") == ("compile", True)


def test_cli_reports_config_errors_cleanly():
    result = subprocess.run([sys.executable, str(ROOT / "train.py"), "--n_layers=4"], capture_output=True,
                            text=True)
    assert result.returncode != 0 and "config error: unknown config key 'n_layers'" in result.stderr
    assert "Traceback" not in result.stderr


def test_lr_schedule():
    cfg = dict(settings.DEFAULTS, learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, lr_decay_iters=110)
    lrs = [get_lr(i, cfg, 110) for i in range(130)]
    assert lrs[0] > 0 and lrs[9] < lrs[10] == pytest.approx(1e-3)
    assert lrs[60] == pytest.approx(0.55e-3)  # half way down the cosine
    assert lrs[110] == lrs[129] == 1e-4
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_eval_windows_are_fixed_and_short_val_fails(data_dir, tmp_path):
    w1 = data.eval_windows(1000, 16, 12, seed=7)
    assert torch.equal(w1, data.eval_windows(1000, 16, 12, seed=7)) and w1.shape == (12,)
    assert not torch.equal(w1, data.eval_windows(1000, 16, 12, seed=8))
    # the windows nlq drew as (eval_iters, batch_size) = (3, 4) before, in the same order: old curves keep meaning
    old = torch.randint(1000 - 16, (3, 4), generator=torch.Generator().manual_seed(7))
    assert torch.equal(w1, old.flatten())
    short = tmp_path / "short"
    short.mkdir()
    np.arange(2000, dtype=np.uint16).tofile(short / "train.bin")
    np.arange(10, dtype=np.uint16).tofile(short / "val.bin")
    (short / "meta.json").write_text(json.dumps(dict(vocab_size=2000, dtype="uint16")))
    with pytest.raises(ValueError, match=r"val.bin holds 10 tokens, fewer than block_size \+ 1 = 17"):
        train.train(tiny_cfg(tmp_path, tmp_path / "out", dataset="short"))
    with pytest.raises(FileNotFoundError, match="not a prepared dataset"):
        train.train(tiny_cfg(tmp_path, tmp_path / "out", dataset="missing"))


def test_every_query_mode_sees_the_same_batches(data_dir, tmp_path, monkeypatch):
    """Same seed -> the same training windows and eval windows, whatever the query mode."""
    seen = {}
    real_get_batch = data.get_batch
    for mode in ("linear", "nonlinear"):
        calls = seen[mode] = []
        spy = (lambda path, *a, calls=calls:
               calls.append((os.path.basename(getattr(path, "name", path)), a[1].tolist()))
               or real_get_batch(path, *a))
        monkeypatch.setattr(data, "get_batch", spy)  # training batches
        monkeypatch.setattr(losses, "get_batch", spy)  # eval batches (losses.estimate_loss)
        train.train(tiny_cfg(data_dir, tmp_path / mode, query_mode=mode, max_iters=2, eval_interval=1,
                             eval_full_at_end=False))
    assert seen["linear"] == seen["nonlinear"] and len(seen["linear"]) == 3 * 2 * 2 + 2 * 2


def test_a_dataset_prepared_again_mid_run_does_not_change_the_run(data_dir, tmp_path, monkeypatch):
    """prepare_data.py --overwrite renames new bins into place; a run that is training goes on reading the
    bins it opened at its start, evals and the whole-split eval included (its losses equal an undisturbed
    run's), and the next run reads the new ones."""
    folder = tmp_path / "data" / "tiny"
    shutil.copytree(data_dir / "tiny", folder)
    losses = lambda out: [{k: v for k, v in row.items() if k not in ("ms_per_iter", "elapsed_s", "tokens_per_s", "mfu")}
                          for row in checkpoint.read_metrics(str(out))]
    train.train(tiny_cfg(tmp_path / "data", tmp_path / "calm"))
    real_get_batch, calls = data.get_batch, []
    def prepare_again_at_iter_2(path, *a):  # train.py's training batches: 2 a step
        calls.append(path)
        if len(calls) == 5:
            for split, n in (("train", 97 * 60), ("val", 97 * 8)):  # as prepare_data.py does it
                np.full(n, 5, np.uint16).tofile(folder / f".new_{split}.bin")
                os.replace(folder / f".new_{split}.bin", folder / f"{split}.bin")
        return real_get_batch(path, *a)
    monkeypatch.setattr(data, "get_batch", prepare_again_at_iter_2)
    train.train(tiny_cfg(tmp_path / "data", tmp_path / "disturbed"))
    assert len(calls) == 12 and losses(tmp_path / "disturbed") == losses(tmp_path / "calm")
    assert losses(tmp_path / "calm")[-1]["val_loss_full"] is not None
    monkeypatch.undo()
    train.train(tiny_cfg(tmp_path / "data", tmp_path / "next", max_iters=1))  # the same model at iter 0 ...
    assert losses(tmp_path / "next")[0]["val_loss"] != losses(tmp_path / "calm")[0]["val_loss"]  # ... new data


def test_a_finished_run_without_its_checkpoint_is_not_replaced(data_dir, tmp_path):
    """A committed study run keeps only metrics.jsonl and config.json: a new run into its folder replaced its
    results without a word. A run stopped before its first checkpoint may still start again there."""
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=3, eval_interval=3))
    (tmp_path / "ckpt.pt").unlink()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ValueError, match="holds a finished run \\(metrics up to iter 3, no checkpoint\\): a "
                                         "new run would replace its results"):
        train.train(tiny_cfg(data_dir, tmp_path, max_iters=3, eval_interval=3))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "metrics.jsonl").write_text(rows[0] + "\n")  # stopped after the iter-0 eval, before a checkpoint
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=3, eval_interval=3))
    assert checkpoint.read_metrics(str(tmp_path))[-1]["iter"] == 3


def test_one_train_py_per_out_dir(data_dir, tmp_path):
    """A second train.py on an out_dir in use (a sweep restarted beside an orphan of a killed one) is refused
    before it writes anything; the lock goes with the process that held it."""
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=1, eval_interval=1))
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
                               str(tmp_path / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        before = (tmp_path / "metrics.jsonl").read_bytes()
        with pytest.raises(ValueError, match="is in use by another train.py"):
            train.train(tiny_cfg(data_dir, tmp_path, max_iters=2, eval_interval=1, init_from="resume"))
        # the same command again, as a fresh run: told that the folder is in use, not to resume or delete it
        with pytest.raises(ValueError, match="is in use by another train.py"):
            train.train(tiny_cfg(data_dir, tmp_path, max_iters=2, eval_interval=1))
        assert checkpoint.is_locked(str(tmp_path / ".lock")) and not checkpoint.is_locked(str(tmp_path / "none"))
        assert (tmp_path / "metrics.jsonl").read_bytes() == before
    finally:
        holder.kill()
        holder.wait()
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=2, eval_interval=1, init_from="resume"))
    assert checkpoint.read_metrics(str(tmp_path))[-1]["iter"] == 2  # the lock went with its process


def test_resume_rejects_changed_model(data_dir, tmp_path):
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=1, eval_interval=1))
    # the mode's own scale differs too, but only the flag that differs in the config is named
    with pytest.raises(ValueError, match=r"settings differ from the checkpoint's.*'query_mode': \('nonlinear', "
                                         r"'linear'\), 'attn_scale': \(0.125, 0.25\)\}; resume with the "
                                         r"checkpoint's settings \(--query_mode=linear\) or start a new out_dir"):
        train.train(tiny_cfg(data_dir, tmp_path, max_iters=2, init_from="resume", query_mode="nonlinear"))


def test_the_default_eval_set_does_not_depend_on_the_micro_batch(data_dir, tmp_path):
    """eval_windows left at its default: two recipes of equal tokens per step (8 x 1 and 4 x 2) evaluate the
    same windows, and a resume at another micro-batch goes on with them (checked against the windows drawn
    from the seed)."""
    base = {**tiny_cfg(data_dir, tmp_path), "eval_windows": settings.DEFAULTS["eval_windows"]}
    cfg = lambda out, **kw: {**base, "out_dir": str(tmp_path / out), "dropout": 0.0, **kw}
    train.train(cfg("a", batch_size=8, gradient_accumulation_steps=1, max_iters=3, eval_interval=3))
    train.train(cfg("b", batch_size=4, gradient_accumulation_steps=2, max_iters=3, eval_interval=3))
    first = lambda out: checkpoint.read_metrics(str(tmp_path / out))[0]  # iter 0: the same weights
    assert first("a")["val_loss"] == pytest.approx(first("b")["val_loss"], abs=1e-5)  # batches of 8, of 4
    assert first("a")["train_loss"] == pytest.approx(first("b")["train_loss"], abs=1e-5)
    assert settings.DEFAULTS["eval_windows"] == 2400
    row = train.train(cfg("b", batch_size=2, gradient_accumulation_steps=4, max_iters=6, eval_interval=3,
                          init_from="resume"))
    model = checkpoint.model_from_checkpoint(checkpoint.load_checkpoint(str(tmp_path / "b" / "ckpt.pt")), "")
    val = data_dir / "tiny" / "val.bin"
    windows = data.eval_windows(len(np.fromfile(val, np.uint16)), 16, 2400, seed=settings.DEFAULTS["seed"])
    want = losses.estimate_loss(model, {"val": (str(val), "uint16", windows, 16)}, contextlib.nullcontext(),
                                batch_size=2)["val"]
    assert checkpoint.read_metrics(str(tmp_path / "b"))[-1]["val_loss"] == pytest.approx(want, abs=1e-5) == row["val"]


def test_what_a_resume_changes_is_recorded_and_compared_as_such(data_dir, tmp_path):
    """config.json holds this start's settings; what a resume changed, and from which iter, stays in the
    checkpoint and config.json ("resumes") across later resumes. A step split into other micro-batches (the
    same sequences a step) and the eval set kept are no change; a step of another size, a longer run and a
    dtype are; report.py shows such a setting with its values in order."""
    from research import report
    cfg = lambda out, **kw: tiny_cfg(data_dir, tmp_path / out, **{"max_iters": 3, "eval_interval": 3, **kw})
    train.train(cfg("split"))  # 4 x 2 sequences a step, then 2 x 4: the same run
    train.train(cfg("split", max_iters=6, init_from="resume", batch_size=2, gradient_accumulation_steps=4))
    record = lambda out: json.loads((tmp_path / out / "config.json").read_text())["resumes"]
    assert record("split") == [dict(iter=3, changed=dict(max_iters=[3, 6]))]
    train.train(cfg("grown"))  # 8 sequences a step, then 16
    train.train(cfg("grown", max_iters=6, init_from="resume", batch_size=8))
    train.train(cfg("grown", max_iters=9, init_from="resume", batch_size=8, dtype="bfloat16"))
    train.train(cfg("grown", max_iters=9, init_from="resume", batch_size=8, dtype="bfloat16"))  # nothing new
    changes = [dict(iter=3, changed=dict(batch_size=[4, 8], max_iters=[3, 6])),
               dict(iter=6, changed=dict(max_iters=[6, 9], dtype=["auto", "bfloat16"]))]
    assert record("grown") == changes
    assert checkpoint.load_checkpoint(str(tmp_path / "grown" / "ckpt.pt"))["resumes"] == changes
    text = report.compare([str(tmp_path / "split"), str(tmp_path / "grown")], str(tmp_path))
    split, grown = tmp_path / "split", tmp_path / "grown"
    assert (f"| setting | {split} | {grown} |\n|---|---:|---:|\n"
            f"| batch_size | 2 | 4, then 8 from iter 3 |\n"
            f"| gradient_accumulation_steps | 4 | 2 |\n"
            f"| max_iters | 3, then 6 from iter 3 | 3, then 6 from iter 3, then 9 from iter 6 |\n") in text
    assert "dtype" not in text  # how a run ran, not compared
    assert (f"{split}, {grown} changed settings when resumed (shown as 'A, then B from iter N'): not the curves of "
            f"straight runs at their final settings.") in text


def test_resume_compares_the_model_as_built_not_the_config_text(data_dir, tmp_path):
    """A run trained at attn_scale=0.1 and resumed with attn_scale unset (None: the mode's default) would train
    on at another scale: refused, naming the flag. None and its resolved value (mlp_hidden 4·n_embd) are one
    setting."""
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=1, eval_interval=1, attn_scale=0.1))
    with pytest.raises(ValueError, match=r"settings differ from the checkpoint's \(yours, checkpoint's\): "
                                         r"\{'attn_scale': \(0.25, 0.1\)\}; resume with the checkpoint's "
                                         r"settings \(--attn_scale=0.1\)"):
        train.train(tiny_cfg(data_dir, tmp_path, max_iters=2, init_from="resume"))
    n_embd = tiny_cfg(data_dir, tmp_path)["n_embd"]
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=2, eval_interval=1, init_from="resume", attn_scale=0.1,
                         mlp_hidden=4 * n_embd))
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["model_args"]["attn_scale"] == 0.1


def test_a_resumed_run_keeps_its_training_time(data_dir, tmp_path):
    """A run trained 100 iterations, stopped there (max_iters) and resumed to 200: ckpt.pt's and metrics.jsonl's
    elapsed_s are the time of both starts, and report.py's wall time is theirs. (Was: the checkpoint's 0.0 after
    any start, so a resumed run's clock began again at 0.) Each start's own share is at most its wall time,
    and the sum is more than the second start's whole wall time, which the second share alone cannot be."""
    from research import report
    run, wall, saved = tmp_path / "run", [], []
    for max_iters, init_from in ((100, "scratch"), (200, "resume")):
        started = time.time()
        train.train(tiny_cfg(data_dir, run, max_iters=max_iters, eval_interval=100, log_interval=100,
                             init_from=init_from))
        wall.append(time.time() - started)
        saved.append(torch.load(run / "ckpt.pt", weights_only=False)["elapsed_s"])
    first, total = saved
    assert 0 < first <= wall[0] and 0 < total - first <= wall[1] and total > wall[1]
    rows = checkpoint.read_metrics(str(run))
    assert [r["iter"] for r in rows] == [0, 100, 200] and rows[1]["elapsed_s"] <= first
    assert 0 <= total - rows[-1]["elapsed_s"] < 0.5  # the last row is written just before the checkpoint
    text = report.main([str(run), "--out", str(tmp_path / "compare")])
    assert text.splitlines()[2].endswith(f"| {rows[-1]['elapsed_s']:.0f} s |")


def test_config_json_records_the_model_built_and_the_code(data_dir, tmp_path):
    """config.json keeps the parameter counts of the model as built and the git commit of the code, so that
    sweep.py and report.py can tell runs made by another model.py (tests/test_sweep.py)."""
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=1, eval_interval=1))
    saved = json.loads((tmp_path / "config.json").read_text())
    model = checkpoint.model_from_checkpoint(checkpoint.load_checkpoint(str(tmp_path / "ckpt.pt")), "")
    assert saved["param_counts"] == model.param_breakdown()
    assert saved["param_counts"]["non_embedding"] == sum(p.numel() for p in model.transformer.h.parameters()) \
        + sum(p.numel() for p in model.transformer.ln_f.parameters())
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a git checkout (CI's clean clone): its commit, and whether .py files differ
        assert saved["code"]["commit"] == head.stdout.strip() and type(saved["code"]["edited"]) is bool
    else:  # a copy without git
        assert saved["code"] is None


def test_resume_refuses_other_optimizer_settings_and_seed_and_keeps_the_record(data_dir, tmp_path):
    """A changed optimizer setting would be half applied (the loaded optimizer state keeps its betas and weight
    decay) and a new seed redraws the eval windows; config.json must keep describing what was trained."""
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=3, eval_interval=3))
    record = (tmp_path / "config.json").read_bytes()
    for change in (dict(learning_rate=2e-2), dict(min_lr=2e-3), dict(warmup_iters=3), dict(beta2=0.5),
                   dict(weight_decay=0.5), dict(grad_clip=0.5), dict(seed=7), dict(decay_lr=False)):
        (key, value), = change.items()
        with pytest.raises(ValueError, match=f"settings differ from the checkpoint's.*'{key}': "
                                             f"\\({value!r}, "):
            train.train(tiny_cfg(data_dir, tmp_path, max_iters=5, init_from="resume", **change))
    assert (tmp_path / "config.json").read_bytes() == record
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=5, init_from="resume", batch_size=2, eval_windows=2))
    assert checkpoint.read_metrics(str(tmp_path))[-1]["iter"] == 5  # length and layout may change
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["init_from"], saved["initialised_from"]) == ("resume", "scratch")


def test_a_checkpoint_that_cannot_be_written_keeps_the_last_one(data_dir, tmp_path, monkeypatch):
    """A full disk at the second checkpoint: a clear error naming the kept checkpoint, which still resumes."""
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=3, eval_interval=3))
    kept = (tmp_path / "ckpt.pt").read_bytes()

    def disk_full(state, path):
        raise RuntimeError("[enforce fail at inline_container.cc:858] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")
    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(train.CheckpointNotWritten, match=r"could not write the checkpoint at iter 6 \(.*file write "
                                                        r"failed\); the previous one is intact"):
        train.train(tiny_cfg(data_dir, tmp_path, max_iters=6, eval_interval=3, init_from="resume"))
    assert (tmp_path / "ckpt.pt").read_bytes() == kept
    monkeypatch.undo()
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=6, eval_interval=3, init_from="resume"))
    assert checkpoint.read_metrics(str(tmp_path))[-1]["iter"] == 6


def paper_model(name):
    cfg = settings.parse_config([str(ROOT / "config" / f"{name}.py")])
    with torch.device("meta"):
        return cfg, GPT(settings.model_config(cfg))


def test_paper_configs_build_and_compare():
    models = {n: paper_model(n) for n in ("baseline_small", "nlq_small", "identity_small", "wide_small")}
    counts = {n: m.param_breakdown() for n, (cfg, m) in models.items()}
    for name, (cfg, model) in models.items():
        assert (cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["block_size"]) == (12, 12, 768, 1024)
        assert cfg["batch_size"] * cfg["gradient_accumulation_steps"] * cfg["block_size"] == 491_520
        assert cfg["max_iters"] == cfg["lr_decay_iters"] == 60000 and cfg["out_dir"].endswith(name)
        assert "| non_embedding_matrix |" in model.param_table()
    assert (models["nlq_small"][0]["query_mode"] == "nonlinear"
            and models["nlq_small"][0]["learning_rate"] == 8e-4)
    assert models["baseline_small"][0]["learning_rate"] == 6e-4
    base = counts["baseline_small"]["non_embedding_matrix"]
    assert counts["wide_small"]["non_embedding_matrix"] / base == pytest.approx(1.125)
    assert counts["nlq_small"]["non_embedding_matrix"] == base
    assert (counts["nlq_small"]["non_embedding"] / counts["baseline_small"]["non_embedding"]
            == pytest.approx(1, abs=1e-3))
    assert (counts["identity_small"]["non_embedding"]
            == counts["baseline_small"]["non_embedding"] - 12 * 768 ** 2)


def test_scratch_never_overwrites_a_checkpoint(data_dir, tmp_path):
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=1, eval_interval=1))
    before = (tmp_path / "ckpt.pt").read_bytes()
    with pytest.raises(ValueError, match="ckpt.pt exists; continue it with --init_from=resume"):
        train.train(tiny_cfg(data_dir, tmp_path, max_iters=1, eval_interval=1))
    assert (tmp_path / "ckpt.pt").read_bytes() == before


def test_bad_checkpoints_and_mismatched_resume(data_dir, tmp_path):
    train.train(tiny_cfg(data_dir, tmp_path, max_iters=1, eval_interval=1))
    other = data_dir / "other"
    other.mkdir(exist_ok=True)
    for split in ("train", "val"):
        np.arange(500, dtype=np.uint16).tofile(other / f"{split}.bin")
    (other / "meta.json").write_text(json.dumps(dict(vocab_size=64, dtype="uint16")))
    with pytest.raises(ValueError,
                       match="settings differ from the checkpoint's.*'dataset': \\('other', 'tiny'\\)"):
        train.train(tiny_cfg(data_dir, tmp_path, max_iters=2, init_from="resume", dataset="other"))
    assert torch.load(tmp_path / "ckpt.pt")["dataset_meta"]["vocab_size"] == 64
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="ckpt.pt is corrupt or not a train.py checkpoint"):
        train.train(tiny_cfg(data_dir, tmp_path, max_iters=2, init_from="resume"))
    with pytest.raises(ValueError, match="vocab_size=32 is smaller than the dataset's vocabulary \\(64\\)"):
        train.train(tiny_cfg(data_dir, tmp_path / "small_vocab", vocab_size=32))


@pytest.mark.parametrize("override,message", [
    ("--batch_size=0", "'batch_size' = 0 must be > 0"),
    ("--eval_interval=0", "'eval_interval' = 0 must be > 0"),
    ("--gradient_accumulation_steps=-1", "'gradient_accumulation_steps' = -1 must be > 0"),
    ("--max_iters=-5", "'max_iters' = -5 must be >= 0"),
    ("--n_head=0", "'n_head' = 0 must be > 0"),
    ("--mlp_hidden=0", "'mlp_hidden' = 0 must be > 0"),
    ("--dropout=1.5", "'dropout' = 1.5 must be >= 0 and < 1"),
    ("--init_from=gpt5", "init_from='gpt5'; use scratch, resume, a GPT-2 name (gpt2, gpt2-medium"),
    ("--init_from=/no/such/run", "init_from='/no/such/run'; use scratch, resume"),
    ("--min_lr=1e-3", "min_lr=0.001 is above learning_rate=0.0006: the schedule would rise instead of decay"),
    ("--beta1=1.5", "config key 'beta1' = 1.5 must be < 1"),
    ("--beta2=1.0", "config key 'beta2' = 1.0 must be < 1"),
])
def test_out_of_range_settings_fail_before_any_run(override, message):
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace(")", "\\)")):
        settings.parse_config([override])


def test_config_file_must_come_first_and_must_parse(tmp_path):
    (tmp_path / "c.py").write_text("n_layer = 3\n")
    with pytest.raises(ValueError, match="must be the first argument"):
        settings.parse_config(["--n_layer=1", str(tmp_path / "c.py")])
    (tmp_path / "broken.py").write_text("n_layer = = 3\n")
    with pytest.raises(ValueError, match="broken.py failed: SyntaxError"):
        settings.parse_config([str(tmp_path / "broken.py")])


@pytest.mark.parametrize("mode", ["nonlinear", "residual"])  # residual: linear_residual's name then
def test_checkpoint_from_before_the_query_module_refactor_loads_and_resumes(mode, tmp_path):
    """tests/fixtures/legacy_*_ckpt.pt were written by nlq at commit 3d8c1eb (f in attn.q_proj); they load
    with the same val loss and resume."""
    import eval as nlq_eval
    data = tmp_path / "data" / "tiny"
    data.mkdir(parents=True)
    pattern = np.random.default_rng(0).integers(0, 64, 97)
    np.tile(pattern, 60).astype(np.uint16).tofile(data / "train.bin")
    np.tile(pattern, 8).astype(np.uint16).tofile(data / "val.bin")
    (data / "meta.json").write_text(json.dumps(dict(name="tiny", vocab_size=64, dtype="uint16",
                                                    tokenizer="char", chars=[chr(48 + i) for i in range(64)],
                                                    eot_token=None)))
    out = tmp_path / "out"
    out.mkdir()
    legacy = torch.load(ROOT / "tests" / "fixtures" / f"legacy_{mode}_ckpt.pt", weights_only=True)
    assert any(".attn.q_proj." in k for k in legacy["model"])
    torch.save(legacy, out / "ckpt.pt")
    r = nlq_eval.evaluate(str(out), data_dir=str(tmp_path / "data"))
    assert r["iter"] == 3 and r["loss"] == pytest.approx(legacy["best_val_loss"], abs=1e-6)
    cfg = {**settings.upgrade(legacy["config"]), "data_dir": str(tmp_path / "data"), "out_dir": str(out),
           "init_from": "resume", "max_iters": 5, "eval_interval": 5}
    losses = train.train(cfg)
    assert losses["val"] < legacy["best_val_loss"]


# ------------------------------------------------------------------ the quick start: data prepared on first use
def first_use_cfg(data_dir, out_dir, dataset, **kw):
    """A one-step run on a shipped dataset (no full-split eval: the line and the bins are what is tested)."""
    return tiny_cfg(data_dir, out_dir, dataset=dataset, max_iters=1, eval_interval=1, eval_windows=4,
                    eval_full_at_end=False, **kw)


def prepared_line(data_dir, dataset):
    counts = {"shakespeare_char": "1,003,854 train + 111,540 val tokens (char)",
              "shakespeare": "301,966 train + 36,059 val tokens (gpt2)"}[dataset]
    return (f"{os.path.join(data_dir, dataset)} was missing: prepared it from tests/data/tinyshakespeare/input.txt: "
            f"{counts}")


def assert_same_dataset(folder, reference):
    """folder holds exactly the files of reference (train.bin, val.bin, meta.json), byte for byte."""
    assert sorted(p.name for p in folder.iterdir()) == sorted(data.BIN_FILES)  # no temp files left
    assert all((folder / f).read_bytes() == (reference / f).read_bytes() for f in data.BIN_FILES)


@pytest.mark.parametrize("dataset", data.SHIPPED_DATASETS)
def test_shipped_dataset_is_prepared_on_first_use(dataset, shipped_data, tmp_path, capsys):
    """train.py on a data_dir without the dataset prepares it (one log line), as prepare_data.py DATASET does;
    the next run finds it and says nothing."""
    data = tmp_path / "data"
    train.train(first_use_cfg(data, tmp_path / "a", dataset))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == prepared_line(data, dataset)
    assert sum("was missing" in line for line in lines) == 1
    prepare_data.main([dataset, "--data_dir", str(tmp_path / "reference")])
    assert_same_dataset(data / dataset, tmp_path / "reference" / dataset)
    capsys.readouterr()
    train.train(first_use_cfg(data, tmp_path / "b", dataset))
    assert "was missing" not in capsys.readouterr().out


def test_only_a_missing_shipped_dataset_is_prepared(data_dir, tmp_path):
    """Another dataset, or a shipped one whose folder holds some of its files, is never prepared or touched:
    load_meta's error says what to do. An unwritable data_dir is a named error."""
    with pytest.raises(FileNotFoundError, match="not a prepared dataset"):
        train.train(tiny_cfg(tmp_path / "data", tmp_path / "a", dataset="openwebtext"))
    assert not (tmp_path / "data").exists()
    partial = tmp_path / "data" / "shakespeare_char"
    partial.mkdir(parents=True)
    (partial / "train.bin").write_bytes(b"old")
    with pytest.raises(FileNotFoundError, match="not a prepared dataset"):
        train.train(first_use_cfg(tmp_path / "data", tmp_path / "b", "shakespeare_char"))
    assert [p.name for p in partial.iterdir()] == ["train.bin"] and (partial / "train.bin").read_bytes() == b"old"
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ValueError, match=r"cannot write to the output folder .*file/shakespeare_char"):
        train.train(first_use_cfg(tmp_path / "file", tmp_path / "c", "shakespeare_char"))


def test_first_use_under_torchrun(shipped_data, tmp_path):
    """2 processes: rank 0 prepares, rank 1 waits; both then train on the same bins."""
    data = tmp_path / "data"
    cfg = first_use_cfg(data, tmp_path / "ddp", "shakespeare_char", dropout=0.0)
    result = run_torchrun([f"--{k}={v}" for k, v in cfg.items() if v != settings.DEFAULTS[k]])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines().count(prepared_line(data, "shakespeare_char")) == 1
    prepare_data.main(["shakespeare_char", "--data_dir", str(tmp_path / "reference")])
    assert_same_dataset(data / "shakespeare_char", tmp_path / "reference" / "shakespeare_char")


def test_quick_start_offline(shipped_data, tmp_path):
    """The README's quick start in an empty folder, with the network cut and an empty tiktoken cache (2 steps
    instead of 2000): train.py prepares Tiny Shakespeare and trains, sample.py samples."""
    config = str(ROOT / "config" / "shakespeare_char.py")
    run = run_offline("train.py", config, "--max_iters=2", "--eval_interval=2", "--eval_windows=12", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[0] == prepared_line("data", "shakespeare_char")
    assert (tmp_path / "out" / "shakespeare_char" / "ckpt.pt").is_file()
    sample = run_offline("sample.py", "--out_dir=out/shakespeare_char", "--max_new_tokens=20", cwd=tmp_path)
    assert sample.returncode == 0, sample.stderr[-3000:]
    assert len(sample.stdout.strip()) >= 20


def test_the_demo_decays_over_the_run_it_is_given():
    """config/shakespeare_char.py leaves lr_decay_iters unset: at its 2000 iterations the schedule is the one it
    had with lr_decay_iters = 2000 (the quick start's val loss stands), and a shorter --max_iters (a trial set
    --max_iters=50) decays to min_lr by its end instead of stopping high on the long decay."""
    demo = str(ROOT / "config" / "shakespeare_char.py")
    cfg = settings.parse_config([demo])
    assert cfg["lr_decay_iters"] is None and cfg["max_iters"] == 2000
    assert decay_horizon(cfg, None, 0, print) == 2000
    short = settings.parse_config([demo, "--max_iters=500"])
    assert decay_horizon(short, None, 0, print) == 500
    assert get_lr(499, short, 500) == pytest.approx(short["min_lr"], rel=1e-3)


def test_whole_split_eval_announces_itself_and_the_log_times_each_interval(data_dir, tmp_path, capsys,
                                                                         monkeypatch):
    """Before the whole-split eval, one line: what it evaluates, how many windows, how to turn it off. Each log
    line's ms/iter is the mean over its interval, as metrics.jsonl's ms_per_iter is over an eval interval (so
    with log_interval = eval_interval they agree), with the elapsed time and an ETA; each checkpoint write says
    so."""
    cfg = tiny_cfg(data_dir, tmp_path / "run", eval_full_at_end=True, log_interval=3, dropout=0.0)
    capsys.readouterr()
    train.train(cfg)
    printed = capsys.readouterr().out.splitlines()
    n_val = 97 * 8  # tokens of val.bin: windows of 16 at 0, 16, ..., each target once
    announce = [line for line in printed if line.startswith("whole-split eval:")]
    assert announce == [f"whole-split eval: val loss over all {n_val - 1:,} next-token predictions of the "
                        f"{n_val:,} val tokens; turn it off with --eval_full_at_end=False"]
    assert printed.index(announce[0]) < next(i for i, line in enumerate(printed)
                                             if "val loss (whole split)" in line)
    logged = [line for line in printed if line.startswith("iter ")]
    assert [line.split(":")[0] for line in logged] == ["iter 3", "iter 6"]
    rows = checkpoint.read_metrics(str(tmp_path / "run"))  # the eval rows
    ms = [float(line.split(" ms/iter")[0].rsplit(", ", 1)[1]) for line in logged]
    assert ms == [round(r["ms_per_iter"], 1) for r in rows[1:]]
    assert all(", elapsed " in line and ", ETA " in line for line in logged)
    assert logged[-1].endswith("ETA 0:00 + the whole-split eval")
    assert all(r["elapsed_s"] >= 0 for r in rows) and rows[-1]["elapsed_s"] >= rows[1]["elapsed_s"]
    assert printed.count(f"saving checkpoint to {tmp_path / 'run' / 'ckpt.pt'}") == 3


def test_eta_counts_the_evals_to_come():
    cfg = dict(max_iters=10, eval_interval=4)  # evals at 0, 4, 8 and 10
    assert [progress.evals_after(i, cfg) for i in (0, 3, 4, 9, 10)] == [3, 3, 2, 1, 0]
    assert progress.evals_after(0, dict(max_iters=8, eval_interval=4)) == 2
    assert [progress.clock(s) for s in (0, 59.6, 61, 3600 + 62)] == ["0:00", "1:00", "1:01", "1:01:02"]
