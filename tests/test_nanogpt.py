"""nanoGPT's config files and checkpoints, as they are (tests/data/nanogpt: nanoGPT's own files, and
checkpoints its train.py wrote, laid out as in a nanoGPT clone)."""
import json
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

import train
from nlq import checkpoint, settings

NANOGPT = ROOT / "tests" / "data" / "nanogpt"
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32)  # the checkpoints' shape


@pytest.mark.parametrize("name", ["train_shakespeare_char", "train_gpt2", "finetune_shakespeare", "eval_gpt2"])
def test_every_nanogpt_config_file_is_read_as_it_is(name, shipped_data):
    cfg = settings.parse_config([str(NANOGPT / "config" / f"{name}.py")])
    eval_iters = dict(train_shakespeare_char=200, train_gpt2=200, finetune_shakespeare=40, eval_gpt2=500)[name]
    assert cfg["eval_iters"] == eval_iters and cfg["eval_windows"] == eval_iters * cfg["batch_size"]
    assert cfg["eval_only"] == (name == "eval_gpt2")
    # an override given after the file wins, whichever of the two names it uses
    assert settings.parse_config([str(NANOGPT / "config" / f"{name}.py"), "--eval_windows=24"])["eval_windows"] == 24


def test_the_readmes_cpu_line_is_nanogpts_baby_model():
    """The README's nanoGPT line on a CPU: nanoGPT's own overrides shrink the file's model to the quick start's
    size (4 x 128 at 64 tokens, what runs in minutes), with nanoGPT's 20 eval batches as fixed windows."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    line = readme.split("`python train.py tests/data/nanogpt/config/train_shakespeare_char.py ", 1)[1].split("`", 1)[0]
    cfg = settings.parse_config([str(NANOGPT / "config" / "train_shakespeare_char.py"), *line.split()])
    assert (cfg["n_layer"], cfg["n_embd"], cfg["block_size"], cfg["batch_size"]) == (4, 128, 64, 12)
    assert (cfg["eval_windows"], cfg["max_iters"], cfg["lr_decay_iters"], cfg["device"]) == (240, 2000, 2000, "cpu")


def test_nanogpts_shakespeare_char_config_trains_unchanged(shipped_data, tmp_path):
    """nanoGPT's config/train_shakespeare_char.py, with only what a CPU test needs added: --eval_iters=N is N x
    batch_size fixed windows, and the log says so."""
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "train.py", str(NANOGPT / "config" / "train_shakespeare_char.py"),
                          "--device=cpu", "--compile=False", *(f"--{k}={v}" for k, v in TINY.items()),
                          "--batch_size=8", "--max_iters=10", "--eval_interval=10", "--eval_iters=3",
                          f"--out_dir={out}", f"--data_dir={tmp_path / 'data'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr
    assert ("eval set: 24 fixed windows per split (eval_iters=3 x batch_size=8, nanoGPT's eval_iters as fixed "
            "windows)") in res.stdout
    rows = checkpoint.read_metrics(str(out))
    assert [r["iter"] for r in rows] == [0, 10] and rows[-1]["val_loss"] < rows[0]["val_loss"]
    saved = json.loads((out / "config.json").read_text())
    assert (saved["eval_windows"], saved["dropout"], saved["always_save_checkpoint"]) == (24, 0.2, False)


def nanogpt_cfg(tmp_path, source, **keys):
    return settings.parse_config([f"--{k}={v}" for k, v in {**dict(
        init_from=source, dataset="shakespeare_char", data_dir=tmp_path / "data", out_dir=tmp_path / "out",
        block_size=32, batch_size=4, max_iters=0, eval_windows=4, eval_full_at_end=False, device="cpu",
        compile=False), **keys}.items()])


@pytest.mark.parametrize("run", ["out-tiny", "out-tiny-nobias"])
def test_init_from_a_nanogpt_checkpoint_gives_nanogpts_own_logits(run, shipped_data, tmp_path, capsys):
    """The linear arm starts from nanoGPT's weights exactly: its logits equal those nanoGPT's model.py computed
    on the same checkpoint (within 1e-5); a resume keeps the checkpoint's shape without flags."""
    train.train(nanogpt_cfg(tmp_path, NANOGPT / run / "ckpt.pt", query_mode="linear"))
    log = capsys.readouterr().out
    assert "query_mode linear: W_Q as it is; the model computes nanoGPT's function exactly" in log
    assert f"the dataset's 65 characters are those of {NANOGPT / 'data' / 'shakespeare_char' / 'meta.pkl'}" in log
    model, ckpt = checkpoint.load_run(str(tmp_path / "out"))
    assert (model.config.bias, model.config.vocab_size, model.config.n_layer) == (run == "out-tiny", 65, 2)
    reference = torch.load(NANOGPT / "reference_logits.pt", weights_only=True)[run]
    with torch.no_grad():
        logits, _ = model(reference["idx"], reference["idx"])
    assert (logits - reference["logits"]).abs().max().item() <= 1e-5
    assert ckpt["initialised_from"] == str(NANOGPT / run / "ckpt.pt")
    resumed = train.train(settings.parse_config([f"--out_dir={tmp_path / 'out'}", "--init_from=resume",
                                                 f"--data_dir={tmp_path / 'data'}", "--dataset=shakespeare_char",
                                                 "--block_size=32", "--batch_size=4", "--max_iters=1",
                                                 "--eval_windows=4", "--eval_full_at_end=False", "--device=cpu"]))
    assert resumed["val"] > 0


def test_a_dataset_of_other_characters_is_refused(shipped_data, tmp_path):
    """meta.pkl names the characters: data tokenized otherwise is refused before any weight is read; a copy of
    the checkpoint without its meta.pkl is checked by the vocabulary's size."""
    text = tmp_path / "abc.txt"
    text.write_text("abcdefghijklmnopqrstuvwxyz " * 400)
    subprocess.run([sys.executable, "prepare_data.py", "local", "--input", str(text), "--name", "abc",
                    "--tokenizer", "char", "--data_dir", str(tmp_path / "data")], cwd=ROOT, check=True,
                   capture_output=True)
    with pytest.raises(ValueError, match=r"dataset abc is tokenized with 'char' \(27 tokens\), but init_from .*"
                                         r"out-tiny/ckpt.pt was trained on the 65 characters of .*meta.pkl"):
        train.train(nanogpt_cfg(tmp_path, NANOGPT / "out-tiny" / "ckpt.pt", dataset="abc"))
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(NANOGPT / "out-tiny" / "ckpt.pt", alone / "ckpt.pt")
    with pytest.raises(ValueError, match=r"but init_from .*alone/ckpt.pt has 65 tokens; give the dataset it was "):
        train.train(nanogpt_cfg(tmp_path, alone, dataset="abc"))  # the out_dir, as nanoGPT names a run


def test_eval_only_evaluates_and_writes_nothing(shipped_data, tmp_path, capsys):
    losses = train.train(nanogpt_cfg(tmp_path, NANOGPT / "out-tiny" / "ckpt.pt", eval_only=True))
    assert losses["val"] > 0 and not (tmp_path / "out").exists()
    log = capsys.readouterr().out
    assert f"eval_only at iter 0: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}" in log


def test_a_nanogpt_out_dir_is_not_resumed_but_started_from(tmp_path):
    """--init_from=resume on nanoGPT's out_dir (as nanoGPT would resume it) says how to start from it."""
    shutil.copytree(NANOGPT / "out-tiny", tmp_path / "out-tiny")
    with pytest.raises(ValueError, match=r"is not a train.py checkpoint \(it is nanoGPT's: start an nlq run from "
                                         r"its weights with --init_from=.*out-tiny/ckpt.pt and a new out_dir\)"):
        checkpoint.load_run(str(tmp_path / "out-tiny"))


def test_did_you_mean_only_for_close_names():
    with pytest.raises(ValueError, match=r"unknown config key 'eval_iter', did you mean 'eval_iters'\?"):
        settings.parse_config(["--eval_iter=3"])
    with pytest.raises(ValueError) as e:
        settings.parse_config(["--iters=3"])
    assert str(e.value) == "unknown config key 'iters'"


def test_a_nanogpt_habit_gets_a_hint(tmp_path, capsys):
    """nanoGPT's config name finds nlq's; the scripts' options are never abbreviated (train.py's keys are not)."""
    import sample
    with pytest.raises(FileNotFoundError, match=r"config/train_shakespeare_char.py not found; did you mean "
                                                r".*config/shakespeare_char.py\?"):
        settings.parse_config([str(ROOT / "config" / "train_shakespeare_char.py")])
    with pytest.raises(SystemExit):
        sample.parse_args(["--num_sample=2"])
    assert "unrecognized arguments: --num_sample=2" in capsys.readouterr().err
