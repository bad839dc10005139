"""prepare_data.py on real data (Tiny Shakespeare, enwiki2015, GPT-2 BPE files shipped in tests/data), offline."""
import bz2
import codecs
import errno
import gzip
import hashlib
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from conftest import run_offline

import prepare_data as P
from nlq import tokenizers
from nlq.data import load_meta

ROOT = Path(__file__).resolve().parents[1]


def prepare(data_dir, *args):
    """Run the CLI in-process on data_dir and return the meta.json it wrote."""
    P.main([*args, "--data_dir", str(data_dir)])
    name = args[args.index("--name") + 1] if "--name" in args else args[0]
    return load_meta(Path(data_dir) / name)


def fails(data_dir, *args):
    """Run the CLI expecting a clean error exit; returns the message."""
    with pytest.raises(SystemExit) as e:
        P.main([*args, "--data_dir", str(data_dir)])
    return str(e.value.code)


def decoded(dataset_dir, meta, bpe_dir=None):
    """decode(train.bin) + decode(val.bin), after checking each bin's sha256 and length against meta."""
    _, decode = tokenizers.get_codec(meta, bpe_dir)
    text = ""
    for split in ("train", "val"):
        path = Path(dataset_dir) / f"{split}.bin"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == meta["sha256"][f"{split}.bin"]
        ids = np.fromfile(path, dtype=meta["dtype"])
        assert ids.size == meta[f"{split}_tokens"]
        text += decode(ids)
    return text


def wiki_articles(folder):
    """Article bodies of WikiExtractor files, parsed independently of prepare_data: header line dropped."""
    bodies = []
    for f in sorted(Path(folder).iterdir()):
        for piece in f.read_text(encoding="utf-8").split("</doc>")[:-1]:
            header, _, body = piece.strip().partition("\n")
            assert header.startswith("<doc ")
            bodies.append(body.strip())
    return bodies


@pytest.fixture(scope="module")
def enc(shipped_data):
    return tokenizers.gpt2_encoding()  # the shipped tests/data/gpt2


# ---------------------------------------------------------------- 1, 2: Tiny Shakespeare round trips

def test_shakespeare_gpt2_exact(shipped_data, tmp_path):
    """No --input, no --bpe_dir: the shipped Tiny Shakespeare and GPT-2 files, nanoGPT's token counts."""
    meta = prepare(tmp_path, "shakespeare")
    assert (meta["train_tokens"], meta["val_tokens"]) == (301_966, 36_059)
    assert meta["train_tokens"] + meta["val_tokens"] == 338_025
    assert ((meta["tokenizer"], meta["vocab_size"], meta["eot_token"], meta["dtype"], meta["source"])
            == ("gpt2", 50257, 50256, "uint16", "tests/data/tinyshakespeare/input.txt"))
    text = (shipped_data / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    assert decoded(tmp_path / "shakespeare", meta) == text


def test_a_copy_of_input_txt_and_bpe_dir_give_the_same_bins(shipped_data, tmp_path):
    """local --input (one text, split by position) and --bpe_dir name other copies of the files: the same bins as
    the shipped defaults."""
    for name in ("tinyshakespeare/input.txt", "gpt2/encoder.json", "gpt2/vocab.bpe"):
        (tmp_path / "copy" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "copy" / name).write_bytes((shipped_data / name).read_bytes())
    ours = prepare(tmp_path, "local", "--input", str(tmp_path / "copy" / "tinyshakespeare" / "input.txt"),
                   "--bpe_dir", str(tmp_path / "copy" / "gpt2"), "--name", "copy")
    shipped = prepare(tmp_path, "shakespeare")
    assert ours["source"] == str(tmp_path / "copy" / "tinyshakespeare" / "input.txt")
    assert ours["sha256"] == shipped["sha256"] and ours["train_tokens"] == 301_966


def test_shakespeare_char_exact(shipped_data, tmp_path, capsys):
    text = (shipped_data / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    meta = prepare(tmp_path, "shakespeare_char")
    assert capsys.readouterr().out.splitlines()[0] == ("Tiny Shakespeare: the copy shipped with nlq, "
                                                       "tests/data/tinyshakespeare/input.txt")
    assert meta["vocab_size"] == 65 and meta["chars"] == sorted(set(text)) and meta["eot_token"] is None
    assert (meta["train_tokens"], meta["val_tokens"]) == (1_003_854, 111_540)
    assert decoded(tmp_path / "shakespeare_char", meta) == text


def test_one_text_file_is_split_by_position(shipped_data, tmp_path):
    """local --input FILE.txt (one plain-text file, the README's example of an input): split by position as
    shakespeare_char is, the very same bins; it failed with '1 document(s) leave no training documents'."""
    src = shipped_data / "tinyshakespeare" / "input.txt"
    text = src.read_text(encoding="utf-8")
    meta = prepare(tmp_path, "local", "--input", str(src), "--name", "shk_local", "--tokenizer", "char")
    shipped = prepare(tmp_path, "shakespeare_char")
    assert meta["sha256"] == shipped["sha256"] and meta["chars"] == shipped["chars"]
    assert (meta["split"], meta["seed"], meta["train_docs"], meta["val_docs"]) == ("position", None, 1, 1)
    assert (meta["train_tokens"], meta["val_tokens"], meta["source"]) == (1_003_854, 111_540, str(src))
    assert decoded(tmp_path / "shk_local", meta) == text
    # byte: the first 80% of the characters are train, no separator added; the seed plays no part
    byte = prepare(tmp_path, "local", "--input", str(src), "--name", "b", "--tokenizer", "byte",
                   "--val_fraction", "0.2", "--seed", "7")
    cut = int(len(text) * 0.8)
    assert bytes(np.fromfile(tmp_path / "b" / "val.bin", np.uint16).astype(np.uint8)) == text[cut:].encode()
    assert (byte["train_tokens"], byte["val_tokens"]) == (len(text[:cut].encode()), len(text[cut:].encode()))
    assert decoded(tmp_path / "b", byte) == text and byte["seed"] is None


# ---------------------------------------------------------------- 3: enwiki, byte and gpt2

def test_enwiki_byte_counts_and_no_tags(shipped_data, tmp_path):
    wiki = shipped_data / "enwiki2015" / "AA"  # one WikiExtractor file, wiki_00: 38 articles, ~1 MB
    meta = prepare(tmp_path, "local", "--input", str(wiki), "--name", "wiki", "--tokenizer", "byte")
    bodies = wiki_articles(wiki)
    assert (meta["train_docs"], meta["val_docs"]) == (34, 4) and len(bodies) == 38
    assert (meta["train_tokens"], meta["val_tokens"]) == (931_261, 99_966)
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(b.encode()) + len(tokenizers.DOC_SEPARATOR)
                                                            for b in bodies)
    text = decoded(tmp_path / "wiki", meta)
    assert "<doc" not in text and "</doc>" not in text
    assert sorted(text.split(tokenizers.DOC_SEPARATOR)[:-1]) == sorted(p for b in bodies
                                                              for p in b.split(tokenizers.DOC_SEPARATOR))


def test_enwiki_gpt2_counts_and_no_tags(shipped_data, enc, tmp_path):
    wiki = shipped_data / "enwiki2015" / "AA"
    meta = prepare(tmp_path, "local", "--input", str(wiki), "--name", "wiki")
    bodies = wiki_articles(wiki)
    assert (meta["train_docs"], meta["val_docs"]) == (34, 4)
    assert (meta["train_tokens"], meta["val_tokens"]) == (195_522, 23_456)
    direct = sum(len(ids) + 1 for ids in enc.encode_ordinary_batch(bodies, num_threads=2))  # + 1 eot each
    assert meta["train_tokens"] + meta["val_tokens"] == direct == 218_978
    ids = np.concatenate([np.fromfile(tmp_path / "wiki" / f, dtype=meta["dtype"])
                          for f in ("train.bin", "val.bin")])
    assert (ids == 50256).sum() == len(bodies) and ids[-1] == 50256
    text = decoded(tmp_path / "wiki", meta)
    assert "<doc" not in text and "</doc>" not in text


@pytest.mark.parametrize("cut", ["before </doc>", "mid-article", "mid-header"])
def test_enwiki_cut_short_keeps_the_last_article_and_says_so(cut, shipped_data, tmp_path, capsys):
    """A WikiExtractor file whose last <doc ...> is never closed (the extraction was cut short) keeps what that
    article has, with a warning naming the file; the last article was dropped without a word."""
    wiki = (shipped_data / "enwiki2015" / "AA" / "wiki_00").read_text(encoding="utf-8")
    last = wiki.rindex('<doc id="624"')
    text = {"before </doc>": wiki[:wiki.rindex("</doc>")],
            "mid-article": wiki[:wiki.index("Bordering", last)],
            "mid-header": wiki[:last + len('<doc id="62')]}[cut]
    (tmp_path / "AA").mkdir()
    (tmp_path / "AA" / "wiki_00").write_text(text, encoding="utf-8")
    docs = P.read_documents(tmp_path / "AA")
    bodies = wiki_articles(shipped_data / "enwiki2015" / "AA")
    assert capsys.readouterr().err == (f"warning: {tmp_path / 'AA' / 'wiki_00'}: the last article has no </doc> "
                                       "(the file was cut short); its text is kept\n")
    if cut == "mid-header":  # nothing of the article's text was written: 37 whole articles
        assert docs == bodies[:-1]
    else:
        assert docs[:-1] == bodies[:-1] and len(docs) == 38
        if cut == "before </doc>":  # all its text is there: the same documents as the whole file
            assert docs[-1] == bodies[-1]
        else:  # the title line and the article's first 102 characters
            assert bodies[-1].startswith(docs[-1]) and len(docs[-1]) == 102
            assert docs[-1].startswith("Alaska\n\nAlaska () is a U.S. state")


# ---------------------------------------------------------------- other local formats, seeds, dtype

@pytest.fixture(scope="module")
def speeches(shipped_data):
    """Tiny Shakespeare's speeches (blank-line separated) as documents without blank lines inside."""
    return [s for s in (shipped_data / "tinyshakespeare" / "input.txt").read_text().split("\n\n") if s.strip()]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "txt_dir"])
def test_local_formats_keep_every_document(speeches, fmt, tmp_path):
    docs = speeches[:2000]
    if fmt == "jsonl":
        src = tmp_path / "c.jsonl"
        src.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        src = tmp_path / "c.parquet"
        pq.write_table(pa.table({"text": docs}), src)
    else:
        src = tmp_path / "c"
        (src / "sub").mkdir(parents=True)
        for i, d in enumerate(docs):
            (src / "sub" / f"{i:05d}.txt").write_text(d)
        (src / "README.md").write_text("not a document")
    meta = prepare(tmp_path / "out", "local", "--input", str(src), "--name", "c", "--tokenizer", "char")
    assert (meta["train_docs"], meta["val_docs"]) == (1800, 200)
    text = decoded(tmp_path / "out" / "c", meta)
    assert sorted(text.split(tokenizers.DOC_SEPARATOR)[:-1]) == sorted(docs)


@pytest.mark.parametrize("tokenizer", ["byte", "char", "gpt2"])
def test_jsonl_keeps_unicode_line_separators_and_replaces_a_lone_surrogate(speeches, tokenizer, tmp_path):
    """JSON Lines as json.dumps(ensure_ascii=False) writes them, with CRLF line ends: records whose strings hold
    U+2028, U+2029 and U+0085 (str.splitlines broke them: 'malformed') are read whole; a JSON-escaped lone
    surrogate (a traceback in the byte and char tokenizers) becomes U+FFFD in every tokenizer, as GPT-2's does."""
    docs = [d + ("\u2028", "\u2029", "\x85", "")[i % 4] + "end" for i, d in enumerate(speeches[:400])]
    docs[7] = "half \ud83d of a pair, then a whole one: \ud83d\ude00"
    src = tmp_path / "c.jsonl"
    src.write_bytes("".join(json.dumps({"text": d}, ensure_ascii=i == 7) + "\r\n"
                            for i, d in enumerate(docs)).encode("utf-8", "surrogatepass"))
    assert "\\ud83d of" in src.read_text("utf-8") and "\u2028" in src.read_text("utf-8")
    meta = prepare(tmp_path / "out", "local", "--input", str(src), "--name", "c", "--tokenizer", tokenizer)
    assert (meta["train_docs"], meta["val_docs"]) == (360, 40)
    text = decoded(tmp_path / "out" / "c", meta)
    separator = "<|endoftext|>" if tokenizer == "gpt2" else tokenizers.DOC_SEPARATOR
    docs[7] = "half \ufffd of a pair, then a whole one: \U0001f600"
    assert sorted(text.split(separator)[:-1]) == sorted(docs)


def test_val_fraction_counts_documents_and_a_csv_is_read_as_text(tmp_path):
    """--val_fraction counts documents: with 3 of them val holds one whole document. One file of another
    suffix is read as plain text, all of it (a folder would skip it)."""
    for i in (1, 2, 3):
        (tmp_path / "docs").mkdir(exist_ok=True)
        (tmp_path / "docs" / f"d{i}.txt").write_text("word " * 400 * i)
    P.prepare_texts(P.read_documents(tmp_path / "docs"), tmp_path / "out", tokenizer="byte", val_fraction=0.1,
                    source=str(tmp_path / "docs"), min_val_tokens=8)
    val, train = ((tmp_path / "out" / f"{split}.bin").stat().st_size // 2 for split in ("val", "train"))
    assert val in (2002, 4002, 6002) and val + train == 12006  # one whole document (its bytes and separator)
    (tmp_path / "t.csv").write_text("id,text\n1,hello\n")
    assert P.read_documents(tmp_path / "t.csv") == ["id,text\n1,hello\n"]


def test_a_folder_says_what_it_skipped(tmp_path, capsys):
    """Suffixes are read in any case (.TXT); the files that are not read are counted by suffix in a warning
    (they were skipped without a word), and a folder of none names what it holds."""
    files = {"a.txt": "doc a", "b.TXT": "doc b", "c.md": "# notes", "d": "no suffix, not WikiExtractor",
             "e.jsonl.gz": gzip.compress(b'{"text": "x"}\n'), ".DS_Store": "hidden",
             "sub/wiki_00": '<doc id="1" title="W">\nW\n\nwiki\n</doc>\n'}
    for name, data in files.items():
        (tmp_path / "c" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "c" / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    assert P.read_documents(tmp_path / "c") == ["doc a", "doc b", "W\n\nwiki"]
    assert capsys.readouterr().err == (f"warning: --input {tmp_path / 'c'}: skipped 3 files that are not .txt, "
                                       ".jsonl, .parquet or WikiExtractor output: 1 .md, 1 without a suffix, "
                                       "1 .gz\n")
    for name in ("a.txt", "b.TXT", "sub/wiki_00"):
        (tmp_path / "c" / name).unlink()
    with pytest.raises(P.DataError) as e:
        P.read_documents(tmp_path / "c")
    assert str(e.value) == (f"--input {tmp_path / 'c'} holds no .txt, .jsonl or .parquet files nor WikiExtractor "
                            "output (it holds 1 .md, 1 without a suffix, 1 .gz)")


def test_upper_case_suffixes_are_read_by_their_kind(tmp_path):
    """A .JSONL is read as JSON lines (a record per document), not as one text."""
    (tmp_path / "C.JSONL").write_text('{"text": "one"}\n{"text": "two"}\n')
    assert P.read_documents(tmp_path / "C.JSONL") == ["one", "two"]


def test_seed_fixes_the_split(speeches, tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in speeches[:1000]))
    sha = [prepare(tmp_path, "local", "--input", str(src), "--name", f"s{i}", "--tokenizer", "byte",
                   "--seed", str(seed))["sha256"]["val.bin"] for i, seed in enumerate((1, 1, 2))]
    assert sha[0] == sha[1] != sha[2]


def test_large_char_vocab_uses_uint32(tmp_path):
    alphabet = "".join(chr(c) for c in range(0x20000, 0x20000 + 70_000))  # > 65536 distinct characters
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": alphabet[i::10]}) + "\n" for i in range(10)))
    meta = prepare(tmp_path, "local", "--input", str(src), "--name", "big", "--tokenizer", "char")
    assert (meta["vocab_size"], meta["dtype"]) == (70_001, "uint32")
    assert np.fromfile(tmp_path / "big" / "train.bin", dtype="uint32").max() > 65535
    assert (sorted(decoded(tmp_path / "big", meta).split("\n\n")[:-1])
            == sorted(alphabet[i::10] for i in range(10)))


def test_codecs_round_trip(shipped_data):
    text = "Hello, wörld — 日本\n"
    for meta in ({"tokenizer": "gpt2"}, {"tokenizer": "byte"},
                 {"tokenizer": "char", "chars": sorted(set(text)), "name": "t"}):
        encode, decode = tokenizers.get_codec(meta)
        assert decode(encode(text)) == text and decode(np.array(encode(text), np.uint16)) == text
    with pytest.raises(ValueError, match="not in the vocabulary"):
        encode("xyz")


# ---------------------------------------------------------------- text encodings: BOM, compressed, UTF-16

@pytest.mark.parametrize("layout", ["file", "suffixless in a folder"])
def test_wikiextractor_file_with_a_bom(shipped_data, tmp_path, layout):
    """A leading UTF-8 byte-order mark is dropped: the file is still read as WikiExtractor output (it was one
    document with <doc tags and a U+FEFF inside), and gives the very bins of the file without it."""
    wiki = (shipped_data / "enwiki2015" / "AA" / "wiki_00").read_bytes()
    for name, data in (("plain", wiki), ("bom", codecs.BOM_UTF8 + wiki)):
        if layout == "file":
            src = tmp_path / name / "wiki_00.txt"
        else:
            src = tmp_path / name / "AA" / "wiki_00"
        src.parent.mkdir(parents=True)
        src.write_bytes(data)
        if layout != "file":
            src = src.parent
        prepare(tmp_path / "out", "local", "--input", str(src), "--name", name, "--tokenizer", "byte")
    plain, bom = (load_meta(tmp_path / "out" / n) for n in ("plain", "bom"))
    assert (bom["train_docs"], bom["val_docs"]) == (34, 4)
    assert bom["sha256"] == plain["sha256"]
    text = decoded(tmp_path / "out" / "bom", bom)
    assert "\ufeff" not in text and "<doc" not in text


def test_bom_in_jsonl_and_shakespeare(shipped_data, tmp_path):
    """The BOM is dropped for every text read: a .jsonl's first line parses, Tiny Shakespeare is unchanged."""
    src = tmp_path / "bom.jsonl"
    src.write_bytes(codecs.BOM_UTF8 + b"".join(b'{"text": "doc %d ' % i + b"x" * 200 + b'"}\n'
                                                 for i in range(100)))
    assert P.read_documents(src)[0] == "doc 0 " + "x" * 200
    txt = tmp_path / "input.txt"
    txt.write_bytes(codecs.BOM_UTF8 + (shipped_data / "tinyshakespeare" / "input.txt").read_bytes())
    assert (prepare(tmp_path, "local", "--input", str(txt), "--name", "bom", "--tokenizer", "char")["sha256"]
            == prepare(tmp_path, "shakespeare_char")["sha256"])


NOT_UTF8 = {  # case: (file name, bytes)
    "gzip": ("docs.jsonl.gz", gzip.compress(b'{"text": "a document"}\n' * 100)),
    "utf-16 le": ("u16.txt", "a document, ünïcode\n".encode("utf-16")),  # Python writes a BOM, native order
    "utf-16 be": ("u16be.txt", codecs.BOM_UTF16_BE + "a document".encode("utf-16-be")),
    "utf-32": ("u32.txt", "a document".encode("utf-32")),
    "bzip2": ("c.txt.bz2", bz2.compress(b"a document" * 100)),
}


@pytest.mark.parametrize("case", NOT_UTF8)
def test_compressed_or_utf16_input_is_refused(case, existing, monkeypatch):
    """A file that is not UTF-8 text is a named error (nothing tokenised), never bytes read as text."""
    name, data = NOT_UTF8[case]
    (existing / name).write_bytes(data)
    monkeypatch.chdir(existing)
    message = fails("data", "local", "--input", name, "--name", "x", "--overwrite", "--tokenizer", "byte")
    assert message.startswith(f"error: {name}: not valid UTF-8 (byte ")


def test_latin1_offset_counts_the_bom(tmp_path):
    """The byte offset named for other undecodable text is the file's, a BOM included."""
    (tmp_path / "l.txt").write_bytes(codecs.BOM_UTF8 + "caf\u00e9".encode("latin-1"))
    with pytest.raises(P.DataError, match=r"l.txt: not valid UTF-8 \(byte 6: b'\\xe9'\); convert it \(e.g. "
                                          r"iconv -f latin1"):
        P.read_text(tmp_path / "l.txt")


# ---------------------------------------------------------------- 4: interrupted writes

def interrupt_val_write(monkeypatch):
    """Make writing val.bin raise at its first chunk; train.bin has been written completely by then."""
    real = P.TokenWriter.write

    def flaky(self, chunk):
        if Path(self.f.name).name == "val.bin":
            raise KeyboardInterrupt
        return real(self, chunk)
    monkeypatch.setattr(P.TokenWriter, "write", flaky)


def interrupted(capsys, args):
    """Run the CLI, which is interrupted (Ctrl-C): exit code 130 and a one-line message, no traceback."""
    with pytest.raises(SystemExit) as e:
        P.main(args)
    assert e.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == "interrupted; nothing was written (existing data kept)"


def test_sigterm_while_writing_is_an_interruption_and_new_bins_never_meet_an_old_meta(shipped_data, tmp_path,
                                                                                        monkeypatch, capsys):
    """SIGTERM (kill, a job's end) while the bins are written stops like Ctrl-C: nothing left behind, the
    old dataset kept. An interruption while the finished files are moved into place leaves no meta.json (the
    old one goes first), never new bins beside an old meta.json, and the message says so."""
    args = ["shakespeare_char", "--data_dir", str(tmp_path), "--overwrite"]
    P.main(args)
    folder = tmp_path / "shakespeare_char"
    old = {f: (folder / f).read_bytes() for f in P.BIN_FILES}
    real_write, real_replace = P.TokenWriter.write, os.replace

    def killed_while_writing(self, chunk):
        signal.raise_signal(signal.SIGTERM)  # to this thread, at once (os.kill may reach another)
        return real_write(self, chunk)
    monkeypatch.setattr(P.TokenWriter, "write", killed_while_writing)
    interrupted(capsys, args)
    assert {f: (folder / f).read_bytes() for f in P.BIN_FILES} == old
    assert sorted(p.name for p in folder.iterdir()) == sorted(P.BIN_FILES)
    assert signal.getsignal(signal.SIGTERM) is not signal.default_int_handler  # main gives the handlers back

    def interrupted_while_moving(src, dst):
        real_replace(src, dst)
        if Path(dst) == folder / "train.bin":  # the new train.bin is in place, val.bin and meta.json are not
            raise KeyboardInterrupt
    monkeypatch.setattr(P.TokenWriter, "write", real_write)
    monkeypatch.setattr(P.os, "replace", interrupted_while_moving)
    with pytest.raises(SystemExit) as e:
        P.main(args + ["--val_fraction", "0.2"])  # another split: new bins, new meta.json
    assert e.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == (f"interrupted while moving files into place: {folder} has "
                                                        "no meta.json; prepare it again")
    assert sorted(p.name for p in folder.iterdir()) == ["train.bin", "val.bin"]


def test_interrupted_run_leaves_no_bins(shipped_data, tmp_path, monkeypatch, capsys):
    interrupt_val_write(monkeypatch)
    interrupted(capsys, ["shakespeare_char", "--data_dir", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []  # no bins, no meta, no temp files, not even the new empty folder


def test_interrupted_overwrite_keeps_old_dataset(shipped_data, tmp_path, monkeypatch, capsys):
    args = ["shakespeare_char"]
    prepare(tmp_path, *args)
    before = {p.name: p.read_bytes() for p in (tmp_path / "shakespeare_char").iterdir()}
    interrupt_val_write(monkeypatch)
    interrupted(capsys, [*args, "--val_fraction", "0.2", "--overwrite", "--data_dir", str(tmp_path)])
    assert {p.name: p.read_bytes() for p in (tmp_path / "shakespeare_char").iterdir()} == before


def test_a_killed_preparations_staging_folder_is_left_alone(shipped_data, tmp_path):
    """A preparation killed outright (SIGKILL: no cleanup runs) leaves data/<name>/.partial-*/; the next
    preparation of the name deletes nothing of it (it could be a concurrent preparation's) and publishes its
    own dataset as always."""
    folder = tmp_path / "shakespeare_char"
    stage = folder / ".partial-k2j_9x1q"
    stage.mkdir(parents=True)
    (stage / "train.bin").write_bytes(b"\0" * 1000)
    prepare(tmp_path, "shakespeare_char")
    assert sorted(p.name for p in folder.iterdir()) == sorted([*P.BIN_FILES, stage.name])
    assert (stage / "train.bin").read_bytes() == b"\0" * 1000


# ------------------------------------------------------------- 5: bad inputs, clear errors, nothing destroyed

@pytest.fixture
def existing(tmp_path):
    """A dataset folder 'x' that every failing run below targets with --overwrite; it must survive."""
    d = tmp_path / "data" / "x"
    d.mkdir(parents=True)
    for f in P.BIN_FILES:
        (d / f).write_text(f"old {f}")
    yield tmp_path
    assert sorted(p.name for p in d.iterdir()) == sorted(P.BIN_FILES)
    assert all((d / f).read_text() == f"old {f}" for f in P.BIN_FILES)


BAD_INPUTS = {  # case: (files to create {name: bytes}, --input, extra args, expected message parts)
    "empty file": ({"e.txt": b""}, "e.txt", [], ["e.txt", "no text found"]),
    "undecodable": ({"l.txt": "caf\u00e9 ".encode("latin-1") * 500}, "l.txt", [],
                    ["l.txt", "not valid UTF-8", "byte 3", "iconv"]),
    "undecodable in dir": ({"d/a.txt": b"fine", "d/b.txt": b"\xff\xfe"}, "d", [],
                           ["b.txt", "not valid UTF-8"]),
    "no text files": ({"d/notes.md": b"# hi", "d/img.png": b"\x89PNG"}, "d", [],
                      ["no .txt, .jsonl or .parquet"]),
    "missing input": ({}, "nope.txt", [], ["nope.txt", "does not exist"]),
    "jsonl without text": ({"j.jsonl": b'{"text": "a"}\n{"body": "b"}\n'}, "j.jsonl", [],
                           ["j.jsonl:2", "'text' field"]),
    "one document": ({"d/one.txt": b"x" * 5000}, "d", [], ["1 document(s)", "no training documents",
                                                         "pass one plain-text file as --input to split it"]),
    "one record": ({"one.jsonl": b'{"text": "a"}\n'}, "one.jsonl", [], ["1 document(s)", "no training"]),
    "one short text": ({"one.txt": b"x" * 5000}, "one.txt", [],  # split by position: 4500 + 500 bytes
                       ["one.txt: the val split has 500 tokens, shorter than one block of 1024",
                        "raise --val_fraction (now 0.1) or use a larger corpus (this one has 5,000 tokens)"]),
    "corpus too short": ({"tiny.txt": b"x" * 1500}, "tiny.txt", ["--val_fraction", "0.5"],  # no fraction fits
                         ["the train split has 750 tokens", "lower --val_fraction (now 0.5)",
                          "this one has 1,500 tokens"]),
    "val too short": ({"s.jsonl": b"".join(b'{"text": "short doc %d"}\n' % i for i in range(200))},
                      "s.jsonl", ["--tokenizer", "byte"],
                      ["val split has", "shorter than one block of 1024", "raise --val_fraction"]),
    "train too short": ({"s.jsonl": b"".join(b'{"text": "short doc %d"}\n' % i for i in range(200))},
                        "s.jsonl", ["--tokenizer", "byte", "--val_fraction", "0.99"],
                        ["train split has", "shorter than one block",
                         "lower --val_fraction (now 0.99) or use a larger corpus"]),
    "bpe_dir incomplete": ({"bpe/encoder.json": b"{}", "c.txt": b"text"}, "c.txt", ["--bpe_dir", "bpe"],
                           ["bpe/encoder.json is missing or not OpenAI's GPT-2 encoder.json", "--bpe_dir"]),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_local_input(case, existing, monkeypatch):
    files, src, extra, expected = BAD_INPUTS[case]
    for name, data in files.items():
        (existing / name).parent.mkdir(parents=True, exist_ok=True)
        (existing / name).write_bytes(data)
    monkeypatch.chdir(existing)
    if "--bpe_dir" not in extra and "--tokenizer" not in extra:
        extra = [*extra, "--tokenizer", "byte"]  # these errors come before any tokenizing: no BPE needed
    message = fails("data", "local", "--input", src, "--name", "x", "--overwrite", *extra)
    for part in expected:
        assert part in message


def test_tiny_positional_val(shipped_data, existing):
    args = ["shakespeare", "--name", "x", "--overwrite", "--val_fraction"]
    message = fails(existing / "data", *args, "1e-9")  # val = the last character
    assert "val split has 1 tokens, shorter than one block" in message and "--val_fraction" in message


def test_refuses_to_overwrite(shipped_data, existing):
    message = fails(existing / "data", "shakespeare_char", "--name", "x")
    assert "already holds a dataset" in message and "--overwrite" in message


# ---------------------------------------------------------------- GPT-2's BPE: shipped, offline, checked

def cut_network(monkeypatch):
    """Make any download fail the test: tiktoken's loaders (its download and cache path) and every socket."""
    import socket

    import tiktoken
    import tiktoken.load

    def download(*args, **kwargs):
        raise AssertionError(f"a download was attempted: {args[:1]}")
    for module, name in ((tiktoken, "get_encoding"), (tiktoken.load, "read_file"),
                         (tiktoken.load, "read_file_cached"), (socket, "getaddrinfo"),
                         (socket, "create_connection")):
        monkeypatch.setattr(module, name, download)


def test_gpt2_from_shipped_files_without_network_or_cache(shipped_data, tmp_path, monkeypatch):
    cache = tmp_path / "tiktoken_cache"
    cache.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    cut_network(monkeypatch)
    tokenizers._encoding_from_files.cache_clear()  # build it now, under these conditions
    enc = tokenizers.gpt2_encoding()
    assert enc.encode("Hello world") == [15496, 995] and enc.decode([15496, 995]) == "Hello world"
    assert (enc.n_vocab, enc.eot_token, enc.encode("<|endoftext|>", allowed_special="all")) == (50257, 50256,
                                                                                                 [50256])
    assert tokenizers.gpt2_encoding(shipped_data / "gpt2").encode("Hello world") == [15496, 995]  # --bpe_dir: the same
    assert list(cache.iterdir()) == []  # nothing written to tiktoken's cache either


def test_gpt2_ranks_equal_tiktokens_own(shipped_data, monkeypatch):
    """The ranks gpt2_encoding builds are the ones tiktoken's own reader of the two files gives."""
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken: no cache, read the local files
    theirs = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=str(shipped_data / "gpt2" / "vocab.bpe"),
                                             encoder_json_file=str(shipped_data / "gpt2" / "encoder.json"))
    enc = tokenizers.gpt2_encoding()
    assert len(theirs) == 50256 and {enc.decode_single_token_bytes(i): i for i in range(50256)} == theirs


@pytest.mark.parametrize("case", ["missing", "a file", "incomplete", "not OpenAI's"])
def test_bad_bpe_dir_is_a_named_error(case, shipped_data, tmp_path):
    """Each of the two files is checked by its sha256: a missing folder or file, or another file, is refused."""
    bpe = tmp_path / "bpe"
    if case == "a file":
        bpe.write_text("x")
    elif case != "missing":
        bpe.mkdir()
        (bpe / "encoder.json").write_bytes((shipped_data / "gpt2" / "encoder.json").read_bytes())
        if case == "not OpenAI's":
            (bpe / "vocab.bpe").write_bytes((shipped_data / "gpt2" / "vocab.bpe").read_bytes()[:-20] + b"\n")
    name = "encoder.json" if case in ("missing", "a file") else "vocab.bpe"
    with pytest.raises(P.DataError) as e:
        tokenizers.gpt2_encoding(bpe)
    assert str(e.value) == (f"{bpe / name} is missing or not OpenAI's GPT-2 {name}; pass --bpe_dir with OpenAI's "
                            "files or restore the shipped ones (git checkout -- tests/data/gpt2)")


def test_missing_shipped_bpe_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizers, "GPT2_BPE_DIR", tmp_path / "gpt2")
    (tmp_path / "gpt2").mkdir()
    message = fails(tmp_path, "shakespeare", "--name", "x")
    assert message == (f"error: {tmp_path / 'gpt2' / 'encoder.json'} is missing or not OpenAI's GPT-2 encoder.json; "
                       "pass --bpe_dir with OpenAI's files or restore the shipped ones (git checkout -- "
                       "tests/data/gpt2)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2"]  # no empty dataset folder left behind


@pytest.mark.parametrize("src, expected", [("nope.txt", "nope.txt does not exist"),
                                           ("e.txt", "no text found")])
def test_input_checked_before_bpe(src, expected, existing, monkeypatch):
    """With the default gpt2 tokenizer and its files missing, a bad input is reported, not the (later) BPE."""
    monkeypatch.setattr(tokenizers, "GPT2_BPE_DIR", existing / "no_gpt2_here")
    (existing / "e.txt").write_text("")
    monkeypatch.chdir(existing)
    message = fails("data", "local", "--input", src, "--name", "x", "--overwrite")
    assert expected in message and "GPT-2" not in message


@pytest.mark.parametrize("case", ["data_dir is a file", "name is a file", "read-only", "name too long"])
def test_unwritable_target_fails_before_any_work(case, tmp_path, monkeypatch):
    monkeypatch.setattr(P, "read_documents",
                        lambda path: pytest.fail("input read before the target was checked"))
    data_dir = tmp_path / "data"
    if case == "name too long":  # a folder name over the file system's 255 bytes: an error, not a traceback
        data_dir = tmp_path / ("d" * 300)
        message = fails(data_dir, "local", "--input", "c.txt", "--name", "x", "--tokenizer", "byte")
        assert message == (f"error: cannot write to the output folder {data_dir / 'x'} (File name too long); "
                           f"choose another")
        assert list(tmp_path.iterdir()) == []
        return
    if case == "data_dir is a file":
        data_dir.write_text("a file")
    elif case == "name is a file":
        data_dir.mkdir()
        (data_dir / "x").write_text("a file")
    else:
        def read_only(*args, **kwargs):
            raise OSError(errno.EROFS, "Read-only file system")
        monkeypatch.setattr(P.tempfile, "TemporaryFile", read_only)
    message = fails(data_dir, "local", "--input", "c.txt", "--name", "x", "--tokenizer", "byte")
    assert message.startswith(f"error: cannot write to the output folder {data_dir / 'x'} (")
    if case == "read-only":
        assert not data_dir.exists()  # the folders made for the check are gone again
    else:
        assert (data_dir if case == "data_dir is a file" else data_dir / "x").read_text() == "a file"


def test_a_parquet_file_needs_a_readable_text_column(existing):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"body": ["a", "b"]}), existing / "n.parquet")
    message = fails(existing / "data", "local", "--input", str(existing / "n.parquet"), "--name", "x",
                    "--overwrite", "--tokenizer", "byte")
    assert "n.parquet: cannot read a 'text' column (" in message
    (existing / "cut.parquet").write_bytes(b"not parquet")  # was a pyarrow traceback
    message = fails(existing / "data", "local", "--input", str(existing / "cut.parquet"), "--name", "x",
                    "--overwrite", "--tokenizer", "byte")
    assert "cut.parquet: cannot read a 'text' column (" in message and "Parquet magic bytes not found" in message


NOT_TEXT = {  # case: (file name, its JSONL lines or parquet 'text' column, expected message after its path)
    "jsonl int": ("j.jsonl", '{"text": "fine"}\n\n{"text": 12345}\n',
                  ":3: field 'text' must be a string, found int 12345"),
    "jsonl list": ("j.jsonl", '{"text": ["a", "b"]}\n', ":1: field 'text' must be a string, found list ['a', 'b']"),
    "parquet int column": ("n.parquet", [7, 12345], ": record 1: column 'text' must be a string, found int 7"),
}


@pytest.mark.parametrize("case", NOT_TEXT)
def test_a_record_whose_text_is_not_a_string_is_named(case, tmp_path):
    """Was a bare TypeError from the tokenizer, naming no file or record. Nothing is written, not even the
    --data_dir this run would have made."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    name, content, expected = NOT_TEXT[case]
    if name.endswith(".parquet"):
        pq.write_table(pa.table({"text": content}), tmp_path / name)
    else:
        (tmp_path / name).write_text(content)
    message = fails(tmp_path / "new" / "data", "local", "--input", str(tmp_path / name), "--name", "x",
                    "--tokenizer", "byte")
    assert message == f"error: {tmp_path / name}{expected}"
    assert not (tmp_path / "new").exists()


def test_openwebtext_offline_says_how_to_fix(shipped_data, tmp_path, monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'Skylion007/openwebtext' on the Hub (LocalEntryNotFoundError)")
    monkeypatch.setattr(datasets, "load_dataset", offline)
    message = fails(tmp_path, "openwebtext", "--num_proc", "1")
    for part in ("could not reach the Hugging Face Hub", "Couldn't reach", "network", "local --input"):
        assert part in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, expected", [
    (["local", "--name", "x"], "local needs --input PATH and --name NAME"),
    (["shakespeare_char", "--input", "x"], "--input is an option of local, not of shakespeare_char"),
    (["openwebtext", "--tokenizer", "char"], "openwebtext takes --tokenizer gpt2 or byte"),
    (["shakespeare_char", "--val_fraction", "0"], "--val_fraction must be between 0 and 1 (exclusive), got 0.0"),
    (["local", "--input", "c.txt", "--name", "x", "--val_fraction", "1"], "--val_fraction must be between 0 and 1"),
])
def test_usage_errors(args, expected, capsys):
    with pytest.raises(SystemExit) as e:
        P.parse_args(args)
    assert e.value.code == 2 and expected in capsys.readouterr().err


def test_an_unforeseen_error_leaves_no_empty_folder(tmp_path, monkeypatch):
    """Not only DataError: any exception after the output folder was made removes it again (if this run made
    it), so no option can leave an empty dataset folder behind."""
    def broken(*args, **kwargs):
        raise ValueError("something nlq did not foresee")
    monkeypatch.setattr(P, "prepare_texts", broken)
    with pytest.raises(ValueError, match="did not foresee"):
        P.main(["shakespeare_char", "--data_dir", str(tmp_path / "data")])
    assert not (tmp_path / "data").exists()  # nor the --data_dir it made
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)  # a folder that was there before is kept
    with pytest.raises(ValueError, match="did not foresee"):
        P.main(["shakespeare_char", "--data_dir", str(tmp_path / "data")])
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["shakespeare_char"]


def test_load_meta_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a prepared dataset"):
        load_meta(tmp_path)


# ----------------------------------------------------------- 6: the OpenWebText code path, on a local Dataset

def test_openwebtext_cli(speeches, enc, tmp_path, monkeypatch):
    """openwebtext: the Hub's dataset (here an in-memory one of its schema) read record by record, GPT-2 BPE with
    end-of-text after each document, a seeded draw of val documents."""
    import datasets
    docs = speeches[:3000:2]
    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return datasets.Dataset.from_dict({"text": docs, "url": [f"u{i}" for i in range(len(docs))]})
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    meta = prepare(tmp_path, "openwebtext", "--num_proc", "2", "--val_fraction", "0.05")
    assert calls == [(("Skylion007/openwebtext",), dict(split="train", num_proc=2))]
    kept = [d for d in docs if d]
    assert (meta["train_docs"] + meta["val_docs"], meta["eot_token"], meta["source"]) == (len(kept), 50256,
                                                                                           P.OPENWEBTEXT)
    assert 50 < meta["val_docs"] < 100  # about 5% of 1500
    assert meta["train_tokens"] + meta["val_tokens"] == sum(len(t) + 1 for t in enc.encode_ordinary_batch(kept))
    assert sorted(decoded(tmp_path / "openwebtext", meta).split("<|endoftext|>")[:-1]) == sorted(kept)


def test_cli_subprocess(tmp_path):
    cmd = ["prepare_data.py", "shakespeare_char", "--data_dir", str(tmp_path)]
    ok = run_offline(*cmd, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.splitlines() == ["Tiny Shakespeare: the copy shipped with nlq, "
                                      "tests/data/tinyshakespeare/input.txt",
                                      f"{tmp_path / 'shakespeare_char'}: 1,003,854 train + 111,540 val tokens "
                                      "(char, vocab 65, uint16)"]
    again = run_offline(*cmd, cwd=tmp_path)
    assert again.returncode == 1 and again.stderr.startswith("error: ") and "--overwrite" in again.stderr


def test_gpt2_cli_with_no_network_and_an_empty_cache(tmp_path):
    """prepare_data.py shakespeare (GPT-2 BPE), no --bpe_dir, network cut, empty tiktoken cache: the shipped
    files, nanoGPT's counts, and the cache stays empty."""
    run = run_offline("prepare_data.py", "shakespeare", "--data_dir", str(tmp_path), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "301,966 train + 36,059 val tokens (gpt2, vocab 50257, uint16)" in run.stdout
    assert list((tmp_path / "tiktoken_cache").iterdir()) == []


def test_hidden_folders_and_nul_characters(tmp_path):
    """A hidden folder's files (.ipynb_checkpoints/ holds copies: one text in train and val) are not read, as
    hidden files are not; a UTF-16 file without a byte-order mark decodes as UTF-8 full of NULs: refused."""
    (tmp_path / "corpus" / ".ipynb_checkpoints").mkdir(parents=True)
    (tmp_path / "corpus" / "one.txt").write_text("one")
    (tmp_path / "corpus" / ".ipynb_checkpoints" / "one-checkpoint.txt").write_text("one")
    assert P.corpus_files(tmp_path / "corpus") == ([tmp_path / "corpus" / "one.txt"], [])
    (tmp_path / "u16.txt").write_bytes("text".encode("utf-16-le"))
    with pytest.raises(P.DataError, match=r"u16.txt: holds NUL characters \(byte 1\): UTF-16 or not text; "
                                          r"convert it \(iconv -f utf-16le -t utf-8\)"):
        P.read_text(tmp_path / "u16.txt")
