"""
Numerical checks that only a GPU can run, printed as one markdown table (part of bench/gpu_check.sh).

    python bench/gpu_sanity.py            # on CUDA; on a CPU-only machine it runs the same checks on the CPU

For every query mode on a 4-layer model: SDPA (flash/efficient kernels on CUDA) against the plain
matmul-softmax path, and torch.compile against eager, in float32 and under bf16 autocast. Reports the max abs
logit difference and the tolerance it is held to (float32 1e-4, TF32 off; bf16 5e-2, relative to logits of
order 1).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, QUERY_MODES, GPTConfig  # noqa: E402

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2}


def logits(model, idx, dtype, device_type):
    with torch.no_grad(), torch.autocast(device_type, dtype=dtype, enabled=dtype != torch.float32):
        return model(idx, targets=idx)[0].float()


def main(argv=None):
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
                            ).parse_args(argv)  # no options: --help prints this docstring, others are refused
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False  # compare float32 maths, not TF32 rounding
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    # rows print as they finish: a timeout keeps them
    print(f"device: {name}, torch {torch.__version__}\n\n| query_mode | dtype | check | max abs diff | "
          f"tolerance | result |\n|---|---|---|---:|---:|---|", flush=True)
    failed = 0
    idx = torch.randint(0, 512, (4, 256), device=device)
    for mode in QUERY_MODES:
        cfg = dict(block_size=256, vocab_size=512, n_layer=4, n_head=4, n_embd=256, query_mode=mode)
        torch.manual_seed(0)
        fast = GPT(GPTConfig(**cfg)).to(device).eval()
        plain = GPT(GPTConfig(**cfg, flash=False)).to(device).eval()
        plain.load_state_dict(fast.state_dict())
        compiled = torch.compile(fast)
        for dtype in (torch.float32, torch.bfloat16):
            ref = logits(plain, idx, dtype, device)
            for check, model in (("sdpa vs plain", fast), ("compile vs plain", compiled)):
                diff = (logits(model, idx, dtype, device) - ref).abs().max().item()
                ok = diff < TOLERANCE[dtype]
                failed += not ok
                print(f"| {mode} | {str(dtype)[6:]} | {check} | {diff:.2e} | {TOLERANCE[dtype]:.0e} | "
                      f"{'ok' if ok else 'FAIL'} |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
