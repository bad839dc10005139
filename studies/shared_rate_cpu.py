# Linear vs nonlinear at one shared learning rate that both arms train at, on enough seeds to pin the gap.
# studies/lr_sensitivity_cpu.py found that choosing each arm's rate on 3 selection seeds puts the nonlinear query
# at the edge of its curve (1.13e-2), where 5 of its 12 final seeds stall or leave the early plateau late, so its
# gap to linear there (+0.108 [+0.022, +0.195]) measures the rate choice more than the query, and would need
# 2,313 pairs for a CI of +-0.3%. Here both arms run at 8e-3: linear's best rate on those curves, and inside the
# nonlinear query's band (within 1% of its best mean), with no stall in either arm's 3 selection seeds there.
# The rate was chosen from the curves' selection seeds (1337-1339), never from these final seeds. The pairs'
# spread measured among on-time runs (sd 0.013-0.018 nats) needs about 25-41 pairs for +-0.3% of linear's loss:
# 30 final seeds, enough for an sd up to about 0.0145 (the report's precision table gives the count the measured
# spread needs). Not each arm's own best rate: the question is the query's effect at a rate safe for both.
# linear at 8e-3 on seeds 2001-2012 is the same experiment as in studies/enwiki_cpu.py (same config, same keys),
# so the runs folder is shared and those runs are made once.
# Runs are made two at a time on a shared 2-core machine, 1 thread each (~6-9 min a run); judge speed by
# bench.py, not by the seconds axis of val_loss.png.
# Budget: 2.46M tokens a run, 2.9 tokens per parameter (0.84M parameters, embeddings included: the convention of
# every study; 3.1 per non-embedding parameter), far below compute-optimal (~20) and the paper's ~240.
#   python prepare_data.py local --input ../shared/data/enwiki2015/AA --name enwiki_bytes --tokenizer byte --val_fraction 0.03
#   python -m research.sweep studies/shared_rate_cpu.py --jobs 2 --threads 1
#   python -m research.report studies/shared_rate_cpu.py
name = "shared_rate_cpu"
config = "config/enwiki_bytes.py"
runs_dir = "results/enwiki_cpu/runs"
overrides = {}
arms = {
    "linear": dict(query_mode="linear"),
    "nonlinear": dict(query_mode="nonlinear"),
}
learning_rates = {"linear": [8e-3], "nonlinear": [8e-3]}
selection_seeds = []
seeds = list(range(2001, 2031))
precision = 0.003  # a 95% CI half-width of 0.3% of linear's loss (report.py: seeds needed at the measured sd)
