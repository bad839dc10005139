"""Tokenise a text corpus into data/<name>/{train.bin, val.bin, meta.json} for train.py.

    python prepare_data.py shakespeare_char                       # Tiny Shakespeare shipped in tests/data
    python prepare_data.py shakespeare                            # the same, GPT-2 BPE
    python prepare_data.py local --input corpus_dir/ --name wiki --tokenizer byte
    python prepare_data.py openwebtext --num_proc 8              # ~9B tokens, ~17 GB train.bin
    python prepare_data.py fineweb_edu --subset sample-10BT --max_tokens 100_000_000     # streamed
    python prepare_data.py hf --hf_dataset roneneldan/TinyStories --name tinystories --max_docs 100000

Each .bin is a flat array of token ids (dtype in meta.json). The formats, the train/val split and what an
interruption leaves: docs/data.md.
"""
import argparse
import codecs
import collections
import hashlib
import itertools
import json
import os
import re
import reprlib
import signal
import sys
import tempfile
from pathlib import Path

import numpy as np
from tqdm import tqdm

from nlq.checkpoint import writable_folder
from nlq.data import BIN_FILES
from nlq.settings import HelpFormatter, at_least
from nlq.tokenizers import (DOC_SEPARATOR, GPT2_EOT, GPT2_VOCAB, DataError, encode_docs, gpt2_encoding, read_text,
                            valid_text)

# Data shipped with nlq (provenance and licences: tests/data/PROVENANCE.md), so that the tests and the quick
# start need no download.
REPO = Path(__file__).resolve().parent
SHIPPED_DATA = REPO / "tests" / "data"
SHAKESPEARE_TXT = SHIPPED_DATA / "tinyshakespeare" / "input.txt"
OPENWEBTEXT = "Skylion007/openwebtext"
FINEWEB_EDU = "HuggingFaceFW/fineweb-edu"
FINEWEB_EDU_SUBSETS = ("sample-10BT", "sample-100BT", "sample-350BT")  # configs of ~10B, 100B, 350B tokens
DATASETS = ("openwebtext", "fineweb_edu", "hf", "shakespeare", "shakespeare_char", "local")
# read from the Hugging Face Hub record by record: gpt2 or byte (a character vocabulary needs the whole corpus)
HUB = ("openwebtext", "fineweb_edu", "hf")
STREAM_BATCH = 1024  # documents tokenised at a time
OPTIONS_OF = dict(subset=("fineweb_edu",), hf_dataset=("hf",), hf_config=("hf",), hf_split=("hf",),
                  text_column=("hf",), max_docs=HUB, max_tokens=HUB, input=("local",))  # only some datasets take
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


def write_dataset(out_dir, meta, pieces, min_val_tokens=MIN_VAL_TOKENS, total=None):
    """Write (split, token ids) pieces into train.bin and val.bin, then meta.json with their token counts and
    sha256; the files appear in out_dir only when all are complete and both splits fill a block."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    # a hidden folder inside out_dir for the files being written, removed on exit whatever happened
    with tempfile.TemporaryDirectory(prefix=".partial-", dir=out_dir, ignore_cleanup_errors=True) as stage:
        stage = Path(stage)
        with open(stage / "train.bin", "xb") as train, open(stage / "val.bin", "xb") as val, \
                tqdm(total=total, unit="tok", unit_scale=True, desc=meta["name"]) as bar:
            out = dict(train=TokenWriter(train, meta["dtype"]), val=TokenWriter(val, meta["dtype"]))
            for split, ids in pieces:
                bar.update(out[split].write(ids))
            for f in (train, val):  # on disk before they are moved into place
                f.flush()
                os.fsync(f.fileno())
        counts = {s: w.count for s, w in out.items()}
        for split, n in counts.items():  # each split fills one evaluation window
            if n < min_val_tokens:
                raise DataError(f"{meta['source']}: the {split} split has {n} tokens, shorter than one block of "
                                f"{min_val_tokens}; {'raise' if split == 'val' else 'lower'} --val_fraction (now "
                                f"{meta['val_fraction']}) or use a larger corpus (this one has "
                                f"{sum(counts.values()):,} tokens)")
        meta.update(sha256={f"{s}.bin": w.digest.hexdigest() for s, w in out.items()},
                    train_tokens=counts["train"], val_tokens=counts["val"])
        # the old meta.json goes first and the new one comes last: each move is atomic, and an interruption between
        # them (a window of microseconds) leaves bins without a meta.json, which data.py refuses, never new bins
        # beside an old meta.json
        (stage / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        (Path(out_dir) / "meta.json").unlink(missing_ok=True)
        for f in BIN_FILES:
            os.replace(stage / f, Path(out_dir) / f)
        return meta


def base_meta(name, source, tokenizer, vocab_size, **extra):
    """meta.json fields known before writing; write_dataset adds token counts and hashes."""
    return dict(name=name, source=str(source), tokenizer=tokenizer, vocab_size=vocab_size,
                eot_token=GPT2_EOT if tokenizer == "gpt2" else None,
                dtype="uint16" if vocab_size <= 65536 else "uint32", **extra)


# ---------------------------------------------------------------- the pipelines (out_dir checked by _prepare)

def tokenized(texts, tokenizer, enc=None, num_threads=1, **kw):
    """Token arrays of texts (encode_docs: end-of-text or separator added), STREAM_BATCH texts at a time."""
    texts = iter(texts)
    for batch in iter(lambda: list(itertools.islice(texts, STREAM_BATCH)), []):
        yield from encode_docs(batch, tokenizer, enc=enc, num_threads=num_threads, **kw)


def prepare_texts(docs, out_dir, *, tokenizer="gpt2", positional=False, val_fraction=0.1, seed=1234,
                  num_proc=1, bpe_dir=None, source="", min_val_tokens=MIN_VAL_TOKENS):
    """Tokenise in-memory documents and save them; positional=True splits their concatenation by position."""
    enc = gpt2_encoding(bpe_dir) if tokenizer == "gpt2" else None
    if positional:  # Tiny Shakespeare's convention: one text, its first (1 - val_fraction) characters train
        text = "".join(docs)
        cut = int(len(text) * (1 - val_fraction))
        parts = {"train": [text[:cut]], "val": [text[cut:]]}
    else:
        n_val = max(1, round(len(docs) * val_fraction))  # a seeded draw of the val documents; each split in order
        if n_val >= len(docs):
            raise DataError(f"{source}: {len(docs)} document(s) leave no training documents; use more documents, or "
                            "pass one plain-text file as --input to split it by position")
        is_val = np.zeros(len(docs), bool)
        is_val[np.random.default_rng(seed).permutation(len(docs))[:n_val]] = True
        parts = {"train": [d for d, v in zip(docs, is_val) if not v], "val": [d for d, v in zip(docs, is_val) if v]}
    chars = sorted(set("".join(docs)) | set("" if positional else DOC_SEPARATOR)) if tokenizer == "char" else None
    vocab = {"gpt2": GPT2_VOCAB, "byte": 256, "char": len(chars or ())}[tokenizer]
    meta = base_meta(Path(out_dir).name, source, tokenizer, vocab, train_docs=len(parts["train"]),
                     val_docs=len(parts["val"]), split="position" if positional else "documents",
                     val_fraction=val_fraction, seed=None if positional else seed)
    if chars:
        meta["chars"] = chars
    pieces = ((split, ids) for split, texts in parts.items()
              for ids in tokenized(texts, tokenizer, enc, num_proc, chars=chars, end=not positional))
    return write_dataset(out_dir, meta, pieces, min_val_tokens)


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


def stream_texts(ds, text_column, source, meta):
    """The non-empty strings in the text_column of ds's records (any iterable of dicts), in order;
    meta["skipped_docs"] counts the empty and null ones. DataError for a record without the column or whose
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
                meta["skipped_docs"] += 1
    except DataError:
        raise
    except Exception as e:  # OSError, ArrowInvalid, JSONDecodeError, EOFError, ...: n records were read
        raise DataError(f"{source}: the stream failed after {n} records ({type(e).__name__}: {e}); nothing was "
                        "written") from e


def prepare_stream(ds, out_dir, *, text_column="text", max_docs=None, max_tokens=None, tokenizer="gpt2",
                   val_fraction=0.0005, seed=1234, num_proc=1, bpe_dir=None, source="",
                   min_val_tokens=MIN_VAL_TOKENS, **meta_extra):
    """Tokenise (gpt2 or byte) the text_column of ds's records (any iterable of dicts: a datasets.Dataset or a
    streaming datasets.IterableDataset) in one pass and save it. Empty texts are skipped; at most max_docs
    documents are taken, and the first whose tokens would pass max_tokens ends the stream. Each document goes to
    val with probability val_fraction (a seeded draw, in stream order). meta_extra goes into meta.json."""
    enc = gpt2_encoding(bpe_dir) if tokenizer == "gpt2" else None
    meta = base_meta(Path(out_dir).name, source, tokenizer, GPT2_VOCAB if enc else 256, split="documents",
                     val_fraction=val_fraction, seed=seed, max_docs=max_docs, max_tokens=max_tokens,
                     train_docs=0, val_docs=0, skipped_docs=0, **meta_extra)
    texts = itertools.islice(stream_texts(ds, text_column, source, meta), max_docs)  # None: no limit

    def pieces():
        rng, total = np.random.default_rng(seed), 0
        for ids in tokenized(texts, tokenizer, enc, num_proc):
            total += ids.size
            if max_tokens is not None and total > max_tokens:
                return
            split = "val" if rng.random() < val_fraction else "train"
            meta[f"{split}_docs"] += 1
            yield split, ids
    return write_dataset(out_dir, meta, pieces(), min_val_tokens, total=max_tokens)


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
    p.add_argument("--input", type=os.path.expanduser, help="local: a .txt/.jsonl/.parquet file or a folder (one "
                   ".txt file: split by position)")
    p.add_argument("--tokenizer", choices=("gpt2", "char", "byte"), help="default: char for shakespeare_char, "
                   "else gpt2 (openwebtext, fineweb_edu, hf: gpt2 or byte)")
    p.add_argument("--val_fraction", type=float, help="held-out fraction of documents (default 0.0005 for "
                   "openwebtext and fineweb_edu, 0.01 for hf, else 0.1; of characters where split by position)")
    hub = p.add_argument_group("openwebtext, fineweb_edu and hf (from the Hugging Face Hub)")
    hub.add_argument("--subset", choices=FINEWEB_EDU_SUBSETS, help="fineweb_edu: its sample (default sample-10BT)")
    hub.add_argument("--hf_dataset", help="hf: the dataset's Hub name, e.g. roneneldan/TinyStories")
    hub.add_argument("--hf_config", help="hf: its config (subset), if it has several")
    hub.add_argument("--hf_split", help="hf: the split to read (default train)")
    hub.add_argument("--text_column", help="hf: the column holding the text (default text)")
    hub.add_argument("--max_docs", type=at_least(1), help="take only the first N documents")
    hub.add_argument("--max_tokens", type=at_least(1), help="take documents while their tokens total at most N")
    p.add_argument("--seed", type=int, default=1234, help="seed of the train/val document draw")
    p.add_argument("--num_proc", type=at_least(1), default=os.cpu_count() or 1, help="tokenising threads "
                   "(openwebtext: download processes too)")
    p.add_argument("--bpe_dir", type=os.path.expanduser, help="folder with GPT-2's encoder.json + vocab.bpe "
                   "(default: the copy shipped in tests/data/gpt2)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing DATA_DIR/NAME dataset")
    args = p.parse_args(argv)
    if args.dataset == "local" and not (args.input and args.name):
        p.error("local needs --input PATH and --name NAME")
    if args.dataset == "hf" and not (args.hf_dataset and args.name):
        p.error("hf needs --hf_dataset NAME (a Hugging Face Hub dataset) and --name NAME (the output folder)")
    if args.dataset in HUB and args.tokenizer == "char":
        p.error(f"{args.dataset} takes --tokenizer gpt2 or byte")
    for option, allowed in OPTIONS_OF.items():
        if getattr(args, option) is not None and args.dataset not in allowed:
            p.error(f"--{option} is an option of {', '.join(allowed)}, not of {args.dataset}")
    if args.val_fraction is not None and not 0 < args.val_fraction < 1:
        p.error(f"--val_fraction must be between 0 and 1 (exclusive), got {args.val_fraction}")
    args.name = args.name or args.dataset
    args.tokenizer = args.tokenizer or ("char" if args.dataset == "shakespeare_char" else "gpt2")
    if args.val_fraction is None:
        args.val_fraction = {"openwebtext": 0.0005, "fineweb_edu": 0.0005, "hf": 0.01}.get(args.dataset, 0.1)
    if args.dataset == "fineweb_edu":
        args.hf_dataset, args.hf_config = FINEWEB_EDU, args.subset or FINEWEB_EDU_SUBSETS[0]
    if args.dataset == "openwebtext":
        args.hf_dataset = OPENWEBTEXT
    args.hf_split, args.text_column = args.hf_split or "train", args.text_column or "text"
    return args


def run(args):
    """Prepare the dataset args (parse_args) describes; returns its meta dict. On any failure the folders this
    run made (the dataset's, and --data_dir's where it was new) are removed again."""
    out_dir = Path(args.data_dir) / args.name
    made = [d for d in (out_dir, *out_dir.parents) if not os.path.lexists(d)]  # deepest first
    try:
        return _prepare(args, out_dir)
    except BaseException:
        for folder in made:  # (write_dataset has removed the partial files)
            if os.path.isdir(folder) and not any(folder.iterdir()):
                folder.rmdir()
        raise


def _prepare(args, out_dir):
    existing = [f for f in BIN_FILES if os.path.exists(out_dir / f)]  # the target first, before reading or downloading
    if existing and not args.overwrite:
        raise DataError(f"{out_dir} already holds a dataset ({', '.join(existing)}); pass --overwrite to "
                        "replace it or choose another --name")
    try:
        writable_folder(out_dir, "the output folder")
    except ValueError as e:  # (the message serves train.py's first-use preparation too: no option names)
        raise DataError(e) from None
    common = dict(val_fraction=args.val_fraction, seed=args.seed, num_proc=args.num_proc, bpe_dir=args.bpe_dir)
    if args.dataset in HUB:
        if args.tokenizer == "gpt2":  # before connecting
            gpt2_encoding(args.bpe_dir)
        ds = (load_openwebtext(args.num_proc) if args.dataset == "openwebtext" else
              load_hf_stream(args.hf_dataset, args.hf_config, args.hf_split))
        hub = dict(dataset=args.hf_dataset, config=args.hf_config, split=args.hf_split, text_column=args.text_column)
        return prepare_stream(ds, out_dir, text_column=args.text_column, max_docs=args.max_docs,
                              max_tokens=args.max_tokens, tokenizer=args.tokenizer, source=args.hf_dataset, hf=hub,
                              **common)
    if args.dataset == "local":  # one plain-text file (not .jsonl, .parquet or WikiExtractor output) is one text,
        path = Path(args.input)  # its documents unknown: split by position, as Tiny Shakespeare
        one_text = path.is_file() and path.suffix.lower() not in (".jsonl", ".parquet") and not _is_wiki(path)
        docs, kw = read_documents(args.input), dict(positional=one_text, source=args.input)
    else:
        source = SHAKESPEARE_TXT.relative_to(REPO).as_posix()  # the same in every clone
        print(f"Tiny Shakespeare: the copy shipped with nlq, {source}")
        docs, kw = [read_text(SHAKESPEARE_TXT)], dict(positional=True, source=source)
    return prepare_texts(docs, out_dir, tokenizer=args.tokenizer, **kw, **common)


def main(argv=None):
    args = parse_args(argv)
    # kill, a closed terminal or a job's end stop the preparation as Ctrl-C does (KeyboardInterrupt)
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        meta = run(args)
    except DataError as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:  # write_dataset has removed the partial files
        out = Path(args.data_dir) / args.name
        cut = (out / "train.bin").exists() and not (out / "meta.json").exists()  # (write_dataset's last moves)
        print(f"interrupted while moving files into place: {out} has no meta.json; prepare it again" if cut else
              "interrupted; nothing was written (existing data kept)", file=sys.stderr)
        sys.exit(130)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"{Path(args.data_dir) / args.name}: {meta['train_tokens']:,} train + {meta['val_tokens']:,} "
          f"val tokens ({meta['tokenizer']}, vocab {meta['vocab_size']}, {meta['dtype']})")


if __name__ == "__main__":  # required: datasets' num_proc workers may re-import this module
    main()
