# Which part of f helps? Controls and ablations of the nonlinear query at the CPU study's scale
# (config/enwiki_bytes.py: 4 x 128, byte-level English Wikipedia), with the CPU study's protocol: the same
# learning-rate search on selection seed 1337 (grid 4e-3, 8e-3, 1.6e-2, extended at an edge, half steps around
# the best; min_lr = lr / 10 unless the arm sets it), then the chosen rate on final seeds 2001-2005 (linear
# and nonlinear) or 2001-2003 (the rest); paired statistics against linear on the whole val split.
# The arms linear, identity, nonlinear and linear_qknorm are the same experiments as in studies/enwiki_cpu.py,
# so both studies share one folder of runs (runs_dir) and those runs are made once. Each control is read
# against linear (the results table) and against the arm it differs from in one part (contrasts).
# Its runs were made two at a time on a shared 2-core machine: judge speed by bench.py (bench/RESULTS.md),
# not by the seconds axis of val_loss.png.
# Budget: 2.46M tokens a run, 2.9 tokens per parameter (0.84M parameters, embeddings included: the convention of
# every study; 3.1 per non-embedding parameter), far below compute-optimal (~20) and the paper's ~240.
#   python -m research.sweep studies/controls_cpu.py --jobs 2 --threads 1
#   python -m research.report studies/controls_cpu.py
name = "controls_cpu"
config = "config/enwiki_bytes.py"
runs_dir = "results/enwiki_cpu/runs"
overrides = {}
_hd = 128 // 4  # head_dim = n_embd / n_head of config/enwiki_bytes.py
arms = {
    "linear": dict(query_mode="linear"),  # the reference: x W_Q, scale 1/sqrt(hd)
    "nonlinear": dict(query_mode="nonlinear"),  # the paper: x + f(x), scale 1/(2 sqrt(hd))
    "identity": dict(query_mode="identity"),  # q = x at the halved scale (W_Q fixed to I)
    "residual": dict(query_mode="linear_residual"),  # the official "residual" control: x + x W_Q, halved scale
    "identity_std_scale": dict(query_mode="identity", attn_scale=1 / _hd ** 0.5),  # q = x, scale not halved
    "linear_half_scale": dict(query_mode="linear", attn_scale=0.5 / _hd ** 0.5),  # x W_Q at the halved scale
    "nonlinear_no_norm_in": dict(query_mode="nonlinear", query_norm_in=False),  # f without its input RMSNorm
    "nonlinear_no_norm_out": dict(query_mode="nonlinear", query_norm_out=False),  # f without its LayerNorm
    "nonlinear_r_quarter": dict(query_mode="nonlinear", query_hidden=32),  # f's width r = d/4 (paper: d/2)
    "nonlinear_r_full": dict(query_mode="nonlinear", query_hidden=128),  # r = d
    "nonlinear_qknorm": dict(query_mode="nonlinear", qk_norm=True),
    "linear_qknorm": dict(query_mode="linear", qk_norm=True),
    # linear decay of the learning rate to 0, one of the recipe changes of the public re-run
    "linear_decay_to_zero": dict(query_mode="linear", lr_schedule="linear", min_lr=0.0),
}
learning_rates = [4e-3, 8e-3, 1.6e-2]
selection_seeds = [1337]
seeds = [2001, 2002, 2003, 2004, 2005]
seeds_per_arm = {_arm: 3 for _arm in arms if _arm not in ("linear", "nonlinear")}
contrasts = [  # paired comparisons of two arms that differ in one part of the query, each at its chosen rate
    ("nonlinear", "identity", "f itself: x + f(x) vs x, both at the halved scale"),
    ("residual", "identity", "a learned linear residual: x + x·W_Q vs x, both at the halved scale"),
    ("nonlinear", "residual", "f's nonlinearity (with its norms) vs a linear residual of d² parameters"),
    ("identity_std_scale", "identity", "the halved scale, for q = x: 1/sqrt(hd) vs 1/(2 sqrt(hd))"),
    ("nonlinear_no_norm_in", "nonlinear", "dropping f's input RMSNorm"),
    ("nonlinear_no_norm_out", "nonlinear", "dropping f's output LayerNorm"),
    ("nonlinear_r_quarter", "nonlinear", "f's width r = d/4 instead of d/2"),
    ("nonlinear_r_full", "nonlinear", "f's width r = d instead of d/2"),
    ("nonlinear_qknorm", "linear_qknorm", "the nonlinear query when both arms have QK-norm"),
]
