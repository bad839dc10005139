# The paper's method (Karbevski, arXiv 2603.13381, method and experiments): nonlinear query Q = (x + f(x)) / 2
# with f = LayerNorm(W2 GELU(W1 RMSNorm(x))), W1: 768x384, W2: 384x768, on GPT-3 small / OpenWebText,
# lr 8e-4 -> 8e-5. Everything else as config/baseline_small.py.
#   torchrun --standalone --nproc_per_node=8 train.py config/nlq_small.py
from config.baseline_small import *

out_dir = "out/nlq_small"
wandb_run_name = "nlq_small"
query_mode = "nonlinear"
learning_rate = 8e-4
min_lr = 8e-5
