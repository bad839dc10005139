# Does the nonlinear query's gap grow, shrink or change sign with model size? The same comparison at four sizes
# spanning 27x in non-embedding parameters (3.1M to 85M; head_dim 64), each trained on about 20 tokens per
# non-embedding parameter (Chinchilla's compute-optimal ratio, Hoffmann et al. 2022, with Kaplan et al.'s
# non-embedding count, the parameters the query changes) of GPT-2 BPE OpenWebText, with the arms linear,
# linear + QK-norm (a public re-run at GPT-3 Large found it matches the nonlinear query) and nonlinear (the
# paper's). Tokens per step grow with size as in GPT-3's and Pythia's recipes (64K to the paper's 491,520), the
# schedule is a 5% warmup and a cosine to lr / 10, and every rung and arm gets the same learning-rate search:
# a base grid of x2 steps around GPT-3's and Pythia's rates for the size (6e-4 at 125M, 1e-3 at 70M),
# extended at an edge, then half steps, on selection seed 1337; the chosen rate then runs on final seeds
# 2001-2003, paired by seed. report.py fits the gap against log10(non-embedding parameters).
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
selection_seeds = [1337]
seeds = [2001, 2002, 2003]
# rung: its shape, tokens per step (32 x accumulation x 1024), steps (20 tokens a non-embedding parameter), the
# schedule, and its base learning-rate grid
rungs = {
    "4x256": dict(n_layer=4, n_head=4, n_embd=256, gradient_accumulation_steps=2, max_iters=961, warmup_iters=48,
                  eval_interval=120, learning_rates=[1e-3, 2e-3, 4e-3]),
    "6x384": dict(n_layer=6, n_head=6, n_embd=384, gradient_accumulation_steps=4, max_iters=1621, warmup_iters=81,
                  eval_interval=200, learning_rates=[7.5e-4, 1.5e-3, 3e-3]),
    "8x512": dict(n_layer=8, n_head=8, n_embd=512, gradient_accumulation_steps=8, max_iters=1921, warmup_iters=96,
                  eval_interval=240, learning_rates=[5e-4, 1e-3, 2e-3]),
    "12x768": dict(n_layer=12, n_head=12, n_embd=768, gradient_accumulation_steps=15, max_iters=3457,
                   warmup_iters=173, eval_interval=432, learning_rates=[3e-4, 6e-4, 1.2e-3]),
}
slurm = dict(gpus_per_run=1, time=240)
