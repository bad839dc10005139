"""
Generate text from a checkpoint written by train.py, decoded with its dataset's tokenizer (meta.json).

    python sample.py --out_dir=out/shakespeare_char --start="ROMEO:" --num_samples=3 --max_new_tokens=300
    python sample.py --out_dir=out/enwiki_bytes --start=FILE:prompt.txt --temperature=0 # greedy
    python sample.py --out_dir=out/owt --top_k=50                                        # GPT-2 BPE

The dataset is found from the checkpoint's config (data_dir/dataset); pass --data_dir if the data moved.
GPT-2's tokenizer comes from the files shipped in tests/data/gpt2 (no network); --bpe_dir names another copy.
An empty --start begins at the end-of-text token (gpt2) or at a newline (char, byte).
"""
import argparse
import math
import os
import sys

import torch
from tqdm import tqdm

from common import (MAX_SEED, HelpFormatter, check_same_dataset, load_checkpoint as read_checkpoint,
                    model_from_checkpoint, read_metrics, resolve_device)
from prepare_data import DataError, get_codec, load_meta, read_text

HERE = os.path.dirname(os.path.abspath(__file__))


def dataset_dir(cfg, data_dir=None):
    """Folder of the checkpoint's dataset: data_dir/dataset, with data_dir from the argument or the config.

    A relative config data_dir is tried from the current folder, then from this repository. FileNotFoundError
    if neither holds a meta.json.
    """
    roots = [data_dir] if data_dir else [cfg["data_dir"], os.path.join(HERE, cfg["data_dir"])]
    for root in roots:
        path = os.path.join(root, cfg["dataset"])
        if os.path.isfile(os.path.join(path, "meta.json")):
            return path
    raise FileNotFoundError(f"dataset {cfg['dataset']!r} not found (looked in "
                            f"{', '.join(os.path.join(r, cfg['dataset']) for r in roots)}); "
                            f"pass --data_dir DIR with DIR/{cfg['dataset']}/meta.json, "
                            f"or prepare it with prepare_data.py")


def find_dataset(out_dir, data_dir=None, need_data=True, dataset=None):
    """The dataset of out_dir/ckpt.pt, found without reading its weights (the file is memory-mapped) ->
    (meta dict, dataset folder). Call it first, and check the tokenizer, before load_checkpoint reads a large
    file. need_data=False (sampling, HellaSwag: only the tokenizer is needed): where the dataset folder is
    missing, the tokenizer the checkpoint records (dataset_meta: gpt2, byte, or char with its characters, or
    convert.py official --tokenizer) serves, and the dataset folder is None. dataset: another prepared
    dataset's name (in data_dir, or the checkpoint's data_dir) instead of the one it was trained on; it must
    have the same tokenizer.

    FileNotFoundError naming the path and how to make a checkpoint if there is none, or the dataset if it is
    not found (and needed); ValueError if the checkpoint records its dataset's meta.json (dataset_meta) and the
    dataset found now differs from it (with `dataset` or need_data=False: if its tokenizer differs; the same
    tokenizer on re-prepared or other text is fine there).
    """
    path = os.path.join(out_dir, "ckpt.pt")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}; train one first, e.g. "
                                f"python train.py config/shakespeare_char.py --out_dir={out_dir}")
    ckpt = read_checkpoint(path, mmap=True)
    saved = ckpt.get("dataset_meta") or {}
    if dataset is not None:
        data = dataset_dir({**ckpt["config"], "dataset": dataset}, data_dir)
        meta = load_meta(data)
        if not saved:  # a checkpoint from before dataset_meta was recorded: its own dataset's meta.json
            try:
                saved = load_meta(dataset_dir(ckpt["config"], data_dir))
            except FileNotFoundError:
                raise ValueError(f"{path} does not record its tokenizer (it predates that) and its own dataset "
                                 f"{ckpt['config']['dataset']!r} is not found to read it from, so {data} "
                                 f"cannot be checked; put that dataset in --data_dir") from None
        check_same_tokenizer(saved, meta, data)
        return meta, data
    try:
        data = dataset_dir(ckpt["config"], data_dir)
    except FileNotFoundError:  # where only the tokenizer is needed, the checkpoint's record of it serves
        decodable = saved.get("tokenizer") in ("gpt2", "byte") or saved.get("chars")  # (convert.py's too)
        if need_data or not decodable:
            raise
        return saved, None
    meta = load_meta(data)
    if "dataset_meta" in ckpt:  # older checkpoints lack it; without need_data only the tokenizer must match
        (check_same_dataset if need_data else check_same_tokenizer)(ckpt["dataset_meta"], meta, data)
    return meta, data


def check_same_tokenizer(trained, meta, data):
    """ValueError unless the dataset at data (its meta.json dict: meta) is tokenised as the checkpoint's
    training data was (trained: the checkpoint's dataset_meta): the same tokenizer, vocabulary size and, for
    char data, the same characters in the same order. The text itself may differ."""
    diffs = [f"{key} {trained.get(key)!r} at training, {meta.get(key)!r} now"
             for key in ("tokenizer", "vocab_size") if trained.get(key) != meta.get(key)]
    fix = f"prepare that text with the checkpoint's tokenizer ({trained.get('tokenizer')})"
    if not diffs and trained.get("chars") != meta.get("chars"):
        diffs = ["other characters, or the same in another order"]
    if trained.get("tokenizer") == meta.get("tokenizer") == "char":  # preparing the text again cannot help:
        # prepare_data.py builds a char vocabulary from the text itself
        fix = ("a char vocabulary is its own dataset's characters, so a char model reads only text whose "
               "meta.json lists the characters of its training data in the same order")
    if diffs:
        raise ValueError(f"dataset {data} is not tokenised as this checkpoint's training data was "
                         f"({'; '.join(diffs)}): its token ids would mean other tokens to the model; {fix}")


def load_checkpoint(out_dir, device="cpu", data_dir=None, need_data=True, dataset=None):
    """out_dir/ckpt.pt -> (model in eval mode on device, checkpoint dict, meta dict, dataset folder).

    The dataset is checked first (find_dataset: its errors; need_data and dataset as there), then the weights
    are read; ValueError if they are not finite (a diverged run) or do not fit the checkpoint's settings.
    """
    meta, data = find_dataset(out_dir, data_dir, need_data, dataset)
    path = os.path.join(out_dir, "ckpt.pt")
    ckpt = read_checkpoint(path)  # onto the CPU first: works for a checkpoint written on any device
    model = model_from_checkpoint(ckpt, path).to(device)
    return model, ckpt, meta, data


def checkpoint_note(out_dir, ckpt):
    """'sampling from OUT/ckpt.pt, iter N': which weights are sampled, and, for a run that diverged after its
    last checkpoint, that these are the last finite ones (for the user who did not see the run's end)."""
    try:
        rows = read_metrics(out_dir)
    except (ValueError, OSError):  # a damaged log does not stop sampling from an intact checkpoint
        rows = []
    note = f"sampling from {os.path.join(out_dir, 'ckpt.pt')}, iter {ckpt['iter_num']:,}"
    if rows and rows[-1].get("diverged"):
        note += f" (the run diverged at iter {rows[-1]['iter']:,}: these are its last finite weights)"
    return note


PROGRESS_DELAY_S = 2  # a sample that takes longer shows a progress bar (10 ms a token: the demo on a CPU)


def prompt_ids(start, meta, encode):
    """Prompt token ids: the text of --start (FILE:path reads a file); empty -> eot (gpt2) or encoded
    newline."""
    if start.startswith("FILE:"):
        if not os.path.isfile(start[5:]):
            raise FileNotFoundError(f"--start {start}: {start[5:]!r} is not a file; "
                                    "FILE:path reads the prompt from a UTF-8 text file")
        path, start = start[5:], read_text(start[5:])
        if not start:
            raise ValueError(f"--start FILE:{path}: the file is empty; write the prompt in it, or leave --start "
                             f"out to start from a new line (end-of-text for GPT-2 BPE)")
    if start:
        try:
            return encode(start)
        except ValueError as e:  # a char model's vocabulary is its training text's characters
            if meta["tokenizer"] != "char":
                raise
            raise ValueError(f"--start: {e}; a char-level model reads only the characters of its training text, "
                             f"so write the prompt in those (byte and gpt2 models take any text)") from None
    if meta["tokenizer"] == "gpt2":
        return [meta["eot_token"]]
    try:
        return encode("\n")
    except ValueError:  # a char vocabulary is the training text's characters: a text without newlines has none
        raise ValueError("with no --start, sampling starts at a newline, which this char vocabulary lacks (its "
                         "training text had none): give a prompt in its characters, e.g. --start=\"The\"") from None


def generate(model, meta, encode, decode, start="", num_samples=1, max_new_tokens=200, temperature=0.8,
             top_k=None, seed=1337, device="cpu", use_cache=True, log=None, each=None, progress=False):
    """num_samples texts (prompt included), each max_new_tokens tokens longer than the prompt.

    The RNG is seeded once, so the same seed and arguments give the same texts. temperature 0 = greedy.
    Only ids < meta["vocab_size"] are sampled (the padded embedding rows never are). use_cache: GPT.generate's
    KV cache (the same texts either way, faster with it). log: called with a note (str) for a prompt longer
    than block_size, or None. each: called with each text as soon as it is generated (sample.py prints it), or
    None. progress: a progress bar (tqdm, on a terminal's stderr) for each sample that takes over
    PROGRESS_DELAY_S seconds.
    """
    ids = prompt_ids(start, meta, encode)
    if not ids:
        raise ValueError(f"--start {start!r} encodes to no tokens")
    block_size = model.config.block_size
    if log and len(ids) > block_size:
        log(f"note: the prompt is {len(ids)} tokens, more than block_size {block_size}: each new token is "
            f"predicted from the last {block_size}")
    x = torch.tensor([ids], dtype=torch.long, device=device)
    torch.manual_seed(seed)
    texts = []
    for i in range(num_samples):
        # a progress bar on the terminal's stderr for a sample that takes long (none in a log file)
        with tqdm(total=max_new_tokens, desc=f"sample {i + 1} of {num_samples}", unit="tok", delay=PROGRESS_DELAY_S,
                  leave=False, file=sys.stderr, disable=None if progress else True) as bar:
            y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k,
                               vocab_size=meta["vocab_size"], use_cache=use_cache, on_token=lambda _: bar.update())
        texts.append(decode(y[0].tolist()))
        if each:
            each(texts[-1])
    return texts


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--out_dir", type=os.path.expanduser,
                   default="out", help="folder with ckpt.pt (a train.py out_dir)")
    p.add_argument("--start", default="", help="prompt text, or FILE:path to read it from a file; "
                   "empty (the default): the end-of-text token (gpt2) or a newline (char, byte)")
    p.add_argument("--num_samples", type=int, default=1, help="texts to generate")
    p.add_argument("--max_new_tokens", type=int, default=200, help="tokens generated after the prompt")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (argmax) decoding")
    p.add_argument("--top_k", type=int, default=None, help="sample from the k most likely tokens only "
                   "(default: no limit)")
    p.add_argument("--seed", type=int, default=1337, help="seed of the sampling RNG (same seed, same texts)")
    p.add_argument("--no_cache", action="store_true", help="run the model on the whole context for every "
                   "token instead of keeping past keys and values (same text, slower)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | mps | auto")
    p.add_argument("--data_dir", type=os.path.expanduser,
                   default=None, help="override the checkpoint's data_dir "
                   "(parent of the dataset; default: the checkpoint's)")
    p.add_argument("--bpe_dir", type=os.path.expanduser, default=None, help="GPT-2 encoder.json + vocab.bpe "
                   "(default: the copy shipped in tests/data/gpt2)")
    args = p.parse_args(argv)
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        p.error(f"--temperature={args.temperature}: give a finite number >= 0 (0 = greedy)")
    if args.num_samples < 1:
        p.error(f"--num_samples={args.num_samples}: give 1 or more")
    if args.max_new_tokens < 0:
        p.error(f"--max_new_tokens={args.max_new_tokens}: give 0 or more")
    if args.top_k is not None and args.top_k < 1:
        p.error("--top_k must be >= 1 (leave it out for no limit)")
    if not abs(args.seed) < MAX_SEED:
        p.error("--seed is too large; use |seed| < 2**62")
    return args


def main(argv=None):
    """Print the samples, separated by lines of dashes; returns them as a list of str."""
    args = parse_args(argv)
    device, _, _ = resolve_device({"device": args.device, "dtype": "float32"})  # clear error if absent
    meta, data = find_dataset(args.out_dir, args.data_dir, need_data=False)  # the dataset and its tokenizer
    if data is None and args.data_dir:  # sampling needs only the tokenizer: say that the folder given went unused
        print(f"note: --data_dir {args.data_dir} does not hold the checkpoint's dataset; sampling with the "
              f"tokenizer the checkpoint records ({meta.get('tokenizer')})", file=sys.stderr)
    encode, decode = get_codec(meta, args.bpe_dir)  # first: quick to check, the weights may take minutes
    model, ckpt, meta, _ = load_checkpoint(args.out_dir, device, args.data_dir, need_data=False)
    print(checkpoint_note(args.out_dir, ckpt), file=sys.stderr)
    texts = generate(model, meta, encode, decode, args.start, args.num_samples, args.max_new_tokens,
                     args.temperature, args.top_k, args.seed, device, not args.no_cache,
                     log=lambda note: print(note, file=sys.stderr),
                     each=lambda text: print(text, "-" * 40, sep="\n", flush=True), progress=True)
    return texts


if __name__ == "__main__":
    try:
        main()
    except (FileNotFoundError, ValueError, DataError) as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit("interrupted")
