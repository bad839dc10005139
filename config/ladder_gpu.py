# The scaling ladder's shared settings (studies/ladder_gpu.py sets each rung's size and token budget): GPT-2 BPE
# web text (OpenWebText), context 1024, bf16 and torch.compile on one GPU (dtype and compile: their defaults
# there), the paper's AdamW and clipping. The final figure of a run is its loss over the whole val split.
#   python prepare_data.py openwebtext --num_proc 16
out_dir = "out/ladder"
dataset = "openwebtext"
block_size = 1024
dropout = 0.0
batch_size = 32           # sequences per micro-batch; each rung sets gradient_accumulation_steps
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
eval_windows = 384        # the fixed-window evals along training: 12 batches of 32, 0.39M tokens per split
log_interval = 50
eval_full_at_end = True
