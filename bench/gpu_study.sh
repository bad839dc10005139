#!/usr/bin/env bash
# The enwiki study at one-GPU scale (studies/enwiki_gpu.py) for as long as its time limit allows, and its report.
# Finished runs stay in results/enwiki_gpu/runs/, so a later call goes on from there (commit them: sweep.py
# skips every run whose metrics are complete). It needs the GPT-2-tokenised Wikipedia (13 MB):
#   python prepare_data.py local --input ../shared/data/enwiki2015/AA --name enwiki_gpt2 --tokenizer gpt2
# Run from the repository root; outputs land in $OUT (default bench/results/gpu_study_<date>):
#   OUT=bench/results/h200_study LIMIT=500 bash bench/gpu_study.sh
set -uo pipefail
OUT=${OUT:-bench/results/gpu_study_$(date +%F)}
mkdir -p "$OUT/study"
export PYTHONUNBUFFERED=1
timeout "${LIMIT:-400}" python3 sweep.py studies/enwiki_gpu.py --jobs 4 2>&1 | tee "$OUT/sweep.log"
python3 report.py studies/enwiki_gpu.py --out "$OUT/study" 2>&1 | tail -n 30
# the study's raw runs (metrics.jsonl and config.json of each run: what git keeps), to commit
tar czf "$OUT/enwiki_gpu_runs.tgz" --exclude=ckpt.pt --exclude='*.tmp' --exclude=train.log results/enwiki_gpu/runs
