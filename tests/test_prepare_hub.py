"""prepare_data.py fineweb_edu and hf: the streamed path on in-memory `datasets` objects, offline."""
import shlex

import datasets
import numpy as np
import pyarrow as pa
import pytest
from conftest import ROOT
from test_prepare_data import decoded, fails, prepare

import prepare_data as P
from nlq import tokenizers


@pytest.fixture(scope="module")
def enc(shipped_data):
    return tokenizers.gpt2_encoding()  # the shipped tests/data/gpt2


@pytest.fixture(scope="module")
def speeches(shipped_data):
    """Tiny Shakespeare's first 1500 speeches as documents; every 100th replaced by an empty or null text."""
    text = (shipped_data / "tinyshakespeare" / "input.txt").read_text()
    docs = [s for s in text.split("\n\n") if s.strip()][:1500]
    return [("" if i % 200 else None) if i % 100 == 99 else d for i, d in enumerate(docs)]


def records(docs):
    """A FineWeb-like schema: text plus columns the preparation must ignore."""
    return {"text": docs, "id": [f"doc{i}" for i in range(len(docs))], "score": [3.1] * len(docs)}


def split_docs(folder, meta, sep="<|endoftext|>"):
    """The documents of train.bin and val.bin, decoded (after decoded()'s sha256 and length checks)."""
    _, decode = tokenizers.get_codec(meta)
    text = decoded(folder, meta)  # checks both bins against meta
    train = decode(np.fromfile(folder / "train.bin", dtype=meta["dtype"]))
    assert text.startswith(train)
    return train.split(sep)[:-1], text[len(train):].split(sep)[:-1]


@pytest.mark.parametrize("limit", [dict(), dict(max_docs=700), dict(max_tokens=60_000)])
def test_stream_exact_token_counts(limit, speeches, enc, tmp_path):
    ds = datasets.Dataset.from_dict(records(speeches)).to_iterable_dataset(num_shards=3)
    assert isinstance(ds, datasets.IterableDataset)
    meta = P.prepare_stream(ds, tmp_path / "fw", val_fraction=0.05, source="test", min_val_tokens=100, **limit)
    docs = [d for d in speeches if d]  # 15 empty or null texts are skipped
    sizes = [len(ids) + 1 for ids in enc.encode_ordinary_batch(docs)]  # + end-of-text
    if "max_docs" in limit:
        taken = 700
    elif "max_tokens" in limit:  # the most documents whose tokens total <= 60,000
        taken = int((np.cumsum(sizes) <= 60_000).sum())
        assert sum(sizes[:taken]) <= 60_000 < sum(sizes[:taken + 1])
    else:
        taken = len(docs)
    assert meta["train_docs"] + meta["val_docs"] == taken
    assert meta["train_tokens"] + meta["val_tokens"] == sum(sizes[:taken])
    position = [i for i, d in enumerate(speeches) if d]  # of each document in the stream
    skipped_before_last = position[taken - 1] + 1 - taken
    if "max_tokens" in limit:  # records are read a batch of documents ahead
        assert skipped_before_last <= meta["skipped_docs"] <= 15
    else:
        assert meta["skipped_docs"] == (15 if not limit else skipped_before_last)
    train, val = split_docs(tmp_path / "fw", meta)
    assert (len(train), len(val)) == (meta["train_docs"], meta["val_docs"]) and 0 < len(val) < len(train) / 10
    assert meta["train_tokens"] == sum(len(t) + 1 for t in enc.encode_ordinary_batch(train))
    in_order = iter(docs[:taken])
    assert all(d in in_order for d in train) and sorted(train + val) == sorted(docs[:taken])  # order kept
    assert (meta["tokenizer"], meta["eot_token"], meta["max_docs"], meta["max_tokens"]) == \
        ("gpt2", 50256, limit.get("max_docs"), limit.get("max_tokens"))


def test_dataset_and_stream_give_the_same_bins_and_seed_fixes_the_split(speeches, tmp_path):
    table = datasets.Dataset.from_dict(records(speeches[:400]))
    kw = dict(val_fraction=0.1, source="test", min_val_tokens=100)
    a = P.prepare_stream(table, tmp_path / "a", **kw)
    b = P.prepare_stream(table.to_iterable_dataset(), tmp_path / "b", **kw)
    c = P.prepare_stream(table.to_iterable_dataset(), tmp_path / "c", **kw, seed=7)
    assert a["sha256"] == b["sha256"] and a["sha256"]["val.bin"] != c["sha256"]["val.bin"]
    assert a["train_tokens"] + a["val_tokens"] == c["train_tokens"] + c["val_tokens"]


def test_reads_no_further_than_max_docs(speeches, tmp_path):
    """A stream that breaks after 300 records (2 of the first 299 empty): max_docs=297 stops reading at
    record 299, the 297th document."""
    def gen():
        yield from ({"text": d} for d in speeches[:300])
        raise AssertionError("read past max_docs")
    ds = datasets.IterableDataset.from_generator(gen)
    assert ds.column_names is None  # columns unknown until read
    meta = P.prepare_stream(ds, tmp_path / "s", tokenizer="byte", max_docs=297, val_fraction=0.1,
                            source="gen")
    docs = [d for d in speeches[:299] if d]
    assert len(docs) == 297 and (meta["train_docs"] + meta["val_docs"], meta["skipped_docs"]) == (297, 2)
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(d.encode()) + 2 for d in docs)  # + "\n\n"
    assert meta["vocab_size"] == 256 and meta["eot_token"] is None


class FakeHub:
    """datasets.load_dataset, offline: records its arguments and returns an in-memory IterableDataset."""

    def __init__(self, columns):
        self.columns, self.calls = columns, []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return datasets.Dataset.from_dict(self.columns).to_iterable_dataset()


def test_fineweb_edu_cli(speeches, enc, tmp_path, monkeypatch):
    hub = FakeHub(records(speeches))
    monkeypatch.setattr(datasets, "load_dataset", hub)
    meta = prepare(tmp_path, "fineweb_edu", "--subset", "sample-100BT", "--max_tokens", "40000",
                   "--val_fraction", "0.05", "--num_proc", "2")
    assert hub.calls == [(("HuggingFaceFW/fineweb-edu", "sample-100BT"), dict(split="train", streaming=True))]
    sizes = np.cumsum([len(ids) + 1 for ids in enc.encode_ordinary_batch([d for d in speeches if d])])
    assert meta["train_tokens"] + meta["val_tokens"] == sizes[sizes <= 40_000][-1]
    assert meta["hf"] == dict(dataset="HuggingFaceFW/fineweb-edu", config="sample-100BT", split="train",
                              text_column="text")
    assert (meta["name"], meta["source"]) == ("fineweb_edu", "HuggingFaceFW/fineweb-edu")
    prepare(tmp_path, "fineweb_edu", "--max_docs", "500", "--name", "fw10", "--val_fraction", "0.05")
    assert hub.calls[1][0] == ("HuggingFaceFW/fineweb-edu", "sample-10BT")  # the default subset


def test_any_hub_dataset_cli(speeches, tmp_path, monkeypatch):
    hub = FakeHub({"story": speeches, "n": list(range(len(speeches)))})
    monkeypatch.setattr(datasets, "load_dataset", hub)
    meta = prepare(tmp_path, "hf", "--hf_dataset", "someone/stories", "--hf_config", "en", "--hf_split",
                   "validation", "--text_column", "story", "--name", "stories", "--tokenizer", "byte",
                   "--max_docs", "1000")
    assert hub.calls == [(("someone/stories", "en"), dict(split="validation", streaming=True))]
    docs = [d for d in speeches if d][:1000]
    assert meta["train_docs"] + meta["val_docs"] == 1000 and meta["val_fraction"] == 0.01
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(d.encode()) + 2 for d in docs)
    train, val = split_docs(tmp_path / "stories", meta, sep=tokenizers.DOC_SEPARATOR)
    assert sorted(train + val) == sorted(docs)


@pytest.fixture
def existing(tmp_path):
    """A dataset folder 'x' that every failing run below targets with --overwrite; it must survive."""
    d = tmp_path / "x"
    d.mkdir()
    for f in P.BIN_FILES:
        (d / f).write_text(f"old {f}")
    yield tmp_path
    assert sorted(p.name for p in d.iterdir()) == sorted(P.BIN_FILES)
    assert all((d / f).read_text() == f"old {f}" for f in P.BIN_FILES)


def broken_stream(after, error):
    def gen():
        for i in range(after):
            yield {"text": f"document {i} " * 20}
        raise error
    return datasets.IterableDataset.from_generator(gen)


BAD_STREAMS = {  # case: (load_dataset's result or exception, extra args, message parts)
    "no such column": (datasets.Dataset.from_dict({"body": ["a"]}).to_iterable_dataset(), [],
                       ["record 1 has no column 'text' (it has body); pass --text_column"]),
    "no such column, columns unknown": (datasets.IterableDataset.from_generator(lambda: iter([{"body": "a"}])), [],
                                        ["record 1 has no column 'text' (it has body)"]),
    "connection lost": (broken_stream(50, ConnectionError("Connection reset by peer")), [],
                        ["the stream failed after 50 records (ConnectionError", "nothing was written"]),
    "corrupt parquet shard": (broken_stream(40, pa.lib.ArrowInvalid("Parquet magic bytes not found in footer")),
                              [], ["the stream failed after 40 records (ArrowInvalid: Parquet magic bytes",
                                   "nothing was written"]),
    "truncated gzip shard": (broken_stream(7, EOFError("Compressed file ended before the end-of-stream marker "
                                                       "was reached")), [],
                             ["the stream failed after 7 records (EOFError", "nothing was written"]),
    "list-valued text": (datasets.Dataset.from_dict({"text": [["a", "b"], ["c"]]}).to_iterable_dataset(), [],
                         ["someone/nope: record 1: column 'text' must be a string, found list ['a', 'b']"]),
    "int text, another column": (datasets.Dataset.from_dict({"text": ["fine"], "n": [7]}).to_iterable_dataset(),
                                 ["--text_column", "n"], ["someone/nope: record 1: column 'n' must be a string, "
                                                          "found int 7"]),
    "no such dataset": (datasets.exceptions.DatasetNotFoundError("Dataset 'someone/nope' doesn't exist"), [],
                        ["cannot stream someone/nope (config en), split train", "doesn't exist"]),
    "bad split": (ValueError('Bad split: valid. Available splits: ["train"]'), [],
                  ["Available splits", "--hf_split"]),
    "offline": (ConnectionError("Couldn't reach 'someone/nope' on the Hub"), [],
                ["cannot stream someone/nope (config en), split train from the Hugging Face Hub (ConnectionError",
                 "network"]),
    "val too short": (datasets.Dataset.from_dict({"text": ["short"] * 1500}).to_iterable_dataset(), [],
                      ["the val split has",
                       "raise --val_fraction (now 0.01) or use a larger corpus (this one has 10,500 tokens)"]),
}


@pytest.mark.parametrize("case", BAD_STREAMS)
def test_bad_streams_keep_the_old_dataset(case, existing, monkeypatch):
    result, extra, expected = BAD_STREAMS[case]

    def load_dataset(*args, **kwargs):
        if isinstance(result, Exception):
            raise result
        return result
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    message = fails(existing, "hf", "--hf_dataset", "someone/nope", "--hf_config", "en", "--name", "x",
                    "--overwrite", "--tokenizer", "byte", *extra)
    for part in expected:
        assert part in message


@pytest.mark.parametrize("case", ["connection lost", "list-valued text"])
def test_a_failed_stream_leaves_no_folder(case, tmp_path, monkeypatch):
    """Nothing was written, and no folder is left: neither the dataset's nor the --data_dir this run made
    (an empty data/ was left behind in a fresh clone)."""
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: BAD_STREAMS[case][0])
    message = fails(tmp_path / "data", "hf", "--hf_dataset", "someone/nope", "--name", "x", "--tokenizer", "byte")
    assert BAD_STREAMS[case][2][0] in message and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, expected", [
    (["hf", "--name", "x"], "hf needs --hf_dataset NAME"),
    (["hf", "--hf_dataset", "a/b"], "needs --hf_dataset NAME (a Hugging Face Hub dataset) and --name NAME"),
    (["local", "--input", "c.txt", "--name", "x", "--max_docs", "5"],
     "--max_docs is an option of openwebtext, fineweb_edu, hf, not of local"),
    (["hf", "--hf_dataset", "a/b", "--name", "x", "--subset", "sample-10BT"], "--subset is an option of "
                                                                              "fineweb_edu, not of hf"),
    (["fineweb_edu", "--text_column", "body"], "--text_column is an option of hf, not of fineweb_edu"),
    (["fineweb_edu", "--tokenizer", "char"], "fineweb_edu takes --tokenizer gpt2 or byte"),
    (["fineweb_edu", "--subset", "sample-1BT"], "invalid choice: 'sample-1BT'"),
    (["fineweb_edu", "--max_docs", "0"], "argument --max_docs: must be an integer >= 1, got 0"),  # was: no text
    (["fineweb_edu", "--max_docs", "-1"], "argument --max_docs: must be an integer >= 1, got -1"),  # a traceback
    (["fineweb_edu", "--max_tokens", "0"], "argument --max_tokens: must be an integer >= 1, got 0"),
    (["fineweb_edu", "--num_proc", "0"], "argument --num_proc: must be an integer >= 1, got 0"),
])
def test_usage_errors(args, expected, capsys):
    with pytest.raises(SystemExit) as e:
        P.parse_args(args)
    assert e.value.code == 2 and expected in capsys.readouterr().err


def test_readme_commands_parse():
    """The fineweb_edu and hf commands of docs/data.md are valid command lines."""
    lines = [line for line in (ROOT / "docs" / "data.md").read_text().splitlines()
             if line.startswith(("python prepare_data.py fineweb_edu", "python prepare_data.py hf"))]
    assert len(lines) == 3
    for line in lines:
        args = P.parse_args(shlex.split(line.split("#")[0])[2:])
        assert args.hf_dataset and args.name and (args.max_docs or args.max_tokens)
