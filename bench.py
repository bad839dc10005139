"""
Training-step throughput, MFU and peak memory per query mode, side by side in one process.

    python bench.py config/shakespeare_char.py --query_modes=linear,identity,nonlinear
    python bench.py config/modern_cpu.py --query_modes=linear,linear+optimizer=adamw+pos_embedding=learned
    python bench.py config/nlq_small.py --compile=True --json=bench/results/gpu.json      # one GPU
    torchrun --standalone --nproc_per_node=8 bench.py config/nlq_small.py --fsdp=True       # FSDP, 8 GPUs

A config file and --key=value overrides as in train.py, plus the bench's own options (below). A step is one
micro-batch (batch_size x block_size tokens) per rank: forward, backward, clip, optimizer step. The timed steps are
taken in --rounds rounds, the modes interleaved, so slow drifts of the machine hit every mode alike.

Under torchrun every rank runs the same steps: with fsdp=True the model is sharded as train.py shards it
(distributed.shard_model), otherwise it is wrapped in DDP, even for one process (so DDP's gradient buckets are
counted). DDP replicates everything, so its memory per rank is the same for any number of ranks; FSDP's falls
with the number of ranks, so one process measures FSDP with nothing sharded (its overhead, not its saving).
ms/iter, tokens/s and MFU are rank 0's (per rank); peak memory is each rank's own (the table: the largest).
Peak memory on CUDA counts what the mode allocates (its model, optimizer, gradients, activations, buffers),
not the models of the modes built before it; on the CPU it is the process's peak RSS so far.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT, QUERY_MODE_ALIASES, QUERY_MODES
from nlq.checkpoint import atomic_write_text
from nlq.data import get_batch, load_meta, open_split, window_starts
from nlq.distributed import end_distributed, shard_model, start_job, use_compile
from nlq.settings import (HelpFormatter, check_value, model_config, parse_config, parse_override, settings_help,
                          validate)


def parser():
    """The bench's own options; everything else is train.py's config (settings.parse_config)."""
    p = argparse.ArgumentParser(usage="python bench.py [CONFIG_FILE.py] [--key=value ...]", description=__doc__,
                                epilog="train.py's config keys, their defaults and meanings:\n" + settings_help(),
                                formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--query_modes", default="linear,identity,nonlinear", help="modes to compare (each gets its "
                   "own model and optimizer); a mode may carry config keys of its own: nonlinear+optimizer=muon")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per mode (torch.compile's included)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per mode")
    p.add_argument("--rounds", type=int, default=5, help="rounds the timed steps are taken in")
    p.add_argument("--data", choices=("synthetic", "real"), default="synthetic", help="random token ids, or "
                   "windows of <data_dir>/<dataset>/train.bin")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--json", help="also write the rows to this file as a JSON list")
    return p


def split_args(argv):
    """(the bench's options as a dict, train.py's config arguments)."""
    opts, rest = parser().parse_known_args(argv)
    modes = [QUERY_MODE_ALIASES.get(m, m) for m in opts.query_modes.split(",")]  # original -> linear
    unknown = [m for m in modes if m.split("+")[0] not in QUERY_MODES]  # before any model is built and compiled
    if unknown:
        raise ValueError(f"--query_modes: unknown {', '.join(unknown)}; registered: {', '.join(QUERY_MODES)}")
    opts.query_modes = ",".join(modes)
    return vars(opts), rest


def batch_source(cfg, opts, vocab_size, device):
    """A function step -> (x, y), each (batch_size, block_size) int64 on device."""
    B, T = cfg["batch_size"], cfg["block_size"]
    gen = torch.Generator().manual_seed(cfg["seed"])
    if opts["data"] == "synthetic":
        def synthetic():
            ids = torch.randint(vocab_size, (B, T + 1), generator=gen)
            return ids[:, :-1].to(device), ids[:, 1:].to(device)
        return synthetic
    data_dir = os.path.join(cfg["data_dir"], cfg["dataset"])
    meta = load_meta(data_dir)
    n, path = len(open_split(data_dir, "train", meta, T)), os.path.join(data_dir, "train.bin")
    return lambda: get_batch(path, meta["dtype"], window_starts(n, T, (B,), gen), T, device, meta["vocab_size"])


def arm_config(cfg, arm):
    """The config of one --query_modes entry: MODE, or MODE+key=value+... (its own settings, checked)."""
    mode, *overrides = arm.split("+")
    cfg = {**cfg, "query_mode": mode, **{k: check_value(k, v) for k, v in map(parse_override, (f"--{o}" for o in
                                                                                             overrides))}}
    validate(cfg)
    return cfg


def make_runner(cfg, vocab_size, device, device_type, ptdtype, ctx):
    """Build model + optimizer for one arm's config (arm_config) as train.py does: sharded with fsdp=True, in DDP
    under torchrun otherwise. Returns (raw model, step function, compiled?)."""
    torch.manual_seed(cfg["seed"])
    model = GPT(model_config(cfg, vocab_size))
    if cfg["fsdp"]:
        shard_model(model, device_type, ptdtype)
    else:
        model.to(device)
    opt = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]),
                                     device_type, cfg["optimizer"], cfg["embedding_lr"], cfg["unembedding_lr"])
    compiled = use_compile(cfg, device_type)
    fwd = torch.compile(model) if compiled else model
    if dist.is_initialized() and not cfg["fsdp"]:
        fwd = DDP(fwd, device_ids=[torch.cuda.current_device()] if device_type == "cuda" else None)

    def step(x, y):
        with ctx:
            _, loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, step, compiled


def sync(device_type):
    if device_type == "cuda":
        torch.cuda.synchronize()


def start_memory_count(device_type):
    """CUDA: reset the peak counter -> the bytes allocated now (earlier modes' models); CPU: 0."""
    if device_type != "cuda":
        return 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def peak_mem_mb(device_type, allocated_before=0):
    """The peak memory of the module's docstring, in MiB (CUDA: since start_memory_count)."""
    if device_type == "cuda":
        return (torch.cuda.max_memory_allocated() - allocated_before) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def bench(cfg, opts):
    """Time every query mode; returns (one row (dict) per mode, device), the same on every rank. The modes are
    built in order, the first (the baseline) first."""
    if opts["threads"]:
        torch.set_num_threads(opts["threads"])
    job = start_job(cfg)
    world_size, device, device_type, ptdtype = job.world_size, job.device, job.device_type, job.dtype
    ctx = job.autocast()
    parallel = "fsdp" if cfg["fsdp"] else "ddp" if dist.is_initialized() else "single"
    arms = {m: arm_config(cfg, m) for m in opts["query_modes"].split(",")}  # all checked before any is built
    data_dir = os.path.join(cfg["data_dir"], cfg["dataset"])  # the data's vocabulary, if it is prepared here
    vocab = load_meta(data_dir)["vocab_size"] if os.path.exists(os.path.join(data_dir, "meta.json")) else None
    next_batch = batch_source(cfg, opts, model_config(cfg, vocab).vocab_size, device)
    runners, times, mems = {}, {m: [] for m in arms}, {}
    for mode, arm in arms.items():
        t0 = time.perf_counter()
        allocated_before = start_memory_count(device_type)
        runners[mode] = make_runner(arm, vocab, device, device_type, ptdtype, ctx)
        for _ in range(opts["warmup"]):  # includes torch.compile's first-call compilation
            runners[mode][1](*next_batch())
        sync(device_type)
        progress(f"{mode}: built, {opts['warmup']} warm-up step{'s' * (opts['warmup'] != 1)}: "
                 f"{time.perf_counter() - t0:.1f} s")
        mems[mode] = [peak_mem_mb(device_type, allocated_before)] * world_size
        if world_size > 1:  # every rank's own peak
            dist.all_gather_object(mems[mode], mems[mode][0])
    per_round = max(1, opts["steps"] // opts["rounds"])
    for done in range(1, opts["rounds"] + 1):
        for mode in runners:
            for _ in range(per_round):
                x, y = next_batch()
                sync(device_type)
                t0 = time.perf_counter()
                runners[mode][1](x, y)
                sync(device_type)
                times[mode].append(time.perf_counter() - t0)
        progress(f"round {done} of {opts['rounds']}: " + ", ".join(
            f"{m} {1000 * statistics.median(times[m]):.1f}" for m in runners) + " ms/iter (medians so far)")
    rows = []
    for mode in arms:
        model, _, compiled = runners[mode]
        dt = statistics.median(times[mode])
        mfu = model.estimate_mfu(cfg["batch_size"], dt)
        p10, p90 = 1000 * np.percentile(times[mode], (10, 90))
        rows.append(dict(query_mode=mode, compile=compiled, dtype=str(ptdtype).replace("torch.", ""),
                         parallel=parallel, world_size=world_size, batch_size=cfg["batch_size"],
                         block_size=cfg["block_size"], ms_per_iter=1000 * dt, ms_p10=float(p10), ms_p90=float(p90),
                         tokens_per_s=cfg["batch_size"] * cfg["block_size"] / dt, mfu=mfu,
                         peak_mem_mb=max(mems[mode]), peak_mem_mb_per_rank=mems[mode],
                         params=model.param_breakdown()["total"], vocab_size=model.config.vocab_size,
                         flops_per_token=model.flops_per_token()))
    end_distributed()
    return rows, device


def progress(line):
    """A progress line on stderr (rank 0 only), so that a long bench is seen to move and stdout keeps the table."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(line, file=sys.stderr, flush=True)


SPREAD_WARNING = 1.5  # p90 / p10 of a mode's step times above which table() says the timings are unreliable


def table(rows, device):
    """Rows as a markdown table, with each mode's tokens/s relative to the first mode's."""
    first = rows[0]
    ref, ranks, cuda = first["tokens_per_s"], first["world_size"], device.startswith("cuda")
    how = ("one process" if first["parallel"] == "single" else
           f"{first['parallel'].upper()}, {ranks} rank{'s' if ranks > 1 else ''} (figures per rank)")
    lines = [f"device: {device_name(device)}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}, "
             f"vocab {first['vocab_size']}, {first['params']:,} parameters ({first['query_mode']}), {how}",
             "| query_mode | compile | dtype | batch x block | ms/iter (median) | p10-p90 ms | tokens/s | "
             f"vs {first['query_mode']} | MFU | {'peak mem MB' if cuda else 'process peak RSS MB so far'} |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        lines.append(f"| {r['query_mode']} | {r['compile']} | {r['dtype']} | {r['batch_size']} x "
                     f"{r['block_size']} | {r['ms_per_iter']:.1f} | {r['ms_p10']:.1f}-{r['ms_p90']:.1f} "
                     f"| {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / ref:.3f} | {mfu} "
                     f"| {r['peak_mem_mb']:,.0f} |")
    spread, mode = max((r["ms_p90"] / r["ms_p10"], r["query_mode"]) for r in rows)
    if spread > SPREAD_WARNING:
        lines += [f"(the step times spread widely: {mode}'s p90 is {spread:.1f}x its p10, so the ratios are "
                  f"uncertain: run again on idle cores, or with more --rounds)"]
    if not cuda:
        lines += ["(CPU: the process's peak RSS only rises from mode to mode, so it does not rank the modes; "
                  "bench/RESULTS.md has their saved activations, counted exactly)"]
    if ranks > 1:
        lines += [f"peak mem MB of ranks 0..{ranks - 1}: " + "; ".join(
            f"{r['query_mode']} " + ", ".join(f"{m:,.0f}" for m in r["peak_mem_mb_per_rank"]) for r in rows)]
    return "\n".join(lines)


def device_name(device):
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def main(argv):
    opts, rest = split_args(argv)
    cfg = parse_config(rest)
    rows, device = bench(cfg, opts)
    if int(os.environ.get("RANK", 0)) != 0:  # under torchrun, rank 0 reports
        return
    print(table(rows, device))
    if opts["json"]:
        atomic_write_text(opts["json"], json.dumps(rows, indent=1))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ValueError, OSError) as e:
        sys.exit(f"bench error: {e}")
    except KeyboardInterrupt:
        sys.exit("interrupted; nothing was written")
