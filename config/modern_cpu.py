# Today's recipe (config/modern_small.py: RoPE, QK-norm, ReLU², untied embeddings, Muon, WSD) at the CPU study's
# scale (config/enwiki_bytes.py: 4 x 128, byte-level enwiki, 1200 steps of 16 x 128 bytes). nanochat scales its
# AdamW rates by (n_embd / 768)^-0.5 = 2.45 at 128: embedding 0.49, unembedding 0.0098; Muon's rate is not scaled.
#   python prepare_data.py local --input ../shared/data/enwiki2015/AA --name enwiki_bytes --tokenizer byte --val_fraction 0.03
#   python train.py config/modern_cpu.py --query_mode=nonlinear
from config.enwiki_bytes import *
from config.modern_small import (  # noqa: F401 (today's recipe: its keys, one definition)
    pos_embedding, qk_norm, activation, tie_weights, optimizer, learning_rate, weight_decay, beta1, beta2,
    lr_schedule, warmdown_ratio, warmup_iters, min_lr)

out_dir = "out/modern_cpu"
attn_scale = 1 / 32 ** 0.5  # 1/sqrt(head_dim) in every query mode, as in config/modern_small.py
embedding_lr = 0.49
unembedding_lr = 0.0098
