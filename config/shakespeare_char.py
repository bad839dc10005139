# CPU demo (teaching): a 4-layer character-level GPT on Tiny Shakespeare that trains in a few minutes on a
# laptop CPU and reaches val loss < 2.0 nats/char. Not a paper setting; the query mode is yours to pick.
#   python train.py config/shakespeare_char.py                      # nonlinear query
#   (the first run prepares data/shakespeare_char from the Tiny Shakespeare shipped in tests/data)
#   python train.py config/shakespeare_char.py --query_mode=linear  # the baseline, --out_dir=... to keep both
out_dir = "out/shakespeare_char"
dataset = "shakespeare_char"
query_mode = "nonlinear"

n_layer = 4
n_head = 4
n_embd = 128
block_size = 64
dropout = 0.0

batch_size = 12
gradient_accumulation_steps = 1
max_iters = 2000  # lr_decay_iters left unset: the decay ends at max_iters, also for a shorter --max_iters
warmup_iters = 100
learning_rate = 1e-3
min_lr = 1e-4
beta2 = 0.99  # few tokens per step: a shorter second-moment memory

eval_interval = 250
eval_windows = 240  # fixed windows per split: 20 batches of 12
log_interval = 50
device = "cpu"
compile = False
