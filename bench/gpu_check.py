"""
The steps of bench/gpu_check.sh, one a call: each appends one JSON row (its result, "ok" first) to --out.

    python bench/gpu_check.py --out ROWS.jsonl env                # device, torch, CUDA, commit
    python bench/gpu_check.py --out ROWS.jsonl bench linear       # tokens/s, MFU, peak memory at 124M
    python bench/gpu_check.py --out ROWS.jsonl correctness        # the default nonlinear path against f as written
    python bench/gpu_check.py --out ROWS.jsonl graph_breaks       # one graph for a training forward at 124M
    torchrun --standalone --nproc_per_node=N bench/gpu_check.py --out ROWS.jsonl ddp   # nonlinear under DDP

--cpu-smoke runs each step on the CPU at tiny shapes (eager benches; torch.compile's aot_eager backend, which
traces as inductor does but generates no code), so that the suite runs the script between GPUs.

correctness: a small nonlinear GPT as it trains by default (f under torch.utils.checkpoint, SDPA) against the
same weights with f as written run plainly and attention written out (matmul-softmax), float32 with TF32 off:
the loss and every gradient, eager and compiled, within a relative error (‖a − b‖ / ‖b‖) of 1e-4. Under bf16
autocast each tensor's bound is twice the error of the plain reference itself run in bf16 (against its float32
self), plus 1e-3: bf16's own rounding is allowed (SDPA's kernels round otherwise), a wrong gradient is not.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import bench  # noqa: E402
import model  # noqa: E402
from nlq.settings import parse_config  # noqa: E402

# bench.py arguments: the paper's 124M (config/nlq_small.py: 12 x 768, block 1024, micro-batch 12, bf16, compiled),
# or, with --cpu-smoke, a tiny eager model
BENCH = ["config/nlq_small.py", "--compile=True", "--warmup=5", "--steps=20", "--rounds=1"]
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
SMOKE = [f"--{k}={v}" for k, v in TINY.items()] + ["--batch_size=2", "--device=cpu", "--dtype=float32",
                                                    "--compile=False", "--warmup=1", "--steps=2"]


class PlainF(model.NonlinearQuery):
    """f as written, run plainly: autograd keeps its intermediates (no checkpoint)."""

    def forward(self, x):
        return x + self.f(x)


def relative_error(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def loss_and_grads(gpt, idx, device, dtype, compiled, smoke):
    """{"loss": loss, parameter name: gradient} of one training step of gpt on idx."""
    net = torch.compile(gpt, backend="aot_eager" if smoke else "inductor") if compiled else gpt
    gpt.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
        _, loss = net(idx, idx)
    loss.backward()
    return {"loss": loss.detach(), **{n: p.grad for n, p in gpt.named_parameters()}}


def correctness(smoke):
    device = "cpu" if smoke else "cuda"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model.QUERY_MODES["plain_f"] = PlainF
    shape = TINY if smoke else dict(n_layer=2, n_head=4, n_embd=256, block_size=256, vocab_size=512)
    torch.manual_seed(0)
    default = model.GPT(model.GPTConfig(query_mode="nonlinear", **shape)).to(device)
    with torch.no_grad():  # gains and biases off their init's ones and zeros, which would hide a misplaced one
        for p in default.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.3)
    plain = model.GPT(model.GPTConfig(query_mode="plain_f", flash=False, **shape)).to(device)
    plain.load_state_dict(default.state_dict())
    idx = torch.randint(shape["vocab_size"], (4, shape["block_size"]), device=device)
    want = loss_and_grads(plain, idx, device, torch.float32, False, smoke)
    bf16_own = {k: relative_error(v, want[k]) for k, v in
                loss_and_grads(plain, idx, device, torch.bfloat16, False, smoke).items()}
    checks = {}
    for dtype in (torch.float32, torch.bfloat16):
        for compiled in (False, True):
            got = loss_and_grads(default, idx, device, dtype, compiled, smoke)
            bound = {k: 1e-3 + 2 * bf16_own[k] if dtype == torch.bfloat16 else 1e-4 for k in want}
            worst = max(want, key=lambda k: relative_error(got[k], want[k]) / bound[k])
            checks[f"{str(dtype)[6:]}_{'compiled' if compiled else 'eager'}"] = dict(
                worst=worst, error=relative_error(got[worst], want[worst]), bound=bound[worst])
    return dict(ok=all(c["error"] <= c["bound"] for c in checks.values()), checks=checks,
                bf16_own_error_max=max(bf16_own.values()), shape=shape)


def run_bench(mode, smoke):
    """bench.bench for one query mode (under torchrun: DDP over its ranks) -> its row."""
    opts, rest = bench.split_args(BENCH + [f"--query_modes={mode}"] + (SMOKE if smoke else []))
    rows, device = bench.bench(parse_config(rest), opts)
    return dict(ok=True, device=bench.device_name(device), **rows[0])


def graph_breaks(smoke):
    """dynamo's view of a training forward of the 124M nonlinear GPT (tiny with --cpu-smoke): one graph."""
    device = "cpu" if smoke else "cuda"
    gpt = model.GPT(model.GPTConfig(query_mode="nonlinear", **(TINY if smoke else {}))).to(device).train()
    idx = torch.randint(gpt.config.vocab_size, (2, gpt.config.block_size), device=device)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=not smoke):
        found = torch._dynamo.explain(gpt)(idx, idx)
    return dict(ok=(found.graph_count, found.graph_break_count) == (1, 0), graphs=found.graph_count,
                graph_breaks=found.graph_break_count, reasons=[str(r) for r in found.break_reasons][:3])


def environment(smoke):
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
    cuda = torch.cuda.is_available()
    return dict(ok=cuda or smoke, device=torch.cuda.get_device_name() if cuda else "CPU",
                gpus=torch.cuda.device_count(), torch=torch.__version__, cuda=torch.version.cuda,
                commit=git.stdout.strip() or None, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["env", "bench", "correctness", "graph_breaks", "ddp"])
    parser.add_argument("mode", nargs="?", default="nonlinear", help="bench: the query mode")
    parser.add_argument("--out", required=True, help="the JSON-lines file each step appends its row to")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (the suite's check)")
    args = parser.parse_args(argv)
    t0 = time.time()
    if args.step in ("bench", "ddp"):
        row = run_bench(args.mode, args.cpu_smoke)
    else:
        row = dict(env=environment, correctness=correctness, graph_breaks=graph_breaks)[args.step](args.cpu_smoke)
    if int(os.environ.get("RANK", 0)) == 0:
        row = {"step": args.step if args.step != "bench" else f"bench {args.mode}", **row,
               "seconds": round(time.time() - t0, 1)}
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row))
    sys.exit(0 if row["ok"] else 1)


if __name__ == "__main__":
    main()
