# Does a learning rate chosen on short runs cost an arm at the final horizon, and does carrying it there remove an
# arm-dependent regret? Linear vs nonlinear at config/enwiki_bytes.py's scale (4 x 128, 0.84M parameters,
# byte-level English Wikipedia), final runs 4,800 steps (its budget x4, as in studies/controls_cpu_long.py:
# warmup 240, cosine to lr / 10 at 4,800; 9.83M tokens, 11.7 tokens per parameter, embeddings included: the
# convention of every study; 12.5 per non-embedding parameter).
# The protocol the GPU studies now use, at their horizons' ratio: each arm's learning-rate search (grid 8e-3,
# 1.13e-2, 1.6e-2, 2.26e-2 in √2 steps, extended at an edge, no half steps; the mean of selection seeds 1337 and
# 1338) runs at 300 and 600 steps, 1/16 and 1/8 of the final horizon (paper_claim_gpu: 1/20 and 1/10), warmup
# 5% of each run as in the final runs (15 and 30 steps), two evals a run. At each horizon the best rate lr* is
# the minimum of a parabola in log(lr) through the best grid rate and its neighbours; log lr* is fitted on
# log(tokens) (LR*(D) ∝ D^-β, Bjorck et al., ICLR 2025) and read at the final runs' tokens: the carried rate.
# Final seeds 2001-2003 run at the carried rate and at the short pick (the 300-step search's chosen rate, what the
# GPU studies did until now): the regret table gives, per arm, the loss at 4,800 steps of each, paired by seed,
# and whether the regret differs between the arms.
# What it shows: at 0.84M parameters and 12 tokens per parameter, whether the short pick costs either arm and
# whether the cost differs by arm, with 3 pairs. What it does not: the size of the shift at 124M and 237 tokens
# per parameter (β may differ with scale and with the data), nor a rate search at the final horizon (the carried
# rate is a fit from two horizons, and with 2 selection seeds its bootstrap interval is coarse).
# Its runs are made two at a time on a shared 2-core machine, 1 thread each: judge speed by bench.py.
# Every run is made by the code at commit 4518785 (a worktree of it, data/ linked), where W_Q, W_K and W_V
# were one fused matrix: later code draws linear's initial weights in another order (nonlinear's as before), so
# the study is finished there too, one version for all its runs.
# Stalls, declared before the runs: a stalled or late final run (docs/studies.md) is kept, never replaced by
# another seed (that would choose seeds by their outcome); the report gives each arm's stall rate with its exact
# 95% interval and the gap without flagged pairs beside the all-pairs gap.
#   python prepare_data.py local --input ../shared/data/enwiki2015/AA --name enwiki_bytes --tokenizer byte --val_fraction 0.03
#   python -m research.sweep studies/horizon_cpu.py --jobs 2 --threads 1
#   python -m research.report studies/horizon_cpu.py
name = "horizon_cpu"
config = "config/enwiki_bytes.py"
overrides = dict(max_iters=4800, lr_decay_iters=4800, warmup_iters=240, eval_interval=1200)
arms = {
    "linear": dict(query_mode="linear"),
    "nonlinear": dict(query_mode="nonlinear"),
}
learning_rates = [8e-3, 1.13e-2, 1.6e-2, 2.26e-2]
selection_seeds = [1337, 1338]
seeds = [2001, 2002, 2003]
half_steps = False
max_extensions = 2
horizons = [300, 600]
horizon_evals = 2
short_pick = True
