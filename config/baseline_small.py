# The paper's linear baseline (Karbevski, arXiv 2603.13381, experiments): GPT-3 small (12 layers, 12 heads,
# n_embd 768, context 1024, GPT-2 BPE padded to 50304, tied embeddings, no biases, dropout 0) on OpenWebText,
# 12 x 40 x 1024 = 491,520 tokens per step for 60,000 steps (~29.5B tokens), standard W_Q, lr 6e-4 -> 6e-5.
#   python prepare_data.py openwebtext
#   torchrun --standalone --nproc_per_node=8 train.py config/baseline_small.py
# The other *_small configs start from this one, so every arm shares data order, eval windows and schedule.
out_dir = "out/baseline_small"
wandb_run_name = "baseline_small"
dataset = "openwebtext"
query_mode = "linear"

n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
vocab_size = 50304
bias = False
tie_weights = True
dropout = 0.0

batch_size = 12
gradient_accumulation_steps = 40  # global: divided among the processes under torchrun
max_iters = 60000
lr_decay_iters = 60000
warmup_iters = 2000
learning_rate = 6e-4
min_lr = 6e-5
beta1 = 0.9
beta2 = 0.95
weight_decay = 0.1
grad_clip = 1.0

eval_interval = 1000
eval_windows = 2400  # fixed windows per split: 200 batches of 12
log_interval = 10
seed = 1337
