# A larger model for FSDP: GPT-3 Large's shape (Brown et al. 2020, table 2.1: 24 layers, d_model 1536,
# 16 heads of 96; context 2048 there, 1024 here) with the paper's nonlinear query (f: 1536 -> 768 -> 1536 in
# every layer): 758M parameters. Weights, gradients and AdamW moments take 16 bytes per parameter, 12.1 GB on
# every GPU under DDP (plus its 4-byte gradient buckets); fsdp=True shards them, 1.5 GB per GPU on 8
# (docs/fsdp.md). GPT-3 Large's learning rate (2.5e-4 at ~0.5M tokens per step), not tuned for the
# nonlinear query. Data, steps and tokens per step (480 x 1024 = 491,520) as nlq_small, in 32 micro-batches
# of 15, so that 8, 16 or 32 GPUs share them evenly.
#   torchrun --standalone --nproc_per_node=8 train.py config/nlq_large.py
#   sbatch scripts/slurm_fsdp.sbatch config/nlq_large.py          (2 nodes x 8 GPUs; see the script)
from config.nlq_small import *

out_dir = "out/nlq_large"
wandb_run_name = "nlq_large"
n_layer = 24
n_head = 16
n_embd = 1536
learning_rate = 2.5e-4
min_lr = 2.5e-5
batch_size = 15
gradient_accumulation_steps = 32  # global: 4 per GPU on 8 GPUs, 2 on 16, 1 on 32
fsdp = True
