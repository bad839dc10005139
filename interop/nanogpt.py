"""
nanoGPT's checkpoints as a starting point: train.py --init_from=PATH, PATH a ckpt.pt that nanoGPT's train.py
wrote (or the out_dir holding it).

    python train.py config/train_shakespeare_char.py --init_from=../nanoGPT/out-shakespeare-char/ckpt.pt \
        --out_dir=out/from_nanogpt

nanoGPT's GPT is nlq's `linear` GPT: the same parameter names and layouts (nn.Linear weights, c_attn holding
[W_Q; W_K; W_V]), the exact GELU, LayerNorm eps 1e-5, the scale 1/sqrt(head_dim) and a tied LM head. So its
weights load exactly in linear mode; in the other modes W_Q is mapped as for GPT-2 (interop/hf.py). A
checkpoint of a compiled model (names prefixed _orig_mod.) loads too. What starts is a new nlq run from those
weights: the optimizer and the step count start afresh.

The dataset must hold the checkpoint's vocabulary: the characters of nanoGPT's meta.pkl, in their order, where
one is found (check_vocabulary); else GPT-2 BPE for a GPT-2-sized model and the same size for any other.
"""
import os
import pickle
from types import SimpleNamespace

import torch

from nlq.tokenizers import GPT2_VOCAB

MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")  # nanoGPT's GPTConfig


def checkpoint_path(init_from):
    """The ckpt.pt init_from names: the file itself, or the one in a folder (a nanoGPT out_dir); None if it
    names neither."""
    if os.path.isfile(init_from):
        return init_from
    inside = os.path.join(init_from, "ckpt.pt")
    return inside if os.path.isfile(inside) and not os.path.isfile(os.path.join(init_from, "config.json")) else None


def read_checkpoint(path):
    """nanoGPT's checkpoint dict (weights_only=True, on the CPU), its model's names without _orig_mod.
    ValueError naming what the file is instead."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"cannot read init_from {path} with torch.load(weights_only=True) ({type(e).__name__}): "
                         f"it is not a checkpoint nanoGPT's train.py wrote, or it is damaged") from None
    args = ckpt.get("model_args", {}) if isinstance(ckpt, dict) else {}
    if "query_mode" in args:
        raise ValueError(f"{path} is an nlq checkpoint: continue its run with --init_from=resume, or export it "
                         f"(python -m interop.convert hf RUN --out=FOLDER) and start from --init_from=FOLDER")
    if not isinstance(ckpt, dict) or "model" not in ckpt or any(k not in args for k in MODEL_ARGS):
        raise ValueError(f"{path} is not a checkpoint nanoGPT's train.py wrote (it needs model and model_args "
                         f"with {', '.join(MODEL_ARGS)})")
    # _orig_mod.: a compiled model's names; attn.bias: the causal mask nanoGPT keeps where it lacks flash attention
    ckpt["model"] = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()
                     if not k.removeprefix("_orig_mod.").endswith(".attn.bias")}
    return ckpt


def gpt2_config(args):
    """nanoGPT's model_args as the GPT-2 config fields hf.gpt2_settings reads (its GPT is GPT-2's shape with
    the exact GELU and a tied head)."""
    return SimpleNamespace(model_type="nanogpt", activation_function="gelu", layer_norm_epsilon=1e-5,
                           scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                           n_positions=args["block_size"], n_layer=args["n_layer"], n_head=args["n_head"],
                           n_embd=args["n_embd"], n_inner=None, vocab_size=args["vocab_size"],
                           tie_word_embeddings=True)


class _PlainData(pickle.Unpickler):
    """Unpickles plain data only (dicts, lists, str, int): a meta.pkl never needs a class, so none is loaded."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def check_vocabulary(path, ckpt, meta, dataset):
    """ValueError, naming both and the fix, if the dataset (meta: its meta.json dict) is not tokenized as the
    checkpoint's data was; -> a note for the log saying what was checked. The checkpoint's characters are in its
    dataset's meta.pkl: beside ckpt.pt, or nanoGPT's data/<dataset>/meta.pkl one folder up (nanoGPT's layout)."""
    vocab = ckpt["model_args"]["vocab_size"]
    data = f"dataset {dataset} is tokenized with {meta['tokenizer']!r} ({meta['vocab_size']} tokens)"
    folder = os.path.dirname(os.path.abspath(path))
    near = [os.path.join(folder, "meta.pkl"),
            os.path.join(os.path.dirname(folder), "data", str((ckpt.get("config") or {}).get("dataset")), "meta.pkl")]
    pkl = next((p for p in near if os.path.isfile(p)), None)
    if pkl is not None:
        with open(pkl, "rb") as f:
            itos = _PlainData(f).load()["itos"]  # {id: character}
        chars = [itos[i] for i in range(len(itos))]
        if meta["tokenizer"] != "char" or meta.get("chars") != chars:
            raise ValueError(f"{data}, but init_from {path} was trained on the {len(chars)} characters of {pkl} "
                             f"(in another order, or others): the ids would mean other characters; prepare the "
                             f"same text with --tokenizer char (python prepare_data.py local --input TEXT --name "
                             f"NAME --tokenizer char)")
        return f"vocabulary: the dataset's {len(chars)} characters are those of {pkl}, in the same order"
    if vocab < GPT2_VOCAB and meta["vocab_size"] != vocab:  # (GPT-2's vocabulary: hf.check_tokenizer's check)
        raise ValueError(f"{data}, but init_from {path} has {vocab} tokens; give the dataset it was trained on (its "
                         f"meta.pkl beside ckpt.pt lets nlq check the characters)")
    return f"vocabulary: {vocab} tokens, checked by size only (no meta.pkl beside {path})"
