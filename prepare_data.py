"""Tokenise a text corpus into data/<name>/{train.bin, val.bin, meta.json} for train.py.

    python prepare_data.py shakespeare_char                       # Tiny Shakespeare shipped in tests/data
    python prepare_data.py shakespeare --download                 # GPT-2 BPE; downloads input.txt first
    python prepare_data.py local --input corpus_dir/ --name wiki --tokenizer byte
    python prepare_data.py openwebtext --num_proc 8              # ~9B tokens, ~17 GB train.bin
    python prepare_data.py fineweb_edu --subset sample-10BT --max_tokens 100_000_000     # streamed
    python prepare_data.py hf --hf_dataset roneneldan/TinyStories --name tinystories --max_docs 100000

Each .bin is a flat array of token ids (dtype in meta.json). Documents are split into train/val by a seeded
draw (--val_fraction of the documents); the shakespeare sets, and local with one plain-text file, split one
text by position (its last --val_fraction is val). gpt2 appends the end-of-text token 50256 after every
document; char/byte append DOC_SEPARATOR instead (none in a split by position, so decoding gives back the
input). GPT-2's BPE is built from the encoder.json + vocab.bpe shipped in tests/data/gpt2 (or --bpe_dir),
never downloaded. fineweb_edu and hf stream their records from the Hugging Face Hub, in order, up to
--max_docs documents or --max_tokens tokens, and draw each document's split as it comes.
The files are written into a hidden staging folder and moved into place only when all are complete, so an
interrupted run leaves the old dataset or the new one, never new bins beside an old meta.json.
"""
import argparse
import codecs
import collections
import contextlib
import hashlib
import itertools
import json
import math
import os
import re
import reprlib
import shutil
import signal
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np
from tqdm import tqdm

from nlq.checkpoint import writable_folder
from nlq.data import BIN_FILES
from nlq.settings import HelpFormatter, at_least
from nlq.tokenizers import (DOC_SEPARATOR, GPT2_EOT, GPT2_VOCAB, DataError, encode_docs, gpt2_encoding, read_text,
                            valid_text)

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
# Data shipped with nlq (provenance and licences: tests/data/PROVENANCE.md), so that the tests and the quick
# start need no download. Tiny Shakespeare is the file at SHAKESPEARE_URL.
REPO = Path(__file__).resolve().parent
SHIPPED_DATA = REPO / "tests" / "data"
SHAKESPEARE_TXT = SHIPPED_DATA / "tinyshakespeare" / "input.txt"
OPENWEBTEXT = "Skylion007/openwebtext"
FINEWEB_EDU = "HuggingFaceFW/fineweb-edu"
FINEWEB_EDU_SUBSETS = ("sample-10BT", "sample-100BT", "sample-350BT")  # configs of ~10B, 100B, 350B tokens
DATASETS = ("openwebtext", "fineweb_edu", "hf", "shakespeare", "shakespeare_char", "local")
STREAMED = ("fineweb_edu", "hf")  # read through datasets' streaming, record by record
STREAM_BATCH = 1024  # documents tokenised at a time when streaming
OPTIONS_OF = dict(subset=("fineweb_edu",), hf_dataset=("hf",), hf_config=("hf",), hf_split=("hf",),
                  text_column=("hf",), max_docs=STREAMED, max_tokens=STREAMED,
                  download=("shakespeare", "shakespeare_char"))  # options that only some datasets take
# the tokenizers of the datasets that are read record by record (a character vocabulary needs the whole corpus)
TOKENIZERS_OF = dict(openwebtext=("gpt2",), fineweb_edu=("gpt2", "byte"), hf=("gpt2", "byte"))
MIN_VAL_TOKENS = 1024  # a typical block size: a shorter split cannot fill one evaluation window
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
# WikiExtractor output: <doc id=.. title=..>text</doc>; a last article cut short (no </doc>) runs to the end
WIKI_DOC = re.compile(r"<doc [^>]*>(.*?)(?:</doc>|\Z)", re.S)


# ---------------------------------------------------------------- reading inputs

def checked_text(value, where):
    """A record's text: value if it is a string or None (no text, skipped); DataError naming where and the type
    found for anything else (a number, a list), on which the tokenizers would fail naming no record."""
    if value is None or isinstance(value, str):
        return value and valid_text(value)
    raise DataError(f"{where} must be a string, found {type(value).__name__} {reprlib.repr(value)}")


def read_file_docs(path):
    """Documents in one file: .parquet/.jsonl records (their 'text'), WikiExtractor articles, else the file."""
    path, suffix = Path(path), Path(path).suffix.lower()
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        try:
            texts = pq.read_table(path, columns=["text"]).column("text").to_pylist()
        except pa.ArrowException as e:  # not parquet, cut short, or no text column
            raise DataError(f"{path}: cannot read a 'text' column ({e})") from e
        return [t for n, t in enumerate(texts, 1) if checked_text(t, f"{path}: record {n}: column 'text'")]
    text = read_text(path)
    if suffix == ".jsonl":
        docs = []
        for n, line in enumerate(text.split("\n"), 1):  # not splitlines: U+2028 and others are text in JSON
            if not line.strip():
                continue
            try:
                value = json.loads(line)["text"]
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(f"{path}:{n}: expected a JSON object with a 'text' field ({e!r})") from e
            docs.append(checked_text(value, f"{path}:{n}: field 'text'"))
        return [d for d in docs if d]
    if text.startswith("<doc "):
        if text.rfind("<doc ") > text.rfind("</doc>"):  # extraction killed: the last article's text so far
            print(f"warning: {path}: the last article has no </doc> (the file was cut short); its text is kept",
                  file=sys.stderr)
        return [a.strip() for a in WIKI_DOC.findall(text) if a.strip()]
    return [text] if text else []


def _is_wiki(path):
    """True if the file starts with WikiExtractor's '<doc ' (after a UTF-8 byte-order mark, if any)."""
    with open(path, "rb") as f:
        return f.read(len(codecs.BOM_UTF8) + 5).removeprefix(codecs.BOM_UTF8).startswith(b"<doc ")


def is_one_text(path):
    """True if --input is one plain-text file (not .jsonl, .parquet or WikiExtractor output): local splits
    it like Tiny Shakespeare, by position (its documents are not known)."""
    path = Path(path)
    return path.is_file() and path.suffix.lower() not in (".jsonl", ".parquet") and not _is_wiki(path)


def corpus_files(folder):
    """(read, skipped): the files under folder (recursively, sorted) that read_documents reads (.txt, .jsonl,
    .parquet in any case, WikiExtractor files without a suffix), and the others. Hidden files and folders
    (.DS_Store, .ipynb_checkpoints/ with copies that would put one text in train and val) are in neither."""
    read, skipped = [], []
    for f in sorted(Path(folder).rglob("*")):
        if f.is_file() and not any(part.startswith(".") for part in f.relative_to(folder).parts):
            wanted = f.suffix.lower() in TEXT_SUFFIXES or (not f.suffix and _is_wiki(f))
            (read if wanted else skipped).append(f)
    return read, skipped


def read_documents(path):
    """Documents of a file or a folder (corpus_files); a folder's skipped files are counted in a warning."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"--input {path} does not exist")
    files, skipped = corpus_files(path) if path.is_dir() else ([path], [])
    if skipped:
        kinds = collections.Counter(f.suffix.lower() or "without a suffix" for f in skipped)
        held = ", ".join(f"{n} {suffix}" for suffix, n in kinds.most_common())
        if not files:
            raise DataError(f"--input {path} holds no .txt, .jsonl or .parquet files nor WikiExtractor output "
                            f"(it holds {held})")
        print(f"warning: --input {path}: skipped {len(skipped)} files that are not .txt, .jsonl, .parquet or "
              f"WikiExtractor output: {held}", file=sys.stderr)
    docs = [d for f in files for d in read_file_docs(f)]
    if not docs:
        raise DataError(f"--input {path}: no text found")
    return docs


def shakespeare_source(input_path=None, download=False):
    """(text, source) of Tiny Shakespeare: the file input_path, else the download, else the copy shipped with
    nlq (the same file, no network; its source is its path in the repository, the same in every clone)."""
    if download:
        try:
            with urllib.request.urlopen(SHAKESPEARE_URL, timeout=60) as r:
                return r.read().decode("utf-8"), SHAKESPEARE_URL
        except OSError as e:
            raise DataError(f"could not download Tiny Shakespeare from {SHAKESPEARE_URL} ({e}); drop --download "
                            f"to use the copy shipped with nlq ({SHAKESPEARE_TXT})") from e
    path = Path(input_path or SHAKESPEARE_TXT)
    if not path.is_file():
        raise DataError(f"{path} is not a file; pass --input with Tiny Shakespeare's input.txt, or --download")
    return read_text(path), str(input_path or SHAKESPEARE_TXT.relative_to(REPO).as_posix())


# ---------------------------------------------------------------- splitting and checking

def split_indices(n_docs, val_fraction, seed, source):
    """Sorted (train, val) document indices: a seeded draw of max(1, round(n * val_fraction)) val documents."""
    n_val = max(1, round(n_docs * val_fraction))
    if n_val >= n_docs:
        raise DataError(f"{source}: {n_docs} document(s) leave no training documents; use more documents, or "
                        "pass one plain-text file as --input to split it by position")
    is_val = np.zeros(n_docs, bool)
    is_val[np.random.default_rng(seed).permutation(n_docs)[:n_val]] = True
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def check_lengths(counts, source, val_fraction, min_tokens=MIN_VAL_TOKENS):
    """DataError unless both splits hold at least min_tokens tokens, advising a val_fraction that leaves both a
    block with a token to spare (rounded inwards to 3 decimals), or a larger corpus if none can."""
    total = sum(counts.values())
    for split, n in counts.items():
        if n < min_tokens:
            problem = f"{source}: the {split} split has {n} tokens, shorter than one block of {min_tokens}; "
            low, high = (min_tokens + 2) / total, 1 - (min_tokens + 2) / total
            if low > high:
                raise DataError(problem + f"the corpus has {total:,} tokens in all: use a corpus of at least "
                                f"{2 * min_tokens + 4:,} tokens")
            low, high = math.ceil(low * 1000) / 1000, math.floor(high * 1000) / 1000
            raise DataError(problem + f"{'raise' if split == 'val' else 'lower'} --val_fraction (now "
                            f"{val_fraction}; {low:.3f} to {high:.3f} fits this corpus's {total:,} tokens) or use "
                            f"a larger corpus")


def check_target(out_dir, overwrite):
    """DataError if out_dir holds a dataset (and overwrite is False) or cannot be made and written."""
    existing = [f for f in BIN_FILES if os.path.exists(os.path.join(out_dir, f))]
    if existing and not overwrite:
        raise DataError(f"{out_dir} already holds a dataset ({', '.join(existing)}); pass --overwrite to "
                        "replace it or choose another --name")
    try:
        writable_folder(out_dir, "the output folder")
    except ValueError as e:  # (the message serves train.py's first-use preparation too: no option names)
        raise DataError(e) from None


# ---------------------------------------------------------------- writing, atomically

class TokenWriter:
    """Appends arrays of token ids to an open binary file as dtype, counting them and hashing the bytes."""

    def __init__(self, f, dtype):
        self.f, self.dtype = f, np.dtype(dtype)
        self.count, self.digest = 0, hashlib.sha256()

    def write(self, chunk):
        """Append one array of ids; returns its size."""
        data = np.ascontiguousarray(chunk, dtype=self.dtype)
        self.f.write(data.data)
        self.digest.update(data.data)
        self.count += data.size
        return data.size

    def sync(self):
        """Flush the file to disk (before it is moved into place)."""
        self.f.flush()
        os.fsync(self.f.fileno())


def write_bin(path, chunks, dtype, total=None, progress=True):
    """Stream arrays of token ids into a new file path (memory holds one at a time) -> (tokens, sha256 hex)."""
    with open(path, "xb") as f, tqdm(total=total, unit="tok", unit_scale=True, desc=Path(path).name,
                                     disable=not progress) as bar:
        out = TokenWriter(f, dtype)
        for chunk in chunks:
            bar.update(out.write(chunk))
        out.sync()
    return out.count, out.digest.hexdigest()


@contextlib.contextmanager
def staging(out_dir):
    """A hidden folder inside out_dir for the files being written, removed on exit whatever happened."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".partial-", dir=out_dir))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def publish(stage, out_dir, meta):
    """Write meta.json into stage, remove out_dir's old meta.json, then move train.bin, val.bin and meta.json
    (last) into out_dir. Each move is atomic; an interruption between them (a window of microseconds) leaves
    bins without a meta.json, which data.py refuses, never new bins beside an old meta.json."""
    (stage / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (Path(out_dir) / "meta.json").unlink(missing_ok=True)
    for f in BIN_FILES:
        os.replace(stage / f, Path(out_dir) / f)
    return meta


def save_dataset(out_dir, splits, meta, progress=True):
    """Write {split: (chunks, total)} as <split>.bin plus meta.json; the files appear only if all succeed."""
    with staging(out_dir) as stage:
        meta["sha256"] = {}
        for split, (chunks, total) in splits.items():
            n, meta["sha256"][f"{split}.bin"] = write_bin(stage / f"{split}.bin", chunks, meta["dtype"], total,
                                                          progress)
            meta[f"{split}_tokens"] = n
        return publish(stage, out_dir, meta)


def base_meta(name, source, tokenizer, vocab_size, **extra):
    """meta.json fields known before writing; save_dataset adds token counts and hashes."""
    return dict(name=name, source=str(source), tokenizer=tokenizer, vocab_size=vocab_size,
                eot_token=GPT2_EOT if tokenizer == "gpt2" else None,
                dtype="uint16" if vocab_size <= 65536 else "uint32", **extra)


# ---------------------------------------------------------------- the pipelines (out_dir checked by run)

def prepare_texts(docs, out_dir, *, tokenizer="gpt2", positional=False, val_fraction=0.1, seed=1234,
                  num_proc=1, bpe_dir=None, source="", min_val_tokens=MIN_VAL_TOKENS, progress=True):
    """Tokenise in-memory documents and save them; positional=True splits their concatenation by position."""
    out_dir = Path(out_dir)
    enc = gpt2_encoding(bpe_dir) if tokenizer == "gpt2" else None
    if positional:  # Tiny Shakespeare's convention: one text, its first (1 - val_fraction) characters train
        text = "".join(docs)
        cut = int(len(text) * (1 - val_fraction))
        parts = {"train": [text[:cut]], "val": [text[cut:]]}
    else:
        train_idx, val_idx = split_indices(len(docs), val_fraction, seed, source)
        parts = {"train": [docs[i] for i in train_idx], "val": [docs[i] for i in val_idx]}
    chars = (sorted(set("".join(docs)) | set("" if positional else DOC_SEPARATOR)) if tokenizer == "char"
             else None)
    vocab = {"gpt2": GPT2_VOCAB, "byte": 256, "char": len(chars or ())}[tokenizer]
    meta = base_meta(out_dir.name, source, tokenizer, vocab, train_docs=len(parts["train"]),
                     val_docs=len(parts["val"]), split="position" if positional else "documents",
                     val_fraction=val_fraction, seed=None if positional else seed)
    if chars:
        meta["chars"] = chars
    tokens = {}
    for split, texts in parts.items():
        batches = range(0, len(texts), 256)  # batches: a progress bar, and threads see many documents at once
        with tqdm(batches, desc=f"tokenizing {split}", unit="batch", disable=not progress) as bar:
            tokens[split] = [a for i in bar for a in encode_docs(texts[i:i + 256], tokenizer, enc=enc,
                                                                 chars=chars, end=not positional,
                                                                 num_threads=num_proc)]
    counts = {s: sum(a.size for a in arrays) for s, arrays in tokens.items()}
    check_lengths(counts, source, val_fraction, min_val_tokens)
    return save_dataset(out_dir, {s: (tokens[s], counts[s]) for s in tokens}, meta, progress)


def _gpt2_batch(batch, bpe_dir=None):
    """datasets.map worker (module level so spawn can pickle it): ids with eot, and their count."""
    enc = gpt2_encoding(bpe_dir)
    ids = [t + [GPT2_EOT] for t in enc.encode_ordinary_batch(batch["text"], num_threads=1)]
    return {"ids": ids, "len": [len(t) for t in ids]}


def _arrow_chunks(tokenized, batch_size=1024):
    """Concatenated ids of batch_size documents at a time, straight from Arrow (bounded memory)."""
    import pyarrow.compute as pc
    for batch in tokenized.with_format("arrow").iter(batch_size=batch_size):
        yield pc.list_flatten(batch["ids"]).to_numpy()


def prepare_hf_dataset(ds, out_dir, *, bpe_dir=None, val_fraction=0.0005, seed=1234, num_proc=1,
                       source=OPENWEBTEXT, min_val_tokens=MIN_VAL_TOKENS):
    """GPT-2 tokenise a datasets.Dataset with a text column (OpenWebText) with num_proc processes and save
    it."""
    import datasets
    # uint16 ids keep datasets' cache at 2 bytes a token, not 8
    features = datasets.Features({"ids": datasets.List(datasets.Value("uint16")), "len": datasets.Value("int64")})
    out_dir = Path(out_dir)
    splits, meta = {}, base_meta(out_dir.name, source, "gpt2", GPT2_VOCAB, split="documents",
                                 val_fraction=val_fraction, seed=seed)
    for split, idx in zip(("train", "val"), split_indices(len(ds), val_fraction, seed, source)):
        tok = ds.select(idx).map(_gpt2_batch, batched=True, fn_kwargs={"bpe_dir": bpe_dir},
                                 remove_columns=ds.column_names, features=features,
                                 num_proc=min(num_proc, len(idx)), desc=f"tokenizing {split}")
        meta[f"{split}_docs"] = len(tok)
        splits[split] = tok
    counts = {s: int(np.sum(t.with_format("numpy")["len"])) for s, t in splits.items()}
    check_lengths(counts, source, val_fraction, min_val_tokens)
    return save_dataset(out_dir, {s: (_arrow_chunks(t), counts[s]) for s, t in splits.items()}, meta)


def load_openwebtext(num_proc):
    """OpenWebText from the Hugging Face Hub (~54 GB download); its parquet export where datasets no longer
    runs loading scripts (datasets >= 4)."""
    from datasets import load_dataset
    try:
        try:
            return load_dataset(OPENWEBTEXT, split="train", num_proc=num_proc)
        except RuntimeError as e:
            if "script" not in str(e):
                raise
            return load_dataset(OPENWEBTEXT, split="train", num_proc=num_proc, revision="refs/convert/parquet")
    except OSError as e:  # ConnectionError, TimeoutError, the Hub's HTTP errors
        raise DataError(f"could not reach the Hugging Face Hub for {OPENWEBTEXT} ({type(e).__name__}: {e}); "
                        "check the network, or use: python prepare_data.py local --input FILES_DIR") from e


def stream_texts(ds, text_column, source, stats):
    """The non-empty strings in the text_column of ds's records (any iterable of dicts), in order;
    stats["skipped_docs"] counts the empty and null ones. DataError for a record without the column or whose
    column is not text, or for any error of the stream itself (a lost connection, a damaged shard)."""
    n = 0
    try:
        for n, record in enumerate(ds, 1):
            if text_column not in record:
                raise DataError(f"{source}: record {n} has no column {text_column!r} (it has "
                                f"{', '.join(record)}); pass --text_column")
            text = checked_text(record[text_column], f"{source}: record {n}: column {text_column!r}")
            if text:
                yield text
            else:
                stats["skipped_docs"] += 1
    except DataError:
        raise
    except Exception as e:  # OSError, ArrowInvalid, JSONDecodeError, EOFError, ...: n records were read
        raise DataError(f"{source}: the stream failed after {n} records ({type(e).__name__}: {e}); nothing was "
                        "written") from e


def tokenized(texts, tokenizer, enc=None, num_threads=1):
    """Token arrays of texts (encode_docs: end-of-text or separator added), STREAM_BATCH texts at a time."""
    texts = iter(texts)
    for batch in iter(lambda: list(itertools.islice(texts, STREAM_BATCH)), []):
        yield from encode_docs(batch, tokenizer, enc=enc, num_threads=num_threads)


def prepare_stream(ds, out_dir, *, text_column="text", max_docs=None, max_tokens=None, tokenizer="gpt2",
                   val_fraction=0.0005, seed=1234, num_proc=1, bpe_dir=None, source="",
                   min_val_tokens=MIN_VAL_TOKENS, **meta_extra):
    """Tokenise (gpt2 or byte) the text_column of ds's records (any iterable of dicts, e.g. a streaming
    datasets.IterableDataset) in one pass and save it. Empty texts are skipped; at most max_docs documents are
    taken, and the first whose tokens would pass max_tokens ends the stream. Each document goes to val with
    probability val_fraction (a seeded draw, in stream order). meta_extra goes into meta.json."""
    out_dir = Path(out_dir)
    enc = gpt2_encoding(bpe_dir) if tokenizer == "gpt2" else None
    meta = base_meta(out_dir.name, source, tokenizer, GPT2_VOCAB if enc else 256, split="documents",
                     val_fraction=val_fraction, seed=seed, max_docs=max_docs, max_tokens=max_tokens,
                     **meta_extra)
    stats, rng = dict(train_docs=0, val_docs=0, skipped_docs=0), np.random.default_rng(seed)
    texts = itertools.islice(stream_texts(ds, text_column, source, stats), max_docs)  # None: no limit
    with staging(out_dir) as stage:
        with open(stage / "train.bin", "xb") as train, open(stage / "val.bin", "xb") as val, \
                tqdm(total=max_tokens, unit="tok", unit_scale=True, desc=source) as bar:
            out = dict(train=TokenWriter(train, meta["dtype"]), val=TokenWriter(val, meta["dtype"]))
            for ids in tokenized(texts, tokenizer, enc, num_proc):
                if max_tokens is not None and out["train"].count + out["val"].count + ids.size > max_tokens:
                    break
                split = "val" if rng.random() < val_fraction else "train"
                bar.update(out[split].write(ids))
                stats[f"{split}_docs"] += 1
            for w in out.values():
                w.sync()
        check_lengths({s: w.count for s, w in out.items()}, source, val_fraction, min_val_tokens)
        meta.update(stats, train_tokens=out["train"].count, val_tokens=out["val"].count,
                    sha256={f"{s}.bin": w.digest.hexdigest() for s, w in out.items()})
        return publish(stage, out_dir, meta)


def load_hf_stream(name, config=None, split="train"):
    """A Hugging Face Hub dataset as a streaming datasets.IterableDataset: records download as they are read."""
    from datasets import load_dataset
    try:
        return load_dataset(name, config, split=split, streaming=True)
    except (OSError, ValueError) as e:  # offline, or no such dataset, config or split (datasets lists them)
        what = name + (f" (config {config})" if config else "") + f", split {split}"
        raise DataError(f"cannot stream {what} from the Hugging Face Hub ({type(e).__name__}: {e}); check the "
                        "network, --hf_dataset, --hf_config and --hf_split") from e


# ---------------------------------------------------------------- command line

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("dataset", choices=DATASETS)
    p.add_argument("--data_dir", type=os.path.expanduser, default="data", help="output goes to DATA_DIR/NAME/")
    p.add_argument("--name", help="output folder name (default: DATASET; required for local and hf)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--input", type=os.path.expanduser, help=".txt/.jsonl/.parquet file or folder (one "
                        ".txt file: split by position); shakespeare*: a copy of input.txt")
    source.add_argument("--download", action="store_true", default=None, help="shakespeare*: download "
                        "input.txt instead of using the shipped copy (the same file)")
    p.add_argument("--tokenizer", choices=("gpt2", "char", "byte"), help="default: char for shakespeare_char, "
                   "else gpt2 (openwebtext: gpt2 only; fineweb_edu, hf: gpt2 or byte)")
    p.add_argument("--val_fraction", type=float, help="held-out fraction of documents (default 0.0005 for "
                   "openwebtext and fineweb_edu, 0.01 for hf, else 0.1; of characters where split by position)")
    hub = p.add_argument_group("fineweb_edu and hf (streamed from the Hugging Face Hub)")
    hub.add_argument("--subset", choices=FINEWEB_EDU_SUBSETS, help="fineweb_edu: its sample (default sample-10BT)")
    hub.add_argument("--hf_dataset", help="hf: the dataset's Hub name, e.g. roneneldan/TinyStories")
    hub.add_argument("--hf_config", help="hf: its config (subset), if it has several")
    hub.add_argument("--hf_split", help="hf: the split to read (default train)")
    hub.add_argument("--text_column", help="hf: the column holding the text (default text)")
    hub.add_argument("--max_docs", type=at_least(1), help="take only the first N documents of the stream")
    hub.add_argument("--max_tokens", type=at_least(1), help="take documents while their tokens total at most N")
    p.add_argument("--seed", type=int, default=1234, help="seed of the train/val document draw")
    p.add_argument("--num_proc", type=at_least(1), default=os.cpu_count() or 1, help="tokenising processes/threads")
    p.add_argument("--bpe_dir", type=os.path.expanduser, help="folder with GPT-2's encoder.json + vocab.bpe "
                   "(default: the copy shipped in tests/data/gpt2)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing DATA_DIR/NAME dataset")
    args = p.parse_args(argv)
    if args.dataset == "local" and not (args.input and args.name):
        p.error("local needs --input PATH and --name NAME")
    if args.dataset == "hf" and not (args.hf_dataset and args.name):
        p.error("hf needs --hf_dataset NAME (a Hugging Face Hub dataset) and --name NAME (the output folder)")
    if args.tokenizer not in TOKENIZERS_OF.get(args.dataset, (args.tokenizer,)) + (None,):
        p.error(f"{args.dataset} takes --tokenizer {' or '.join(TOKENIZERS_OF[args.dataset])}")
    for option, allowed in OPTIONS_OF.items():
        if getattr(args, option) is not None and args.dataset not in allowed:
            p.error(f"--{option} is an option of {' and '.join(allowed)}, not of {args.dataset}")
    if args.val_fraction is not None and not 0 < args.val_fraction < 1:
        p.error(f"--val_fraction must be between 0 and 1 (exclusive), got {args.val_fraction}")
    args.name = args.name or args.dataset
    args.tokenizer = args.tokenizer or ("char" if args.dataset == "shakespeare_char" else "gpt2")
    if args.val_fraction is None:
        args.val_fraction = {"openwebtext": 0.0005, "fineweb_edu": 0.0005, "hf": 0.01}.get(args.dataset, 0.1)
    if args.dataset == "fineweb_edu":
        args.hf_dataset, args.hf_config = FINEWEB_EDU, args.subset or FINEWEB_EDU_SUBSETS[0]
    args.hf_split, args.text_column = args.hf_split or "train", args.text_column or "text"
    return args


def run(args):
    """Prepare the dataset args (parse_args) describes; returns its meta dict. On any failure the folders this
    run made (the dataset's, and --data_dir's where it was new) are removed again."""
    out_dir = Path(args.data_dir) / args.name
    made = [d for d in (out_dir, *out_dir.parents) if not os.path.lexists(d)]  # deepest first
    try:
        check_target(out_dir, args.overwrite)  # before reading or downloading anything
        return _prepare(args, out_dir)
    except BaseException:
        for folder in made:  # (staging has removed the partial files)
            if os.path.isdir(folder) and not any(folder.iterdir()):
                folder.rmdir()
        raise


def _prepare(args, out_dir):
    common = dict(val_fraction=args.val_fraction, seed=args.seed, num_proc=args.num_proc, bpe_dir=args.bpe_dir)
    if args.dataset in TOKENIZERS_OF:  # from the Hugging Face Hub
        if args.tokenizer == "gpt2":  # before connecting
            gpt2_encoding(args.bpe_dir)
        if args.dataset == "openwebtext":
            return prepare_hf_dataset(load_openwebtext(args.num_proc), out_dir, **common)
        hub = dict(dataset=args.hf_dataset, config=args.hf_config, split=args.hf_split, text_column=args.text_column)
        return prepare_stream(load_hf_stream(args.hf_dataset, args.hf_config, args.hf_split), out_dir,
                              text_column=args.text_column, max_docs=args.max_docs, max_tokens=args.max_tokens,
                              tokenizer=args.tokenizer, source=args.hf_dataset, hf=hub, **common)
    if args.dataset == "local":  # one plain-text file is one text: split by position, as Tiny Shakespeare
        docs, kw = read_documents(args.input), dict(positional=is_one_text(args.input), source=args.input)
    else:
        text, source = shakespeare_source(args.input, args.download)
        if not args.input:
            print(f"Tiny Shakespeare: {'downloaded from' if args.download else 'the copy shipped with nlq,'} "
                  f"{source}")
        docs, kw = [text], dict(positional=True, source=source)
    return prepare_texts(docs, out_dir, tokenizer=args.tokenizer, **kw, **common)


def main(argv=None):
    args = parse_args(argv)
    # kill, a closed terminal or a job's end stop the preparation as Ctrl-C does (KeyboardInterrupt)
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        meta = run(args)
    except DataError as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:  # staging has removed the partial files
        out = Path(args.data_dir) / args.name
        cut = (out / "train.bin").exists() and not (out / "meta.json").exists()  # (publish's microseconds)
        print(f"interrupted while moving files into place: {out} has no meta.json; prepare it again" if cut else
              "interrupted; nothing was written (existing data kept)", file=sys.stderr)
        sys.exit(130)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"{Path(args.data_dir) / args.name}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} "
          f"val tokens ({meta['tokenizer']}, vocab {meta['vocab_size']}, {meta['dtype']})")


if __name__ == "__main__":  # required: datasets' num_proc workers re-import this module under spawn
    main()
