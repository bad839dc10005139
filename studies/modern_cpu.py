# Does the nonlinear query help on today's recipe? Linear vs nonlinear at the CPU study's scale on
# config/modern_cpu.py: config/enwiki_bytes.py's 4 x 128 byte-level GPT on English Wikipedia (1,200 steps of
# 16 x 128 bytes) trained as nanochat and modded-nanogpt train: rotary positions, QK-norm, ReLU², untied
# embeddings, Muon for the matrices inside the blocks (W_Q, W_K, W_V, f's W1 and W2 each its own matrix in both
# arms), AdamW for the embeddings, and warmup-stable-decay (the last 20% a linear decay to 0).
# Both arms use the standard attention scale 1/sqrt(head_dim) (the config's attn_scale): with QK-norm each
# head's q is RMS-normalised, so the paper's halving of q (its scale 1/(2 sqrt(head_dim))) is undone and only the
# attention temperature would differ; the arms then differ in the query alone, q = x W_Q against q = x + f(x).
# Search, the same for both arms: Muon's rate (learning_rate) on the grid 1e-2, 2e-2 (nanochat's), 4e-2,
# extended at an edge (at most twice), then half steps, each point the mean of selection seeds 1337 and 1338, at
# the final horizon itself (a CPU can afford it: nothing is carried). The AdamW rates follow one rule for both
# arms: nanochat's at 768 scaled by (n_embd / 768)^-0.5 (config/modern_cpu.py). The chosen rate then runs on
# final seeds 2001-2008, paired by seed (the same data order for both arms).
# What it can show: whether f changes the val loss of a 0.85M-parameter model on this recipe at 2.9 tokens per
# parameter. What it cannot: anything at 124M (the paper's scale: studies/modern_gpu.py asks it there); the
# paper's own recipe found no gain for f at this CPU scale either (results/enwiki_cpu).
# Budget: 2.46M tokens a run, 2.9 tokens per parameter (embeddings included, untied: the convention of every
# study). Runs are made two at a time on a shared 2-core machine, 1 thread each: judge speed by bench.py.
# Stalls, declared before the runs: a stalled or late final run (docs/studies.md) is kept, never replaced by
# another seed (that would choose seeds by their outcome); the report gives each arm's stall rate with its exact
# 95% interval and the gap without flagged pairs beside the all-pairs gap.
#   python prepare_data.py local --input ../shared/data/enwiki2015/AA --name enwiki_bytes --tokenizer byte --val_fraction 0.03
#   python -m research.sweep studies/modern_cpu.py --jobs 2 --threads 1
#   python -m research.report studies/modern_cpu.py
name = "modern_cpu"
config = "config/modern_cpu.py"
overrides = {}
arms = {
    "linear": dict(query_mode="linear", min_lr=0.0),
    "nonlinear": dict(query_mode="nonlinear", min_lr=0.0),
}
learning_rates = [1e-2, 2e-2, 4e-2]
selection_seeds = [1337, 1338]
seeds = list(range(2001, 2009))
