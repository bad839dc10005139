"""
Generation speed of nlq's exports in transformers (greedy `generate`, batch 1, random weights, float32), with and
without the KV cache, against a plain GPT2LMHeadModel of the same shape.

    python bench/hf_generate.py --threads=1              # 4 x 128, block 512, bytes (vocab 256), 256 new tokens
    python bench/hf_generate.py --threads=1 --tokenizer=gpt2     # GPT-2 BPE: the 50304 x 128 LM head dominates
    python bench/hf_generate.py --query_mode=identity --rounds=5

The models, each a random nlq model of the same shape exported by convert.py hf (hf.export):
    GPT2LMHeadModel          a linear model: a plain GPT2LMHeadModel, transformers' own code
    export, linear           the same linear model through modeling_nlq.py (--code=nlq): GPT-2 with nlq's
                             query class; the same function, so the difference is the machinery's own cost
    export, QUERY_MODE       the --query_mode model (nonlinear: the paper's), GPT-2 with nlq's query
    nlq GPT.generate         the linear and QUERY_MODE models in nlq itself (sample.py's path), for reference
seconds = the wall time of one generate call of --new_tokens tokens after a --prompt-token prompt (the prefill
included), the median over --rounds rounds; each round runs every model and cache setting once, so the slow
drifts of a shared machine hit all alike. 'same' says whether the cache changed no token.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from interop import hf  # noqa: E402
from model import GPT, QUERY_MODES, GPTConfig  # noqa: E402
from nlq.settings import at_least  # noqa: E402
from nlq.tokenizers import GPT2_VOCAB  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("n_layer", 4), ("n_head", 4), ("n_embd", 128), ("block_size", 512), ("prompt", 32),
                          ("new_tokens", 256), ("rounds", 3)):
        p.add_argument(f"--{name}", type=at_least(1), default=default)
    p.add_argument("--query_mode", default="nonlinear", choices=[m for m in QUERY_MODES if m != "linear"])
    p.add_argument("--tokenizer", default="byte", choices=("byte", "gpt2"),
                   help="byte: vocab 256; gpt2: GPT-2 BPE, vocab 50304 (its 50257 tokens, padded)")
    p.add_argument("--threads", type=at_least(1), default=None, help="torch CPU threads (default: torch's choice)")
    return p.parse_args(argv)


def nlq_model(query_mode, args):
    """A random nlq GPT of the benchmark's shape, in eval mode (seed 0)."""
    torch.manual_seed(0)
    gpt2 = args.tokenizer == "gpt2"
    return GPT(GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size,
                         vocab_size=50304 if gpt2 else 256, data_vocab_size=GPT2_VOCAB if gpt2 else 256,
                         query_mode=query_mode)).eval()


def exported(model, folder, code="auto"):
    """model exported to folder (hf.export) and loaded back with transformers, in eval mode."""
    import transformers
    meta = dict(tokenizer="gpt2", vocab_size=GPT2_VOCAB) if model.config.vocab_size > 256 else \
        dict(tokenizer="byte", vocab_size=256)
    hf.export(model, meta, folder, code=code)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()


def generator(model):
    """(prompt, n, use_cache) -> ids, greedy, exactly n new tokens (no early stop at <|endoftext|>)."""
    if isinstance(model, GPT):
        return lambda prompt, n, use_cache: model.generate(prompt, n, temperature=0, use_cache=use_cache)
    return lambda prompt, n, use_cache: model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                                       max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                                       use_cache=use_cache)


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    linear, other = nlq_model("linear", args), nlq_model(args.query_mode, args)
    with tempfile.TemporaryDirectory() as tmp:
        models = {"GPT2LMHeadModel": exported(linear, os.path.join(tmp, "gpt2")),
                  "export, linear": exported(linear, os.path.join(tmp, "linear"), code="nlq"),
                  f"export, {args.query_mode}": exported(other, os.path.join(tmp, "other")),
                  "nlq GPT.generate, linear": linear, f"nlq GPT.generate, {args.query_mode}": other}
    assert [type(m).__name__ for m in models.values()] == ["GPT2LMHeadModel", "NlqForCausalLM", "NlqForCausalLM",
                                                           "GPT", "GPT"]
    runs = {name: generator(model) for name, model in models.items()}
    prompt = torch.randint(0, 256, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    seconds, ids = {(name, cache): [] for name in runs for cache in (True, False)}, {}
    with torch.no_grad():
        for run in runs.values():  # warm-up: first calls allocate and pick kernels
            run(prompt, 4, True)
        for _ in range(args.rounds):
            for (name, cache), times in seconds.items():
                t0 = time.perf_counter()
                ids[name, cache] = runs[name](prompt, args.new_tokens, cache)
                times.append(time.perf_counter() - t0)
    s = {key: statistics.median(times) for key, times in seconds.items()}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.n_layer} x {args.n_embd}, "
          f"{args.n_head} heads, block {args.block_size}, vocab {linear.config.vocab_size}; prompt {args.prompt}, "
          f"{args.new_tokens} new tokens, batch 1, float32, median of {args.rounds} rounds\n")
    print("| model | seconds, cache | seconds, no cache | tokens/s, cache | cache speed-up | vs GPT2LMHeadModel, "
          "cache | same tokens |\n|---|---:|---:|---:|---:|---:|---|")
    for name in runs:
        print(f"| {name} | {s[name, True]:.3f} | {s[name, False]:.3f} | {args.new_tokens / s[name, True]:,.0f} | "
              f"{s[name, False] / s[name, True]:.2f}x | {s[name, True] / s['GPT2LMHeadModel', True]:.3f}x | "
              f"{torch.equal(ids[name, True], ids[name, False])} |")


if __name__ == "__main__":
    main()
