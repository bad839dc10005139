"""
init_from: a run that starts from pretrained weights instead of a random initialisation (train.py).

    --init_from=gpt2 (gpt2-medium, gpt2-large, gpt2-xl)   OpenAI's GPT-2, from the Hugging Face Hub (interop/hf.py)
    --init_from=FOLDER                                    a transformers GPT-2 folder, or an nlq export
    --init_from=PATH/ckpt.pt                              a checkpoint nanoGPT's train.py wrote (interop/nanogpt.py)

The weights fix the model's shape, which the run takes and a resume keeps (TrainState.init_settings); the run
keeps its query mode, block_size (at most the source's) and the rest. Their tokenizer must be the dataset's:
checked before any weight is read. In linear mode the model computes the source's function exactly; in the
others W_Q is mapped as interop/hf.py's docstring says.
"""
import torch

from interop import hf, nanogpt
from nlq.checkpoint import split_c_attn


class Pretrained:
    """The weights of cfg["init_from"], checked against the run (cfg) and its dataset (meta: meta.json):
    .settings, the model keys they fix (for cfg), and .load_into(model) to copy them into the GPT built so."""

    def __init__(self, cfg, meta, log):
        source, path = cfg["init_from"], nanogpt.checkpoint_path(cfg["init_from"])
        if path is not None:  # nanoGPT: nn.Linear layouts, biases as it was trained
            ckpt = nanogpt.read_checkpoint(path)
            vocabulary = nanogpt.check_vocabulary(path, ckpt, meta, cfg["dataset"])
            config, args = nanogpt.gpt2_config(ckpt["model_args"]), ckpt["model_args"]
            self.settings, notes = hf.gpt2_settings(config, cfg, meta, bias=args["bias"], source="nanoGPT")
            self.weights, self.conv1d, notes = ckpt["model"], False, [*notes, vocabulary]
        else:  # GPT-2 or an nlq export: transformers' Conv1D layouts
            config = hf.load_gpt2_config(source)
            self.settings, notes = hf.gpt2_settings(config, cfg, meta)
            self.weights, self.conv1d = hf.load_gpt2(source, config)[0], True
        log("\n".join(notes))

    def load_into(self, model):
        """load_weights into an nlq GPT built from cfg with .settings (f's are left, where the query is nonlinear)."""
        return load_weights(model, self.weights, self.conv1d)


def load_weights(model, sd, conv1d=True):
    """Copy a GPT-2-shaped state dict (GPT2LMHeadModel's, an nlq export's, nanoGPT's) into an nlq GPT built
    from its settings (in place, no grad); returns the names of the nlq parameters it did not set.

    conv1d: the weights are in transformers' Conv1D layout (in, out) and are transposed. A GPT-2's c_attn
    gives K and V to c_k and c_v and W_Q by query mode (interop/hf.py's docstring); an export's query parameters
    keep their names; wpe is cropped to block_size. A bias=False export has no query biases: theirs stay zero,
    as initialised. ValueError if a shape does not fit.
    """
    cfg, C = model.config, model.config.n_embd
    mine = model.state_dict()
    out = {}
    for name, t in sd.items():
        if name == "lm_head.weight" and cfg.tie_weights:
            continue
        t = t.t() if conv1d and name.endswith(hf.CONV1D) else t
        if name == "transformer.wpe.weight" and cfg.pos_embedding == "rope" and not t.any():
            continue  # a rope export's zero wpe (interop/hf.py)
        if name == "transformer.wpe.weight":
            t = t[:cfg.block_size]
        out[name] = t
    out = split_c_attn(out, C)
    for name in [k for k in out if ".attn.query.c_q." in k and cfg.query_mode != "linear"]:  # the source's W_Q
        w_q = out.pop(name)
        if cfg.query_mode == "linear_residual":
            w_q = w_q - torch.eye(C, dtype=w_q.dtype) if name.endswith("weight") else w_q
            out[name.replace(".c_q.", ".w_q.")] = w_q
    for name, t in out.items():
        if name not in mine or mine[name].shape != t.shape:
            raise ValueError(f"the pretrained {name} {tuple(t.shape)} does not fit the nlq model "
                             f"({tuple(mine[name].shape) if name in mine else 'no such parameter'})")
    with torch.no_grad():
        for name, t in out.items():
            mine[name].copy_(t)
    return sorted(set(mine) - set(out) - ({"lm_head.weight"} if cfg.tie_weights else set()))
