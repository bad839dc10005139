# The pilot of studies/paper_small.py: the same arms, grid, seeds and protocol for a tenth of the steps
# (6,000 steps of 491,520 tokens = 2.95B tokens a run; warmup and decay scaled alike: warmup 200, cosine to
# lr / 10 at step 6,000; an eval every 500 steps). It checks the pipeline on the cluster (data, jobs,
# preemption, the report) and shows where each arm's rate lands before the full study is paid for; a rate
# chosen at a tenth of the horizon need not be the best at the full one, so the full study searches again.
# Cost (as studies/paper_small.py computes it, a tenth): 54-66 runs, 101-124 H200 GPU-hours.
# Budget: 2.95B tokens a run, 23.7 tokens per parameter (124.4M parameters, embeddings included: the convention
# of every study; 34.7 per non-embedding parameter).
#   python -m research.sweep studies/paper_short.py --dry_run --bench_json bench/results/h200_2026-11-30/bench_nlq_small.json
#   python -m research.sweep studies/paper_short.py --executor slurm --gpus_per_run 8 --slurm_partition PART --slurm_time 120
#   python -m research.sweep studies/paper_short.py --print 8
#   python -m research.report studies/paper_short.py
from studies.paper_small import *  # noqa: F401,F403  (arms, learning_rates, seeds, contrasts, config)

name = "paper_short"
overrides = dict(max_iters=6000, lr_decay_iters=6000, warmup_iters=200, eval_interval=500)
