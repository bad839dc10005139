"""sample.py and eval.py on a tiny checkpoint, plus an end-to-end run on the real Tiny Shakespeare."""
import codecs
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
from conftest import ROOT

import eval as nlq_eval  # eval.py: the module name shadows the builtin only inside this namespace
import prepare_data
import sample
import train
from nlq import checkpoint, data, settings
from nlq import tokenizers

TEXT = b"the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.\n"  # 86 bytes


def small_cfg(data_dir, out_dir, **kw):
    cfg = dict(settings.DEFAULTS)
    cfg.update(data_dir=str(data_dir), dataset="tiny", out_dir=str(out_dir), n_layer=2, n_head=2, n_embd=32,
               block_size=16, batch_size=4, gradient_accumulation_steps=1, max_iters=6, eval_interval=3,
               eval_windows=12, log_interval=100, warmup_iters=2, learning_rate=1e-2, min_lr=1e-3, dropout=0.0,
               device="cpu", compile=False)
    cfg.update(kw)
    return cfg


def write_tiny_dataset(root):
    """root/tiny: the pangram as bytes, train 3000 tokens, val 700 (not a multiple of block_size)."""
    (root / "tiny").mkdir()
    data = np.frombuffer(TEXT * 50, np.uint8).astype(np.uint16)
    data[:3000].tofile(root / "tiny" / "train.bin")
    data[3000:3700].tofile(root / "tiny" / "val.bin")
    (root / "tiny" / "meta.json").write_text(json.dumps(
        dict(name="tiny", tokenizer="byte", vocab_size=256, dtype="uint16", eot_token=None)))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny byte-level dataset (val: 700 tokens, not a multiple of block_size) and a 6-step checkpoint."""
    root = tmp_path_factory.mktemp("tiny")
    write_tiny_dataset(root)
    out = root / "out"
    train.train(small_cfg(root, out))
    return root, out


def test_sampling_needs_only_the_checkpoint_not_its_dataset(run, tmp_path):
    """A run folder copied where its dataset is not samples with the tokenizer its checkpoint records; the loss,
    which reads the data, needs the dataset."""
    _, out = run
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    ckpt["config"]["data_dir"] = str(tmp_path / "no_data")
    (tmp_path / "copy").mkdir()
    torch.save(ckpt, tmp_path / "copy" / "ckpt.pt")
    args = ["--start", "the ", "--max_new_tokens", "20", "--seed", "7"]
    assert sample.main(["--out_dir", str(tmp_path / "copy"), *args]) == sample.main(["--out_dir", str(out), *args])
    with pytest.raises(FileNotFoundError, match="not a prepared dataset"):
        nlq_eval.main(["--out_dir", str(tmp_path / "copy")])


def test_sample_prints_text(run, capsys):
    _, out = run
    texts = sample.main(["--out_dir", str(out), "--start", "the ", "--num_samples", "2",
                         "--max_new_tokens", "20"])
    printed = capsys.readouterr().out
    assert len(texts) == 2 and all(t.startswith("the ") and t in printed for t in texts)
    assert printed.count("-" * 40) == 2
    long = sample.main(["--out_dir", str(out), "--start", "x" * 20, "--max_new_tokens", "3"])  # block_size 16
    assert long[0].startswith("x" * 20) and len(long[0]) == 23


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


@pytest.mark.parametrize("arg, message", [
    ("--top_k=-3", "--top_k must be an integer >= 0 (0: no top-k filter), got -3"),
    ("--temperature=-1", "--temperature must be a finite number >= 0 (0: greedy), got -1.0"),
    ("--temperature=nan", "--temperature must be a finite number >= 0 (0: greedy), got nan"),
    ("--max_new_tokens=-5", "--max_new_tokens must be an integer >= 0, got -5"),
    ("--num_samples=0", "argument --num_samples: must be an integer >= 1, got 0"),
])
def test_bad_sampling_arguments_stop_before_the_checkpoint_is_read(arg, message, tmp_path, capsys):
    """Was: a traceback from torch (--top_k=-3), greedy text (--temperature=-1), or nothing printed and exit
    status 0 (--num_samples=0, --max_new_tokens=-5). The run folder does not exist: the arguments come first."""
    with pytest.raises(SystemExit) as e:
        sample.main(["--out_dir", str(tmp_path / "nope"), arg])
    assert e.value.code == 2 and capsys.readouterr().err.endswith(f" error: {message}\n")


def test_top_k_zero_samples_from_every_token(run):
    """--top_k=0 means no top-k filter, as in transformers (it was an IndexError from torch.topk)."""
    common = ["--out_dir", str(run[1]), "--start", "fox", "--max_new_tokens", "40", "--temperature", "1.5"]
    assert sample.main(common + ["--top_k", "0"]) == sample.main(common) != sample.main(common + ["--top_k", "2"])


def test_unavailable_device_is_a_clear_error(run, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises((ValueError, RuntimeError), match="CUDA is not available"):
        sample.main(["--out_dir", str(run[1]), "--device", "cuda"])


def test_samples_only_real_vocabulary(run):
    """A vocabulary of 10 in a 256-row embedding: no padded id is ever drawn."""
    model, _ = checkpoint.load_run(str(run[1]))
    meta = dict(tokenizer="char", vocab_size=10, eot_token=None)
    ids = sample.generate(model, meta, lambda s: [1, 2], lambda ids: ids, "ab", num_samples=3,
                          max_new_tokens=50, temperature=3.0)
    assert all(max(i[2:]) < 10 for i in ids)


def test_each_sample_is_handed_over_as_soon_as_it_is_generated(run):
    """sample.py prints each text when it is done (10 long samples on a CPU: the first after seconds, not all
    at the end)."""
    model, _ = checkpoint.load_run(str(run[1]))
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
    model, _ = checkpoint.load_run(str(run[1]))
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
    encode, _ = tokenizers.get_codec(byte)
    assert sample.prompt_ids("", byte, encode) == [10]  # a newline
    assert sample.prompt_ids("", dict(tokenizer="gpt2", eot_token=50256), None) == [50256]
    (tmp_path / "p.txt").write_text("héllo", encoding="utf-8")
    assert sample.prompt_ids(f"FILE:{tmp_path / 'p.txt'}", byte, encode) == list("héllo".encode())
    char = dict(tokenizer="char", vocab_size=3, chars=[" ", "a", "b"], name="one_line")  # a text without "\n"
    encode, _ = tokenizers.get_codec(char)
    assert sample.prompt_ids("ab", char, encode) == [1, 2]
    with pytest.raises(ValueError, match=r"characters \['c', 'é'\] are not in the vocabulary of dataset one_line"):
        sample.prompt_ids("abcé", char, encode)


def test_a_prompt_file_with_a_byte_order_mark_samples_as_without_it(run, tmp_path):
    """A prompt file saved with a byte-order mark started the prompt with U+FEFF (other samples than the same
    file without it); Windows line ends read as \\n, as the corpus's were; a folder, a missing file or one that
    is not UTF-8 is one line naming it."""
    (tmp_path / "plain.txt").write_bytes(b"The quick\nbrown")
    (tmp_path / "bom.txt").write_bytes(codecs.BOM_UTF8 + b"The quick\r\nbrown")  # Windows line ends too
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9".encode("latin-1"))
    out = run[1]
    texts = [sample.main(["--out_dir", str(out), f"--start=FILE:{tmp_path / f}", "--max_new_tokens=8"])
             for f in ("plain.txt", "bom.txt")]
    assert texts[0] == texts[1] and texts[0][0].startswith("The quick\nbrown")
    for start, message in ((tmp_path, r"cannot read .* \(Is a directory\); give a UTF-8 text file"),
                           (tmp_path / "binary.dat", r"cannot read .*binary.dat \(No such file or directory\)"),
                           (tmp_path / "latin1.txt", r"latin1.txt: not valid UTF-8 \(byte 3: b'\\xe9'\); convert it")):
        with pytest.raises(ValueError, match=message):  # printed as one line by sample.py
            sample.main(["--out_dir", str(out), f"--start=FILE:{start}"])


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
    """A checkpoint records its dataset's meta.json; eval refuses data that changed since training (sampling
    needs the tokenizer alone, which the checkpoint holds)."""
    root, out = run
    meta = json.loads((root / "tiny" / "meta.json").read_text())
    meta["sha256"] = {f: hashlib.sha256((root / "tiny" / f).read_bytes()).hexdigest()
                      for f in ("train.bin", "val.bin")}
    shutil.copytree(root / "tiny", tmp_path / "tiny")
    (tmp_path / "tiny" / "meta.json").write_text(json.dumps(meta))
    ckpt = torch.load(out / "ckpt.pt", map_location="cpu")
    ckpt["dataset_meta"] = meta
    (tmp_path / "out").mkdir()
    torch.save(ckpt, tmp_path / "out" / "ckpt.pt")
    args = ["--out_dir", str(tmp_path / "out"), "--data_dir", str(tmp_path)]
    assert nlq_eval.main(args)["iter"] == 6  # the same data: fine
    changes = {"the bins' sha256 differ": {"sha256": {**meta["sha256"], "val.bin": "0" * 64}},
               "tokenizer: 'byte' at training, 'char' now": {"tokenizer": "char", "chars": ["a"]},
               "vocab_size: 256 at training, 300 now": {"vocab_size": 300}}
    for expected, change in changes.items():
        (tmp_path / "tiny" / "meta.json").write_text(json.dumps({**meta, **change}))
        with pytest.raises(ValueError) as e:
            nlq_eval.main(args)
        for part in (f"dataset {tmp_path / 'tiny'} is not the data", expected, "--data_dir"):
            assert part in str(e.value)


def test_eval_reproduces_metrics_and_bits_per_byte(run, tmp_path):
    _, out = run
    # folder is created
    r = nlq_eval.main(["--out_dir", str(out), "--json", str(tmp_path / "new" / "r.json")])
    rows = {row["iter"]: row for row in checkpoint.read_metrics(str(out))}  # the eval rows
    assert r["iter"] == 6 and abs(r["loss"] - rows[6]["val_loss"]) < 1e-4
    assert r["tokens"] == r["bytes"] == 3 * 4 * 16  # eval_windows x block_size; byte data
    assert r["bits_per_byte"] == pytest.approx(r["loss"] / math.log(2), rel=1e-12)
    assert r["ppl"] == pytest.approx(math.exp(r["loss"]))
    assert json.loads((tmp_path / "new" / "r.json").read_text())["loss"] == r["loss"]
    assert abs(nlq_eval.main(["--out_dir", str(out), "--split", "train"])["loss"]
               - rows[6]["train_loss"]) < 1e-4


def test_eval_full_predicts_every_val_token_once(run):
    """700 val tokens -> 699 targets in 44 windows of 16 (the last one holds 11), batching does not matter."""
    root, out = run
    r = nlq_eval.main(["--out_dir", str(out), "--full", "--batch_size", "5"])
    assert (r["tokens"], r["windows"], r["bytes"]) == (699, 44, 699)
    assert (nlq_eval.main(["--out_dir", str(out), "--full", "--batch_size", "64"])["loss"]
            == pytest.approx(r["loss"]))
    model, _ = checkpoint.load_run(str(out))  # reference: one window at a time, straight from the file
    val = torch.from_numpy(np.fromfile(root / "tiny" / "val.bin", np.uint16).astype(np.int64))
    nats = 0.0
    with torch.no_grad():
        for s in range(0, 699, 16):
            x, y = val[s:min(s + 16, 699)][None], val[s + 1:min(s + 17, 700)][None]
            nats += F.cross_entropy(model(x, y)[0][0], y[0], reduction="sum").item()
    assert r["loss"] == pytest.approx(nats / 699, rel=1e-5)


def test_eval_on_another_dataset_of_the_same_tokenizer(run, tmp_path):
    """--dataset NAME: the checkpoint's loss on other prepared data, when it is tokenised the same way: the
    same numbers as the checkpoint's own dataset holding that data; another tokenizer is refused."""
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
    model, _ = checkpoint.load_run(str(out))  # reference: the whole text in windows of 16
    ids, nats = torch.from_numpy(val.astype(np.int64)), 0.0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, 16):
            y = ids[s + 1:s + 17]
            x = ids[s:s + len(y)]
            nats += F.cross_entropy(model(x[None], y[None])[0][0], y, reduction="sum").item()
    assert r["loss"] == pytest.approx(nats / (len(val) - 1), rel=1e-5)
    assert nlq_eval.main(["--out_dir", str(out), "--full"])["dataset"] == "tiny"  # its own by default
    (other / "meta.json").write_text(json.dumps({**meta, "vocab_size": 300}))
    with pytest.raises(ValueError, match=f"dataset {other} is not tokenized as the checkpoint's training data was"):
        nlq_eval.main(["--out_dir", str(out), "--data_dir", str(tmp_path / "data"), "--dataset", "other"])
    with pytest.raises(FileNotFoundError, match="not a prepared dataset"):
        nlq_eval.main(["--out_dir", str(out), "--data_dir", str(tmp_path / "data"), "--dataset", "nope"])


def test_another_dataset_must_be_tokenized_alike(tmp_path):
    """eval.py --dataset: another dataset's ids must mean the same tokens: a char vocabulary's characters in the
    same order."""
    trained = dict(tokenizer="char", vocab_size=3, chars=["a", "b", "c"], dtype="uint16")
    ckpt = dict(config=dict(data_dir=str(tmp_path), dataset="own"), dataset_meta=trained)
    (tmp_path / "other").mkdir()
    for chars in (["a", "c", "b"], ["x", "y", "z"]):
        (tmp_path / "other" / "meta.json").write_text(json.dumps({**trained, "chars": chars}))
        with pytest.raises(ValueError, match="is not tokenized as the checkpoint's training data was"):
            nlq_eval.dataset_of(ckpt, dataset="other")
    (tmp_path / "other" / "meta.json").write_text(json.dumps(trained))
    assert nlq_eval.dataset_of(ckpt, dataset="other")[1] == trained


def test_token_bytes_char():
    meta = dict(tokenizer="char", chars=["\n", "a", "é", "€"])
    assert tokenizers.token_bytes(meta).tolist() == [1, 1, 2, 3]


def test_token_bytes_gpt2(shipped_data):
    table = tokenizers.token_bytes(dict(tokenizer="gpt2"))  # the shipped tests/data/gpt2
    enc = tokenizers.gpt2_encoding()
    text = "Héllo wörld – 10 € each"
    assert table[tokenizers.GPT2_EOT] == 0 and len(table) == 50257
    assert table[enc.encode_ordinary(text)].sum() == len(text.encode("utf-8"))


def test_shakespeare_end_to_end(shipped_data, tmp_path):
    """Prepare the real Tiny Shakespeare (char, the shipped copy), train a few steps, sample from it, evaluate
    it."""
    prepare_data.main(["shakespeare_char", "--data_dir", str(tmp_path), "--num_proc", "1"])
    out = tmp_path / "out"
    train.train(small_cfg(tmp_path, out, dataset="shakespeare_char", block_size=32, max_iters=8,
                          eval_interval=8, eval_windows=8))
    meta = data.load_meta(tmp_path / "shakespeare_char")
    text, = sample.main(["--out_dir", str(out), "--start", "ROMEO:", "--max_new_tokens", "30",
                         "--top_k", "10"])
    assert text.startswith("ROMEO:") and len(text) == 36 and set(text) <= set(meta["chars"])
    r = nlq_eval.main(["--out_dir", str(out)])
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert abs(r["loss"] - last["val_loss"]) < 1e-4 and r["bytes"] >= r["tokens"]


