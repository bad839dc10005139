# The paper's identity arm (Karbevski, arXiv 2603.13381, introduction): W_Q fixed to the identity, q = x
# (scale 1/(2 sqrt(head_dim))), 12 x 768^2 fewer non-embedding parameters than the baseline. Otherwise as
# config/baseline_small.py (lr 6e-4 -> 6e-5).
#   torchrun --standalone --nproc_per_node=8 train.py config/identity_small.py
from config.baseline_small import *

out_dir = "out/identity_small"
wandb_run_name = "identity_small"
query_mode = "identity"
