"""sample.py and eval.py on a tiny checkpoint, plus an end-to-end run on the real Tiny Shakespeare."""
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import eval as nlq_eval  # eval.py: the module name shadows the builtin only inside this namespace
import prepare_data
import common
import sample
import train
from conftest import ROOT

TEXT = b"the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.\n"  # 86 bytes


def small_cfg(data_dir, out_dir, **kw):
    cfg = dict(common.DEFAULTS)
    cfg.update(data_dir=str(data_dir), dataset="tiny", out_dir=str(out_dir), n_layer=2, n_head=2, n_embd=32,
               block_size=16, batch_size=4, gradient_accumulation_steps=1, max_iters=6, eval_interval=3,
               eval_iters=3, log_interval=100, warmup_iters=2, learning_rate=1e-2, min_lr=1e-3, dropout=0.0,
               device="cpu", compile=False)
    cfg.update(kw)
    return cfg


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny byte-level dataset (val: 700 tokens, not a multiple of block_size) and a 6-step checkpoint."""
    root = tmp_path_factory.mktemp("tiny")
    (root / "tiny").mkdir()
    data = np.frombuffer(TEXT * 50, np.uint8).astype(np.uint16)
    data[:3000].tofile(root / "tiny" / "train.bin")
    data[3000:3700].tofile(root / "tiny" / "val.bin")
    (root / "tiny" / "meta.json").write_text(json.dumps(
        dict(name="tiny", tokenizer="byte", vocab_size=256, dtype="uint16", eot_token=None)))
    out = root / "out"
    train.train(small_cfg(root, out))
    return root, out


def test_sampling_needs_only_the_checkpoint_not_its_dataset(run, tmp_path, capsys):
    """A run folder copied to a machine without its dataset samples with the tokenizer the checkpoint records
    (it asked for the dataset folder although only the tokenizer is needed: an adversarial trial), and says so
    where a --data_dir given went unused; the loss, which reads the data, still needs it."""
    _, out = run
    args = ["--out_dir", str(out), "--start", "the ", "--max_new_tokens", "20", "--seed", "7"]
    elsewhere = ["--data_dir", str(tmp_path / "no_data")]
    assert sample.main(args + elsewhere) == sample.main(args)
    assert capsys.readouterr().err.count(f"note: --data_dir {tmp_path / 'no_data'} does not hold the checkpoint's "
                                         f"dataset; sampling with the tokenizer the checkpoint records (byte)") == 1
    with pytest.raises(FileNotFoundError, match="dataset 'tiny' not found"):
        nlq_eval.main(["--out_dir", str(out), *elsewhere])


def test_sample_prints_text(run, capsys):
    _, out = run
    texts = sample.main(["--out_dir", str(out), "--start", "the ", "--num_samples", "2",
                         "--max_new_tokens", "20"])
    printed = capsys.readouterr().out
    assert len(texts) == 2 and all(t.startswith("the ") and t in printed for t in texts)
    assert printed.count("-" * 40) == 2
    long = sample.main(["--out_dir", str(out), "--start", "x" * 20, "--max_new_tokens", "3"])  # block_size 16
    assert long[0].startswith("x" * 20) and len(long[0]) == 23
    assert ("note: the prompt is 20 tokens, more than block_size 16: each new token is predicted from the last "
            "16") in capsys.readouterr().err


def test_temperature_top_k_and_seed(run):
    _, out = run
    common = ["--out_dir", str(out), "--start", "fox", "--max_new_tokens", "40"]
    greedy = sample.main(common + ["--temperature", "0", "--seed", "1"])
    assert greedy == sample.main(common + ["--temperature", "0", "--seed", "2"])  # greedy ignores the seed
    # top-1 = argmax
    assert greedy == sample.main(common + ["--temperature", "1", "--top_k", "1", "--seed", "3"])
    hot = sample.main(common + ["--temperature", "1.5", "--seed", "4"])
    assert hot == sample.main(common + ["--temperature", "1.5", "--seed", "4"])  # same seed, same text
    assert hot != sample.main(common + ["--temperature", "1.5", "--seed", "5"])
    # > vocab: no limit
    assert hot == sample.main(common + ["--temperature", "1.5", "--seed", "4", "--top_k", "100000"])
    assert hot == sample.main(common + ["--temperature", "1.5", "--seed", "4", "--no_cache"])  # same text


@pytest.mark.parametrize("arg, said", [("--temperature=nan", "--temperature=nan: give a finite number >= 0"),
                                       ("--temperature=inf", "--temperature=inf: give a finite number >= 0"),
                                       ("--temperature=-1", "--temperature=-1.0: give a finite number >= 0"),
                                       ("--num_samples=0", "--num_samples=0: give 1 or more"),
                                       ("--max_new_tokens=-1", "--max_new_tokens=-1: give 0 or more")])
def test_bad_sampling_flags_are_named(arg, said, capsys):
    with pytest.raises(SystemExit) as e:
        sample.parse_args([arg])
    assert e.value.code == 2 and said in capsys.readouterr().err


def test_unavailable_device_is_a_clear_error(run, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises((ValueError, RuntimeError), match="CUDA is not available"):
        sample.main(["--out_dir", str(run[1]), "--device", "cuda"])


def test_samples_only_real_vocabulary(run):
    """A vocabulary of 10 in a 256-row embedding: no padded id is ever drawn."""
    model, *_ = sample.load_checkpoint(str(run[1]))
    meta = dict(tokenizer="char", vocab_size=10, eot_token=None)
    ids = sample.generate(model, meta, lambda s: [1, 2], lambda ids: ids, "ab", num_samples=3,
                          max_new_tokens=50, temperature=3.0)
    assert all(max(i[2:]) < 10 for i in ids)


def test_each_sample_is_handed_over_as_soon_as_it_is_generated(run):
    """sample.py prints each text when it is done (10 long samples on a CPU: the first after seconds, not all
    at the end)."""
    model, *_ = sample.load_checkpoint(str(run[1]))
    meta = dict(tokenizer="char", vocab_size=10, eot_token=None)
    calls, seen = [], []
    generate = model.generate
    model.generate = lambda *args, **kw: calls.append(1) or generate(*args, **kw)
    texts = sample.generate(model, meta, lambda s: [1, 2], lambda ids: ids, "ab", num_samples=3, max_new_tokens=5,
                            each=lambda text: seen.append((len(calls), text)))
    assert seen == [(1, texts[0]), (2, texts[1]), (3, texts[2])] and len(texts[0]) == 7


def test_a_progress_bar_on_a_terminal_only_and_the_same_texts(run, monkeypatch):
    """GPT.generate hands each new token to on_token; sample.py draws a progress bar from it on a terminal's
    stderr (a long sample on a CPU was silent for minutes), none in a log file, and the texts do not change."""
    import io
    model, *_ = sample.load_checkpoint(str(run[1]))
    drawn = []
    x = torch.tensor([[1, 2]])
    torch.manual_seed(0)
    y = model.generate(x, 6, on_token=drawn.append)
    assert [t.shape for t in drawn] == [(1, 1)] * 6 and torch.equal(torch.cat([x, *drawn], dim=1), y)

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    meta = dict(tokenizer="char", vocab_size=10, eot_token=None)
    args = (model, meta, lambda s: [1, 2], lambda ids: ids, "ab")
    monkeypatch.setattr(sample, "PROGRESS_DELAY_S", 0)
    texts = {}
    for stderr in (Terminal(), io.StringIO()):
        monkeypatch.setattr(sys, "stderr", stderr)
        texts[type(stderr)] = sample.generate(*args, num_samples=2, max_new_tokens=5, progress=True)
        shown = stderr.getvalue()
        assert (("sample 1 of 2:   0%" in shown and "sample 2 of 2:   0%|          | 0/5" in shown)
                if stderr.isatty() else shown == ""), shown
    assert texts[Terminal] == texts[io.StringIO] == sample.generate(*args, num_samples=2, max_new_tokens=5)


def test_prompt_ids(tmp_path):
    byte = dict(tokenizer="byte", vocab_size=256, eot_token=None)
    encode, _ = prepare_data.get_codec(byte)
    assert sample.prompt_ids("", byte, encode) == [10]  # a newline
    assert sample.prompt_ids("", dict(tokenizer="gpt2", eot_token=50256), None) == [50256]
    (tmp_path / "p.txt").write_text("héllo", encoding="utf-8")
    assert sample.prompt_ids(f"FILE:{tmp_path / 'p.txt'}", byte, encode) == list("héllo".encode())
    with pytest.raises(UnicodeEncodeError):  # (a byte from a non-UTF-8 shell): not blamed on a char vocabulary
        sample.prompt_ids("\udcff", byte, encode)
    char = dict(tokenizer="char", vocab_size=3, chars=[" ", "a", "b"], name="one_line")  # a text without "\n"
    encode, _ = prepare_data.get_codec(char)
    assert sample.prompt_ids("ab", char, encode) == [1, 2]
    with pytest.raises(ValueError, match=r"^with no --start, sampling starts at a newline, which this char "
                                         r"vocabulary lacks \(its training text had none\): give a prompt in its "
                                         r"characters"):
        sample.prompt_ids("", char, encode)  # was: "characters ['\n'] are not in the vocabulary", unasked
    with pytest.raises(ValueError, match=r"^--start: characters \['c', 'é'\] are not in the vocabulary of "
                                         r"dataset one_line; a char-level model reads only the characters of its "
                                         r"training text, so write the prompt in those \(byte and gpt2 models"):
        sample.prompt_ids("abcé", char, encode)  # (a trial: the message named the characters, not the fix)


@pytest.mark.parametrize("content, expected", [(None, "is not a file"),
                                               (b"\x00\xff\xfe binary", "not valid UTF-8")])
def test_start_file_errors(content, expected, tmp_path):
    path = tmp_path / "binary.dat"
    if content is not None:
        path.write_bytes(content)
    byte = dict(tokenizer="byte", vocab_size=256, eot_token=None)
    with pytest.raises((FileNotFoundError, prepare_data.DataError), match=expected) as e:
        sample.prompt_ids(f"FILE:{path}", byte, prepare_data.get_codec(byte)[0])
    assert str(path) in str(e.value)


@pytest.mark.parametrize("extra, expected", [([], "no checkpoint at {ckpt}"),
                                             (["--device", "cuda"], "CUDA is not available")])
def test_cli_errors_are_clear(extra, expected, tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "sample.py"), "--out_dir", str(tmp_path / "nothing"),
                             *extra],
                            capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 1 and "Traceback" not in result.stderr and result.stderr.startswith("error: ")
    assert expected.format(ckpt=tmp_path / "nothing" / "ckpt.pt") in result.stderr


def test_changed_dataset_is_refused(run, tmp_path):
    """A checkpoint records its dataset's meta.json; eval refuses data that changed since training, sample
    only data tokenised otherwise (it needs the tokenizer alone: re-prepared text with the same one is fine)."""
    root, out = run
    meta = json.loads((root / "tiny" / "meta.json").read_text())
    meta["sha256"] = {f: hashlib.sha256((root / "tiny" / f).read_bytes()).hexdigest()
                      for f in ("train.bin", "val.bin")}
    shutil.copytree(root / "tiny", tmp_path / "tiny")
    (tmp_path / "tiny" / "meta.json").write_text(json.dumps(meta))
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu")  # train.py records dataset_meta itself from now on
    ckpt["dataset_meta"] = meta
    (tmp_path / "out").mkdir()
    torch.save(ckpt, tmp_path / "out" / "ckpt.pt")
    args = ["--out_dir", str(tmp_path / "out"), "--data_dir", str(tmp_path)]
    assert sample.main(args + ["--max_new_tokens", "2"])  # same data: fine
    changes = {"sha256 of val.bin differs": {"sha256": {**meta["sha256"], "val.bin": "0" * 64}},
               "tokenizer: 'byte' at training, 'char' now": {"tokenizer": "char", "chars": ["a"]},
               "vocab_size: 256 at training, 300 now": {"vocab_size": 300}}
    for expected, change in changes.items():
        (tmp_path / "tiny" / "meta.json").write_text(json.dumps({**meta, **change}))
        with pytest.raises(ValueError) as e:
            nlq_eval.main(args)
        for part in (f"dataset {tmp_path / 'tiny'} is not the data", expected, "changed since training",
                     "--data_dir"):
            assert part in str(e.value)
        if expected.startswith("sha256"):  # the same tokenizer: sampling needs nothing else
            assert sample.main(args + ["--max_new_tokens", "2"])
            continue
        with pytest.raises(ValueError) as e:
            sample.main(args)
        for part in (f"dataset {tmp_path / 'tiny'} is not tokenised as this checkpoint's training data was",
                     expected.replace(":", "")):
            assert part in str(e.value)


def test_eval_reproduces_metrics_and_bits_per_byte(run, tmp_path):
    _, out = run
    # folder is created
    r = nlq_eval.main(["--out_dir", str(out), "--json", str(tmp_path / "new" / "r.json")])
    rows = {row["iter"]: row for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert r["iter"] == 6 and abs(r["loss"] - rows[6]["val_loss"]) < 1e-4
    assert r["tokens"] == r["bytes"] == 3 * 4 * 16  # eval_iters x batch_size x block_size; byte data
    assert r["bits_per_byte"] == pytest.approx(r["loss"] / math.log(2), rel=1e-12)
    assert r["ppl"] == pytest.approx(math.exp(r["loss"]))
    assert json.loads((tmp_path / "new" / "r.json").read_text())["loss"] == r["loss"]
    assert abs(nlq_eval.main(["--out_dir", str(out), "--split", "train"])["loss"]
               - rows[6]["train_loss"]) < 1e-4


def test_eval_says_when_it_replaces_its_earlier_json(run, tmp_path, capsys):
    _, out = run
    path = tmp_path / "r.json"
    nlq_eval.main(["--out_dir", str(out), "--json", str(path)])
    assert "will be replaced" not in capsys.readouterr().err
    train_loss = nlq_eval.main(["--out_dir", str(out), "--json", str(path), "--split", "train"])["loss"]
    assert (f"note: --json {path} holds an earlier result of this command; it will be replaced"
            in capsys.readouterr().err)
    assert json.loads(path.read_text())["loss"] == train_loss


@pytest.mark.parametrize("target, expected", [("", "is a folder"),
                                              ("file/r.json", "cannot create its folder")])
def test_eval_bad_json_path_fails_before_evaluating(target, expected, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(nlq_eval, "evaluate", lambda *a: pytest.fail("evaluated before checking --json"))
    with pytest.raises(SystemExit) as e:
        nlq_eval.main(["--out_dir", str(tmp_path), "--json", str(tmp_path / target)])
    assert e.value.code == 2 and expected in capsys.readouterr().err


def test_eval_full_predicts_every_val_token_once(run):
    """700 val tokens -> 699 targets in 44 windows of 16 (the last one holds 11), batching does not matter."""
    root, out = run
    r = nlq_eval.main(["--out_dir", str(out), "--full", "--batch_size", "5"])
    assert (r["tokens"], r["windows"], r["bytes"]) == (699, 44, 699)
    assert (nlq_eval.main(["--out_dir", str(out), "--full", "--batch_size", "64"])["loss"]
            == pytest.approx(r["loss"]))
    model, *_ = sample.load_checkpoint(str(out))  # reference: one window at a time, straight from the file
    val = torch.from_numpy(np.fromfile(root / "tiny" / "val.bin", np.uint16).astype(np.int64))
    nats = 0.0
    with torch.no_grad():
        for s in range(0, 699, 16):
            x, y = val[s:min(s + 16, 699)][None], val[s + 1:min(s + 17, 700)][None]
            nats += F.cross_entropy(model(x, y)[0][0], y[0], reduction="sum").item()
    assert r["loss"] == pytest.approx(nats / 699, rel=1e-5)


def test_eval_on_another_dataset_of_the_same_tokenizer(run, tmp_path):
    """--dataset NAME: the checkpoint's loss on other prepared data, when it is tokenised the same way: the
    same numbers as the checkpoint's own dataset holding that data; another tokenizer is refused before the
    weights are read."""
    root, out = run
    other = tmp_path / "data" / "other"
    other.mkdir(parents=True)
    val = np.frombuffer(b"a different text about foxes, dogs and jugs of liquor. " * 12, np.uint8)
    val.astype(np.uint16).tofile(other / "val.bin")
    meta = dict(name="other", tokenizer="byte", vocab_size=256, dtype="uint16", eot_token=None)
    (other / "meta.json").write_text(json.dumps(meta))
    r = nlq_eval.main(["--out_dir", str(out), "--data_dir", str(tmp_path / "data"), "--dataset", "other",
                       "--full"])
    assert (r["dataset"], r["tokens"]) == ("other", len(val) - 1)
    model, *_ = sample.load_checkpoint(str(out))  # reference: the whole text in windows of 16
    ids, nats = torch.from_numpy(val.astype(np.int64)), 0.0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, 16):
            y = ids[s + 1:s + 17]
            x = ids[s:s + len(y)]
            nats += F.cross_entropy(model(x[None], y[None])[0][0], y, reduction="sum").item()
    assert r["loss"] == pytest.approx(nats / (len(val) - 1), rel=1e-5)
    assert nlq_eval.main(["--out_dir", str(out), "--full"])["dataset"] == "tiny"  # its own by default
    for change, said in [({"tokenizer": "char", "chars": ["a"]}, "tokenizer 'byte' at training, 'char' now"),
                         ({"vocab_size": 300}, "vocab_size 256 at training, 300 now")]:
        (other / "meta.json").write_text(json.dumps({**meta, **change}))
        with pytest.raises(ValueError, match=f"dataset {other} is not tokenised as this checkpoint's training "
                                             f"data was \\({said}\\): its token ids would mean other tokens"):
            nlq_eval.main(["--out_dir", str(out), "--data_dir", str(tmp_path / "data"), "--dataset", "other"])
    with pytest.raises(FileNotFoundError, match="dataset 'nope' not found"):
        nlq_eval.main(["--out_dir", str(out), "--data_dir", str(tmp_path / "data"), "--dataset", "nope"])
    for name in ("", ".", ".."):
        with pytest.raises(SystemExit):
            nlq_eval.main(["--out_dir", str(out), "--dataset", name])
    # a checkpoint from before dataset_meta was recorded is checked against its own dataset's meta.json
    old = tmp_path / "old"
    old.mkdir()
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    del ckpt["dataset_meta"]
    torch.save(ckpt, old / "ckpt.pt")
    (other / "meta.json").write_text(json.dumps({**meta, "tokenizer": "char", "chars": ["a"]}))
    shutil.copytree(root / "tiny", tmp_path / "data" / "tiny")  # its own dataset, beside the other one
    with pytest.raises(ValueError, match="tokenizer 'byte' at training, 'char' now"):
        nlq_eval.main(["--out_dir", str(old), "--data_dir", str(tmp_path / "data"), "--dataset", "other"])
    (other / "meta.json").write_text(json.dumps(meta))
    r = nlq_eval.main(["--out_dir", str(old), "--data_dir", str(tmp_path / "data"), "--dataset", "other/"])
    assert r["dataset"] == "other" and r["loss"] == pytest.approx(nlq_eval.main(
        ["--out_dir", str(out), "--data_dir", str(tmp_path / "data"), "--dataset", "other"])["loss"])
    shutil.rmtree(tmp_path / "data" / "tiny")
    with pytest.raises(ValueError, match="does not record its tokenizer .* its own dataset 'tiny' is not found"):
        nlq_eval.main(["--out_dir", str(old), "--data_dir", str(tmp_path / "data"), "--dataset", "other"])


def test_a_char_model_reads_only_its_own_characters(tmp_path):
    trained = dict(tokenizer="char", vocab_size=3, chars=["a", "b", "c"])
    for chars in (["a", "c", "b"], ["x", "y", "z"]):
        with pytest.raises(ValueError, match="other characters, or the same in another order.*a char model reads "
                                             "only text whose meta.json lists the characters of its training"):
            sample.check_same_tokenizer(trained, {**trained, "chars": chars}, "d")
    sample.check_same_tokenizer(trained, dict(trained), "d")  # the same characters: fine


def test_token_bytes_char():
    meta = dict(tokenizer="char", chars=["\n", "a", "é", "€"])
    assert nlq_eval.token_bytes(meta).tolist() == [1, 1, 2, 3]


def test_token_bytes_gpt2(shipped_data):
    table = nlq_eval.token_bytes(dict(tokenizer="gpt2"))  # the shipped tests/data/gpt2
    enc = prepare_data.gpt2_encoding()
    text = "Héllo wörld – 10 € each"
    assert table[prepare_data.GPT2_EOT] == 0 and len(table) == 50257
    assert table[enc.encode_ordinary(text)].sum() == len(text.encode("utf-8"))


def test_shakespeare_end_to_end(shipped_data, tmp_path):
    """Prepare the real Tiny Shakespeare (char, the shipped copy), train a few steps, sample from it, evaluate
    it."""
    prepare_data.main(["shakespeare_char", "--data_dir", str(tmp_path), "--num_proc", "1"])
    out = tmp_path / "out"
    train.train(small_cfg(tmp_path, out, dataset="shakespeare_char", block_size=32, max_iters=8,
                          eval_interval=8, eval_iters=2))
    meta = prepare_data.load_meta(tmp_path / "shakespeare_char")
    text, = sample.main(["--out_dir", str(out), "--start", "ROMEO:", "--max_new_tokens", "30",
                         "--top_k", "10"])
    assert text.startswith("ROMEO:") and len(text) == 36 and set(text) <= set(meta["chars"])
    r = nlq_eval.main(["--out_dir", str(out)])
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert abs(r["loss"] - last["val_loss"]) < 1e-4 and r["bytes"] >= r["tokens"]


@pytest.mark.parametrize("script", ["sample", "eval", "hellaswag"])
def test_missing_tokenizer_is_found_before_the_weights_are_read(script, run, tmp_path, monkeypatch):
    """The tokenizer check (gpt2's BPE files offline, here made to fail) comes before the checkpoint's weights
    are read: only a memory-mapped look at its settings happens first."""
    reads = []
    real = sample.read_checkpoint
    monkeypatch.setattr(sample, "read_checkpoint",
                        lambda path, mmap=False: reads.append(mmap) or real(path, mmap))

    def no_tokenizer(*args, **kwargs):
        raise prepare_data.DataError("GPT-2's BPE files are not available")
    monkeypatch.setattr(nlq_eval if script != "sample" else sample,
                        "token_bytes" if script == "eval" else "get_codec", no_tokenizer)
    hellaswag = tmp_path / "h.jsonl"
    hellaswag.write_text(json.dumps(dict(activity_label="Cooking", ctx_a="the", ctx_b="cook",
                                         endings=["a", "b", "c", "d"], label=0)) + "\n")
    argv = {"sample": ["--out_dir", str(run[1])], "eval": ["--out_dir", str(run[1])],
            "hellaswag": ["--out_dir", str(run[1]), "--hellaswag", str(hellaswag)]}[script]
    with pytest.raises(prepare_data.DataError, match="BPE"):
        (sample.main if script == "sample" else nlq_eval.main)(argv)
    assert reads == [True]  # settings only, no weights
