# The fair comparison at the paper's scale (Karbevski, arXiv 2603.13381): GPT-3 small (12 x 768, 12 heads,
# context 1024) on OpenWebText at the paper's settings (config/baseline_small.py: 60,000 steps of 491,520
# tokens = 29.5B tokens a run, warmup 2000, cosine to lr / 10, AdamW 0.9/0.95, weight decay 0.1, clip 1.0).
# The paper ran linear at one rate (6e-4) against a ~29-configuration sweep of its method; here every arm gets
# the same learning-rate search: one grid for all, 6e-4 to 4.8e-3 in x2 steps, on selection seed 1337,
# extended one step at an edge (at most twice), then half steps around the best; the chosen rate then runs on
# final seeds 2001-2003 (paired statistics against linear, on the whole val split).
# Arms: linear (the paper's baseline), linear + QK-norm (the public re-run's recipe), nonlinear (the paper's
# method, halved scale 1/(2 sqrt(64))), nonlinear + QK-norm at the standard scale 1/sqrt(64) (close to the
# re-run's best variant), wide (+12.5% non-embedding matrix parameters: mlp_hidden 3648 = 4.75 x 768) and
# identity (q = x).
#
# Cost: an arm makes 9-11 runs, 54-66 in all, 1011-1235 H200 GPU-hours at bench/RESULTS.md's one-H200 speeds
# (docs/cluster.md); the --dry_run line below prints the plan and recomputes it from any bench.py JSON.
# Budget: 29.5B tokens a run, 237 tokens per parameter (124.4M parameters, embeddings included: the convention of
# every study; 347 per non-embedding parameter), the paper's own, far past compute-optimal (~20).
#   python -m research.sweep studies/paper_small.py --dry_run --bench_json bench/results/h200_2026-11-30/bench_nlq_small.json
#   python prepare_data.py openwebtext
#   python -m research.sweep studies/paper_small.py --print 8   # the torchrun lines of the runs due now
#   python -m research.sweep studies/paper_small.py --executor slurm --gpus_per_run 8 --slurm_partition PART --slurm_time 480
#   python -m research.report studies/paper_small.py
name = "paper_small"
config = "config/baseline_small.py"
overrides = {}
_hd = 768 // 12  # head_dim
arms = {
    "linear": dict(query_mode="linear"),
    "linear_qknorm": dict(query_mode="linear", qk_norm=True),
    "nonlinear": dict(query_mode="nonlinear"),
    "nonlinear_qknorm_std": dict(query_mode="nonlinear", qk_norm=True, attn_scale=1 / _hd ** 0.5),
    "wide": dict(query_mode="linear", mlp_hidden=3648),
    "identity": dict(query_mode="identity"),
}
learning_rates = [6e-4, 1.2e-3, 2.4e-3, 4.8e-3]
selection_seeds = [1337]
seeds = [2001, 2002, 2003]
contrasts = [
    ("nonlinear", "linear_qknorm", "the paper's query vs the re-run's recipe (QK-norm), each at its own best rate"),
    ("nonlinear_qknorm_std", "linear_qknorm", "the nonlinear query when both arms have QK-norm"),
    ("nonlinear", "identity", "f itself: x + f(x) vs x, both at the halved scale"),
]
