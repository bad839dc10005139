# The paper's claim against a baseline tuned as hard as its method (Karbevski, arXiv 2603.13381): GPT-3 small
# (12 x 768, 12 heads, context 1024, GPT-2 BPE OpenWebText; config/baseline_small.py) at the paper's settings. The
# paper ran linear at one rate (6e-4) against a ~30-configuration sweep of its method (rates 8e-4 to 3.4e-3,
# several weight decays); here linear, linear + QK-norm and nonlinear get one symmetric search over learning
# rate x weight decay, then paired final runs at the paper's full horizon.
# Token budget (tokens per parameter on total parameters, embeddings included: the convention of every study):
# a final run is the paper's 60,000 steps of 491,520 tokens = 29.5B tokens, 237 tokens per parameter (347 per
# non-embedding parameter) of the 124.4M; a selection run is a twentieth of it, 3,000 steps = 1.47B tokens, 11.9
# per parameter. The dry run prints both ways.
# Search, the same for every arm: weight decay 0.05, 0.1 (the paper's) and 0.2 (also_search), and for each a
# learning-rate search from the grid 6e-4, 1.2e-3, 2.4e-3 (x2 steps, the paper's linear rate at the bottom and
# its method's range inside), extended at an edge (at most twice), then half steps; each point is the mean of two
# selection seeds (1337, 1338) with the stall rule (stall_margin = 2: no rate at or within a x2 step below a rate
# at which a selection run stalled or diverged). Selection runs: 3,000 steps, warmup 100 and a cosine to lr / 10 at 3,000
# (the paper's schedule shrunk 20x). The (rate, weight decay) with the lowest mean selection loss then runs on
# final seeds 2001-2003 with the paper's schedule (warmup 2,000, cosine to lr / 10 at 60,000): paired statistics
# against linear on the whole val split, and nonlinear against linear + QK-norm. A rate chosen at a twentieth of
# the horizon may not be the best at the full one, for any arm alike; the searches are otherwise unaffordable
# (at the full horizon: ~1,700-2,300 GPU-hours).
# On one H200 (the committed bench/RESULTS.md speeds, compiled, bf16): 99-135 runs, about 251-284 GPU-hours, 167
# of them the 9 final runs; `sweep.py --dry_run` recomputes it from any bench.py JSON or --tokens_per_s.
#   python prepare_data.py openwebtext --num_proc 16
#   python -m research.sweep studies/paper_claim_gpu.py --dry_run
#   python -m research.sweep studies/paper_claim_gpu.py          # one GPU, runs one at a time; resumable
#   python -m research.sweep studies/paper_claim_gpu.py --executor slurm --gpus_per_run 8 --slurm_partition PART
#   python -m research.report studies/paper_claim_gpu.py
name = "paper_claim_gpu"
config = "config/baseline_small.py"
overrides = dict(max_iters=3000, lr_decay_iters=3000, warmup_iters=100, eval_interval=250)
final_overrides = dict(max_iters=60000, lr_decay_iters=60000, warmup_iters=2000, eval_interval=1000)
arms = {
    "linear": dict(query_mode="linear"),
    "linear_qknorm": dict(query_mode="linear", qk_norm=True),
    "nonlinear": dict(query_mode="nonlinear"),
}
contrasts = [("nonlinear", "linear_qknorm", "f against a linear baseline with QK-norm, each tuned alike")]
learning_rates = [6e-4, 1.2e-3, 2.4e-3]
also_search = {"weight_decay": [0.05, 0.1, 0.2]}
selection_seeds = [1337, 1338]
seeds = [2001, 2002, 2003]
stall_margin = 2
slurm = dict(gpus_per_run=8, time=480)
