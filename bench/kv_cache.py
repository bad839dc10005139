"""
Generation speed of GPT.generate with and without its KV cache, per query mode (greedy, random weights).

    python bench/kv_cache.py --n_layer=4 --n_head=4 --n_embd=128 --vocab_size=128 --block_size=512 \
        --prompt=32 --new_tokens=480                         # a character-level model, within the block
    python bench/kv_cache.py --n_layer=4 --n_head=4 --n_embd=256 --block_size=1024 --prompt=64 \
        --new_tokens=960                                     # a small GPT-2 BPE model (vocab 50304)
    python bench/kv_cache.py --device=cuda --dtype=bfloat16 ...

Two cases per query mode:
    within  the prompt, then new_tokens, all inside block_size: the cache runs one token per step
    past    a prompt of block_size tokens, then past_tokens more: every step slides the window, so the cache
            is refilled with block_size tokens each step (GPT.generate's docstring says why)
tokens/s = new tokens / wall seconds of one generate call (the prefill included), the median over --rounds
rounds; the rounds interleave the modes and cache settings, so slow drifts of a shared machine hit all alike.
'same' says whether both settings returned the same tokens.
"""
import argparse
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, GPTConfig  # noqa: E402
from nlq.settings import at_least  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("n_layer", 4), ("n_head", 4), ("n_embd", 128), ("block_size", 512),
                          ("vocab_size", 50304), ("prompt", 32), ("new_tokens", 480), ("past_tokens", 32),
                          ("batch_size", 1), ("rounds", 3)):
        p.add_argument(f"--{name}", type=at_least(1), default=default)
    p.add_argument("--query_modes", default="linear,nonlinear")
    p.add_argument("--threads", type=at_least(1), default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="bfloat16: autocast")
    args = p.parse_args(argv)
    if args.prompt + args.new_tokens > args.block_size:
        p.error(f"--prompt + --new_tokens must fit in --block_size={args.block_size} (the 'within' case)")
    return args


def timed_generate(model, idx, n, use_cache, args):
    """(seconds, ids) of one greedy generate call of n new tokens."""
    with torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(idx, n, temperature=0, use_cache=use_cache)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size,
                 vocab_size=args.vocab_size)
    models = {}
    for mode in args.query_modes.split(","):
        torch.manual_seed(0)
        models[mode] = GPT(GPTConfig(**shape, query_mode=mode)).to(args.device).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = {"within": torch.randint(args.vocab_size, (args.batch_size, args.prompt), generator=gen),
               "past": torch.randint(args.vocab_size, (args.batch_size, args.block_size), generator=gen)}
    new = {"within": args.new_tokens, "past": args.past_tokens}
    for mode, model in models.items():  # warm-up: first calls allocate
        for use_cache in (True, False):
            timed_generate(model, prompts["within"].to(args.device), 4, use_cache, args)
    times = {(m, case, c): [] for m in models for case in prompts for c in (True, False)}
    outputs = {}
    for _ in range(args.rounds):
        for case, idx in prompts.items():
            for mode, model in models.items():
                for use_cache in (True, False):
                    dt, out = timed_generate(model, idx.to(args.device), new[case], use_cache, args)
                    times[mode, case, use_cache].append(dt)
                    outputs[mode, case, use_cache] = out
    where = (torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else
             f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads")
    n_params = sum(p.numel() for p in next(iter(models.values())).parameters())
    print(f"{time.strftime('%Y-%m-%d')} · {where} · torch {torch.__version__} · {args.dtype} · "
          f"{args.n_layer} x {args.n_embd}, {args.n_head} heads, block {args.block_size}, vocab "
          f"{args.vocab_size} ({n_params:,} parameters) · batch {args.batch_size} · "
          f"median of {args.rounds} rounds")
    print("\n| query_mode | case | prompt + new tokens | cache tok/s | no cache tok/s | speed-up | same |\n"
          "|---|---|---|---:|---:|---:|---|")
    for case, idx in prompts.items():
        for mode in models:
            cached, plain = (new[case] / statistics.median(times[mode, case, c]) for c in (True, False))
            same = torch.equal(outputs[mode, case, True], outputs[mode, case, False])
            print(f"| {mode} | {case} | {idx.size(1)} + {new[case]} | {cached:,.1f} | {plain:,.1f} | "
                  f"{cached / plain:.2f}x | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
