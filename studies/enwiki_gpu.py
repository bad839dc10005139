# The CPU study (studies/enwiki_cpu.py) at a larger scale for one GPU: config/enwiki_gpu.py (6 x 384, GPT-2 BPE
# Wikipedia), the same five arms, the same 3-point learning-rate sweep, then the best rate with 2 more seeds.
#   bash bench/gpu_check.sh        (runs: python sweep.py studies/enwiki_gpu.py --jobs 4; python report.py ...)
name = "enwiki_gpu"
config = "config/enwiki_gpu.py"
overrides = {}
arms = {
    "linear": dict(query_mode="linear"),
    "identity": dict(query_mode="identity"),
    "nonlinear": dict(query_mode="nonlinear"),
    "wide": dict(query_mode="linear", mlp_hidden=1824),  # 4.75 x 384: +12.5% non-embedding matrix parameters
    "linear_qknorm": dict(query_mode="linear", qk_norm=True),
}
learning_rates = [1e-3, 2e-3, 4e-3]  # the CPU study found small models prefer high rates
seeds = [1337, 1338, 1339]
