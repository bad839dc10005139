# Does a gain of the nonlinear query belong to long training? One mid size (6 x 384, head_dim 64: 30.3M
# parameters, 10.6M non-embedding; the ladder's second rung) trained on three budgets, 20, 80 and 320 tokens per
# parameter (the convention of every study: tokens per parameter on total parameters, embeddings included; 320 is
# beyond the paper's ~240 at 124M), with the arms linear, linear + QK-norm and nonlinear, on GPT-2 BPE
# OpenWebText. The paper trains far past compute-optimal; the CPU studies ran at ~3 tokens per parameter. If f
# helps only late, the gap turns in its favour along these rungs.
# Every rung is the same model with the same recipe: 131,072 tokens a step, warmup 5% of a run, a cosine to lr / 10
# at the run's end, the same base grid (7.5e-4, 1.5e-3, 3e-3; extended at an edge, then half steps) chosen on the
# mean of two selection seeds (1337, 1338) with the stall rule (stall_margin = 2). Each budget searches at 1/16
# and 1/8 of its own final runs (warmup 5% there too, 8 evals a run), fits its best rates as a power law in tokens
# (Bjorck et al., ICLR 2025: the best rate falls as runs grow) and carries the rate to its own final runs, which
# run on seeds 2001-2003, paired by seed; the three fits' β, side by side in the report, say whether one power
# law holds over the whole 16x of lengths. The 20-tokens budget searches at 1.25 and 2.5 tokens per parameter,
# close to where results/horizon_cpu's fit failed: read its selection curves before its final runs.
# report.py: a training-length ladder (its rungs share one model): the gap at each budget in nats and in % of
# the other arm's loss, its change per 10x training tokens, the effective-data multiplier (how many times the
# tokens linear would need to reach the other arm's loss), robust summaries and the probe's plots.
# Stalls, declared before the runs: a stalled or late final run (docs/studies.md) is kept, never replaced by
# another seed (that would choose seeds by their outcome); the report gives each arm's stall rate with its exact
# 95% interval and the gap without flagged pairs beside the all-pairs gap.
#   python prepare_data.py openwebtext --num_proc 16
#   python -m research.sweep studies/length_gpu.py --dry_run
#   python -m research.sweep studies/length_gpu.py          # one GPU: the budgets in turn, shortest first
#   python -m research.report studies/length_gpu.py
name = "length_gpu"
config = "config/ladder_gpu.py"
overrides = dict(n_layer=6, n_head=6, n_embd=384, gradient_accumulation_steps=4)
arms = {
    "linear": dict(query_mode="linear"),
    "linear_qknorm": dict(query_mode="linear", qk_norm=True),
    "nonlinear": dict(query_mode="nonlinear"),
}
contrasts = [("nonlinear", "linear_qknorm", "f against a linear baseline with QK-norm")]
learning_rates = [7.5e-4, 1.5e-3, 3e-3]
selection_seeds = [1337, 1338]
seeds = [2001, 2002, 2003]
stall_margin = 2
horizon_evals = 8


def _budget(final_steps):
    """A rung: final runs of final_steps x 131,072 tokens (warmup 5%, 8 evals), the search at 1/16 and 1/8 of them."""
    return dict(max_iters=final_steps, lr_decay_iters=final_steps, warmup_iters=round(0.05 * final_steps),
                eval_interval=round(final_steps / 8), horizons=[round(final_steps / 16), round(final_steps / 8)])


rungs = {  # final steps x 131,072 tokens = 20, 80, 320 x 30,331,776 parameters
    "20tpp": _budget(4628),
    "80tpp": _budget(18513),
    "320tpp": _budget(74052),
}
slurm = dict(gpus_per_run=1, time=240)
