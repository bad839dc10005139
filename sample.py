"""
Generate text from a checkpoint written by train.py, decoded with the tokenizer it was trained with.

    python sample.py --out_dir=out/shakespeare_char --start="ROMEO:" --num_samples=3 --max_new_tokens=300
    python sample.py --out_dir=out/enwiki_bytes --start=FILE:prompt.txt --temperature=0 # greedy
    python sample.py --out_dir=out/owt --top_k=50                                        # GPT-2 BPE

The checkpoint records its dataset's meta.json (the tokenizer; a char vocabulary's characters), so sampling
needs no dataset. GPT-2's tokenizer comes from the files shipped in tests/data/gpt2 (no network); --bpe_dir
names another copy. An empty --start begins at the end-of-text token (gpt2) or at a newline (char, byte).
"""
import argparse
import os
import sys

import torch
from tqdm import tqdm

from model import check_sampling
from nlq.checkpoint import load_run
from nlq.distributed import resolve_device
from nlq.preemption import exit_on_stop_signals
from nlq.settings import HelpFormatter, at_least
from nlq.tokenizers import get_codec, read_text


def prompt_ids(start, meta, encode):
    """The prompt's token ids: the text of --start (FILE:path reads a file); empty -> end-of-text (gpt2) or a
    newline."""
    if start.startswith("FILE:"):
        start = read_text(start[5:])
    if start:
        return encode(start)
    return [meta["eot_token"]] if meta["tokenizer"] == "gpt2" else encode("\n")


def generate(model, meta, encode, decode, start="", num_samples=1, max_new_tokens=200, temperature=0.8,
             top_k=None, seed=1337, device="cpu", use_cache=True, each=None, progress=False):
    """num_samples texts (the prompt included), each max_new_tokens tokens longer than the prompt.

    The RNG is seeded once, so the same seed and arguments give the same texts. temperature 0 = greedy.
    use_cache: GPT.generate's KV cache (the same texts, faster). each: called with each text as soon as it is
    generated. progress: a progress bar on a terminal (tqdm draws none off one).
    """
    x = torch.tensor([prompt_ids(start, meta, encode)], dtype=torch.long, device=device)
    torch.manual_seed(seed)
    texts = []
    for i in range(num_samples):
        with tqdm(total=max_new_tokens, desc=f"sample {i + 1} of {num_samples}", unit="tok", leave=False,
                  file=sys.stderr, disable=None if progress else True) as bar:
            y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k,
                               vocab_size=meta["vocab_size"], use_cache=use_cache, on_token=lambda _: bar.update())
        texts.append(decode(y[0].tolist()))
        if each:
            each(texts[-1])
    return texts


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--out_dir", type=os.path.expanduser, default="out", help="folder with ckpt.pt (train.py's)")
    p.add_argument("--start", default="", help="prompt text, or FILE:path to read it from a file")
    p.add_argument("--num_samples", type=at_least(1), default=1, help="texts to generate")
    p.add_argument("--max_new_tokens", type=int, default=200, help="tokens generated after the prompt")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (argmax) decoding")
    p.add_argument("--top_k", type=int, default=None, help="sample from the k most likely tokens only (0: no "
                   "top-k filter, as in transformers)")
    p.add_argument("--seed", type=int, default=1337, help="seed of the sampling RNG (same seed, same texts)")
    p.add_argument("--no_cache", action="store_true", help="run the model on the whole context for every "
                   "token instead of keeping past keys and values (same text, slower)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | mps | auto")
    p.add_argument("--bpe_dir", type=os.path.expanduser, default=None, help="GPT-2 encoder.json + vocab.bpe "
                   "(default: the copy shipped in tests/data/gpt2)")
    args = p.parse_args(argv)
    try:  # GPT.generate's own check, before the checkpoint is read
        check_sampling(args.max_new_tokens, args.temperature, args.top_k)
    except ValueError as e:
        p.error(f"--{e}")
    return args


def main(argv=None):
    """Print the samples, separated by lines of dashes; returns them as a list of str."""
    args = parse_args(argv)
    device, _, _ = resolve_device({"device": args.device, "dtype": "float32"})
    model, ckpt = load_run(args.out_dir, device)
    meta = ckpt["dataset_meta"]
    encode, decode = get_codec(meta, args.bpe_dir)
    print(f"sampling from {os.path.join(args.out_dir, 'ckpt.pt')}, iter {ckpt['iter_num']:,}", file=sys.stderr)
    return generate(model, meta, encode, decode, args.start, args.num_samples, args.max_new_tokens,
                    args.temperature, args.top_k, args.seed, device, not args.no_cache,
                    each=lambda text: print(text, "-" * 40, sep="\n", flush=True), progress=True)


if __name__ == "__main__":
    exit_on_stop_signals()  # SIGTERM, SIGUSR1, SIGUSR2: one line and status 144, as train.py
    try:
        main()
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit("interrupted")
