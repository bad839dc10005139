#!/usr/bin/env bash
# Every GPU measurement of nlq in one script, for one CUDA GPU, sized for an H200: under 10 minutes in all.
#   0. bench/gpu_sanity.py: SDPA and torch.compile against plain attention, float32 and bf16, every query mode;
#   1. bench/saved_activations.py on the GPU: bytes saved for the backward pass per layer and token, per mode
#      (an exact count: it must equal the CPU's);
#   2. bench.py at the paper's shapes (config/nlq_small.py: 12 x 768, block 1024, bf16, compile), linear,
#      identity and nonlinear side by side, at micro-batch 12 (the paper's) and 16, 32, 64: ms/iter,
#      tokens/s, MFU, peak memory. If a larger micro-batch is faster, the paper configs can keep 491,520 tokens
#      per step with it (batch_size x gradient_accumulation_steps);
#   3. bench/kv_cache.py: generation with and without the KV cache at GPT-2 small's shape.
# The enwiki study at GPU scale has its own script, bench/gpu_study.sh.
# Run from the repository root; every output lands in $OUT (default bench/results/gpu_<date>):
#   OUT=bench/results/h200 bash bench/gpu_check.sh
set -uo pipefail
OUT=${OUT:-bench/results/gpu_$(date +%F)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; } | tee "$OUT/env.txt"

timeout 80 python3 bench/gpu_sanity.py 2>&1 | tee "$OUT/gpu_sanity.md"

timeout 40 python3 bench/saved_activations.py --device=cuda 2>&1 | tee "$OUT/saved_activations.md"

for B in 12 16 32 64; do  # compile takes most of each call; 3 rounds of 5 timed steps per mode
  timeout 100 python3 bench.py config/nlq_small.py --compile=True --batch_size=$B --warmup=5 --steps=15 \
      --rounds=3 --json="$OUT/bench_nlq_small_b$B.json" 2>&1 | tee "$OUT/bench_nlq_small_b$B.md"
done

timeout 50 python3 bench/kv_cache.py --device=cuda --dtype=bfloat16 --n_layer=12 --n_head=12 --n_embd=768 \
    --block_size=1024 --prompt=64 --new_tokens=192 --past_tokens=16 --query_modes=linear,identity,nonlinear \
    2>&1 | tee "$OUT/kv_cache.md"
