"""eval.py --hellaswag: the harness's text, scores vs a hand computation with the model; acc, acc_norm (per
character); bad files."""
import json
import math

import numpy as np
import pytest
import torch
from test_sample_eval import small_cfg, write_tiny_dataset

import eval as nlq_eval
import train
from nlq import checkpoint
from nlq import tokenizers

EXAMPLES = [  # byte-level: short ones fit block_size 32, the long ones lose context (and ending) tokens
    dict(activity_label="Fox", ctx_a="the quick", ctx_b="brown", endings=["fox", "dog", "jugs", "box"], label=0),
    dict(activity_label="Box", ctx_a="pack", ctx_b="box [step] with",  # WikiHow markers, cleaned
         endings=["five dozen", "liquor [title] jugs", "lazy dog", "q"], label=0),
    dict(activity_label="Pangram", ctx_a="the quick brown fox jumps over the lazy dog;",
         ctx_b="pack my box with five",
         endings=["dozen liquor jugs.", "foxes", "brown", "the quick brown fox jumps over"], label=0),
    dict(activity_label="Dog", ctx_a="jumps over", ctx_b="the", endings=["lazy dog", "quick fox", "box", "five"],
         label=2, ind=7),
    dict(activity_label="A", ctx_a="", ctx_b="a", endings=["b", "c", "d", "e"], label="3"),  # label: a string
]
# the harness's text: activity_label + ": " + ctx_a + " " + ctx_b.capitalize(), markers cleaned
CONTEXTS = ["Fox: the quick Brown", "Box: pack Box with",
            "Pangram: the quick brown fox jumps over the lazy dog; Pack my box with five", "Dog: jumps over The",
            "A: A"]
ENDINGS_CLEAN = [ex["endings"] for ex in EXAMPLES]
ENDINGS_CLEAN[1] = ["five dozen", "liquor. jugs", "lazy dog", "q"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A byte-level model (block_size 32) trained 6 steps on a pangram, and a HellaSwag-format file."""
    root = tmp_path_factory.mktemp("hs")
    write_tiny_dataset(root)
    train.train(small_cfg(root, root / "out", block_size=32))
    path = root / "hellaswag_val.jsonl"
    path.write_text("".join(json.dumps(ex) + "\n" for ex in EXAMPLES) + "\n")  # a blank last line is fine
    return root / "out", path


def by_hand(model, ctx, ending, block_size=32):
    """Summed log-probability of the ending's bytes after ctx + ' ', and the number of bytes scored: the last
    block_size + 1 bytes of the completion, log-softmax written out, each scored byte from the logits of the
    position before it."""
    ids = list(ctx.encode()) + list((" " + ending).encode())
    n_ending = len((" " + ending).encode())
    ids = ids[-(block_size + 1):]
    n = min(n_ending, len(ids) - 1)
    x = torch.tensor(ids[:-1])[None]
    with torch.no_grad():
        logits = model(x, targets=x)[0][0].double()  # (T, vocab): logits at every position
    m = logits.max(dim=-1, keepdim=True).values
    logp = logits - m - torch.log(torch.exp(logits - m).sum(dim=-1, keepdim=True))
    total = sum(logp[t - 1, ids[t]].item() for t in range(len(ids) - n, len(ids)))
    return total, n


def test_scores_match_a_hand_computation(ckpt):
    out, path = ckpt
    model, _ = checkpoint.load_run(str(out))
    examples = nlq_eval.read_hellaswag(str(path))
    assert [ex[1] for ex in examples] == CONTEXTS and [ex[2] for ex in examples] == ENDINGS_CLEAN
    encode, _ = tokenizers.get_codec(dict(tokenizer="byte"))
    rows, cropped = nlq_eval.hellaswag_rows(examples, encode, 32)
    hand = [[by_hand(model, c, e) for e in endings] for c, endings in zip(CONTEXTS, ENDINGS_CLEAN)]
    assert [[n for _, n in ex] for ex in rows] == [[n for _, n in ex] for ex in hand]
    assert hand[2][0][1] == 19 and hand[2][3][1] == 31 and hand[0][0][1] == 4  # cropped / whole endings
    assert cropped == 4  # example 3: 65 context bytes + each ending > 33
    ctx = nlq_eval.autocast("cpu", torch.float32)
    for batch_size in (1, 2, 8):
        scores = nlq_eval.score_hellaswag(model, ctx, rows, batch_size, "cpu")
        np.testing.assert_allclose(scores, [[s for s, _ in ex] for ex in hand], rtol=1e-5, atol=1e-5)


def test_acc_and_acc_norm_with_standard_errors(ckpt, capsys):
    out, path = ckpt
    model, _ = checkpoint.load_run(str(out))
    hand = np.array([[by_hand(model, c, e) for e in endings] for c, endings in zip(CONTEXTS, ENDINGS_CLEAN)])
    labels = np.array([0, 0, 0, 2, 3])
    acc = np.mean(hand[:, :, 0].argmax(1) == labels)
    chars = np.array([[len(e) for e in endings] for endings in ENDINGS_CLEAN])  # the harness: per character
    acc_norm = np.mean((hand[:, :, 0] / chars).argmax(1) == labels)
    r = nlq_eval.main(["--out_dir", str(out), "--hellaswag", str(path), "--batch_size", "2"])
    assert (r["examples"], r["cropped"]) == (5, 4)
    assert r["acc"] == pytest.approx(acc) and r["acc_norm"] == pytest.approx(acc_norm)
    assert r["acc_stderr"] == pytest.approx(math.sqrt(acc * (1 - acc) / 4))
    assert r["acc_norm_stderr"] == pytest.approx(math.sqrt(acc_norm * (1 - acc_norm) / 4))
    printed = capsys.readouterr().out
    assert f"| acc | {acc:.4f} | {r['acc_stderr']:.4f} |" in printed and "5 examples" in printed
    assert f"| acc_norm | {acc_norm:.4f} | {r['acc_norm_stderr']:.4f} |" in printed
    assert nlq_eval.main(["--out_dir", str(out), "--hellaswag", str(path), "--limit", "2"])["examples"] == 2


def test_metrics_by_hand():
    scores = np.array([[-1.0, -2.0, -3.0, -4.0], [-4.0, -3.0, -2.0, -6.0], [-9.0, -2.0, -1.0, -8.0]])
    counts = np.array([[1, 1, 1, 1], [8, 1, 1, 8], [3, 1, 1, 4]])
    r = nlq_eval.hellaswag_metrics(scores, counts, np.array([0, 0, 3]))
    assert r["acc"] == pytest.approx(1 / 3) and r["acc_norm"] == pytest.approx(2 / 3)  # -4/8 beats -2/1
    assert r["acc_stderr"] == pytest.approx(math.sqrt(1 / 3 * 2 / 3 / 2))


def test_gpt2_endings_are_joined_with_a_space(shipped_data):
    enc = tokenizers.gpt2_encoding()  # the shipped tests/data/gpt2
    ex = [(1, "A man is sitting on a roof.", ["he starts pulling up roofing.", "is using wrap.", "x", "y"],
           0)]
    rows, _ = nlq_eval.hellaswag_rows(ex, enc.encode_ordinary, 1024)
    ids, n = rows[0][0]
    ending = [339, 4940, 10427, 510, 9753, 278, 13]  # ' he' ' starts' ' pulling' ' up' ' roof' 'ing' '.'
    assert ids == enc.encode_ordinary("A man is sitting on a roof.") + ending and n == 7
    assert enc.decode(ending) == " he starts pulling up roofing."
    # the harness moves a context's trailing spaces to the ending, then splits the whole text's tokens
    assert nlq_eval.harness_pair(enc.encode_ordinary, "A man is ", "sitting") == \
        (enc.encode_ordinary("A man is"), enc.encode_ordinary(" sitting"))


def line(**fields):
    ex = dict(activity_label="A", ctx_a="a", ctx_b="b", endings=["b", "c", "d", "e"], label=0)
    ex.update(fields)
    return json.dumps({k: v for k, v in ex.items() if v is not None}) + "\n"


BAD_FILES = {
    "not json": (line() + "{oops\n", ":2: expected a JSON object"),
    "no label": (line(label=None), ":1: expected a JSON object with fields activity_label, ctx_a, ctx_b, "
                                   "endings, label (KeyError"),
    "no ctx_b (ctx only)": ('{"ctx": "a", "endings": ["b", "c", "d", "e"], "label": 0}\n',
                            ":1: expected a JSON object with fields activity_label"),
    "3 endings": ("\n" + line(endings=["b", "c", "d"]), ":2: expected strings, a list of 4 string endings and a "
                                                       "label 0, 1, 2 or 3"),
    "label 4": (line(label=4), ":1: expected strings, a list of 4 string endings and a label 0, 1, 2 or 3"),
    "ctx_a a number": (line(ctx_a=3), ":1: expected strings, a list of 4"),
    "empty file": ("\n", " holds no examples"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_files_name_the_line(case, ckpt, tmp_path, monkeypatch):
    text, expected = BAD_FILES[case]
    path = tmp_path / "hs.jsonl"
    path.write_text(text)
    monkeypatch.setattr(nlq_eval, "score_hellaswag", lambda *a: pytest.fail("scored a bad file"))
    with pytest.raises(ValueError) as e:
        nlq_eval.main(["--out_dir", str(ckpt[0]), "--hellaswag", str(path)])
    assert f"{path}{expected}" in str(e.value)


def test_missing_file_and_char_vocabulary(ckpt, tmp_path):
    with pytest.raises(FileNotFoundError, match="hellaswag_val.jsonl from https://raw.githubusercontent.com/"
                                                "rowanz/hellaswag/master/data/hellaswag_val.jsonl"):
        nlq_eval.main(["--out_dir", str(ckpt[0]), "--hellaswag", str(tmp_path / "nope.jsonl")])
    meta = dict(tokenizer="char", chars=list("abc "), name="abc")
    encode, _ = tokenizers.get_codec(meta)
    with pytest.raises(ValueError, match=r"hs.jsonl:9: characters \['x'\] are not in the vocabulary.*gpt2 "
                                         r"or byte"):
        nlq_eval.hellaswag_rows([(9, "abc", ["a", "b", "x", "c"], 0)], encode, 32, "hs.jsonl")


@pytest.mark.parametrize("args, expected", [
    (["--limit", "3"], "--hellaswag (with --limit) scores HellaSwag instead of the loss"),
    (["--hellaswag", "x", "--full"], "--full, --split and --dataset are the loss's"),
    (["--batch_size", "4"], "--batch_size sets the batches of --full or --hellaswag"),
    # were: every example scored (--limit 0 and -1), the default batch size taken (--batch_size 0)
    (["--hellaswag", "x", "--limit", "0"], "argument --limit: must be an integer >= 1, got 0"),
    (["--hellaswag", "x", "--limit", "-1"], "argument --limit: must be an integer >= 1, got -1"),
    (["--hellaswag", "x", "--batch_size", "0"], "argument --batch_size: must be an integer >= 1, got 0"),
    (["--full", "--batch_size", "-1"], "argument --batch_size: must be an integer >= 1, got -1"),
])
def test_usage_errors(args, expected, capsys):
    with pytest.raises(SystemExit) as e:
        nlq_eval.main(args)
    assert e.value.code == 2 and expected in capsys.readouterr().err
