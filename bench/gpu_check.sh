#!/usr/bin/env bash
# Every GPU check of nlq in one script, for one CUDA GPU (sized for an H200: about 9 minutes in all).
#   0. bench/gpu_sanity.py: SDPA and torch.compile against plain attention, float32 and bf16, every query mode;
#   1. bench.py at the paper's shapes (config/nlq_small.py: 12 x 768, block 1024, micro-batch 12, bf16, compile),
#      linear, identity and nonlinear side by side: ms/iter, tokens/s, MFU, peak memory;
#   2. the enwiki study at GPU scale (studies/enwiki_gpu.py) for as long as its time limit allows, and its
#      report. The study's finished runs are kept in results/enwiki_gpu/runs/, so a later call goes on from
#      there (commit them: python sweep.py skips every run whose metrics are complete).
# It needs the GPT-2-tokenised Wikipedia (13 MB):
#   python prepare_data.py local --input ../shared/data/enwiki2015/AA --name enwiki_gpt2 --tokenizer gpt2
# Run from the repository root; every output lands in $OUT (default bench/results/gpu_<date>):
#   OUT=bench/results/h200 bash bench/gpu_check.sh
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
# the study's raw runs (metrics.jsonl and config.json of each run: what git keeps), to commit
tar czf "$OUT/enwiki_gpu_runs.tgz" --exclude=ckpt.pt --exclude='*.tmp' --exclude=train.log results/enwiki_gpu/runs
