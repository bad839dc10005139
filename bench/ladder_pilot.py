"""
The scaling ladder's pilot on one GPU (bench/gpu_ladder_pilot.sh runs it): before the study's 30-40 GPU-hours,
about 9 minutes that measure what its cost model assumes and try its first rung for real.

    python bench/ladder_pilot.py --out bench/results/ladder_pilot --data_dir data --dataset enwiki_gpt2

1. bench.py at every rung of studies/ladder_gpu.py (its shape and micro-batch, compiled, bf16), linear and
   nonlinear: tokens/s and MFU. The rows go to OUT/bench_rungs.json, which `sweep.py studies/ladder_gpu.py
   --dry_run --bench_json OUT/bench_rungs.json` then counts GPU-hours with (each rung at its own measured
   speed, where the committed figures scale one 12 x 768 measurement by FLOPs per token).
2. The smallest rung's linear and nonlinear arms on its two selection seeds, at the middle rate of the rung's
   grid, as selection runs at its longest horizon (1/8 of a final run's tokens), on a small prepared GPT-2 BPE
   dataset (the Wikipedia of ../shared/data: 13 MB of bins, so the pilot needs no OpenWebText): their losses and
   wall times, in OUT/runs/.
Each step runs only if its timeout still fits in --budget seconds from the start; what did not is named.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from research.study import arm_config, load_study, run_args  # noqa: E402

STUDY = "studies/ladder_gpu.py"


def commands(out, data_dir, dataset):
    """[(name, timeout in s, argv)] of the pilot's steps, in order."""
    ladder, steps = load_study(STUDY), []
    for rung, study in ladder["rungs"].items():
        cfg = arm_config(study, "linear")
        shape = [f"--{k}={cfg[k]}" for k in ("n_layer", "n_head", "n_embd", "batch_size")]
        steps.append((f"bench {rung}", 100, [sys.executable, "bench.py", study["config"], *shape, "--compile=True",
                                             "--query_modes=linear,nonlinear", "--warmup=5", "--steps=15",
                                             "--rounds=3", f"--json={out}/bench_{rung}.json"]))
    smallest = list(next(iter(ladder["rungs"].values()))["horizon_studies"].values())[-1]
    grid = smallest["grids"]["linear"]
    for arm in ("linear", "nonlinear"):
        for seed in smallest["selection_seeds"][:2]:
            args = [a for a in run_args(smallest, arm, grid[len(grid) // 2], seed)
                    if not a.startswith(("--out_dir=", "--data_dir=", "--dataset="))]
            steps.append((f"train {arm} seed {seed}", 120, [
                sys.executable, "train.py", *args, f"--data_dir={data_dir}", f"--dataset={dataset}",
                f"--out_dir={out}/runs/{arm}_seed{seed}", "--compile=False"]))
    return steps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--budget", type=float, default=540, help="seconds for the whole pilot")
    p.add_argument("--data_dir", default="data")
    p.add_argument("--dataset", default="enwiki_gpt2", help="a prepared GPT-2 BPE dataset for the pilot runs")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    start, skipped = time.time(), []
    for name, limit, argv_ in commands(args.out, args.data_dir, args.dataset):
        if time.time() - start + limit > args.budget:
            skipped.append(name)
            continue
        t0 = time.time()
        print(f"== {name}: {' '.join(argv_)}", flush=True)
        try:
            code = subprocess.run(argv_, timeout=limit).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        print(f"== {name}: status {code} after {time.time() - t0:.0f} s", flush=True)
    out = Path(args.out)
    rows = [r for p in sorted(out.glob("bench_*.json")) if p.name != "bench_rungs.json"
            for r in json.loads(p.read_text())]
    (out / "bench_rungs.json").write_text(json.dumps(rows, indent=1))
    print(f"{len(rows)} bench rows in {args.out}/bench_rungs.json" + (f"; not run (budget): {', '.join(skipped)}"
                                                                      if skipped else ""))


if __name__ == "__main__":
    main()
