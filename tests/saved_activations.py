"""Bytes of activations saved for the backward pass, counted exactly (no allocator, no timing), for the tests of
tests/test_nonlinear_query.py. bench/RESULTS.md has the counts at the paper's shapes (its command was
bench/saved_activations.py, this counter with a table printer, at commit 7f7de89).

Every tensor that autograd saves during one forward pass goes through torch.autograd.graph.saved_tensors_hooks,
which records its storage (a storage that several saved tensors view counts once). Parameters, and the bf16
copies autocast makes of them, drop out of a double difference over layers (L, 2L) and sequences (1, 2):
    bytes per layer per token = [S(2L, 2) - S(L, 2) - S(2L, 1) + S(L, 1)] / (L · block_size).
Under torch.compile the count is of the tensors that AOTAutograd's min-cut partitioner (inductor's settings)
passes from the forward graph to the backward graph, found on the CPU without generating kernels.
"""
import torch

from model import GPT, GPTConfig


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
