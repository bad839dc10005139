# Does the nonlinear query's gap grow, shrink or change sign with model size? The same comparison at five sizes
# spanning 48x in non-embedding parameters (1.8M to 85M; 12M to 124M in all, the largest GPT-3 small, the paper's
# model; head_dim 64) on GPT-2 BPE OpenWebText, with the arms linear, linear + QK-norm (a public re-run at GPT-3
# Large found it matches the nonlinear query) and nonlinear (the paper's).
# Token budget (the convention of every study: tokens per parameter on total parameters, embeddings included, as
# Chinchilla counts them): each final run trains on 20 tokens per parameter, Chinchilla's compute-optimal ratio
# (Hoffmann et al. 2022), so every rung sits in the same regime. The dry run prints it both ways.
# Tokens per step grow with size as in GPT-3's and Pythia's recipes (64K to the paper's 491,520); warmup 5% of a
# final run's steps, then a cosine to lr / 10.
# Tuning, the same for every rung and arm: a base grid of x2 steps around GPT-3's and Pythia's rates for the size
# (6e-4 at 125M, 1e-3 at 70M), extended at an edge, then half steps, chosen on the mean of two selection seeds
# (1337, 1338) with the stall rule (stall_margin = 2: no rate at or within a x2 step below a rate at which a
# selection run stalled or diverged; results/lr_sensitivity_cpu). Each rung searches at two horizons, 1/16 and
# 1/8 of its final runs (1.25 and 2.5 tokens per parameter: close to where results/horizon_cpu's fit failed;
# read the selection curves before the final runs), every run with warmup 5% of its
# steps and 8 evals; its best rate at each horizon is fitted as a power law in tokens (Bjorck et al., ICLR 2025)
# and carried to the final runs, which run it on seeds 2001-2003 at 20 tokens per parameter, paired by seed. So
# every rung's rate is carried alike, and a rate bias that differs by size cannot pass for a trend.
# Five rungs, not four: with 3 seeds the trend test sees a gap that changes by -0.025 nats per 10x in 79% of
# ladders (the dry run's "Trend power", at the CPU studies' pair sd), against 43% for the four larger rungs alone;
# the smallest rung costs under 1% of the GPU-hours, 5 seeds at four rungs would reach only 59%.
# report.py: the gap at each size in nats and in % of the other arm's loss, its change per 10x parameters (least
# squares over the rungs, t on k - 2 df), the effective-size multiplier, robust summaries and the probe's plots.
# Stalls, declared before the runs: a stalled or late final run (docs/studies.md) is kept, never replaced by
# another seed (that would choose seeds by their outcome); the report gives each arm's stall rate with its exact
# 95% interval and the gap without flagged pairs beside the all-pairs gap.
#   python prepare_data.py openwebtext --num_proc 16
#   bash bench/gpu_ladder_pilot.sh                 # on one GPU first: every rung's tokens/s, the smallest rung
#   python -m research.sweep studies/ladder_gpu.py --dry_run --bench_json bench/results/ladder_pilot/bench_rungs.json
#   python -m research.sweep studies/ladder_gpu.py          # one GPU: the rungs in turn, smallest first
#   python -m research.report studies/ladder_gpu.py
name = "ladder_gpu"
config = "config/ladder_gpu.py"
overrides = {}
arms = {
    "linear": dict(query_mode="linear"),
    "linear_qknorm": dict(query_mode="linear", qk_norm=True),
    "nonlinear": dict(query_mode="nonlinear"),
}
contrasts = [("nonlinear", "linear_qknorm", "f against a linear baseline with QK-norm")]
selection_seeds = [1337, 1338]
seeds = [2001, 2002, 2003]
stall_margin = 2
horizon_evals = 8


def _rung(n_layer, n_embd, accum, final_steps, learning_rates):
    """A rung: its shape, 32 x accum x 1024 tokens a step, final runs of final_steps (x tokens a step = 20 x its
    parameters; warmup 5%, an eval every eighth), the search at 1/16 and 1/8 of them."""
    return dict(n_layer=n_layer, n_head=n_embd // 64, n_embd=n_embd, gradient_accumulation_steps=accum,
                max_iters=final_steps, lr_decay_iters=final_steps, warmup_iters=round(0.05 * final_steps),
                eval_interval=round(final_steps / 8), learning_rates=learning_rates,
                horizons=[round(final_steps / 16), round(final_steps / 8)])


rungs = {  # parameters: 11.6M, 16.3M, 30.3M, 51.5M, 124.4M (non-embedding 1.8M, 3.1M, 10.6M, 25.2M, 85.0M)
    "4x192": _rung(4, 192, 2, 3548, [1e-3, 2e-3, 4e-3]),
    "4x256": _rung(4, 256, 2, 4971, [1e-3, 2e-3, 4e-3]),
    "6x384": _rung(6, 384, 4, 4628, [7.5e-4, 1.5e-3, 3e-3]),
    "8x512": _rung(8, 512, 8, 3926, [5e-4, 1e-3, 2e-3]),
    "12x768": _rung(12, 768, 15, 5061, [3e-4, 6e-4, 1.2e-3]),
}
slurm = dict(gpus_per_run=1, time=240)
