#!/usr/bin/env bash
# Every GPU check of this project in one prepared run (at most ~9.5 minutes on one H200: the timeouts below add up to 540 s; device run with timeout_s=600):
#   0. bench/gpu_sanity.py: SDPA and torch.compile against plain attention, float32 and bf16, every query mode;
#   1. bench.py at the paper's shapes (config/nlq_small.py: 12 x 768, block 1024, micro-batch 12, bf16, compile),
#      linear, identity and nonlinear side by side: ms/iter, tokens/s, MFU, peak memory;
#   2. the enwiki study at GPU scale (studies/enwiki_gpu.py) and its report.
# Needs data/enwiki_gpt2 (13 MB; carry it):
#   python prepare_data.py local --input ../shared/data/enwiki2015/AA --name enwiki_gpt2 --tokenizer gpt2
# Run:  OUT=bench/results/h200 bash bench/gpu_check.sh        (results land in $OUT)
set -uo pipefail
OUT=${OUT:-bench/results/gpu_$(date +%F)}
mkdir -p "$OUT/study"
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; } | tee "$OUT/env.txt"

timeout 120 python3 bench/gpu_sanity.py 2>&1 | tee "$OUT/gpu_sanity.md"

timeout 200 python3 bench.py config/nlq_small.py --compile=True --warmup=8 --steps=40 --rounds=4 \
    --json="$OUT/bench_nlq_small.json" 2>&1 | tee "$OUT/bench_nlq_small.md"

timeout 220 python3 sweep.py studies/enwiki_gpu.py --jobs 4 2>&1 | tee "$OUT/sweep.log"
python3 report.py studies/enwiki_gpu.py --out "$OUT/study" 2>&1 | tail -n 30
