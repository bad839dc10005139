"""
nlq and the Hugging Face ecosystem: export a run to a `transformers` folder, import GPT-2's weights.

    python -m interop.convert hf out/owt --out=hf/owt                                # export (convert.py calls export)
    python train.py --init_from=gpt2 --dataset=shakespeare --out_dir=out/gpt2_shakespeare   # import (train.py)

Export. Every model becomes transformers' GPT-2 (nn.Linear weights transposed into its Conv1D layout, c_q, c_k
and c_v as c_attn's [W_Q; W_K; W_V], absent biases saved as zeros, the whole padded embedding): a `linear` model at
the scale 1/sqrt(head_dim) without qk_norm or RoPE is a plain GPT2LMHeadModel; every other model gets
modeling_nlq.py (trust_remote_code=True), model.py's source and then GPT2_WITH_NLQ_QUERY below, GPT-2 whose
attention takes q from model.py's query-mode class (a rope model: zeros for wpe, and model.py's rotary at GPT-2's
position_ids).
Import. GPT-2's weights load into nlq exactly in `linear` mode; in the other modes K, V and the rest are GPT-2's
and W_Q becomes w_q = W_Q - I (`linear_residual`, exact at 1/sqrt(head_dim)) or is dropped (`identity`,
`nonlinear`). An nlq export loads exactly in its own query mode, read as JSON and safetensors (none of its code
runs). docs/huggingface.md has the details.
"""
import importlib.util
import json
import math
import os
from pathlib import Path

import torch

import model as nlq_model
from model import GPTConfig
from nlq.checkpoint import fix_for, replace_atomically, writable_folder
from nlq.settings import DEFAULTS, check_value
from nlq.tokenizers import GPT2_BPE_DIR, GPT2_VOCAB, gpt2_encoding

# GPT-2's activation_function -> GPTConfig.activation (GPT-2 itself uses gelu_new, the tanh approximation)
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu2": "relu2"}
EXPORT_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu2": "relu2"}
MODELING_FILE = "modeling_nlq.py"
END_OF_TEXT = "<|endoftext|>"  # byte and char exports' end-of-text token (tokenizer_for), named as GPT-2's
# nlq's query settings in an export's config.json (NlqConfig, with bias); init_from an export takes them
QUERY_KEYS = ("query_mode", "query_hidden", "query_norm_in", "query_norm_out", "attn_scale", "qk_norm", "pos_embedding")
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")  # (in, out) in GPT-2
GPT2_BIASED = ("ln_1", "ln_2", "ln_f", "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # GPT-2 has biases


def _transformers():
    """transformers, imported on first use (it takes seconds); a clear error if it is not installed."""
    try:
        import transformers
        return transformers
    except ImportError:
        raise ValueError("this needs the transformers package: pip install -r requirements-extra.txt") from None


# ------------------------------------------------------------------------------------------------ export
def gpt2_blockers(cfg: GPTConfig):
    """Why a plain GPT2LMHeadModel cannot compute this model: a list of str, empty if it can."""
    standard = 1 / math.sqrt(cfg.n_embd // cfg.n_head)
    out = [] if cfg.query_mode == "linear" else [f"query_mode {cfg.query_mode!r} (GPT-2's query is linear)"]
    if not math.isclose(cfg.attn_scale, standard, rel_tol=1e-12):
        out.append(f"attn_scale {cfg.attn_scale:.6g} (GPT-2 uses 1/sqrt(head_dim) = {standard:.6g})")
    if cfg.qk_norm:
        out.append("qk_norm (GPT-2 has none)")
    if cfg.pos_embedding == "rope":
        out.append("rotary position embeddings (GPT-2's are learned)")
    return out


def gpt2_config(cfg: GPTConfig, config_class=None, **extra):
    """The transformers config (GPT2Config, or config_class: modeling_nlq's NlqConfig) of an nlq model's shape."""
    config_class = config_class or _transformers().GPT2Config
    return config_class(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd,
                        n_layer=cfg.n_layer, n_head=cfg.n_head, n_inner=cfg.mlp_hidden,
                        activation_function=EXPORT_ACTIVATIONS[cfg.activation], resid_pdrop=cfg.dropout,
                        embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, layer_norm_epsilon=1e-5,
                        scale_attn_weights=True, tie_word_embeddings=cfg.tie_weights, **extra)


def to_gpt2_state_dict(sd):
    """An nlq model's state dict -> the export's, in GPT-2's names and layout (the module's docstring); the query
    mode's own parameters (attn.query.*, qk_norm's attn.q_norm and attn.k_norm) stay as they are."""
    out, sd = {}, dict(sd)
    for name in [k for k in sd if ".attn.c_k." in k]:  # W_Q (linear), W_K, W_V -> GPT-2's c_attn rows
        head, tail = name.split(".c_k.")
        q = [sd.pop(f"{head}.query.c_q.{tail}")] if f"{head}.query.c_q.{tail}" in sd else []
        sd[f"{head}.c_attn.{tail}"] = torch.cat([*q, sd.pop(name), sd.pop(f"{head}.c_v.{tail}")])
    for name, t in sd.items():
        out[name] = t.t() if name.endswith(CONV1D) else t
        layer = name.removesuffix(".weight")
        if layer.endswith(GPT2_BIASED):
            out.setdefault(f"{layer}.bias", torch.zeros(t.size(0)))
    return out


# modeling_nlq.py is model.py's source, then this: transformers' GPT-2 with one change, the attention's q.
GPT2_WITH_NLQ_QUERY = '''

# ---------------------------------------------------------------- GPT-2 with nlq's query (hf.py's export)
# transformers' GPT-2 whose attention takes q from the query mode above (at its scale, with qk_norm if set).
# Everything else is GPT-2's own: the KV cache, padding and causal masks, SDPA or eager attention, generate,
# gradient checkpointing, save_pretrained, resize_token_embeddings.
from huggingface_hub.dataclasses import strict
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, eager_attention_forward
from transformers.pytorch_utils import Conv1D


@strict
class NlqConfig(GPT2Config):
    """GPT2Config and nlq's query settings (GPTConfig's fields of the same names). bias is the query mode's
    (GPT-2's own layers always have biases: those of a bias=False model are zeros)."""
    model_type = "nlq"
    query_mode: str = "linear"
    query_hidden: int | None = None
    query_norm_in: bool = True
    query_norm_out: bool = True
    attn_scale: float | None = None
    qk_norm: bool = False
    pos_embedding: str = "learned"
    bias: bool = True


class NlqAttention(GPT2Attention):
    """GPT2Attention whose q is the query mode's: c_attn computes K and V (and linear's W_Q)."""

    def __init__(self, config, layer_idx=None):
        super().__init__(config, layer_idx=layer_idx)
        cfg = GPTConfig(n_embd=config.n_embd, n_head=config.n_head,
                        **{k: getattr(config, k) for k in NlqConfig.__annotations__})  # the query's settings
        linear, C = cfg.query_mode == "linear", self.embed_dim
        self.query = None if linear else QUERY_MODES[cfg.query_mode](cfg)  # linear: W_Q in c_attn
        self.c_attn = Conv1D((C if linear else 0) + 2 * C, C)
        self.scaling, self.qk_norm, self.rope = cfg.attn_scale, cfg.qk_norm, cfg.pos_embedding == "rope"
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-5)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-5)

    def forward(self, hidden_states, past_key_values=None, attention_mask=None, **kwargs):
        x, C = hidden_states, self.embed_dim
        xwkv = self.c_attn(x)  # (B, T, [C +] 2C): sized by its output, as c_attn may be peft's LoRA wrapper
        xw, k, v = xwkv.split([xwkv.size(-1) - 2 * C, C, C], dim=-1)
        q = self.query(x) if self.query is not None else xw
        q, k, v = (t.view(*x.shape[:-1], -1, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:  # at GPT-2's positions (B, T), which follow its KV cache
            cos_sin = rotary(kwargs["position_ids"], self.head_dim)[:, :, None]  # (2, B, 1, T, hd/2)
            q, k = rotate(q, cos_sin), rotate(k, cos_sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        y, weights = attention(self, q, k, v, attention_mask, dropout=self.attn_dropout.p if self.training else 0.0,
                               scaling=self.scaling, **kwargs)
        return self.resid_dropout(self.c_proj(y.reshape(x.shape))), weights


class NlqForCausalLM(GPT2LMHeadModel):
    """GPT2LMHeadModel with NlqAttention in every block."""
    config_class = NlqConfig

    def __init__(self, config):
        super().__init__(config)
        for i, block in enumerate(self.transformer.h):
            block.attn = NlqAttention(config, layer_idx=i)
        self.post_init()
'''
AUTO_MAP = {"AutoConfig": "modeling_nlq.NlqConfig", "AutoModelForCausalLM": "modeling_nlq.NlqForCausalLM"}


def write_modeling_file(folder):
    """Write folder/modeling_nlq.py, model.py's source text and then GPT2_WITH_NLQ_QUERY, and import it: the
    model is built from the very file the folder holds."""
    path = os.path.join(folder, MODELING_FILE)
    header = ("# Written by nlq's convert.py hf: model.py as it was at export time, then GPT-2 with its query.\n"
              "# Load with AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).\n")
    Path(path).write_text(header + Path(nlq_model.__file__).read_text(encoding="utf-8") + GPT2_WITH_NLQ_QUERY,
                          encoding="utf-8")
    spec = importlib.util.spec_from_file_location(MODELING_FILE.removesuffix(".py"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------- tokenizers
def tokenizer_for(meta, bpe_dir=None, rows=None):
    """The transformers tokenizer of a dataset's meta.json dict, its ids nlq's (gpt2: bpe_dir's files, checked as
    gpt2_encoding checks them). Its end-of-text token, END_OF_TEXT, is an id no text encodes to, so that
    lm-evaluation-harness can stop generation tasks and pad their batches with it (it fails without one): byte
    0xFF, which UTF-8 never uses, or, for char, the id after the characters where the model has that row (rows:
    its embedding's rows; None: no model to fit). split_special_tokens: a text's literal "<|endoftext|>" still
    encodes as its characters."""
    t = _transformers()
    if meta["tokenizer"] == "gpt2":
        bpe_dir = str(GPT2_BPE_DIR if bpe_dir is None else bpe_dir)
        gpt2_encoding(bpe_dir)  # checks the files' sha256: OpenAI's files, or a clear error
        return t.GPT2Tokenizer(vocab=os.path.join(bpe_dir, "encoder.json"), merges=os.path.join(bpe_dir, "vocab.bpe"),
                               pad_token=END_OF_TEXT)  # pads as GPT-2's users do (masked)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    if meta["tokenizer"] == "byte":
        from transformers.convert_slow_tokenizer import bytes_to_unicode
        table = bytes_to_unicode()  # byte -> the printable character byte-level BPE stands it for
        vocab = {table[b]: b for b in range(255)} | {END_OF_TEXT: 255}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
    else:  # char
        vocab = {c: i for i, c in enumerate(meta["chars"])}
        if rows is None or rows > len(vocab):
            vocab[END_OF_TEXT] = len(vocab)
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
        tok.decoder = decoders.Fuse()
    special = dict(eos_token=END_OF_TEXT, pad_token=END_OF_TEXT) if END_OF_TEXT in vocab else {}
    return t.PreTrainedTokenizerFast(tokenizer_object=tok, split_special_tokens=True, **special)


# ------------------------------------------------------------------------------------------- the folder
def check_new_folder(hf_dir):
    """ValueError, naming the fix, unless hf_dir (convert.py hf's --out) is absent and its parent writable."""
    if os.path.lexists(hf_dir):
        raise ValueError(f"{hf_dir} exists; choose a new --out folder (or delete the old one)")
    writable_folder(os.path.dirname(os.path.abspath(hf_dir)), "--out's parent folder")


def export(model, meta, hf_dir, bpe_dir=None, code="auto", source=""):
    """Write an nlq GPT (eval mode, any device) and its tokenizer as a transformers folder at hf_dir.

    meta: the dataset's meta.json dict (its tokenizer). code: "auto" = nlq's modeling code only where a plain
    GPT-2 cannot compute the model, "nlq" = always, "gpt2" = never (ValueError naming why). The folder is
    written next to hf_dir and renamed into place: complete or absent, with the permissions a plain mkdir and
    open would give. ValueError if hf_dir exists or cannot be made or written. Returns notes (str) for the user.
    """
    t = _transformers()
    cfg = model.config
    check_new_folder(hf_dir)  # before the temporary folder is made next to it
    blockers = gpt2_blockers(cfg)
    if code == "gpt2" and blockers:
        raise ValueError(f"this model cannot be a plain GPT2LMHeadModel: {'; '.join(blockers)}; export it "
                         f"with its modeling code (--code=auto or --code=nlq)")
    custom = code == "nlq" or bool(blockers)
    query = nlq_model.QUERY_MODES[cfg.query_mode]
    if custom and query.__module__ != nlq_model.__name__:  # modeling_nlq.py is model.py's source text
        raise ValueError(f"query mode {cfg.query_mode!r} ({query.__name__}) is defined in {query.__module__}, not "
                         f"in model.py, whose source the export's modeling code is: define the class there")
    tokenizer = tokenizer_for(meta, bpe_dir, cfg.vocab_size)
    tokenizer.model_max_length = cfg.block_size
    eos = tokenizer.eos_token_id  # None only for a char vocabulary whose model has no row to spare
    ids = dict(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    from safetensors import SafetensorError  # its writer reports a full disk as its own error

    def write(tmp):  # the folder, beside hf_dir, made as a plain mkdir makes it
        os.mkdir(tmp)
        if custom:
            modeling = write_modeling_file(tmp)
            query = {k: getattr(cfg, k) for k in (*QUERY_KEYS, "bias")}
            hf_model = modeling.NlqForCausalLM(gpt2_config(cfg, modeling.NlqConfig, auto_map=AUTO_MAP, **query, **ids))
        else:
            hf_model = t.GPT2LMHeadModel(gpt2_config(cfg, **ids))
        weights = model.state_dict()
        if cfg.pos_embedding == "rope":  # GPT-2 adds wpe: zeros add nothing
            weights["transformer.wpe.weight"] = torch.zeros(cfg.block_size, cfg.n_embd)
        hf_model.load_state_dict(to_gpt2_state_dict(weights))
        padding = list(range(cfg.data_vocab_size, cfg.vocab_size))  # never generated, as by GPT.generate
        hf_model.generation_config = t.GenerationConfig(**ids, **({"suppress_tokens": padding} if padding else {}))
        hf_model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # the modes a plain open gives, 0o666 less the umask: safetensors writes its file 0600, which other users,
        # a shared model folder or a web server could not read
        umask = os.umask(0o022)  # the umask can only be read by setting it: set it back at once
        os.umask(umask)
        for name in os.listdir(tmp):
            os.chmod(os.path.join(tmp, name), 0o666 & ~umask)
    try:
        replace_atomically(hf_dir, write)
    except (OSError, SafetensorError) as e:
        raise ValueError(f"cannot write the export to {hf_dir} ({e}); {fix_for(e)} or choose another --out") from e
    why = f": {'; '.join(blockers)}" if blockers else ""
    kind = (f"GPT-2 with nlq's query (modeling_nlq.py, trust_remote_code=True){why}" if custom
            else "a plain GPT2LMHeadModel (no custom code)")
    return [f"exported {source + ' ' if source else ''}-> {hf_dir} as {kind}", *export_notes(cfg, meta, eos)]


def export_notes(cfg: GPTConfig, meta, eos):
    """What a user of an export needs to know (a list of str); eos: the tokenizer's end-of-text id, or None."""
    notes = [f"it has {cfg.block_size} positions (n_positions): keep a prompt's length + max_new_tokens <= "
             f"{cfg.block_size + 1} in generate"]  # past them, GPT-2's position embedding fails (IndexError)
    if meta["tokenizer"] != "gpt2":  # byte and char vocabularies: their texts start after a newline
        chars = meta.get("chars") or []
        newline = 10 if meta["tokenizer"] == "byte" else chars.index("\n") if "\n" in chars else "ID"
        notes.append(f"lm-evaluation-harness starts a text without context from the end-of-text token, which the "
                     f"model never saw: add prefix_token_id={newline} (a newline, or a token that starts texts in "
                     f"the training data) to lm_eval's --model_args" + ("" if eos is not None else
                     f"; the tokenizer has no end-of-text token (the embedding has no row to spare for one: export "
                     f"a model with vocab_size > {len(chars)}), so generation tasks (generate_until) cannot run"))
    if meta["tokenizer"] == "char":  # the Rust tokenizer's own error would say only "Missing [UNK] token"
        notes.append(f"the char tokenizer knows only the {len(meta['chars'])} characters of its training text: a "
                     f"text with any other character fails to encode (tokenizers: 'Missing [UNK] token'); to score "
                     f"other text, train on a byte or gpt2 dataset")
    if cfg.vocab_size > cfg.data_vocab_size:
        notes.append(f"the embedding has {cfg.vocab_size} rows for the tokenizer's {cfg.data_vocab_size} tokens "
                     f"(padding rows, never sampled by nlq): logits have {cfg.vocab_size} entries")
    return notes


# ------------------------------------------------------------------------------------------------ import
def load_gpt2_config(name_or_path):
    """The GPT2Config of a GPT2_HUB name (downloaded once into the Hugging Face cache) or a local folder (an nlq
    export's model_type and query settings are attributes of it too). ValueError naming the problem (and, for a
    folder init_from cannot load, the fix)."""
    t = _transformers()
    if os.path.isdir(name_or_path):  # (transformers reads a local folder before the Hub)
        # its config.json read as plain JSON: no code of the folder runs, and transformers is not asked (it would
        # offer to run an nlq export's modeling_nlq.py, interactively)
        folder, path = name_or_path, os.path.join(name_or_path, "config.json")
        try:
            config = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
            config = None
        if not isinstance(config, dict):
            raise ValueError(f"{path} is damaged (not a JSON object); export or download the folder again")
        model_type = config.get("model_type")
        if model_type is None and "model_args" in config and "out_dir" in config:
            raise ValueError(f"{folder} is an nlq run folder (train.py's config.json), not a transformers folder: "
                             f"continue that run with --init_from=resume --out_dir={folder} (or export it for "
                             f"init_from: python -m interop.convert hf {folder} --out=NEW_FOLDER)")
        if model_type not in ("gpt2", "nlq"):
            raise ValueError(f"{folder} holds a {model_type!r} model (config.json's model_type); init_from loads "
                             f"GPT-2 (model_type gpt2) and nlq's exports (nlq) only")
        return t.GPT2Config.from_dict(config)
    try:
        config = t.AutoConfig.from_pretrained(name_or_path, trust_remote_code=False)
    except OSError as e:
        reason = (str(e).splitlines() or [type(e).__name__])[0].rstrip(".")
        raise ValueError(f"cannot load {name_or_path!r}: {reason}. Give gpt2, gpt2-medium, gpt2-large or gpt2-xl "
                         f"(downloaded once into the Hugging Face cache; offline, HF_HUB_OFFLINE=1 reads the cache "
                         f"without retrying the network), or a local folder with a GPT-2's config.json and "
                         f"model.safetensors (what save_pretrained writes)") from None
    return config


def load_gpt2(name_or_path, config=None):
    """A transformers GPT-2 (GPT2LMHeadModel) or nlq export -> (its state dict, its GPT2Config), on the CPU.
    config: load_gpt2_config's, if read already. An nlq export's weights are read with safetensors alone (none of
    the folder's code runs): model.safetensors, or else the shards model.safetensors.index.json names
    (save_pretrained(max_shard_size=...), the HF Trainer's). ValueError naming the problem."""
    t = _transformers()
    config = config or load_gpt2_config(name_or_path)
    try:
        if config.model_type == "nlq":  # what GPT2Config.from_dict keeps of the folder's config.json
            from safetensors.torch import load_file
            shards, index = ["model.safetensors"], os.path.join(name_or_path, "model.safetensors.index.json")
            if not os.path.isfile(os.path.join(name_or_path, shards[0])) and os.path.isfile(index):  # {weight: shard}
                shards = sorted(set(json.loads(Path(index).read_text(encoding="utf-8"))["weight_map"].values()))
            return {k: v for s in shards for k, v in load_file(os.path.join(name_or_path, s)).items()}, config
        hf = t.GPT2LMHeadModel.from_pretrained(name_or_path, config=config, dtype=torch.float32,
                                               trust_remote_code=False)
    except Exception as e:  # OSError (no weights), safetensors' SafetensorError (truncated), ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"cannot read the weights of {name_or_path} ({type(e).__name__}: {first}); they are "
                         f"missing, truncated or damaged: export or download them again") from e
    return {k: v.detach() for k, v in hf.state_dict().items()}, config


def check_tokenizer(config, cfg, meta):
    """ValueError, naming both and the fix, if the dataset (meta: its meta.json dict) is not tokenized as the
    model of init_from (cfg["init_from"]; config: its GPT2Config) was trained. A folder's tokenizer.json must
    hold the dataset's vocabulary, token for token (its end-of-text token aside: a byte or char model never saw
    it); without one, a GPT-2-sized embedding (50257 rows, or more: padded, as nlq's exports of GPT-2 BPE runs
    are) needs GPT-2 BPE data."""
    data = f"dataset {cfg['dataset']} is tokenized with {meta['tokenizer']!r} ({meta['vocab_size']} tokens)"
    source, file = cfg["init_from"], os.path.join(cfg["init_from"], "tokenizer.json")
    if os.path.isfile(file):
        theirs = _transformers().PreTrainedTokenizerFast(tokenizer_file=file).get_vocab()
        ours = tokenizer_for(meta).get_vocab()
        if {**theirs, END_OF_TEXT: None} != {**ours, END_OF_TEXT: None}:
            raise ValueError(f"{data}, but init_from {source} has another vocabulary ({len(theirs)} tokens, its "
                             f"tokenizer.json): the ids would mean other tokens; fine-tune it on data prepared "
                             f"with its tokenizer")
    elif config.vocab_size >= GPT2_VOCAB and meta["tokenizer"] != "gpt2":
        raise ValueError(f"{data}, but GPT-2 reads GPT-2 BPE ids (init_from {source}: {config.vocab_size} rows); "
                         f"fine-tune it on GPT-2 BPE data (e.g. python prepare_data.py shakespeare, then "
                         f"--dataset=shakespeare)")


def gpt2_settings(config, cfg, meta, bias=True, source="GPT-2"):
    """The nlq model keys a GPT-2 config fixes -> (dict of them, notes for the log). cfg: the run's config dict
    (query_mode, attn_scale, qk_norm, block_size are the run's, an nlq export's query settings its own); meta:
    the dataset's meta.json dict. bias and source: a GPT-2-shaped model of another kind (a nanoGPT checkpoint).
    ValueError for a GPT-2 variant nlq cannot compute, or a dataset whose tokens are not the model's."""
    act = HF_ACTIVATIONS.get(config.activation_function)
    if (act is None or not math.isclose(config.layer_norm_epsilon, 1e-5) or not config.scale_attn_weights
            or config.scale_attn_by_inverse_layer_idx):
        raise ValueError(f"nlq cannot load this GPT-2 variant exactly: it needs activation_function "
                         f"{' or '.join(HF_ACTIVATIONS)} (not {config.activation_function!r}), layer_norm_epsilon "
                         f"1e-5 (not {config.layer_norm_epsilon}) and the attention scale 1/sqrt(head_dim)")
    check_tokenizer(config, cfg, meta)
    if cfg["block_size"] > config.n_positions:
        raise ValueError(f"block_size={cfg['block_size']} exceeds the model's {config.n_positions} positions; "
                         f"set block_size <= {config.n_positions}")
    C, H = config.n_embd, config.n_head
    settings = dict(n_layer=config.n_layer, n_head=H, n_embd=C, mlp_hidden=config.n_inner or 4 * C,
                    vocab_size=config.vocab_size, bias=bias, tie_weights=config.tie_word_embeddings,
                    activation=act)
    notes = [f"{source} weights: {config.n_layer} layers x {C}, {H} heads, vocab {config.vocab_size}, "
             f"bias={bias}, activation={act}, tie_weights={config.tie_word_embeddings}"]
    if config.model_type == "nlq":  # an nlq export: its own query, as it was trained
        settings.update({k: check_value(k, getattr(config, k)) for k in QUERY_KEYS})
        notes.append(f"query_mode {settings['query_mode']}: the nlq export's own query and its settings; the "
                     f"model computes the export's function exactly")
    else:
        mode = nlq_model.QUERY_MODE_ALIASES.get(cfg["query_mode"], cfg["query_mode"])
        standard = 1 / math.sqrt(C // H)
        if mode == "linear_residual" and cfg["attn_scale"] is None:
            settings["attn_scale"] = standard
        scale = settings.get("attn_scale", cfg["attn_scale"])
        exact = mode in ("linear", "linear_residual") and not cfg["qk_norm"] and (
            scale is None if mode == "linear" else math.isclose(scale, standard))
        what = {"linear": "W_Q as it is", "linear_residual": "w_q = W_Q - I at attn_scale 1/sqrt(head_dim)",
                "identity": "W_Q dropped (q = x)", "nonlinear": "W_Q dropped; f starts from its random init"}
        notes.append(f"query_mode {mode}: {what.get(mode, 'W_Q dropped')}; the model "
                     + ("computes" if exact else "does NOT compute") + f" {source}'s function exactly")
    replaced = [f"{k}={cfg[k]!r} (now {v!r})" for k, v in settings.items()
                if cfg.get(k, DEFAULTS[k]) not in (DEFAULTS[k], v)]
    if replaced:  # set by the config file or the command line, but the weights fix them
        notes.append(f"note: the {source}'s shape replaces what the config set: {', '.join(replaced)}")
    if cfg["block_size"] < config.n_positions:
        notes.append(f"position embeddings cropped to block_size {cfg['block_size']} of {config.n_positions}")
    return settings, notes
