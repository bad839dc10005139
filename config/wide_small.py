# The paper's larger baseline (Karbevski, arXiv 2603.13381, experiments): linear W_Q with MLP width
# 3648 = 4.75 x 768, +12.5% non-embedding (matrix) parameters over config/baseline_small.py; lr 6e-4 -> 6e-5,
# otherwise the same.
#   torchrun --standalone --nproc_per_node=8 train.py config/wide_small.py
from config.baseline_small import *

out_dir = "out/wide_small"
wandb_run_name = "wide_small"
mlp_hidden = 3648
