# Does the gap grow or shrink with training? Linear vs nonlinear at 4x the CPU study's steps
# (config/enwiki_bytes.py: 4800 steps instead of 1200, warmup 240, cosine to lr / 10 at step 4800),
# 3 seeds each.
# No new search: each arm runs at the rate studies/enwiki_cpu.py chose for it (linear 8e-3, nonlinear 1.13e-2,
# both chosen on seed 1337 at 1200 steps). A rate tuned for the short horizon may not be the best for the long
# one, for either arm; the report's paired CI is about these two rates, not about each arm's best.
# The final seeds are the CPU study's first three, so each pair of runs sees the same data order.
# Its runs were made two at a time on a shared 2-core machine: judge speed by bench.py (bench/RESULTS.md),
# not by the seconds axis of val_loss.png.
# Budget: 9.83M tokens a run, 11.7 tokens per parameter (0.84M parameters, embeddings included: the convention of
# every study; 12.5 per non-embedding parameter).
#   python -m research.sweep studies/controls_cpu_long.py --jobs 2 --threads 1
#   python -m research.report studies/controls_cpu_long.py
name = "controls_cpu_long"
config = "config/enwiki_bytes.py"
overrides = dict(max_iters=4800, lr_decay_iters=4800, warmup_iters=240, eval_interval=1200)
arms = {
    "linear": dict(query_mode="linear"),
    "nonlinear": dict(query_mode="nonlinear"),
}
learning_rates = {"linear": [8e-3], "nonlinear": [1.13e-2]}
selection_seeds = []
seeds = [2001, 2002, 2003]
