"""
Bytes of activations saved for the backward pass, per layer and per token, per query mode: an exact count on any
machine (no allocator, no timing).

    python bench/saved_activations.py                         # the paper's shapes: n_embd 768, 12 heads
    python bench/saved_activations.py --n_embd=128 --n_head=4 --block_size=64 --device=cuda
    python bench/saved_activations.py --compile                # what torch.compile's partitioner saves

Every tensor that autograd saves during one forward pass goes through torch.autograd.graph.saved_tensors_hooks.
The hook records the tensor's storage (its data pointer and size), so a storage that several saved tensors view
(q, k and v as slices of one matmul output) counts once. Parameters are not activations; neither are the bf16
copies that autocast makes of them. Both drop out of a double difference: the count at n_layer = 2L and
n_layer = L (the difference is L layers), each at 2 sequences and at 1 (the difference is one sequence), so
    bytes per layer per token = [S(2L, 2) - S(L, 2) - S(2L, 1) + S(L, 1)] / (L · block_size),
where S(n_layer, sequences) is the count of one forward pass. What the embeddings, the final LayerNorm and the
LM head save is in neither difference.

--compile counts what torch.compile saves instead: AOTAutograd traces forward and backward into one graph and
its min-cut partitioner (the one inductor uses, with inductor's settings) decides which tensors the forward
passes to the backward and which the backward recomputes. The count is the size of those tensors (the backward
graph's inputs other than the gradients), found by running that partitioner on the CPU without generating
kernels, so it holds on any device; the double difference again removes what does not grow with layers and
tokens. (It counts before inductor's own graph rewrites, which can fuse but do not store more.)

The nonlinear query counts as it runs on the device: in a training step on CUDA (and under --compile) f runs
under torch.utils.checkpoint and keeps only its input x (a storage the attention's input matmul keeps anyway),
its intermediates recomputed; on the CPU, eager, it runs plainly and its intermediates count.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, GPTConfig  # noqa: E402
from nlq.distributed import resolve_device  # noqa: E402


def saved_bytes(cfg, n_sequences, dtype=None, device="cpu", seed=0):
    """Bytes of the distinct storages that autograd saves in one training-mode forward pass of GPT(cfg) on
    n_sequences windows of cfg.block_size tokens (int). dtype: None for float32, or an autocast dtype
    (torch.bfloat16). Parameters are excluded (they are not saved copies); autocast's weight casts are not."""
    torch.manual_seed(seed)
    model = GPT(cfg).to(device).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    idx = torch.randint(cfg.vocab_size, (n_sequences, cfg.block_size), device=device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype is not None):
        _, loss = model(idx, idx)
    del loss
    return sum(storages.values())


def compiled_saved_bytes(cfg, n_sequences, dtype=None, device="cpu", seed=0):
    """Bytes of the tensors that torch.compile's min-cut partitioner passes from the forward graph to the
    backward graph of GPT(cfg) on n_sequences windows (int), parameters included (a double difference removes
    them). dtype: None for float32, or an autocast dtype. Traced, partitioned and run without inductor."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    total = []

    def partition(joint, joint_inputs, **kwargs):
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, compiler="inductor", **kwargs)
        saved = [n.meta.get("val") for n in bw.graph.nodes
                 if n.op == "placeholder" and not n.name.startswith("tangents")]
        total.append(sum(t.numel() * t.element_size() for t in saved if isinstance(t, torch.Tensor)))
        return fw, bw

    as_is = lambda gm, _: make_boxed_func(gm)  # noqa: E731
    torch._dynamo.reset()
    torch.manual_seed(seed)
    model = torch.compile(GPT(cfg).to(device).train(), dynamic=False,
                          backend=aot_autograd(fw_compiler=as_is, bw_compiler=as_is, partition_fn=partition))
    idx = torch.randint(cfg.vocab_size, (n_sequences, cfg.block_size), device=device)
    with torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype is not None):
        model(idx, idx)
    return sum(total)


def saved_bytes_per_layer_token(query_mode, dtype=None, n_embd=768, n_head=12, block_size=256, n_layer=2,
                                device="cpu", compiled=False, **keys):
    """Bytes saved for the backward pass per layer and per token of one query mode (float): the double
    difference of saved_bytes (compiled_saved_bytes if compiled) over n_layer (n_layer, 2·n_layer) and
    sequences (1, 2). keys: more GPTConfig fields (qk_norm, query_hidden, ...). The vocabulary is small (256):
    the LM head is outside the difference anyway."""
    count_bytes = compiled_saved_bytes if compiled else saved_bytes
    def count(layers, sequences):
        cfg = GPTConfig(n_layer=layers, n_head=n_head, n_embd=n_embd, block_size=block_size, vocab_size=256,
                        query_mode=query_mode, **keys)
        return count_bytes(cfg, sequences, dtype, device)
    L = n_layer
    diff = count(2 * L, 2) - count(L, 2) - count(2 * L, 1) + count(L, 1)
    return diff / (L * block_size)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--query_modes", default="linear,identity,linear_residual,nonlinear")
    parser.add_argument("--n_embd", type=int, default=768)
    parser.add_argument("--n_head", type=int, default=12)
    parser.add_argument("--block_size", type=int, default=256, help="tokens per sequence (any: per token)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true", help="count what torch.compile's partitioner saves")
    args = parser.parse_args(argv)
    modes = args.query_modes.split(",")
    args.device = resolve_device({"device": args.device, "dtype": "float32"})[0]  # auto: the device it picks
    print(f"saved activations{' under torch.compile' if args.compile else ''}, bytes per layer per token "
          f"(n_embd {args.n_embd}, {args.n_head} heads, torch {torch.__version__}, {args.device})")
    print("| query_mode | float32 | vs linear | bf16 autocast | vs linear |\n|---|---:|---:|---:|---:|")
    rows = {m: [saved_bytes_per_layer_token(m, dt, args.n_embd, args.n_head, args.block_size,
                                            device=args.device, compiled=args.compile)
                for dt in (None, torch.bfloat16)]
            for m in modes}
    ref = rows.get("linear", rows[modes[0]])
    for m, (f32, bf16) in rows.items():
        print(f"| {m} | {f32:,.0f} | {f32 / ref[0]:.3f} | {bf16:,.0f} | {bf16 / ref[1]:.3f} |")


if __name__ == "__main__":
    main()
