"""Tokenise a text corpus into data/<name>/{train.bin, val.bin, meta.json} for train.py.

    python prepare_data.py shakespeare_char                       # Tiny Shakespeare shipped in tests/data
    python prepare_data.py shakespeare --download                 # GPT-2 BPE; downloads input.txt first
    python prepare_data.py local --input corpus_dir/ --name wiki --tokenizer byte
    python prepare_data.py openwebtext --num_proc 8              # ~9B tokens, ~17 GB train.bin
    python prepare_data.py fineweb_edu --subset sample-10BT --max_tokens 100_000_000     # streamed
    python prepare_data.py hf --hf_dataset roneneldan/TinyStories --name tinystories --max_docs 100000

Each .bin is a flat array of token ids (dtype in meta.json). Documents are split into train/val
by a seeded draw (--val_fraction of the documents); the shakespeare sets, and local with one plain-text
file, split one text by position (the last --val_fraction of it is val; default 90/10). The GPT-2
tokenizer is built from the encoder.json + vocab.bpe shipped in tests/data/gpt2 (or --bpe_dir), never
downloaded. gpt2 appends the end-of-text token 50256 after every document; char/byte append
DOC_SEPARATOR instead (no separator in the positional split, so decoding gives back the input).
fineweb_edu and hf stream their records from the Hugging Face Hub (no full download), in order, up to
--max_docs documents or --max_tokens tokens, and draw each document's split as it comes.
Bins are staged in a hidden folder inside the target folder and renamed into place only when
every file is complete, so an interrupted run leaves no train.bin/val.bin that looks valid. A run killed
outright (SIGKILL) leaves its staging folder; the next preparation of the same name names it, with its size
and the command to delete it.
"""
import argparse
import codecs
import collections
import contextlib
import errno
import functools
import hashlib
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import urllib.request
import uuid
from pathlib import Path

import numpy as np
from tqdm import tqdm

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
# Data shipped with nlq (provenance and licences: tests/data/PROVENANCE.md): the files the tests and the quick
# start need, so that neither needs a download. Tiny Shakespeare is the file at SHAKESPEARE_URL.
REPO = Path(__file__).resolve().parent
SHIPPED_DATA = REPO / "tests" / "data"
GPT2_BPE_DIR = SHIPPED_DATA / "gpt2"  # encoder.json + vocab.bpe: the GPT-2 tokenizer unless --bpe_dir is given
SHAKESPEARE_TXT = SHIPPED_DATA / "tinyshakespeare" / "input.txt"
OPENWEBTEXT = "Skylion007/openwebtext"
FINEWEB_EDU = "HuggingFaceFW/fineweb-edu"
FINEWEB_EDU_SUBSETS = ("sample-10BT", "sample-100BT", "sample-350BT")  # configs of ~10B, 100B, 350B tokens
DATASETS = ("openwebtext", "fineweb_edu", "hf", "shakespeare", "shakespeare_char", "local")
SHIPPED_DATASETS = ("shakespeare_char", "shakespeare")  # their text ships with nlq: train.py prepares them
STREAMED = ("fineweb_edu", "hf")  # read through datasets' streaming, record by record
STREAM_BATCH = 1024  # documents tokenised at a time when streaming
# options of some datasets only
OPTIONS_OF = dict(subset=("fineweb_edu",), hf_dataset=("hf",), hf_config=("hf",), hf_split=("hf",),
                  text_column=("hf",), max_docs=STREAMED, max_tokens=STREAMED,
                  download=("shakespeare", "shakespeare_char"))
GPT2_EOT, GPT2_VOCAB = 50256, 50257
DOC_SEPARATOR = "\n\n"  # char/byte corpora: written after every document, like gpt2's end-of-text token
MIN_VAL_TOKENS = 1024  # a typical block size: a shorter val split cannot fill one evaluation window
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")
BIN_FILES = ("train.bin", "val.bin", "meta.json")  # a dataset folder (data.py reads it)
# sha256 of OpenAI's GPT-2 files, as pinned by tiktoken; a wrong file then fails loudly
BPE_SHA256 = {"encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
              "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"}
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
WIKI_DOC = re.compile(r"<doc [^>]*>(.*?)</doc>", re.S)  # WikiExtractor: <doc id=.. title=..>text</doc>


class DataError(ValueError):
    """Bad input or environment; the message names the file and the fix."""


def warn(text):
    """Print a one-line warning about the input to stderr (the run goes on)."""
    print(f"warning: {text}", file=sys.stderr)


def not_a_folder(path):
    """(part, what) for the nearest part of path (path itself or a parent) that exists but is no folder, what
    saying so for an error message ("a file, not a folder", "a link to gone/, which does not exist"); None if
    there is none."""
    for p in (Path(path), *Path(path).parents):
        if os.path.lexists(p) and not os.path.isdir(p):
            dangling = os.path.islink(p) and not os.path.exists(p)
            return p, f"a link to {os.readlink(p)}, which does not exist" if dangling else "a file, not a folder"
    return None


# ---------------------------------------------------------------- tokenizers

def gpt2_encoding(bpe_dir=None):
    """GPT-2's BPE as a tiktoken Encoding (50257 ids, end-of-text 50256), built from encoder.json + vocab.bpe.

    bpe_dir: a folder holding OpenAI's two files (--bpe_dir); None means the copy shipped with nlq in
    tests/data/gpt2 (GPT2_BPE_DIR). Never downloads and never touches tiktoken's cache. DataError naming the
    folder and the fix if a file is missing or is not OpenAI's (its sha256 is checked).
    """
    return _encoding_from_files(str(GPT2_BPE_DIR if bpe_dir is None else bpe_dir), bpe_dir is None)


def _gpt2_byte_decoder():
    """{character: byte} of GPT-2's data-gym alphabet, in which encoder.json and vocab.bpe spell bytes: the
    printable bytes stand for themselves, the others (space, control bytes, ...) for chr(256), chr(257), ...
    in byte order."""
    printable = [b for b in range(256) if chr(b).isprintable() and b != ord(" ")]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


def _bpe_error(folder, shipped, problem):
    """The DataError for GPT-2 files that cannot be used: names the folder, the problem and the fix."""
    if shipped:
        return DataError(f"the GPT-2 tokenizer shipped with nlq ({folder}) {problem}; restore it with git checkout "
                         "-- tests/data/gpt2, or pass --bpe_dir DIR with GPT-2's encoder.json and vocab.bpe")
    return DataError(f"--bpe_dir {folder} {problem}; it must be a folder with OpenAI's GPT-2 encoder.json and "
                     "vocab.bpe (openaipublic.blob.core.windows.net/gpt-2/encodings/main/)")


def _read_bpe_files(folder, shipped):
    """{name: bytes} of encoder.json and vocab.bpe in folder; _bpe_error if the folder or a file is absent or a
    file's sha256 is not OpenAI's."""
    folder = Path(folder)
    if not folder.is_dir():
        raise _bpe_error(folder, shipped, "is a file" if folder.exists() else "does not exist")
    missing = [name for name in BPE_SHA256 if not (folder / name).is_file()]
    if missing:
        raise _bpe_error(folder, shipped, f"lacks {' and '.join(missing)}")
    files = {name: (folder / name).read_bytes() for name in BPE_SHA256}
    for name, data in files.items():
        if hashlib.sha256(data).hexdigest() != BPE_SHA256[name]:
            raise _bpe_error(folder, shipped, f"has a {name} that is not OpenAI's (its sha256 is not "
                                              f"{BPE_SHA256[name]})")
    return files


@functools.lru_cache(maxsize=None)  # ~0.5 s to build; datasets.map calls this once per batch
def _encoding_from_files(bpe_dir, shipped=False):
    """gpt2_encoding's work: the ranks from vocab.bpe (merge order), checked against encoder.json."""
    import tiktoken  # imported only where a GPT-2 tokenizer is used
    files = _read_bpe_files(bpe_dir, shipped)
    encoder = json.loads(files["encoder.json"])
    merges = files["vocab.bpe"].decode("utf-8").split("\n")[1:-1]  # the lines after "#version: 0.2"
    to_byte = _gpt2_byte_decoder()

    def spelled(token):
        return bytes(to_byte[c] for c in token)
    # rank = merge priority: the 256 single bytes in alphabet order, then each merge in file order
    ranks = {bytes([b]): n for n, b in enumerate(to_byte.values())}
    for merge in merges:
        left, right = merge.split(" ")
        ranks[spelled(left) + spelled(right)] = len(ranks)
    # encoder.json must give the same ranks (as tiktoken checks too); with OpenAI's files this checks the code
    if ranks != {spelled(t): n for t, n in encoder.items() if t != "<|endoftext|>"}:
        raise DataError(f"{bpe_dir}: the ranks of vocab.bpe and encoder.json disagree")
    try:  # newer tiktoken ships an equivalent, faster form of the GPT-2 split pattern
        from tiktoken_ext.openai_public import r50k_pat_str as pattern
    except ImportError:
        pattern = GPT2_PATTERN
    return tiktoken.Encoding(name="gpt2", pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": GPT2_EOT}, explicit_n_vocab=GPT2_VOCAB)


def get_codec(meta, bpe_dir=None):
    """(encode: str -> list[int], decode: ids -> str) for a dataset's meta.json dict. ValueError for an
    unknown tokenizer, or a char one without its list of characters."""
    kind = meta.get("tokenizer")
    if kind == "gpt2":
        enc = gpt2_encoding(bpe_dir)
        return enc.encode_ordinary, lambda ids: enc.decode(np.asarray(ids).tolist())
    if kind == "byte":  # invalid UTF-8 (a sample cut mid-character) decodes to U+FFFD
        return (lambda s: list(s.encode("utf-8")),
                lambda ids: np.asarray(ids, dtype=np.uint8).tobytes().decode("utf-8", errors="replace"))
    if kind == "char":
        chars = meta.get("chars")
        if not isinstance(chars, list):
            raise ValueError(f"meta.json of dataset {meta.get('name')} has tokenizer char but no list of "
                             "chars: it was not written by prepare_data.py; prepare the dataset again")
        stoi = {c: i for i, c in enumerate(chars)}

        def encode(s):
            unknown = sorted(set(s) - stoi.keys())
            if unknown:
                raise ValueError(f"characters {unknown[:10]} are not in the vocabulary of dataset "
                                 f"{meta.get('name')}")
            return [stoi[c] for c in s]
        return encode, lambda ids: "".join(chars[i] for i in ids)
    raise ValueError(f"unknown tokenizer {kind!r} in meta.json (gpt2, char or byte); prepare the dataset "
                     "again")


def encode_docs(texts, tokenizer, *, enc=None, chars=None, end=True, num_threads=1):
    """Token ids of each text as an array; end=True adds eot (gpt2) or DOC_SEPARATOR (char/byte)."""
    if tokenizer == "gpt2":
        batch = enc.encode_ordinary_batch(texts, num_threads=num_threads)
        return [np.array(ids + [GPT2_EOT] if end else ids, np.uint16) for ids in batch]
    sep = DOC_SEPARATOR if end else ""
    if tokenizer == "byte":
        return [np.frombuffer((t + sep).encode("utf-8"), np.uint8) for t in texts]
    codepoints = np.array([ord(c) for c in chars], np.uint32)  # sorted, so id = position of the code point
    return [np.searchsorted(codepoints, np.frombuffer((t + sep).encode("utf-32-le"), np.uint32))
            for t in texts]


# ---------------------------------------------------------------- reading inputs

# Files that are not UTF-8 text but are often passed as if they were: (leading bytes, what it is, the fix).
# Checked only when a file does not decode, so that the advice fits (iconv from latin1 would make garbage of
# these). UTF-32's BOM starts like UTF-16's, so it comes first.
NOT_UTF8 = ((b"\x1f\x8b", "gzip-compressed", "decompress it first: gunzip -k {path}"),
            (b"BZh", "bzip2-compressed", "decompress it first: bunzip2 -k {path}"),
            (b"\xfd7zXZ\x00", "xz-compressed", "decompress it first: unxz -k {path}"),
            (b"\x28\xb5\x2f\xfd", "zstd-compressed", "decompress it first: unzstd {path}"),
            (b"PK\x03\x04", "a zip archive", "unpack it first (unzip {path}) and pass the text files"),
            (b"\xff\xfe\x00\x00", "UTF-32 text (it starts with a UTF-32 byte-order mark)",
             "convert it: iconv -f utf-32 -t utf-8 {path} > fixed.txt"),
            (b"\xff\xfe", "UTF-16 text (it starts with a UTF-16 byte-order mark)",
             "convert it: iconv -f utf-16 -t utf-8 {path} > fixed.txt"),
            (b"\xfe\xff", "UTF-16 text (it starts with a UTF-16 byte-order mark)",
             "convert it: iconv -f utf-16 -t utf-8 {path} > fixed.txt"))


def read_text(path):
    """A file's text as str, without a leading UTF-8 byte-order mark (editors on Windows write one; it would
    hide a WikiExtractor file's <doc and become a U+FEFF token). DataError naming the file and byte offset if it
    is not UTF-8, with the fix for what it is: compressed, UTF-16/32, or else (likely) latin1."""
    data = Path(path).read_bytes()
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        text = data[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        for magic, kind, fix in NOT_UTF8:
            if data.startswith(magic):
                raise DataError(f"{path}: not valid UTF-8: it is {kind}; {fix.format(path=path)}") from e
        at = bom + e.start  # offset in the file, BOM included
        raise DataError(f"{path}: not valid UTF-8 (byte {at}: {data[at:at + 4]!r}); "
                        f"convert it, e.g. iconv -f latin1 -t utf-8 {path} > fixed.txt, "
                        "or remove the file") from e
    if "\x00" in text:  # valid UTF-8, but text has no NUL: UTF-16 without a byte-order mark, or a binary file
        at = data.index(b"\x00")
        raise DataError(f"{path}: holds NUL characters (byte {at}), which text does not: it is "
                        f"likely UTF-16 without a byte-order mark (convert it: iconv -f utf-16le -t utf-8 {path} "
                        f"> fixed.txt) or not text; remove the file")
    return text


def read_file_docs(path):
    """Documents in one file: WikiExtractor articles (tags stripped), .jsonl/.parquet records, else the
    file."""
    path, suffix = Path(path), Path(path).suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq
        import pyarrow as pa
        try:
            schema = pq.read_schema(path)
        except pa.ArrowException as e:  # ArrowInvalid: not parquet, or cut short
            raise DataError(f"{path}: not a readable parquet file ({e}); replace it, or remove it from "
                            "--input") from e
        if "text" not in schema.names:
            raise DataError(f"{path}: no 'text' column; the parquet file needs one string column named text")
        kind = schema.field("text").type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise DataError(f"{path}: column 'text' holds {kind}, not strings; store the documents as a "
                            "string column named text")
        return [t for t in pq.read_table(path, columns=["text"]).column("text").to_pylist() if t]
    text = read_text(path)
    if suffix == ".jsonl":
        docs = []
        for n, line in enumerate(text.splitlines(), 1):
            try:
                doc = json.loads(line)["text"] if line.strip() else ""
                if not isinstance(doc, str):
                    raise TypeError(f"text is a {type(doc).__name__}")
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(f"{path}:{n}: expected a JSON object with a 'text' field per line "
                                f"({e!r})") from e
            docs.append(doc)
        return [d for d in docs if d]
    if text.startswith("<doc "):
        return wiki_articles(text, path)
    return [text] if text else []


def wiki_articles(text, path):
    """The articles of a WikiExtractor file's text: what each <doc ...> ... </doc> holds (title line and body),
    stripped, empty ones dropped.

    A last article whose </doc> never comes (the extraction was cut short: killed, disk full) is kept as far
    as it goes, with a warning naming the file. Kept, not dropped: its text is as real as any other article's,
    only shorter, and dropping it would lose data without a word; the warning says the file may want
    extracting again.
    """
    articles, end = [], 0
    for match in WIKI_DOC.finditer(text):
        articles.append(match.group(1))
        end = match.end()
    tail = text[end:].lstrip()
    if tail.startswith("<doc "):
        header, closed, body = tail.partition(">")  # a header cut before its '>' leaves no text
        articles.append(body if closed else "")
        title = re.search(r'title="([^"]*)"', header)
        warn(f"{path}: its last article ({title.group(1) if title else header[:80]!r}) has no closing </doc>: "
             f"the file looks cut short; its text so far is kept. Extract the file again if it should be complete")
    return [a.strip() for a in articles if a.strip()]


def _is_wiki(path):
    """True if the file starts with WikiExtractor's '<doc ' (after a UTF-8 byte-order mark, if any)."""
    with open(path, "rb") as f:
        head = f.read(len(codecs.BOM_UTF8) + 5)
    return head.removeprefix(codecs.BOM_UTF8).startswith(b"<doc ")


def is_one_text(path):
    """True if --input path is one plain-text file: not .jsonl or .parquet (any case), not WikiExtractor output.
    local splits such a file like Tiny Shakespeare, by position (its documents are not known)."""
    path = Path(path)
    return (path.is_file() and path.suffix.lower() not in (".jsonl", ".parquet")
            and not _is_wiki(path))


def corpus_files(folder):
    """(read, skipped): the files under folder (recursively, sorted) that read_documents reads, and the others.

    Read: .txt, .jsonl and .parquet files, the suffix in any case (notes.TXT), and files without a suffix that
    are WikiExtractor output (wiki_00). Hidden files and folders (.DS_Store, .ipynb_checkpoints/: copies that
    would put one text in train and val) are in neither list.
    """
    read, skipped = [], []
    for f in sorted(Path(folder).rglob("*")):
        hidden = any(part.startswith(".") for part in f.relative_to(folder).parts)  # .ipynb_checkpoints/ too
        if f.is_file() and not hidden:
            wanted = f.suffix.lower() in TEXT_SUFFIXES or (not f.suffix and _is_wiki(f))
            (read if wanted else skipped).append(f)
    return read, skipped


def _suffix_counts(files):
    """How many files of each suffix, most first: '2 .md, 1 .gz, 1 without a suffix'."""
    counts = collections.Counter(f.suffix.lower() or "without a suffix" for f in files)
    return ", ".join(f"{n} {suffix}" for suffix, n in counts.most_common())


def read_documents(path):
    """Documents of a file or a directory (recursively: corpus_files, sorted). The files of a directory that
    are not read are counted in a warning, by suffix; never skipped without a word."""
    path = Path(path)
    if not path.exists():
        hint = ("; the CPU studies' 30 Wikipedia files: docs/studies.md says where to get them, and "
                "tests/data/enwiki2015/AA holds one of them for a --quick trial" if "enwiki2015" in str(path) else "")
        raise DataError(f"--input {path} does not exist{hint}")
    if path.is_dir():
        files, skipped = corpus_files(path)
        if not files:
            held = f"; it holds {_suffix_counts(skipped)}" if skipped else ""
            raise DataError(f"--input {path}: directory holds no .txt, .jsonl or .parquet files "
                            f"(nor WikiExtractor output){held}; point --input at a folder of such files "
                            "or at one file")
        if skipped:
            warn(f"--input {path}: read {len(files)} file(s); skipped {len(skipped)} that are not .txt, .jsonl "
                 f"or .parquet (any case) nor WikiExtractor output: {_suffix_counts(skipped)} (e.g. "
                 f"{skipped[0]}); rename those that hold text to .txt (decompress compressed ones) to include "
                 "them")
    else:
        files = [path]
        if is_one_text(path) and path.suffix.lower() not in ("", ".txt"):  # a folder would skip it: say so
            warn(f"--input {path}: read as one plain text, all of it (a {path.suffix}'s header, commas or keys "
                 f"too); if only a column or field is the text, write it out as .txt, or as .jsonl with a "
                 f"\"text\" field")
    docs = [d for f in files for d in read_file_docs(f)]
    if not docs:
        raise DataError(f"--input {path}: no text found (empty file or only empty documents); check the path")
    return docs


def read_input_file(path):
    """read_text of --input, with a DataError if it is missing or not a file (shakespeare*: one text file)."""
    path = Path(path)
    if not path.is_file():
        problem = ("is a directory" if path.is_dir() else "does not exist" if not path.exists()
                   else "is not a file")
        raise DataError(f"--input {path} {problem}; pass the path of one text file "
                        "(Tiny Shakespeare's input.txt)")
    return read_text(path)


def download_shakespeare():
    """Tiny Shakespeare from its public URL; DataError when offline, pointing at the shipped copy."""
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=60) as r:
            return r.read().decode("utf-8")
    except OSError as e:
        raise DataError(f"could not download Tiny Shakespeare from {SHAKESPEARE_URL} ({e}); drop --download "
                        f"to use the copy shipped with nlq ({SHAKESPEARE_TXT}), or pass --input PATH/input.txt"
                        ) from e


def shakespeare_source(input_path=None, download=False):
    """(text, source) of Tiny Shakespeare: the file input_path (--input), else the download (download=True), else
    the copy shipped with nlq (SHAKESPEARE_TXT, the same file as the download, no network). source is the path
    or URL read (the shipped copy: its path in the repository, the same in every clone). DataError for a
    missing, empty or undecodable file, or a failed download."""
    if download:
        return download_shakespeare(), SHAKESPEARE_URL
    path = input_path or SHAKESPEARE_TXT
    if input_path is None and not SHAKESPEARE_TXT.is_file():
        raise DataError(f"the Tiny Shakespeare shipped with nlq ({SHAKESPEARE_TXT}) is missing; restore it "
                        "(git checkout -- tests/data/tinyshakespeare), or pass --download or --input PATH")
    text = read_input_file(path)
    if not text:
        raise DataError(f"--input {path}: the file is empty; pass Tiny Shakespeare's input.txt")
    return text, str(input_path or SHAKESPEARE_TXT.relative_to(REPO).as_posix())


# ---------------------------------------------------------------- splitting and writing

def check_fraction(val_fraction):
    if not 0 < val_fraction < 1:
        raise DataError(f"--val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")


def split_indices(n_docs, val_fraction, seed, source):
    """Sorted (train, val) document indices: a seeded draw of max(1, round(n * val_fraction)) val
    documents."""
    check_fraction(val_fraction)
    n_val = max(1, round(n_docs * val_fraction))
    if n_val >= n_docs:
        raise DataError(f"{source}: {n_docs} document(s) leave no training documents with --val_fraction "
                        f"{val_fraction}; use more documents (one per file, .jsonl line or parquet record), or "
                        "pass one plain-text file as --input to split it by position")
    is_val = np.zeros(n_docs, bool)
    is_val[np.random.default_rng(seed).permutation(n_docs)[:n_val]] = True
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def check_lengths(counts, source, val_fraction, min_tokens=MIN_VAL_TOKENS):
    """DataError unless both splits hold at least min_tokens tokens. The advice is one that can work: a
    val_fraction that leaves both splits a block with a token to spare (rounded inwards: its ends work too,
    where the split is by position; a split by documents lands near it), or a larger corpus if none can."""
    total = sum(counts.values())
    for split, n in counts.items():
        if n < min_tokens:
            problem = (f"{source}: the {split} split has {n} tokens, shorter than one block of {min_tokens}; ")
            low, high = (min_tokens + 2) / total, 1 - (min_tokens + 2) / total
            if low > high:  # no fraction gives both splits a block
                raise DataError(problem + f"the corpus has {total:,} tokens in all and each split needs "
                                f"{min_tokens}: use a corpus of at least {2 * min_tokens + 4:,} tokens")
            low, high = math.ceil(low * 1000) / 1000, math.floor(high * 1000) / 1000  # 3 decimals, inwards
            raise DataError(problem + f"{'raise' if split == 'val' else 'lower'} --val_fraction (now "
                            f"{val_fraction}; {low:.3f} to {high:.3f} fits this corpus's {total:,} tokens) or use "
                            f"a larger corpus")


def check_target(out_dir, overwrite):
    """DataError if out_dir already holds a dataset (and overwrite is False) or cannot be created and
    written."""
    try:  # before any work: a file in the way, a read-only disk, missing permissions, a too-long name fail here
        existing = [f for f in BIN_FILES if (Path(out_dir) / f).exists()]
        if existing and not overwrite:
            raise DataError(f"{out_dir} already holds a dataset ({', '.join(existing)}); pass --overwrite to "
                            "replace it or choose another --name")
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:  # (the message serves train.py's first-use preparation too: no option names)
        in_the_way = not_a_folder(out_dir)
        raise DataError(f"cannot write the output folder {out_dir} ({e.strerror or e}); "
                        + ("{} is {}; ".format(*in_the_way) if in_the_way else "")
                        + ("each folder name holds at most 255 bytes; " if e.errno == errno.ENAMETOOLONG else "")
                        + "choose a writable data_dir and a dataset name that is not a file in it") from e


class TokenWriter:
    """Appends arrays of token ids to an open binary file as dtype, counting them and hashing the bytes."""

    def __init__(self, f, dtype, path):
        self.f, self.dtype, self.path = f, np.dtype(dtype), path
        self.count, self.digest = 0, hashlib.sha256()

    def write(self, chunk):
        """Append one array of ids; returns its size. ValueError if an id does not fit dtype."""
        chunk = np.asarray(chunk)
        if chunk.size and chunk.max() > np.iinfo(self.dtype).max:
            raise ValueError(f"{self.path}: token id {chunk.max()} does not fit {self.dtype}")
        data = np.ascontiguousarray(chunk, dtype=self.dtype)
        self.f.write(data.data)
        self.digest.update(data.data)
        self.count += data.size
        return data.size


def write_bin(path, chunks, dtype, total=None, desc=None, progress=True):
    """Stream arrays of token ids into path; returns (tokens written, sha256 hex).

    Writes to a temporary file next to path and renames it into place only when complete; on any
    exception (KeyboardInterrupt included) the temp file is deleted and an existing path is untouched.
    Memory holds one chunk at a time. total (tokens) sizes the progress bar and must match if given;
    progress=False hides the bar.
    """
    path = Path(path)
    # not mkstemp: keep umask mode
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as f, tqdm(total=total, unit="tok", unit_scale=True, desc=desc or path.name,
                                        disable=not progress) as bar:
            out = TokenWriter(f, dtype, path)
            for chunk in chunks:
                bar.update(out.write(chunk))
            f.flush()
            os.fsync(f.fileno())
        if total is not None and out.count != total:
            raise ValueError(f"{path}: wrote {out.count} tokens, expected {total}")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out.count, out.digest.hexdigest()


def _folder_size(folder):
    """The bytes of the files under folder, as '3.2 GB' (files that vanish meanwhile count 0)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if total >= size:
            return f"{total / size:.1f} {unit}"
    return f"{total} bytes"


def warn_about_leftover_stages(out_dir):
    """Warn about each hidden staging folder (.partial-*) already in out_dir, with its size and the command that
    deletes it. A preparation killed outright (SIGKILL, the OOM killer: no cleanup runs) leaves its files there,
    up to 17 GB for OpenWebText; one still running (train.py's first use beside another run) is writing them
    now. Which of the two it is cannot be told safely from here, so nothing is deleted."""
    for stage in sorted(Path(out_dir).glob(".partial-*")):
        if stage.is_dir():
            warn(f"{stage} ({_folder_size(stage)}) holds the staging files of another preparation of this "
                 f"dataset, killed or still running; if none is running, delete them: "
                 f"rm -rf {shlex.quote(str(stage))}")


@contextlib.contextmanager
def staging(out_dir):
    """A hidden folder inside out_dir for the files being written; removed on exit, whatever happened (a hard
    kill leaves it: the next preparation names it, warn_about_leftover_stages)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".partial-", dir=out_dir))
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


PUBLISHED = []  # the dataset folders this main() has put in place (its message after an interruption)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_held():
    """Hold Ctrl-C and the stop signals until the block ends, then deliver those that came to the handlers
    they had (main's stop, Python's KeyboardInterrupt, or train.py's, which checkpoints at its next step).
    Python runs signal handlers in the main thread, so only there can a block be held; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for signum in dict.fromkeys(caught):  # each once, in the order they came, to its handler called here (a
        # signal raised again reaches a Python handler at whichever later bytecode checks for it: not here)
        handler = previous[signum]
        if callable(handler):
            handler(signum, None)
        elif handler != signal.SIG_IGN:  # the default action (or a handler set outside Python)
            signal.raise_signal(signum)


def publish(stage, out_dir, meta):
    """Write meta.json into stage, then move train.bin, val.bin and meta.json (last) into out_dir. The moves
    take milliseconds and a stop signal waits for them: out_dir holds the old dataset or the new one, never
    the new bins without their meta.json."""
    (stage / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    with signals_held():
        (Path(out_dir) / "meta.json").unlink(missing_ok=True)  # an old meta.json must never describe new bins
        for f in BIN_FILES:
            os.replace(stage / f, Path(out_dir) / f)
        PUBLISHED.append(str(out_dir))
    return meta


def save_dataset(out_dir, splits, meta, progress=True):
    """Write {split: (chunks, total)} as <split>.bin plus meta.json; all files appear only if all succeed."""
    with staging(out_dir) as stage:
        meta["sha256"] = {}
        for split, (chunks, total) in splits.items():
            n, meta["sha256"][f"{split}.bin"] = write_bin(stage / f"{split}.bin", chunks, meta["dtype"],
                                                          total, progress=progress)
            meta[f"{split}_tokens"] = n
        return publish(stage, out_dir, meta)


def base_meta(name, source, tokenizer, vocab_size, **extra):
    """meta.json fields known before writing; save_dataset adds token counts and hashes."""
    return dict(name=name, source=str(source), tokenizer=tokenizer, vocab_size=vocab_size,
                eot_token=GPT2_EOT if tokenizer == "gpt2" else None,
                dtype="uint16" if vocab_size <= 65536 else "uint32", **extra)


# ---------------------------------------------------------------- the two pipelines

def prepare_texts(docs, out_dir, *, tokenizer="gpt2", positional=False, val_fraction=0.1, seed=1234,
                  num_proc=1, bpe_dir=None, source="", overwrite=False, min_val_tokens=MIN_VAL_TOKENS,
                  progress=True):
    """Tokenise in-memory documents and save them; positional=True splits their concatenation by position.
    progress=False hides the progress bars."""
    out_dir = Path(out_dir)
    check_target(out_dir, overwrite)
    check_fraction(val_fraction)
    enc = gpt2_encoding(bpe_dir) if tokenizer == "gpt2" else None
    if positional:  # Tiny Shakespeare convention: one text, first (1 - val_fraction) of characters is train
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
        with tqdm(batches, desc=f"tokenizing {split}", unit="batch", disable=not progress) as bar:  # closed
            # also on Ctrl-C, so that the message goes on a line of its own
            tokens[split] = [a for i in bar for a in encode_docs(texts[i:i + 256], tokenizer, enc=enc,
                                                                 chars=chars, end=not positional,
                                                                 num_threads=num_proc)]
    counts = {s: sum(a.size for a in arrays) for s, arrays in tokens.items()}
    check_lengths(counts, source, val_fraction, min_val_tokens)
    share = counts["val"] / (counts["train"] + counts["val"])
    if not positional and abs(share - val_fraction) > val_fraction / 2:  # whole documents: few, or unequal
        warn(f"{source}: val holds {share:.1%} of the tokens ({len(val_idx)} of {len(docs)} documents): "
             f"--val_fraction {val_fraction} counts documents, not tokens; more (or more even) documents give a "
             f"closer fraction")
    return save_dataset(out_dir, {s: (tokens[s], counts[s]) for s in tokens}, meta, progress)


def _gpt2_batch(batch, bpe_dir=None):
    """datasets.map worker (module level so spawn can pickle it): ids with eot, and their count."""
    enc = gpt2_encoding(bpe_dir)
    ids = [t + [GPT2_EOT] for t in enc.encode_ordinary_batch(batch["text"], num_threads=1)]
    return {"ids": ids, "len": [len(t) for t in ids]}


def _token_features():
    """Arrow types of _gpt2_batch's output: uint16 ids keep datasets' cache at 2 bytes a token, not 8."""
    import datasets
    return datasets.Features({"ids": datasets.List(datasets.Value("uint16")), "len": datasets.Value("int64")})


def _arrow_chunks(tokenized, batch_size=1024):
    """Concatenated ids of batch_size documents at a time, straight from Arrow (bounded memory)."""
    import pyarrow.compute as pc
    for batch in tokenized.with_format("arrow").iter(batch_size=batch_size):
        yield pc.list_flatten(batch["ids"]).to_numpy()


def prepare_hf_dataset(ds, out_dir, *, bpe_dir=None, val_fraction=0.0005, seed=1234, num_proc=1,
                       source=OPENWEBTEXT, overwrite=False, min_val_tokens=MIN_VAL_TOKENS):
    """GPT-2 tokenise a datasets.Dataset with a text column (OpenWebText) with num_proc processes and save
    it."""
    out_dir = Path(out_dir)
    check_target(out_dir, overwrite)
    if "text" not in ds.column_names:
        raise DataError(f"{source}: the dataset has no 'text' column (columns: {ds.column_names})")
    gpt2_encoding(bpe_dir)  # fail here, not in every worker
    splits, meta = {}, base_meta(out_dir.name, source, "gpt2", GPT2_VOCAB, split="documents",
                                 val_fraction=val_fraction, seed=seed)
    for split, idx in zip(("train", "val"), split_indices(len(ds), val_fraction, seed, source)):
        tok = ds.select(idx).map(_gpt2_batch, batched=True, fn_kwargs={"bpe_dir": bpe_dir},
                                 remove_columns=ds.column_names, features=_token_features(),
                                 num_proc=min(num_proc, len(idx)), desc=f"tokenizing {split}")
        meta[f"{split}_docs"] = len(tok)
        splits[split] = tok
    counts = {s: int(np.sum(t.with_format("numpy")["len"])) for s, t in splits.items()}
    check_lengths(counts, source, val_fraction, min_val_tokens)
    return save_dataset(out_dir, {s: (_arrow_chunks(t), counts[s]) for s, t in splits.items()}, meta)


def load_openwebtext(num_proc):
    """OpenWebText from the Hugging Face Hub (~54 GB download); falls back to its parquet export."""
    from datasets import load_dataset
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    try:
        try:
            return load_dataset(OPENWEBTEXT, split="train", num_proc=num_proc)
        except RuntimeError as e:  # datasets >= 4 no longer runs loading scripts
            if "script" not in str(e):
                raise
            return load_dataset(OPENWEBTEXT, split="train", num_proc=num_proc,
                                revision="refs/convert/parquet")
    except (ConnectionError, TimeoutError, HfHubHTTPError, LocalEntryNotFoundError) as e:
        raise DataError(f"could not reach the Hugging Face Hub for {OPENWEBTEXT} ({type(e).__name__}: {e}); "
                        "check the network, or set HF_DATASETS_OFFLINE=1 with the dataset already in the "
                        "datasets cache (HF_HOME), or download its files elsewhere and use: "
                        "python prepare_data.py local --input FILES_DIR --name openwebtext") from e


def stream_texts(ds, text_column, source, stats):
    """The non-empty strings in the text_column of ds's records, in order; stats["skipped_docs"] counts the
    empty and null ones read. ds: any iterable of dicts (a datasets.Dataset or IterableDataset).

    DataError if a record lacks the column or holds another type there, naming the record (1-based), and for
    any error the stream itself raises: a connection that fails mid-stream (after datasets' own retries), or
    a damaged or truncated shard (pyarrow's ArrowInvalid for parquet, a JSON or decompression error).
    """
    records, n = iter(ds), 0
    while True:
        try:
            record = next(records)
        except StopIteration:
            return
        except OSError as e:  # ConnectionError, TimeoutError and the Hub's HTTP errors
            raise DataError(f"{source}: streaming failed after {n} records ({type(e).__name__}: {e}); "
                            f"nothing was written; run the command again (the stream starts from its "
                            f"beginning)") from e
        except Exception as e:  # the reader's own errors: ArrowInvalid, JSONDecodeError, zlib.error, EOFError...
            raise DataError(f"{source}: the stream could not be read after {n} records ({type(e).__name__}: "
                            f"{e}): a shard of the dataset is damaged or cut short; nothing was written. Run "
                            f"the command again; if it fails at the same record, the copy in the datasets "
                            f"cache (HF_HOME) is damaged: delete it, or report the shard to the dataset's "
                            f"owners") from e
        n += 1
        if text_column not in record:
            raise DataError(f"{source}: record {n} has no column {text_column!r} (it has "
                            f"{', '.join(record)}); pass the right --text_column")
        text = record[text_column]
        if text is not None and not isinstance(text, str):
            raise DataError(f"{source}: record {n}: column {text_column!r} is of type "
                            f"{type(text).__name__}, not a string; pass a --text_column of strings")
        if text:
            yield text
        else:
            stats["skipped_docs"] += 1


def tokenized(texts, tokenizer, enc=None, num_threads=1):
    """Token arrays of texts (encode_docs: end-of-text or separator added), STREAM_BATCH texts at a time."""
    texts = iter(texts)
    for batch in iter(lambda: list(itertools.islice(texts, STREAM_BATCH)), []):
        yield from encode_docs(batch, tokenizer, enc=enc, num_threads=num_threads)


def prepare_stream(ds, out_dir, *, text_column="text", max_docs=None, max_tokens=None, tokenizer="gpt2",
                   val_fraction=0.0005, seed=1234, num_proc=1, bpe_dir=None, source="", overwrite=False,
                   min_val_tokens=MIN_VAL_TOKENS, **meta_extra):
    """Tokenise the text_column of a dataset's records in one pass, in their order, and save it.

    ds: any iterable of dicts, e.g. a streaming datasets.IterableDataset (records are fetched as they are
    read, so a subset costs only its own download) or a datasets.Dataset. Documents are taken in order,
    empty and null texts skipped, up to max_docs documents and up to max_tokens tokens: the first document
    whose tokens (end-of-text or separator included) would pass max_tokens ends the stream (records are read
    up to STREAM_BATCH documents ahead, so skipped_docs may count a few beyond it). Each document
    goes to val with probability val_fraction (a seeded draw per document, in stream order), else to train.
    tokenizer: gpt2 or byte (char needs the whole corpus for its vocabulary). Memory holds STREAM_BATCH
    documents. meta_extra goes into meta.json. DataError for a bad record (stream_texts) or a split under
    min_val_tokens; nothing is published then.
    """
    out_dir = Path(out_dir)
    check_target(out_dir, overwrite)
    check_fraction(val_fraction)
    if tokenizer not in ("gpt2", "byte"):
        raise DataError(f"a streamed dataset is tokenised with gpt2 or byte, not {tokenizer}: a character "
                        "vocabulary needs the whole corpus first")
    columns = getattr(ds, "column_names", None)  # None for a stream whose columns are unknown until read
    if columns is not None and text_column not in columns:
        raise DataError(f"{source}: no column {text_column!r} (columns: {', '.join(columns)}); "
                        f"pass --text_column")
    enc = gpt2_encoding(bpe_dir) if tokenizer == "gpt2" else None
    meta = base_meta(out_dir.name, source, tokenizer, GPT2_VOCAB if enc else 256, split="documents",
                     val_fraction=val_fraction, seed=seed, max_docs=max_docs, max_tokens=max_tokens,
                     **meta_extra)
    stats, rng = dict(train_docs=0, val_docs=0, skipped_docs=0), np.random.default_rng(seed)
    texts = itertools.islice(stream_texts(ds, text_column, source, stats), max_docs)  # None: no limit
    with staging(out_dir) as stage:
        with contextlib.ExitStack() as files:
            out = {s: TokenWriter(files.enter_context(open(stage / f"{s}.bin", "xb")), meta["dtype"], s)
                   for s in ("train", "val")}
            bar = files.enter_context(tqdm(total=max_tokens, unit="tok", unit_scale=True, desc=source))
            for ids in tokenized(texts, tokenizer, enc, num_proc):
                if max_tokens is not None and out["train"].count + out["val"].count + ids.size > max_tokens:
                    break
                split = "val" if rng.random() < val_fraction else "train"
                bar.update(out[split].write(ids))
                stats[f"{split}_docs"] += 1
            for w in out.values():
                w.f.flush()
                os.fsync(w.f.fileno())
        check_lengths({s: w.count for s, w in out.items()}, source, val_fraction, min_val_tokens)
        meta.update(stats, train_tokens=out["train"].count, val_tokens=out["val"].count,
                    sha256={f"{s}.bin": w.digest.hexdigest() for s, w in out.items()})
        return publish(stage, out_dir, meta)


def load_hf_stream(name, config=None, split="train"):
    """A Hugging Face Hub dataset as a streaming datasets.IterableDataset: records download as they are read.

    DataError with the fix when the Hub cannot be reached, or the dataset, config or split does not exist
    (datasets' own message, which lists the valid configs or splits, is included).
    """
    from datasets import load_dataset
    what = f"{name}" + (f" (config {config})" if config else "") + f", split {split}"
    try:
        return load_dataset(name, config, split=split, streaming=True)
    except (FileNotFoundError, ValueError) as e:  # no such dataset (DatasetNotFoundError), config or split
        raise DataError(f"cannot stream {what} from the Hugging Face Hub: {e}; check the dataset name, "
                        f"--hf_config and --hf_split on its Hub page") from e
    except OSError as e:  # ConnectionError, TimeoutError, HfHubHTTPError
        raise DataError(f"could not reach the Hugging Face Hub for {what} ({type(e).__name__}: {e}); check "
                        "the network, or download its files elsewhere and use: python prepare_data.py local "
                        "--input FILES_DIR --name NAME") from e


# ---------------------------------------------------------------- command line

def parse_args(argv=None):
    from settings import HelpFormatter  # here: the tokenizing workers import this module and need no torch
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("dataset", choices=DATASETS)
    p.add_argument("--data_dir", type=os.path.expanduser,
                   default="data", help="output goes to DATA_DIR/NAME/")
    p.add_argument("--name", help="output folder name (default: DATASET; required for local)")
    p.add_argument("--input", type=os.path.expanduser, help=".txt/.jsonl/.parquet file or directory (one "
                   ".txt file: split by position; shakespeare*: a copy of input.txt; default: the one shipped "
                   "in tests/data)")
    p.add_argument("--download", action="store_true", default=None, help="shakespeare*: download input.txt "
                   "instead of using the shipped copy (the same file)")
    p.add_argument("--tokenizer", choices=("gpt2", "char", "byte"),
                   help="default: char for shakespeare_char, else gpt2 (openwebtext: gpt2 only; "
                   "fineweb_edu, hf: gpt2 or byte)")
    p.add_argument("--val_fraction", type=float, help="held-out fraction of documents (default 0.0005 for "
                   "openwebtext and fineweb_edu, 0.01 for hf, else 0.1; shakespeare* and a local .txt file: of "
                   "characters, by position)")
    hub = p.add_argument_group("fineweb_edu and hf (streamed from the Hugging Face Hub)")
    hub.add_argument("--subset", choices=FINEWEB_EDU_SUBSETS, help="fineweb_edu: its sample (default "
                     "sample-10BT)")
    hub.add_argument("--hf_dataset", help="hf: the dataset's Hub name, e.g. roneneldan/TinyStories")
    hub.add_argument("--hf_config", help="hf: its config (subset), if it has several")
    hub.add_argument("--hf_split", help="hf: the split to read (default train)")
    hub.add_argument("--text_column", help="hf: the column holding the text (default text)")
    hub.add_argument("--max_docs", type=int, help="take only the first N documents of the stream")
    hub.add_argument("--max_tokens", type=int, help="take documents while their tokens total at most N")
    p.add_argument("--seed", type=int, default=1234, help="seed of the train/val document draw (not used by "
                   "a split by position)")
    p.add_argument("--num_proc", type=int, default=os.cpu_count() or 1, help="tokenising processes/threads")
    p.add_argument("--bpe_dir", type=os.path.expanduser, help="folder with GPT-2's encoder.json + vocab.bpe "
                   "(default: the copy shipped in tests/data/gpt2)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing DATA_DIR/NAME dataset")
    args = p.parse_args(argv)
    if args.dataset == "local" and not (args.input and args.name):
        p.error("local needs --input PATH and --name NAME")
    if args.dataset == "openwebtext" and args.tokenizer not in (None, "gpt2"):
        p.error("openwebtext is prepared with --tokenizer gpt2 only")
    if args.dataset in STREAMED and args.tokenizer == "char":
        p.error(f"{args.dataset} is streamed: use --tokenizer gpt2 or byte (a character vocabulary needs the "
                "whole corpus first)")
    if args.dataset == "hf" and not (args.hf_dataset and args.name):
        p.error("hf needs --hf_dataset NAME (a Hugging Face Hub dataset) and --name NAME (the output folder)")
    for option, allowed in OPTIONS_OF.items():
        if getattr(args, option) is not None and args.dataset not in allowed:
            p.error(f"--{option} is an option of {' and '.join(allowed)}, not of {args.dataset}")
    if args.download and args.input:
        p.error("--download and --input both say where Tiny Shakespeare comes from; pass one of them")
    for option in ("max_docs", "max_tokens"):
        if getattr(args, option) is not None and getattr(args, option) < 1:
            p.error(f"--{option} must be >= 1, got {getattr(args, option)}")
    if args.num_proc < 1:
        p.error(f"--num_proc must be >= 1, got {args.num_proc}")
    if args.seed < 0:  # numpy's default_rng takes no negative seed; checked before any folder is made
        p.error(f"--seed must be >= 0, got {args.seed}; pass a non-negative integer, e.g. --seed 1234")
    if args.name is not None and (args.name.strip() in ("", ".", "..") or Path(args.name).name != args.name):
        p.error(f"--name {args.name!r} must be a plain folder name (no path separators, not '..' nor blank); "
                "use --data_dir to choose where it goes")
    if not args.data_dir.strip():
        p.error("--data_dir is empty; give a folder, e.g. --data_dir data")
    args.name = args.name or args.dataset
    args.tokenizer = args.tokenizer or ("char" if args.dataset == "shakespeare_char" else "gpt2")
    if args.val_fraction is None:
        args.val_fraction = {"openwebtext": 0.0005, "fineweb_edu": 0.0005, "hf": 0.01}.get(args.dataset, 0.1)
    if args.dataset == "fineweb_edu":
        args.hf_dataset, args.hf_config = FINEWEB_EDU, args.subset or FINEWEB_EDU_SUBSETS[0]
    args.hf_split, args.text_column = args.hf_split or "train", args.text_column or "text"
    return args


def run(args, verbose=True):
    """Prepare the dataset args (parse_args) describes; returns its meta dict. verbose=False: no progress bars
    and no note on where Tiny Shakespeare came from. A data folder this run created is removed again if it
    fails (any exception: a DataError, an interruption, or an error nlq did not foresee)."""
    out_dir = Path(args.data_dir) / args.name
    fresh = not os.path.lexists(out_dir)  # (os.path: False, not an OSError, for a name too long to look up)
    try:
        return _run(args, out_dir, verbose)
    except BaseException:  # write_bin/staging have already removed partial files
        if fresh and os.path.isdir(out_dir) and not any(out_dir.iterdir()):
            out_dir.rmdir()  # the empty folder check_target made for this run
        raise


def _run(args, out_dir, verbose):
    common = dict(val_fraction=args.val_fraction, seed=args.seed, num_proc=args.num_proc,
                  bpe_dir=args.bpe_dir, overwrite=args.overwrite)
    check_target(out_dir, args.overwrite)  # fail before reading or downloading anything
    warn_about_leftover_stages(out_dir)  # a killed run's staging files (up to 17 GB): named, with the command
    if args.dataset == "openwebtext":  # ~54 GB to download: check the BPE first
        gpt2_encoding(args.bpe_dir)
        return prepare_hf_dataset(load_openwebtext(args.num_proc), out_dir, **common)
    if args.dataset in STREAMED:
        if args.tokenizer == "gpt2":  # before connecting
            gpt2_encoding(args.bpe_dir)
        hub = dict(dataset=args.hf_dataset, config=args.hf_config, split=args.hf_split,
                   text_column=args.text_column)
        ds = load_hf_stream(args.hf_dataset, args.hf_config, args.hf_split)
        return prepare_stream(ds, out_dir, text_column=args.text_column, max_docs=args.max_docs,
                              max_tokens=args.max_tokens, tokenizer=args.tokenizer, source=args.hf_dataset,
                              hf=hub, **common)
    if args.dataset.startswith("shakespeare"):
        text, source = shakespeare_source(args.input, args.download)
        if verbose and not args.input:
            print(f"Tiny Shakespeare: {'downloaded from' if args.download else 'the copy shipped with nlq,'} "
                  f"{source}")
        docs, kw = [text], dict(positional=True, source=source)
    else:  # one plain-text file is one text: split by position, as Tiny Shakespeare (no draw of one document)
        docs = read_documents(args.input)
        kw = dict(positional=is_one_text(args.input), source=args.input)
    if args.tokenizer == "gpt2":  # after the (cheap) input checks, before any tokenising
        gpt2_encoding(args.bpe_dir)
    return prepare_texts(docs, out_dir, tokenizer=args.tokenizer, progress=verbose, **kw, **common)


def prepare_if_missing(data_dir, name):
    """Prepare data_dir/name from the data shipped with nlq if it is a shipped dataset (Tiny Shakespeare by
    characters or GPT-2 BPE) and its folder holds no dataset yet, exactly as `python prepare_data.py NAME` does:
    train.py's first use. Returns the meta dict, or None if nothing was prepared. DataError if it cannot be."""
    if name not in SHIPPED_DATASETS or any((Path(data_dir) / name / f).exists() for f in BIN_FILES):
        return None
    return run(parse_args([name, "--data_dir", str(data_dir)]), verbose=False)


def stop(signum, frame=None):
    """SIGTERM and SIGHUP (kill, a closed terminal, a job's end) stop the preparation as Ctrl-C does."""
    raise KeyboardInterrupt


def main(argv=None):
    args = parse_args(argv)
    PUBLISHED.clear()
    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS[1:]}
    try:
        meta = run(args)
    except DataError as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        print(f"interrupted, after {PUBLISHED[-1]} was written (complete)" if PUBLISHED else
              "interrupted; nothing was written (existing data kept)", file=sys.stderr)
        sys.exit(130)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"{Path(args.data_dir) / args.name}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} "
          f"val tokens ({meta['tokenizer']}, vocab {meta['vocab_size']}, {meta['dtype']})")


if __name__ == "__main__":  # required: datasets' num_proc workers re-import this module under spawn
    main()
