#!/usr/bin/env bash
# Every GPU measurement of nlq in one script, for one CUDA GPU, sized to finish within about 10 minutes on an
# H200 (BUDGET, below). The steps run in order of what they decide, each under its own timeout and each writing its own
# file as it ends, so a call that runs out of time still returns everything finished before:
#   1. bench/saved_activations.py on the GPU: bytes saved for the backward pass per layer and token, per mode
#      (an exact count, to set beside the CPU's in bench/RESULTS.md: they differ only where the GPU's
#      attention kernels save other tensors than the CPU's);
#   2. bench.py at the paper's shapes (config/nlq_small.py: 12 x 768, block 1024, bf16, compile), linear,
#      identity and nonlinear side by side at micro-batch 12 (the paper's): tokens/s, MFU, peak memory;
#   3. the same, linear and nonlinear, at micro-batch 64, 32, 16 (the fastest published PyTorch runs of this
#      shape use 64 x 1024 per GPU). If one beats 12, the paper configs can keep 491,520 tokens per step with
#      it (batch_size x gradient_accumulation_steps);
#   4. bench/gpu_sanity.py: SDPA and torch.compile against plain attention, float32 and bf16, every mode;
#   5. bench/kv_cache.py: generation with and without the KV cache at GPT-2 small's shape.
# A step starts only if its timeout still fits in BUDGET seconds (default 560) since the script began; the
# ones skipped are named at the end, and STEPS=3,5 (say) runs only those steps in a second call. A signal
# (Ctrl-C, an outer timeout) stops the step under way with the script; on a machine without CUDA it stops at once.
# Each bench.py call compiles its models (most of its time), so every micro-batch is its own process.
# The enwiki study at GPU scale has its own script, bench/gpu_study.sh.
# Run from the repository root; every output lands in $OUT (default bench/results/gpu_<date>):
#   OUT=bench/results/h200 bash bench/gpu_check.sh
set -uo pipefail
OUT=${OUT:-bench/results/gpu_$(date +%F)}
BUDGET=${BUDGET:-560}
STEPS=${STEPS:-1,2,3,4,5}
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "BUDGET=$BUDGET: give whole seconds, e.g. BUDGET=560" >&2; exit 2; }
[[ $STEPS =~ ^[1-5](,[1-5])*$ ]] || { echo "STEPS=$STEPS: give step numbers 1-5, e.g. STEPS=3,5" >&2; exit 2; }
python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)" || {
  echo "no CUDA GPU here (torch.cuda.is_available() is False): gpu_check.sh measures a GPU; run it on one" >&2
  exit 2; }
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; } | tee "$OUT/env.txt"

skipped=() running=""
stop() {  # a signal to the script stops the step under way (timeout passes it on to the step's processes)
  [[ -n $running ]] && pkill -TERM -P "$running"
  echo "== stopped by a signal after ${SECONDS}s; the finished steps' files are complete" | tee -a "$OUT/steps.log"
  exit 130
}
trap stop INT TERM HUP
step() {  # step NUMBER TIMEOUT_S OUTFILE COMMAND...: run COMMAND if it is selected and its timeout fits
  local n=$1 limit=$2 file=$3; shift 3
  [[ ",$STEPS," == *",$n,"* ]] || return 0
  if (( SECONDS + limit > BUDGET )); then skipped+=("$n:$(basename "$file")"); return 0; fi
  echo "== step $n ($(date -u +%T), ${SECONDS}s in): $*" | tee -a "$OUT/steps.log"
  # in the background, so that a signal reaches stop() at once (bash runs traps only between commands)
  ( timeout "$limit" "$@" 2>&1 | tee "$OUT/$file"; exit "${PIPESTATUS[0]}" ) &
  running=$!
  wait "$running"
  local status=$?
  running=""
  echo "== step $n ended with status $status after ${SECONDS}s" | tee -a "$OUT/steps.log"
}
BENCH=(python3 bench.py config/nlq_small.py --compile=True --warmup=5 --steps=15 --rounds=3)

step 1 60 saved_activations.md python3 bench/saved_activations.py --device=cuda
step 2 200 bench_nlq_small_b12.md "${BENCH[@]}" --batch_size=12 --query_modes=linear,identity,nonlinear \
    --json="$OUT/bench_nlq_small_b12.json"
for B in 64 32 16; do
  step 3 130 "bench_nlq_small_b$B.md" "${BENCH[@]}" --batch_size="$B" --query_modes=linear,nonlinear \
      --json="$OUT/bench_nlq_small_b$B.json"
done
step 4 100 gpu_sanity.md python3 bench/gpu_sanity.py
step 5 50 kv_cache.md python3 bench/kv_cache.py --device=cuda --dtype=bfloat16 --n_layer=12 --n_head=12 \
    --n_embd=768 --block_size=1024 --prompt=64 --new_tokens=192 --past_tokens=16 \
    --query_modes=linear,identity,nonlinear
if (( ${#skipped[@]} )); then
  echo "not run, the budget of ${BUDGET}s would not hold them: ${skipped[*]}" | tee -a "$OUT/steps.log"
fi
