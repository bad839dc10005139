#!/usr/bin/env bash
# Peak memory per rank of nlq_small (12 x 768, block 1024, micro-batch 12, bf16, eager) on one GPU under DDP and
# under FSDP (fsdp=True), linear and nonlinear side by side; then bench/gpu_sanity.py. About 3 minutes on an H200.
# One GPU: DDP's memory per rank is the same for any number of GPUs (it replicates everything); FSDP on one
# GPU shards nothing, so its row shows FSDP's own overhead, not its saving (that needs N GPUs).
#   OUT=bench/results/h200_fsdp bash bench/gpu_fsdp_check.sh
set -uo pipefail
OUT=${OUT:-bench/results/gpu_fsdp_$(date +%F)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; } | tee "$OUT/env.txt"
for fsdp in False True; do
  timeout 90 torchrun --standalone --nproc_per_node=1 bench.py config/nlq_small.py --query_modes=linear,nonlinear \
      --compile=False --warmup=5 --steps=20 --rounds=2 --fsdp=$fsdp --json="$OUT/bench_fsdp_$fsdp.json"
done 2>&1 | tee "$OUT/fsdp_memory.md"
timeout 100 python3 bench/gpu_sanity.py 2>&1 | tee "$OUT/gpu_sanity.md"
