"""convert.py on the paper's official checkpoints (tests/data/official_ckpt, one per official query
mode): the converted nlq model computes the official logits, a resumed step is the official step, the run
folder works with train.py, sample.py and eval.py, and bad inputs are clear errors that write nothing."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from conftest import ROOT

import eval as nlq_eval
import prepare_data
import sample
import train
from interop import convert
from nlq import checkpoint, settings
from nlq import tokenizers

pytestmark = pytest.mark.xdist_group("convert")  # one worker makes the module's shared runs once

MODES = {"original": "linear", "identity": "identity", "residual": "linear_residual", "residual_gelu": "nonlinear"}


@pytest.fixture(scope="module")
def official(shipped_data):
    """The folder of the official checkpoints and expected.pt (the official model's logits and loss)."""
    return shipped_data / "official_ckpt"


@pytest.fixture(scope="module")
def data_dir(shipped_data, tmp_path_factory):
    """Tiny Shakespeare by characters (the shipped copy): a vocabulary of 65, which fits the checkpoints'
    96-row embedding."""
    root = tmp_path_factory.mktemp("data")
    prepare_data.main(["shakespeare_char", "--data_dir", str(root)])
    return root


@pytest.fixture(scope="module")
def converted(official, data_dir, tmp_path_factory):
    """{official mode: nlq run folder converted from its checkpoint}."""
    root = tmp_path_factory.mktemp("runs")
    for mode in MODES:
        convert.main(["official", str(official / mode / "ckpt.pt"), f"--out_dir={root / mode}",
                      "--dataset=shakespeare_char", f"--data_dir={data_dir}"])
    return {mode: root / mode for mode in MODES}


# ------------------------------------------------------------------------------------- the same model
@pytest.mark.parametrize("mode", MODES)
def test_logits_and_loss_equal_the_official_code(mode, official, converted):
    expected = torch.load(official / "expected.pt", weights_only=True)[mode]
    model, ckpt = checkpoint.load_run(str(converted[mode]))  # eval mode, as expected.pt was made
    with torch.no_grad():
        logits, loss = model(expected["idx"], expected["targets"])
    assert logits.shape == expected["logits"].shape == (4, 32, 96)
    assert (logits - expected["logits"]).abs().max().item() <= 1e-6
    assert abs(loss.item() - expected["loss"].item()) <= 1e-6
    raw = torch.load(official / mode / "ckpt.pt", weights_only=True)
    args = raw["model_args"]
    cfg = model.config
    assert (cfg.query_mode, cfg.attn_scale, cfg.mlp_hidden) == (MODES[mode], args["scale"], 256)
    assert (cfg.n_head, cfg.tie_weights, cfg.bias, cfg.dropout) == (4, True, False, 0.0)
    assert (cfg.vocab_size, cfg.data_vocab_size) == (96, 65)  # the checkpoint's embedding, the data's vocab
    assert model.lm_head.weight is model.transformer.wte.weight
    if mode == "residual":  # W_Q: the first n_embd rows of the official c_attn, exactly
        c_attn = raw["model"]["_orig_mod.transformer.h.1.attn.c_attn.weight"]
        assert torch.equal(model.transformer.h[1].attn.query.w_q.weight, c_attn[:64])
        assert torch.equal(model.transformer.h[1].attn.c_k.weight, c_attn[64:128])
        assert torch.equal(model.transformer.h[1].attn.c_v.weight, c_attn[128:])


def test_settings_carried_and_recorded(official, converted, data_dir):
    ckpt = checkpoint.load_checkpoint(str(converted["residual_gelu"] / "ckpt.pt"))
    cfg = ckpt["config"]
    # the official train.py's saved config, the optimizer's settings, the dataset named on the command line
    assert (cfg["learning_rate"], cfg["max_iters"], cfg["batch_size"], cfg["gradient_accumulation_steps"],
            cfg["eval_interval"], cfg["eval_windows"]) == (0.01, 60002, 12, 40, 1000, 2400)
    assert (cfg["weight_decay"], cfg["beta1"], cfg["beta2"]) == (0.1, 0.9, 0.95)
    assert (cfg["dataset"], cfg["data_dir"], cfg["init_from"]) == ("shakespeare_char", str(data_dir),
                                                                    "resume")
    assert (ckpt["dataset_meta"]["vocab_size"], ckpt["iter_num"], ckpt["lr_decay_iters"]) == (65, 1, 60002)
    assert ckpt["best_val_loss"] == pytest.approx(4.026783466339111)
    assert ckpt["converted_from"]["query_mode"] == "residual_gelu"
    assert {"transformer.h.0.attn.query.w1.weight", "transformer.h.1.attn.query.norm_in.weight",
            "transformer.h.1.attn.query.norm_out.weight"} <= set(ckpt["model"])
    # train_config.py holds the same settings, as train.py reads them
    assert settings.parse_config([str(converted["residual_gelu"] / "train_config.py")]) == cfg


# --------------------------------------------------------------------------------- the optimizer, exactly
@pytest.mark.parametrize("mode", MODES)
def test_a_resumed_step_equals_the_official_step(mode, official, converted):
    """One AdamW step from the converted state moves every weight exactly as the official optimizer does."""
    raw = torch.load(official / mode / "ckpt.pt", weights_only=True)
    batch = torch.load(official / "expected.pt", weights_only=True)[mode]
    model, ckpt = checkpoint.load_run(str(converted[mode]))
    model.train()
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    C, query_mode = model.config.n_embd, model.config.query_mode

    # official: its weights as leaves in its named_parameters() order (lm_head is tied to wte), its optimizer
    weights = {k.removeprefix("_orig_mod."): v.clone() for k, v in raw["model"].items()}
    leaves = {k: v.requires_grad_() for k, v in weights.items() if k != "lm_head.weight"}
    tied = lambda ts: {**ts, "lm_head.weight": ts["transformer.wte.weight"]}
    # its gradients: the official function is the nlq model on the mapped weights (the logits test above)
    _, loss = torch.func.functional_call(model, convert.map_tensors(tied(leaves), shapes, query_mode, C),
                                         (batch["idx"], batch["targets"]))
    loss.backward()
    decay, no_decay = convert.split_by_decay([(k, tuple(v.shape)) for k, v in leaves.items()])
    opt = torch.optim.AdamW([{"params": [leaves[k] for k in names]} for names in (decay, no_decay)])
    opt.load_state_dict(raw["optimizer"])
    opt.step()

    # nlq: the converted model and optimizer state, as train.py resumes them (the groups' settings come along)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    nlq_opt = model.configure_optimizers(0.0, 0.0, (0.0, 0.0), "cpu")
    nlq_opt.load_state_dict(ckpt["optimizer"])
    assert [g["lr"] for g in nlq_opt.param_groups] == [0.01, 0.01]
    assert [g["weight_decay"] for g in nlq_opt.param_groups] == [0.1, 0.0]
    model(batch["idx"], batch["targets"])[1].backward()
    nlq_opt.step()

    want = convert.map_tensors(tied({k: v.detach() for k, v in leaves.items()}), shapes, query_mode, C)
    for name, p in model.state_dict().items():
        torch.testing.assert_close(p, want[name], rtol=0, atol=1e-7, msg=name)
        assert not torch.equal(p, before[name]), f"{name} did not move"


def test_a_converted_run_stopped_before_its_first_eval_resumes_without_a_log_warning(converted, tmp_path):
    """A converted run preempted before its first eval has a checkpoint (which records where it started, not
    converted_from) and no metrics.jsonl: its log starts at a resume, not lost (an adversarial trial's false
    'deleted or moved?' warning)."""
    out = tmp_path / "run"
    shutil.copytree(converted["residual"], out)
    ckpt = torch.load(out / "ckpt.pt", weights_only=False)
    ckpt["initialised_from"] = f"convert.py: {ckpt.pop('converted_from')['path']}"
    ckpt["iter_num"] += 20  # as train.py's checkpoint at the stop
    torch.save(ckpt, out / "ckpt.pt")
    cfg = settings.parse_config([str(out / "train_config.py"), f"--out_dir={out}",
                               f"--max_iters={ckpt['iter_num'] + 1}", "--eval_windows=2", "--batch_size=2",
                               "--gradient_accumulation_steps=1", "--eval_full_at_end=False", "--device=cpu",
                               "--compile=False"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train.train(cfg)
    assert not [w for w in caught if "holds no eval" in str(w.message)]


# ------------------------------------------------------------------------------------ the run folder
@pytest.mark.parametrize("mode", ["residual", "residual_gelu"])
def test_converted_run_resumes_samples_and_evaluates(mode, converted, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(converted[mode], out)
    cfg = settings.parse_config([str(out / "train_config.py"), f"--out_dir={out}", "--max_iters=4",
                               "--eval_interval=2", "--eval_windows=8", "--batch_size=4",
                               "--gradient_accumulation_steps=1", "--eval_full_at_end=False", "--device=cpu",
                               "--compile=False"])
    losses = train.train(cfg)
    assert np.isfinite([losses["train"], losses["val"]]).all()
    rows = checkpoint.read_metrics(str(out))  # the eval rows
    assert [r["iter"] for r in rows] == [2, 4]  # resumed at the converted iteration, 1
    ckpt = checkpoint.load_checkpoint(str(out / "ckpt.pt"))
    assert ckpt["iter_num"] == 4 and ckpt["model_args"]["query_mode"] == MODES[mode]
    assert ckpt["initialised_from"].startswith("convert.py: ") and ckpt["initialised_from"].endswith(".pt")
    texts = sample.main(["--out_dir", str(out), "--start", "ROMEO:", "--max_new_tokens", "30",
                         "--num_samples", "2"])
    assert len(texts) == 2 and all(t.startswith("ROMEO:") and len(t) == len("ROMEO:") + 30 for t in texts)
    r = nlq_eval.evaluate(str(out))
    assert (r["iter"], r["tokens"]) == (4, 2 * 4 * 32)  # train.py's eval windows: its val loss again
    assert r["loss"] == pytest.approx(losses["val"], abs=1e-5)


def test_the_readme_command(official, data_dir, tmp_path):
    out = tmp_path / "paper_nlq"
    src = official / "residual_gelu" / "ckpt.pt"
    res = subprocess.run([sys.executable, "-m", "interop.convert", "official", str(src), f"--out_dir={out}",
                          "--dataset=shakespeare_char", f"--data_dir={data_dir}"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "(official residual_gelu, iter 1)" in res.stdout and "(nlq nonlinear, 2 layers x 64" in res.stdout
    assert "AdamW state of 25 tensors converted exactly" in res.stdout  # c_k and c_v of each layer
    assert "nlq's defaults used: min_lr=6e-05, warmup_iters=2000" in res.stdout
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.pt", "train_config.py"]


def test_the_scripts_point_official_files_to_convert(official, tmp_path):
    hint = r"official format: convert it with python -m interop.convert official"
    with pytest.raises(ValueError, match=hint):  # what train.py --init_from=resume reads a checkpoint with
        checkpoint.load_checkpoint(str(official / "residual" / "ckpt.pt"))
    shutil.copy(official / "residual" / "ckpt.pt", tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match=hint):
        sample.main(["--out_dir", str(tmp_path)])


# -------------------------------------------------------------------------------------------- bad input
def edited(official, tmp_path, edit):
    """A copy of the official residual_gelu checkpoint changed by edit(ckpt); returns its path."""
    ckpt = torch.load(official / "residual_gelu" / "ckpt.pt", weights_only=True)
    edit(ckpt)
    path = tmp_path / "edited.pt"
    torch.save(ckpt, path)
    return path


def truncated(official, tmp_path):
    data = (official / "residual_gelu" / "ckpt.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[:len(data) // 2])
    return tmp_path / "cut.pt"


def saved(obj):
    def make(official, tmp_path):
        torch.save(obj, tmp_path / "other.pt")
        return tmp_path / "other.pt"
    return make


BAD = {
    "random dict": (saved({"weights": torch.ones(3), "step": 7}),
                    r"not an official checkpoint: it lacks model, optimizer, model_args, iter_num, "
                    r"best_val_loss, config"),
    "a tensor": (saved(torch.ones(3)), r"not an official checkpoint: it lacks model"),
    "truncated file": (truncated, r"cannot read .*cut.pt with torch.load\(weights_only=True\) \(.*\); it is not "
                                  r"the official train.py's ckpt.pt, or it is truncated"),
    "missing file": (lambda o, t: t / "nope.pt", r"nope.pt is not a file"),
    "a pickled object": (saved({"model": argparse.Namespace(step=7)}),  # no advice to unpickle it anyway
                         r"other.pt with torch.load\(weights_only=True\) \(UnpicklingError\); it is not the "
                         r"official train.py's ckpt.pt, or it is truncated: download it again$"),
    "a text file": (lambda o, t: (t / "notes.txt").write_text("# notes\n") and t / "notes.txt",
                    r"cannot read .*notes.txt with torch.load"),
    "unknown mode": (lambda o, t: edited(o, t, lambda c: c["model_args"].update(query_mode="residual_relu")),
                     r"unknown official query_mode 'residual_relu'; known: original, identity, residual, "
                     r"residual_gelu"),
    "missing weight": (lambda o, t: edited(o, t, lambda c: c["model"].pop(
                           "_orig_mod.transformer.h.1.attn.residual_in.weight")),
                       r"does not match a 'nonlinear' model .*: "
                       r"missing transformer.h.1.attn.residual_in.weight"),
    "wrong shape": (lambda o, t: edited(o, t, lambda c: c["model_args"].update(mlp_hidden_size=128)),
                    r"transformer.h.0.mlp.c_fc.weight has shape \(256, 64\); the model_args give "
                    r"transformer.h.0.mlp.c_fc.weight the shape \(128, 64\)"),
    # was written, with `next: python sample.py ...`, which then refused the run
    "NaN weights": (lambda o, t: edited(o, t, lambda c: c["model"]["_orig_mod.transformer.h.1.mlp.c_fc.weight"]
                                        [3].fill_(float("nan"))),
                    r"edited.pt: the weights are not finite \(training diverged\), e.g. "
                    r"transformer.h.1.mlp.c_fc.weight"),
    "foreign optimizer": (lambda o, t: edited(o, t, lambda c: c["optimizer"]["param_groups"][0]["params"]
                                              .pop()),
                          r"the optimizer's decayed \(≥2-D\) group has 13 parameters; the model has 14"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_a_clear_error_and_writes_nothing(case, official, data_dir, tmp_path):
    make, message = BAD[case]
    path, out = make(official, tmp_path), tmp_path / "out"
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        convert.main(["official", str(path), f"--out_dir={out}", "--dataset=shakespeare_char",
                      f"--data_dir={data_dir}"])
    assert not out.exists()


TORCH_DISK_FULL = "[enforce fail at inline_container.cc:672] . unexpected pos 36480 vs 36432"


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), RuntimeError(TORCH_DISK_FULL),
                                   KeyboardInterrupt()], ids=["os_error", "torch_save_error", "ctrl_c"])
def test_a_full_disk_or_ctrl_c_while_writing_leaves_nothing(error, official, data_dir, tmp_path, monkeypatch):
    """The checkpoint's write fails after train_config.py was written (an adversarial trial's 12 kB disk left
    train_config.py without ckpt.pt): both are gone, the folder too; a full disk is one error naming the fix,
    also as torch.save reports it (a RuntimeError, with the message above on a real full tmpfs)."""
    def full(state, path):
        raise error
    monkeypatch.setattr(convert.torch, "save", full)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt if isinstance(error, KeyboardInterrupt) else ValueError) as e:
        convert.main(["official", str(official / "residual_gelu" / "ckpt.pt"), f"--out_dir={out}",
                      "--dataset=shakespeare_char", f"--data_dir={data_dir}"])
    assert not out.exists()
    if not isinstance(error, KeyboardInterrupt):
        why = "No space left on device" if isinstance(error, OSError) else TORCH_DISK_FULL
        assert str(e.value) == f"cannot write {out} ({why}); free space or choose another --out_dir"
    out.mkdir()  # a folder that was there before stays, empty
    with pytest.raises((ValueError, KeyboardInterrupt)):
        convert.main(["official", str(official / "residual_gelu" / "ckpt.pt"), f"--out_dir={out}",
                      "--dataset=shakespeare_char", f"--data_dir={data_dir}"])
    assert out.is_dir() and os.listdir(out) == []


def test_an_nlq_checkpoint_needs_no_conversion(converted, data_dir, tmp_path):
    with pytest.raises(ValueError, match=r"is an nlq checkpoint \(train.py's format\) already.*no conver"):
        convert.main(["official", str(converted["residual"] / "ckpt.pt"), f"--out_dir={tmp_path / 'out'}",
                      "--dataset=shakespeare_char", f"--data_dir={data_dir}"])
    assert not (tmp_path / "out").exists()


def test_dataset_must_exist_and_fit_the_vocabulary(official, data_dir, tmp_path):
    src, out = str(official / "original" / "ckpt.pt"), tmp_path / "out"
    with pytest.raises(FileNotFoundError, match=r"openwebtext.meta.json not found.*prepare_data.py"):
        convert.main(["official", src, f"--out_dir={out}", f"--data_dir={data_dir}", "--dataset=openwebtext"])
    # its config's dataset is openwebtext: GPT-2's tokenizer by default, whose 50257 ids do not fit 96 rows
    with pytest.raises(ValueError, match=r"vocabulary \(50257 tokens\) does not fit the checkpoint's "
                                         r"embedding \(96 rows\).*--tokenizer"):
        convert.main(["official", src, f"--out_dir={out}", f"--data_dir={data_dir}"])
    with pytest.raises(SystemExit):  # argparse: not allowed with argument --tokenizer
        convert.main(["official", src, f"--out_dir={out}", "--dataset=shakespeare_char", "--tokenizer=gpt2"])
    (tmp_path / "bytes").mkdir()  # a byte-level dataset: 256 token ids, more than the 96-row embedding
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "bytes" / "train.bin")
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "bytes" / "val.bin")
    (tmp_path / "bytes" / "meta.json").write_text(json.dumps(dict(tokenizer="byte", vocab_size=256,
                                                                  dtype="uint16", eot_token=None)))
    with pytest.raises(ValueError, match=r"vocabulary \(256 tokens\) does not fit the checkpoint's embedding "
                                         r"\(96 rows\).*--dataset"):
        convert.main(["official", src, f"--out_dir={out}", "--dataset=bytes", f"--data_dir={tmp_path}"])
    assert not out.exists()


def test_an_existing_run_is_never_overwritten(official, data_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(b"an earlier run")
    with pytest.raises(ValueError, match=r"out is not empty \(it holds ckpt.pt\); convert.py official makes a "
                                         r"new run folder: choose a new --out_dir"):
        convert.main(["official", str(official / "identity" / "ckpt.pt"), f"--out_dir={out}",
                      "--dataset=shakespeare_char", f"--data_dir={data_dir}"])
    assert [p.name for p in out.iterdir()] == ["ckpt.pt"]
    assert (out / "ckpt.pt").read_bytes() == b"an earlier run"


def test_an_out_dir_that_cannot_be_made_or_holds_another_run_is_refused(official, data_dir, tmp_path,
                                                                        monkeypatch):
    """Under a file (was a NotADirectoryError traceback), empty, or not empty (another run's metrics.jsonl or
    config.json was accepted: a resume kept the other run's rows; a user's train_config.py was replaced): one
    line, nothing written."""
    (tmp_path / "file.txt").write_text("x")
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text('{"iter": 0, "val_loss": 4.2}\n')
    monkeypatch.chdir(other)
    for out, message in ((tmp_path / "file.txt" / "sub", r"cannot write .*file.txt.sub \(Not a directory\)"),
                         ("", r"^cannot write  \("),
                         (other, r"--out_dir .*other is not empty \(it holds metrics.jsonl\); .* choose a new "
                          r"--out_dir \(or empty that one\)$")):
        with pytest.raises(ValueError, match=message):
            convert.main(["official", str(official / "identity" / "ckpt.pt"), f"--out_dir={out}",
                          "--dataset=shakespeare_char", f"--data_dir={data_dir}"])
    for name in ("config.json", "train_config.py", "notes.txt"):  # a user's own train_config.py was replaced
        (other / name).write_text("{}")
    with pytest.raises(ValueError, match=r"\(it holds config.json, metrics.jsonl, notes.txt ...\)"):
        convert.main(["official", str(official / "identity" / "ckpt.pt"), f"--out_dir={other}",
                      "--dataset=shakespeare_char", f"--data_dir={data_dir}"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "other"]
    assert sorted(p.name for p in other.iterdir()) == ["config.json", "metrics.jsonl", "notes.txt",
                                                       "train_config.py"]
    assert (other / "train_config.py").read_text() == "{}"


# ----------------------------------------------------------------------------- GPT-2's vocabulary, no dataset
def gpt2_vocab_checkpoint(official, path):
    """The official `original` checkpoint with GPT-2's padded vocabulary (50304 rows), as the shared fixtures
    were made (PROVENANCE.md): the same layout, a random embedding (tied: lm_head too), its AdamW moments
    resized, model_args' vocab_size 50304; its config names openwebtext."""
    ckpt = torch.load(official / "original" / "ckpt.pt", weights_only=True)
    wte = torch.randn(50304, 64, generator=torch.Generator().manual_seed(0)) * 0.02
    ckpt["model"]["_orig_mod.transformer.wte.weight"] = wte
    ckpt["model"]["_orig_mod.lm_head.weight"] = wte
    ckpt["model_args"]["vocab_size"] = 50304
    first = ckpt["optimizer"]["param_groups"][0]["params"][0]  # wte: the first decayed parameter
    ckpt["optimizer"]["state"][first].update(exp_avg=torch.zeros(50304, 64), exp_avg_sq=torch.zeros(50304, 64))
    assert ckpt["config"]["dataset"] == "openwebtext"
    torch.save(ckpt, path)
    return wte


def test_a_gpt2_vocabulary_checkpoint_converts_without_a_dataset(official, shipped_data, tmp_path):
    wte = gpt2_vocab_checkpoint(official, tmp_path / "owt.pt")
    out, nowhere = tmp_path / "run", tmp_path / "no_data"
    convert.main(["official", str(tmp_path / "owt.pt"), f"--out_dir={out}", f"--data_dir={nowhere}"])
    ckpt = checkpoint.load_checkpoint(str(out / "ckpt.pt"))
    assert ckpt["dataset_meta"] == dict(name="openwebtext", tokenizer="gpt2", vocab_size=50257, dtype="uint16",
                                        eot_token=50256, tokenizer_only=True)
    assert (ckpt["model_args"]["vocab_size"], ckpt["model_args"]["data_vocab_size"]) == (50304, 50257)
    assert torch.equal(ckpt["model"]["transformer.wte.weight"], wte)
    assert not nowhere.exists()
    # sample.py decodes with GPT-2's BPE: the text is the prompt plus the greedy ids, decoded
    bpe = str(shipped_data / "gpt2")
    texts = sample.main(["--out_dir", str(out), "--start", "Hello world", "--max_new_tokens", "8",
                         "--temperature", "0", "--bpe_dir", bpe])
    enc = tokenizers.gpt2_encoding(bpe)
    model = checkpoint.model_from_checkpoint(ckpt, "")
    ids = model.generate(torch.tensor([enc.encode_ordinary("Hello world")]), 8, temperature=0)[0].tolist()
    assert max(ids) < 50257 and texts == [enc.decode(ids)] and texts[0].startswith("Hello world")
    # the loss needs the dataset, and says so; once it is prepared, train.py accepts it (no hashes recorded)
    with pytest.raises(FileNotFoundError, match=r"openwebtext.meta.json not found"):
        nlq_eval.evaluate(str(out))
    checkpoint.check_same_dataset(ckpt["dataset_meta"], dict(tokenizer="gpt2", vocab_size=50257,
                                                         sha256={"train.bin": "ab"}), "data/openwebtext")
    with pytest.raises(ValueError, match=r"tokenizer: 'gpt2' at training, 'char' now"):
        checkpoint.check_same_dataset(ckpt["dataset_meta"], dict(tokenizer="char", vocab_size=50257), "d")
