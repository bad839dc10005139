"""
Tokenizers: text to token ids and back, for the three kinds a dataset's meta.json names.

    gpt2   OpenAI's GPT-2 BPE (50257 ids, end-of-text 50256), built from encoder.json + vocab.bpe
    char   one id per character of the corpus (meta.json's sorted list of chars)
    byte   one id per UTF-8 byte (256 ids)

    encode, decode = get_codec(meta)          # meta: a dataset's meta.json (or a checkpoint's dataset_meta)

prepare_data.py, sample.py, eval.py and the Hugging Face exports all tokenize through this module. GPT-2's
files ship in tests/data/gpt2 and are never downloaded.

Text, for every tokenizer: files are read by read_text, as UTF-8, a leading byte-order mark dropped and Windows
line ends (\\r\\n) read as \\n, as Python's text mode (and nanoGPT) reads them. A lone surrogate (half of a
UTF-16 pair: no UTF-8 file holds one, but a JSON escape such as "\\ud83d" does) becomes U+FFFD, the
replacement character, as GPT-2's tokenizer (tiktoken) makes it.
"""
import codecs
import functools
import hashlib
import re
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
GPT2_BPE_DIR = REPO / "tests" / "data" / "gpt2"  # encoder.json + vocab.bpe, unless a bpe_dir is given
GPT2_EOT, GPT2_VOCAB = 50256, 50257
DOC_SEPARATOR = "\n\n"  # char/byte corpora: written after every document, like gpt2's end-of-text token
# sha256 of OpenAI's GPT-2 files, as pinned by tiktoken; a wrong file then fails loudly
BPE_SHA256 = {"encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
              "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"}


class DataError(ValueError):
    """Bad input data or files; the message names the file and the fix."""


def read_text(path):
    """A file's text, without a leading UTF-8 byte-order mark and with \\r\\n read as \\n (editors on Windows
    write them; a mark would become a U+FEFF token, or hide a WikiExtractor file's <doc). DataError naming the
    file if it cannot be read or is not UTF-8 text."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:  # missing, a folder, no permission
        raise DataError(f"cannot read {path} ({e.strerror or e}); give a UTF-8 text file") from None
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        text = data[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = bom + e.start  # the offset in the file
        raise DataError(f"{path}: not valid UTF-8 (byte {at}: {data[at:at + 4]!r}); convert it (e.g. iconv -f "
                        "latin1 -t utf-8), decompress it, or remove it") from e
    if "\x00" in text:  # valid UTF-8 but not text: UTF-16 without a byte-order mark, or a binary file
        raise DataError(f"{path}: holds NUL characters (byte {data.index(0)}): UTF-16 or not text; convert it "
                        "(iconv -f utf-16le -t utf-8) or remove it")
    return text.replace("\r\n", "\n")


def valid_text(text):
    """text with each lone surrogate replaced by U+FFFD (the module's docstring says why)."""
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


def gpt2_encoding(bpe_dir=None):
    """GPT-2's BPE as a tiktoken Encoding (50257 ids, end-of-text 50256), built from OpenAI's encoder.json and
    vocab.bpe in bpe_dir (None: the copy shipped in tests/data/gpt2), each checked by its sha256. Never
    downloads and never touches tiktoken's cache."""
    return _encoding_from_files(str(GPT2_BPE_DIR if bpe_dir is None else bpe_dir))


@functools.lru_cache(maxsize=None)  # ~0.5 s to build; datasets.map calls this once per batch
def _encoding_from_files(bpe_dir):
    """gpt2_encoding's work: both files checked by their sha256, the ranks from vocab.bpe (merge order)."""
    import tiktoken  # imported only where a GPT-2 tokenizer is used
    from tiktoken_ext.openai_public import r50k_pat_str  # GPT-2's pre-tokenizing split, as tiktoken writes it
    files = {}
    for name, sha in BPE_SHA256.items():
        path = Path(bpe_dir) / name
        files[name] = path.read_bytes() if path.is_file() else b""
        if hashlib.sha256(files[name]).hexdigest() != sha:
            raise DataError(f"{path} is missing or not OpenAI's GPT-2 {name}; pass --bpe_dir with OpenAI's files "
                            "or restore the shipped ones (git checkout -- tests/data/gpt2)")
    merges = files["vocab.bpe"].decode("utf-8").split("\n")[1:-1]  # the lines after "#version: 0.2"
    # GPT-2's alphabet spells bytes as characters: the printable ones as themselves, the others (space,
    # control bytes, ...) as chr(256), chr(257), ... in byte order
    printable = [b for b in range(256) if chr(b).isprintable() and b != ord(" ")]
    others = [b for b in range(256) if b not in printable]
    to_byte = {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}
    spelled = lambda token: bytes(to_byte[c] for c in token)
    # rank = merge priority: the 256 single bytes in alphabet order, then each merge in file order
    ranks = {bytes([b]): n for n, b in enumerate(to_byte.values())}
    for merge in merges:
        left, right = merge.split(" ")
        ranks[spelled(left) + spelled(right)] = len(ranks)
    return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": GPT2_EOT}, explicit_n_vocab=GPT2_VOCAB)


def get_codec(meta, bpe_dir=None):
    """(encode: str -> list[int], decode: ids -> str) for a dataset's meta.json dict."""
    kind = meta.get("tokenizer")
    if kind == "gpt2":
        enc = gpt2_encoding(bpe_dir)
        return enc.encode_ordinary, lambda ids: enc.decode(np.asarray(ids).tolist())
    if kind == "byte":  # invalid UTF-8 (a sample cut mid-character) decodes to U+FFFD
        return (lambda s: list(valid_text(s).encode("utf-8")),
                lambda ids: np.asarray(ids, dtype=np.uint8).tobytes().decode("utf-8", errors="replace"))
    if kind == "char":
        chars = meta.get("chars")
        if not isinstance(chars, list):
            raise ValueError("meta.json has tokenizer char but no list of chars; prepare the dataset again")
        stoi = {c: i for i, c in enumerate(chars)}

        def encode(s):
            s = valid_text(s)
            unknown = sorted(set(s) - stoi.keys())
            if unknown:
                raise ValueError(f"characters {unknown[:10]} are not in the vocabulary of dataset "
                                 f"{meta.get('name')}")
            return [stoi[c] for c in s]
        return encode, lambda ids: "".join(chars[i] for i in ids)
    raise ValueError(f"unknown tokenizer {kind!r} in meta.json (gpt2, char or byte); prepare the dataset again")


def encode_docs(texts, tokenizer, *, enc=None, chars=None, end=True, num_threads=1):
    """Token ids of each text as an array; end=True adds eot (gpt2) or DOC_SEPARATOR (char/byte)."""
    if tokenizer == "gpt2":
        batch = enc.encode_ordinary_batch(texts, num_threads=num_threads)
        return [np.array(ids + [GPT2_EOT] if end else ids, np.uint16) for ids in batch]
    sep = DOC_SEPARATOR if end else ""
    if tokenizer == "byte":
        return [np.frombuffer((t + sep).encode("utf-8"), np.uint8) for t in texts]
    codepoints = np.array([ord(c) for c in chars], np.uint32)  # sorted, so id = position of the code point
    return [np.searchsorted(codepoints, np.frombuffer((t + sep).encode("utf-32-le"), np.uint32)) for t in texts]


def token_bytes(meta, bpe_dir=None):
    """UTF-8 byte length of each token id's text, an int64 array indexed by id: byte 1 each; char the
    character's length; gpt2 the token's bytes, 0 for end-of-text (a document boundary, not text). Summed over
    target ids it gives the bytes of their text exactly, also where a window cuts a character in two."""
    kind = meta["tokenizer"]
    if kind == "byte":
        return np.ones(256, np.int64)
    if kind == "char":
        get_codec(meta)  # a clear error if meta.json lacks the characters
        return np.array([len(c.encode("utf-8")) for c in meta["chars"]], np.int64)
    enc = gpt2_encoding(bpe_dir)
    return np.array([len(enc.decode_single_token_bytes(i)) for i in range(GPT2_EOT)] + [0], np.int64)
