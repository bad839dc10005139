# The paper's question on today's recipe at its scale: linear vs nonlinear query in the 124M GPT (12 x 768, 12
# heads, context 1024, GPT-2 BPE OpenWebText, 60,000 steps of 491,520 tokens = 29.5B tokens a run) trained as
# nanochat and modded-nanogpt train (config/modern_small.py: rotary positions, QK-norm, ReLU², untied embeddings,
# Muon for the matrices inside the blocks with W_Q, W_K, W_V, W1 and W2 each its own matrix in both arms, AdamW
# at nanochat's rates for the embeddings, warmup-stable-decay with a linear decay to 0 over the last 20%).
# Both arms at the standard attention scale 1/sqrt(64) (the config's attn_scale): with QK-norm the paper's
# halving of q is normalised away, so the arms differ in the query alone (studies/modern_cpu.py says why at CPU scale).
# The protocol is paper_claim_gpu's: Muon's rate (learning_rate) searched alike for both arms on the grid 1e-2,
# 2e-2 (nanochat's), 4e-2, extended at an edge, then half steps, on selection seeds 1337 and 1338 with the stall
# rule (stall_margin 2), at two horizons, 3,000 and 6,000 steps (1/20 and 1/10 of the final runs; each the same
# schedule at its own length: no warmup, the last 20% a decay); each arm's best rate per horizon fitted as a power
# law in training tokens and carried to 60,000 steps (docs/studies.md), then final seeds 2001-2003 at the carried
# rate, paired by seed. The AdamW rates and weight decay (0, nanochat's) are the config's for both arms: one rule.
# A warmup-stable-decay run's stable phase can be branched into cool-downs at other horizons
# (docs/training.md), which a study of training length would use; this study does not need it.
# On one H200 (the committed bench speeds, measured with AdamW: Muon's extra step is not yet timed on a GPU,
# bench/RESULTS.md has its CPU cost): 46-62 runs, about 170-193 GPU-hours, 113 of them the 6 final runs.
# Budget: 29.5B tokens a final run, 182 tokens per parameter (162.2M with the untied LM head, embeddings
# included: the convention of every study; 347 per non-embedding parameter).
# Stalls, declared before the runs: a stalled or late final run (docs/studies.md) is kept, never replaced by
# another seed (that would choose seeds by their outcome); the report gives each arm's stall rate with its exact
# 95% interval and the gap without flagged pairs beside the all-pairs gap.
#   python prepare_data.py openwebtext --num_proc 16
#   python -m research.sweep studies/modern_gpu.py --dry_run
#   python -m research.sweep studies/modern_gpu.py --executor slurm --gpus_per_run 8 --slurm_partition PART
#   python -m research.report studies/modern_gpu.py
name = "modern_gpu"
config = "config/modern_small.py"
overrides = dict(max_iters=60000, lr_decay_iters=60000, eval_interval=1000)  # the final runs
horizons = [3000, 6000]  # the search's max_iters: 1/20 and 1/10 of the final runs
horizon_evals = 12  # an eval every 250 and 500 steps
arms = {
    "linear": dict(query_mode="linear", min_lr=0.0),
    "nonlinear": dict(query_mode="nonlinear", min_lr=0.0),
}
learning_rates = [1e-2, 2e-2, 4e-2]
selection_seeds = [1337, 1338]
seeds = [2001, 2002, 2003]
stall_margin = 2
slurm = dict(gpus_per_run=8, time=480)
