# CPU study scale (not a paper setting): a 4-layer, 128-wide byte-level GPT on ~28 MB of English Wikipedia
# (enwik8 convention: UTF-8 bytes, vocab 256, loss reported in bits per byte). ~1200 steps of 16 x 128 bytes.
# 3% of the articles are the val split (~0.9M bytes): enough for a stable whole-split eval at the end of
# each run.
#   python prepare_data.py local --input ../shared/data/enwiki2015/AA --name enwiki_bytes --tokenizer byte --val_fraction 0.03
#   python train.py config/enwiki_bytes.py --query_mode=nonlinear
# studies/enwiki_cpu.py runs every arm of the paper's comparison at this scale.
out_dir = "out/enwiki_bytes"
dataset = "enwiki_bytes"
query_mode = "linear"

n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
dropout = 0.0

batch_size = 16
gradient_accumulation_steps = 1
max_iters = 1200
lr_decay_iters = 1200
warmup_iters = 60
learning_rate = 2e-3
min_lr = 2e-4
beta2 = 0.99

eval_interval = 300
eval_windows = 800  # fixed windows per split: 50 batches of 16
log_interval = 100
device = "cpu"
compile = False
