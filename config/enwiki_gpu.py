# GPU study scale (not a paper setting): a 6-layer, 384-wide GPT on GPT-2-tokenised English Wikipedia
# (6.8M tokens; one pass over the train split in 750 steps of 32 x 256 tokens), bf16, eager (runs this short
# would spend longer compiling than training). studies/enwiki_gpu.py runs every arm (python -m research.sweep).
#   python prepare_data.py local --input ../shared/data/enwiki2015/AA --name enwiki_gpt2 --tokenizer gpt2
out_dir = "out/enwiki_gpu"
dataset = "enwiki_gpt2"
query_mode = "linear"

n_layer = 6
n_head = 6
n_embd = 384
block_size = 256
dropout = 0.0

batch_size = 32
gradient_accumulation_steps = 1
max_iters = 750
lr_decay_iters = 750
warmup_iters = 50
learning_rate = 1e-3
min_lr = 1e-4

eval_interval = 150
eval_windows = 1280  # fixed windows per split: 40 batches of 32
log_interval = 50
compile = False
