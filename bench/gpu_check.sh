#!/usr/bin/env bash
# The first thing to run whenever a GPU is lent: about 8 minutes on one H100, from a bare machine. Each step is its
# own process under its own time limit (the limits add up to 480 s) and appends one JSON row to
# $OUT/gpu_check.jsonl as it ends; a step that fails or runs out of time gets a row that says so, and the next
# step runs. So a call cut short keeps every row before, and the linear baseline comes first:
#   env              device, GPUs, torch, CUDA, commit
#   bench linear     tokens/s, MFU, peak memory at the paper's 124M (config/nlq_small.py: bf16, compiled)
#   correctness      the default nonlinear path (f under its checkpoint, SDPA) against f as written: loss and
#                    every gradient, float32 and bf16, eager and compiled (bench/gpu_check.py says the bounds)
#   bench nonlinear  as bench linear
#   graph_breaks     one graph, no break, for a training forward of the 124M nonlinear GPT
#   ddp              nonlinear at 124M under DDP with NCCL, on every GPU here (one rank on one GPU)
# Each step's output goes to $OUT/<step>.log. Run from the repository root:
#   OUT=bench/results/h100_$(date +%F) bash bench/gpu_check.sh
#   bash bench/gpu_check.sh --cpu-smoke      # every step at tiny shapes on the CPU (tests/test_gpu_check.py)
set -uo pipefail
SMOKE=()
[[ ${1:-} == --cpu-smoke ]] && SMOKE=(--cpu-smoke)
OUT=${OUT:-bench/results/gpu_check_$(date +%F)}
if (( ! ${#SMOKE[@]} )); then
  GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())") || exit 2
  (( GPUS > 0 )) || { echo "no CUDA GPU here: gpu_check.sh measures one (bash bench/gpu_check.sh --cpu-smoke runs" \
    "its steps on the CPU)" >&2; exit 2; }
fi
mkdir -p "$OUT"
ROWS=$OUT/gpu_check.jsonl
export PYTHONUNBUFFERED=1
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 rows
  shift 2
  rows=$(cat "$ROWS" 2>/dev/null | wc -l)
  echo "== $name (limit ${limit}s, ${SECONDS}s in)"
  timeout "$limit" "$@" --out "$ROWS" "${SMOKE[@]}" > "$OUT/${name// /_}.log" 2>&1
  local status=$?
  if (( $(cat "$ROWS" 2>/dev/null | wc -l) == rows )); then  # it wrote no row: it failed, or ran out of time
    echo "{\"step\": \"$name\", \"ok\": false, \"exit_status\": $status, \"timed_out\": $( ((status == 124)) &&
      echo true || echo false), \"log\": \"$OUT/${name// /_}.log\"}" >> "$ROWS"
  fi
  tail -n 1 "$ROWS"
}
step env 20 python3 bench/gpu_check.py env
step "bench linear" 110 python3 bench/gpu_check.py bench linear
step correctness 100 python3 bench/gpu_check.py correctness
step "bench nonlinear" 110 python3 bench/gpu_check.py bench nonlinear
step graph_breaks 40 python3 bench/gpu_check.py graph_breaks
step ddp 100 python3 -m torch.distributed.run --standalone --nproc_per_node="${GPUS:-1}" bench/gpu_check.py ddp
