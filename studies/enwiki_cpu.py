# The paper's comparison at CPU scale on byte-level English Wikipedia (config/enwiki_bytes.py):
# linear vs identity vs nonlinear query, the +12.5% wider linear baseline, and linear + QK-norm.
# Every arm: the same 4-point learning-rate sweep (min_lr = lr / 10) at seed 1337, then its best rate with
# seeds 1338 and 1339. A seed fixes the initial weights, the order of training windows and the eval windows
# (train.py draws them from the seed alone): at one seed every arm sees the same batches.
#   python sweep.py studies/enwiki_cpu.py --jobs 2 --threads 1
#   python report.py studies/enwiki_cpu.py
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
learning_rates = [2e-3, 4e-3, 8e-3, 1.6e-2]
seeds = [1337, 1338, 1339]
