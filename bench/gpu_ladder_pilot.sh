#!/usr/bin/env bash
# The scaling ladder's pilot on one GPU (studies/ladder_gpu.py), about 9 minutes on an H200: every rung's tokens/s
# for the cost model, then the smallest rung's linear and nonlinear arms on 2 seeds (bench/ladder_pilot.py says
# what each step does). The pilot runs train on a small GPT-2 BPE dataset (13 MB of bins), prepared once:
#   python prepare_data.py local --input ../shared/data/enwiki2015/AA --name enwiki_gpt2 --tokenizer gpt2
# (on a device machine: carry data/enwiki_gpt2). Run from the repository root; every output lands in $OUT:
#   OUT=bench/results/h200_ladder_pilot bash bench/gpu_ladder_pilot.sh
# then: python -m research.sweep studies/ladder_gpu.py --dry_run --bench_json $OUT/bench_rungs.json
set -uo pipefail
OUT=${OUT:-bench/results/ladder_pilot_$(date +%F)}
python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)" || {
  echo "no CUDA GPU here: the ladder pilot measures a GPU; run it on one" >&2; exit 2; }
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; } | tee "$OUT/env.txt"
python3 bench/ladder_pilot.py --out "$OUT" --budget "${BUDGET:-540}" --data_dir "${DATA_DIR:-data}" \
    --dataset "${DATASET:-enwiki_gpt2}" 2>&1 | tee "$OUT/pilot.log"
