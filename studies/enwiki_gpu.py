# The CPU study (studies/enwiki_cpu.py) at a larger scale for one GPU: config/enwiki_gpu.py (6 x 384, GPT-2
# BPE Wikipedia), the same five arms and the same protocol: a learning-rate search on selection seed 1337
# (grid 1e-3, 2e-3, 4e-3, extended at an edge, then half steps), then the chosen rate on final
# seeds 2001-2003.
# Budget: 6.1M tokens a run, 0.2 tokens per parameter (30.0M parameters, embeddings included: the convention of
# every study; 0.6 per non-embedding parameter): a short trial of the pipeline, not a regime to read gains from.
#   python prepare_data.py local --input ../shared/data/enwiki2015/AA --name enwiki_gpt2 --tokenizer gpt2
#   python -m research.sweep studies/enwiki_gpu.py --jobs 4
#   python -m research.report studies/enwiki_gpu.py
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
learning_rates = [1e-3, 2e-3, 4e-3]
selection_seeds = [1337]
seeds = [2001, 2002, 2003]
