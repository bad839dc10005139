# The paper's comparison at CPU scale on byte-level English Wikipedia (config/enwiki_bytes.py):
# linear vs identity vs nonlinear query, the +12.5% wider linear baseline, and linear + QK-norm.
# Every arm gets the same learning-rate search on selection seed 1337 (the grid 4e-3, 8e-3, 1.6e-2, extended
# at an edge, then half steps around the best; min_lr = lr / 10), then its chosen rate on the final seeds
# 2001-2005 (identity and linear + QK-norm: 2001-2003), which never took part in choosing it. A seed fixes the
# initial weights, the order of training windows and the eval windows: at one seed every arm sees the same
# batches. The final figure is the val loss over the whole val split.
# Its runs were made two at a time on a shared 2-core machine: judge speed by bench.py (bench/RESULTS.md),
# not by the seconds axis of val_loss.png.
# Budget: 2.46M tokens a run, 2.9 tokens per parameter (0.84M parameters, embeddings included: the convention of
# every study; 3.1 per non-embedding parameter), far below compute-optimal (~20) and the paper's ~240.
#   python prepare_data.py local --input ../shared/data/enwiki2015/AA --name enwiki_bytes --tokenizer byte --val_fraction 0.03
#   python -m research.sweep studies/enwiki_cpu.py --jobs 2 --threads 1
#   python -m research.report studies/enwiki_cpu.py
name = "enwiki_cpu"
config = "config/enwiki_bytes.py"
overrides = {}
arms = {
    "linear": dict(query_mode="linear"),
    "identity": dict(query_mode="identity"),
    "nonlinear": dict(query_mode="nonlinear"),
    "wide": dict(query_mode="linear", mlp_hidden=608),  # 4.75 x 128: +12.5% non-embedding matrix parameters
    "linear_qknorm": dict(query_mode="linear", qk_norm=True),
}
learning_rates = [4e-3, 8e-3, 1.6e-2]
selection_seeds = [1337]
seeds = [2001, 2002, 2003, 2004, 2005]
seeds_per_arm = {"identity": 3, "linear_qknorm": 3}
