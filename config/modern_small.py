# Today's recipe at the paper's 124M shape (config/baseline_small.py: 12 x 768, OpenWebText, 491,520 tokens a
# step for 60,000 steps): rotary positions, QK-norm, ReLU², untied embeddings, Muon for the matrices inside the
# blocks and a warmup-stable-decay schedule, as nanochat and modded-nanogpt train. Rates are nanochat's at
# n_embd 768 (its gpt.py setup_optimizers: matrix 0.02, embedding 0.2, unembedding 0.004; no weight decay; a
# linear warmdown over the last 20%, to 0); learning_rate is Muon's. --query_mode=nonlinear asks the paper's
# question on this recipe.
#   torchrun --standalone --nproc_per_node=8 train.py config/modern_small.py --query_mode=nonlinear
from config.baseline_small import *

out_dir = "out/modern_small"
wandb_run_name = "modern_small"
pos_embedding = "rope"
qk_norm = True
attn_scale = 1 / 64 ** 0.5  # the standard 1/sqrt(head_dim) in every query mode: QK-norm normalises away the
# nonlinear query's halving, so linear and nonlinear differ in the query alone
activation = "relu2"
tie_weights = False
optimizer = "muon"
learning_rate = 0.02  # Muon's rate (the matrices)
embedding_lr = 0.2
unembedding_lr = 0.004
weight_decay = 0.0
beta1 = 0.8  # nanochat's AdamW betas (its AdamW groups)
beta2 = 0.95
lr_schedule = "wsd"
warmdown_ratio = 0.2
warmup_iters = 0
min_lr = 0.0
