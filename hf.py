"""
nlq and the Hugging Face ecosystem: export a run to a `transformers` folder, import GPT-2's weights.

    python convert.py hf out/owt --out=hf/owt                                # export (convert.py calls export)
    python train.py --init_from=gpt2 --dataset=shakespeare --out_dir=out/gpt2_shakespeare   # import (train.py)

hf.py itself is a library: `python hf.py` only prints these commands (docs/huggingface.md has the details).

Export. A `linear` model that GPT-2 can express (the standard scale 1/sqrt(head_dim), no qk_norm) becomes a plain
GPT2LMHeadModel folder that AutoModelForCausalLM loads without custom code: nn.Linear weights are transposed into
GPT-2's Conv1D layout (c_attn's [W_Q; W_K; W_V] rows become its columns), missing biases (bias=False) are saved
as zeros, and activation_function is "gelu" (exact erf GELU, nlq's default) or "gelu_pytorch_tanh" (nlq's
gelu_tanh: the same F.gelu call). Every other model is saved with its own modeling code in the folder
(modeling_nlq.py, loaded with trust_remote_code=True): model.py's source as it is, then a small wrapper
(WRAPPER below) that makes it a PreTrainedModel; the weights keep nlq's names (transformer.h.N.attn...). Either
way the whole embedding is saved, the padding rows of vocab_size included (50304 rows for GPT-2's 50257
tokens): logits have vocab_size entries, as nlq's have.

Import. GPT-2's weights (a Hub name, through the normal Hugging Face cache, or a local folder) load into nlq
exactly in `linear` mode, with bias=True and activation="gelu_tanh" (GPT-2's tanh approximation). In the other
query modes K, V and the rest are GPT-2's; W_Q becomes: `residual`: w_q = W_Q - I at the standard scale
1/sqrt(head_dim), which is exact (q = x + x(W_Q - I) = x W_Q); `identity`: dropped (q = x); `nonlinear`:
dropped, and f starts from its random initialisation (the run's seed). f's own GELU stays the exact one.
"""
import json
import math
import os
import shutil
import sys
import tempfile

import torch

import model as nlq_model
from settings import DEFAULTS
from model import GPTConfig
from prepare_data import GPT2_BPE_DIR, GPT2_EOT, GPT2_VOCAB, gpt2_encoding

# GPT-2's activation_function -> GPTConfig.activation (GPT-2 itself uses gelu_new, the tanh approximation)
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
EXPORT_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}
MODELING_FILE = "modeling_nlq.py"
# The model keys a GPT-2's config fixes (gpt2_settings), whatever the run's config says; attn_scale too for
# residual runs that leave it unset
GPT2_SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "mlp_hidden", "vocab_size", "bias", "tie_weights", "activation")


def _transformers():
    """transformers, imported on first use (it takes seconds); a clear error if it is not installed."""
    try:
        import transformers
    except ImportError:
        raise ValueError("this needs the transformers package: pip install -r requirements.txt") from None
    return transformers


# ------------------------------------------------------------------------------------------------ export
def gpt2_blockers(cfg: GPTConfig):
    """Why a plain GPT2LMHeadModel cannot compute this model: a list of str, empty if it can."""
    out = []
    if cfg.query_mode != "linear":
        out.append(f"query_mode {cfg.query_mode!r} (GPT-2's query is linear)")
    standard = 1 / math.sqrt(cfg.n_embd // cfg.n_head)
    if not math.isclose(cfg.attn_scale, standard, rel_tol=1e-12):
        out.append(f"attn_scale {cfg.attn_scale:.6g} (GPT-2 uses 1/sqrt(head_dim) = {standard:.6g})")
    if cfg.qk_norm:
        out.append("qk_norm (GPT-2 has none)")
    return out


def gpt2_config(cfg: GPTConfig, **extra):
    """The transformers GPT2Config that computes a GPT-2-expressible nlq model (see gpt2_blockers)."""
    t = _transformers()
    return t.GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd,
                        n_layer=cfg.n_layer, n_head=cfg.n_head, n_inner=cfg.mlp_hidden,
                        activation_function=EXPORT_ACTIVATIONS[cfg.activation], resid_pdrop=cfg.dropout,
                        embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, layer_norm_epsilon=1e-5,
                        scale_attn_weights=True, tie_word_embeddings=cfg.tie_weights, **extra)


def to_gpt2_state_dict(sd, cfg: GPTConfig):
    """An nlq linear model's state dict -> GPT2LMHeadModel's {name: tensor} (float32 copies).

    Conv1D weights are nn.Linear's transposed, (in, out); absent biases (bias=False) become zeros; lm_head.weight
    only for an untied head. ValueError if the model is not GPT-2-expressible (gpt2_blockers).
    """
    blockers = gpt2_blockers(cfg)
    if blockers:
        raise ValueError(f"a plain GPT-2 cannot compute this model: {'; '.join(blockers)}")
    out = {}
    for name, t in sd.items():
        if name == "lm_head.weight" and cfg.tie_weights:
            continue
        conv = name.startswith("transformer.h.") and name.endswith(".weight") and t.dim() == 2
        out[name] = (t.t() if conv else t).float().contiguous().clone()
    C = cfg.n_embd
    widths = {"ln_1": C, "ln_2": C, "attn.c_attn": 3 * C, "attn.c_proj": C, "mlp.c_fc": cfg.mlp_hidden,
              "mlp.c_proj": C}
    for i in range(cfg.n_layer):
        for layer, width in widths.items():
            out.setdefault(f"transformer.h.{i}.{layer}.bias", torch.zeros(width))
    out.setdefault("transformer.ln_f.bias", torch.zeros(C))
    return out


# The transformers wrapper appended to model.py's source in modeling_nlq.py. GPT.forward returns all positions'
# logits only with targets, so the wrapper passes targets (all -1 = ignored unless labels are given).
WRAPPER = '''

# ------------------------------------------------------------------------- the transformers wrapper (hf.py)
import transformers
from transformers.modeling_outputs import CausalLMOutputWithPast


class LayerCache:
    """One layer of a transformers Cache (generate's DynamicCache) as model.py's KVCache: length, append."""

    def __init__(self, cache, layer):
        self.cache, self.layer = cache, layer

    @property
    def length(self):
        return self.cache.get_seq_length(self.layer)

    def append(self, k, v):
        return self.cache.update(k, v, self.layer)  # (B, nh, L, hd) each: the past keys and values, then these


class NlqConfig(transformers.PretrainedConfig):
    """A transformers config holding nlq's GPTConfig fields under "nlq"."""
    model_type = "nlq"

    def __init__(self, nlq=None, **kwargs):
        self.nlq = dict(nlq or {})
        super().__init__(**kwargs)


class NlqForCausalLM(transformers.PreTrainedModel, transformers.GenerationMixin):
    """nlq's GPT as a transformers causal LM: forward(input_ids) -> CausalLMOutputWithPast with logits
    (B, T, vocab) for every position; labels (B, T), -100 = ignored, give the mean next-token cross-entropy
    as loss. With use_cache (generate's default) or past_key_values (a transformers Cache) the keys and
    values of past tokens are kept, so each generated token costs one token's forward pass, up to
    block_size positions. No padding mask (attention is causal, so right padding is harmless; left padding
    is an error)."""
    config_class = NlqConfig
    base_model_prefix = "transformer"
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}

    def __init__(self, config):
        super().__init__(config)
        gpt = GPT(GPTConfig(**config.nlq))
        self.transformer, self.lm_head = gpt.transformer, gpt.lm_head  # nlq's parameter names
        self.__dict__["gpt"] = gpt  # the same modules; not registered twice
        self.post_init()

    def _init_weights(self, module):
        GPT._init_weights(module)

    def get_input_embeddings(self):
        return self.transformer.wte

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, attention_mask=None, labels=None, past_key_values=None, use_cache=None,
                **kwargs):
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("nlq models take no padding mask: pad on the right (or not at all), or use "
                             "batch size 1")
        past = 0 if past_key_values is None else past_key_values.get_seq_length()
        block_size = self.gpt.config.block_size
        if past + input_ids.size(1) > block_size:
            raise ValueError(f"this model has {block_size} positions (block_size): {past} past + "
                             f"{input_ids.size(1)} new tokens do not fit; keep the prompt's length + "
                             f"max_new_tokens <= {block_size + 1}, or crop the prompt on the left")
        targets = torch.full_like(input_ids, -1)
        if labels is not None:
            targets[:, :-1] = labels[:, 1:].masked_fill(labels[:, 1:] == -100, -1)
        cache = None
        if use_cache or past_key_values is not None:  # input_ids follow the cached tokens
            if past_key_values is None:
                past_key_values = transformers.DynamicCache()
            cache = [LayerCache(past_key_values, i) for i in range(len(self.transformer.h))]
        logits, loss = self.gpt(input_ids, targets=targets, cache=cache)
        return CausalLMOutputWithPast(loss=loss if labels is not None else None, logits=logits,
                                      past_key_values=past_key_values)
'''


def modeling_source():
    """modeling_nlq.py: model.py's source text, then WRAPPER. One file, written from the model code itself."""
    with open(nlq_model.__file__, encoding="utf-8") as f:
        source = f.read()
    header = ("# Written by nlq's convert.py hf: model.py as it was at export time, then a transformers wrapper.\n"
              "# Load with AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).\n")
    return header + source + WRAPPER


# ------------------------------------------------------------------------------------------- tokenizers
def gpt2_tokenizer(bpe_dir=None):
    """GPT-2's BPE as a transformers tokenizer, from encoder.json + vocab.bpe in bpe_dir (None: the copy shipped
    in tests/data/gpt2), offline. DataError (prepare_data) if the files are missing or not OpenAI's."""
    t = _transformers()
    bpe_dir = str(GPT2_BPE_DIR if bpe_dir is None else bpe_dir)
    gpt2_encoding(bpe_dir)  # checks the files' sha256: OpenAI's files, or a clear error
    with open(os.path.join(bpe_dir, "encoder.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(bpe_dir, "vocab.bpe"), encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().split("\n")[1:] if line]
    return t.GPT2Tokenizer(vocab=vocab, merges=merges)


def vocab_tokenizer(meta):
    """A byte or char vocabulary (meta.json's tokenizer and chars) as a transformers tokenizer whose ids are
    nlq's: byte = the UTF-8 bytes, char = the index in meta["chars"]. No special tokens."""
    t = _transformers()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    if meta["tokenizer"] == "byte":
        from transformers.convert_slow_tokenizer import bytes_to_unicode
        table = bytes_to_unicode()  # byte -> the printable character byte-level BPE stands it for
        tok = Tokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
    elif meta["tokenizer"] == "char":
        chars = meta["chars"]
        tok = Tokenizer(models.WordLevel(vocab={c: i for i, c in enumerate(chars)}, unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
        tok.decoder = decoders.Fuse()
    else:
        raise ValueError(f"unknown tokenizer {meta['tokenizer']!r} in meta.json")
    return t.PreTrainedTokenizerFast(tokenizer_object=tok)


def tokenizer_for(meta, bpe_dir=None):
    """The transformers tokenizer of a dataset's meta.json dict (gpt2, byte or char)."""
    if meta.get("tokenizer") == "gpt2":
        return gpt2_tokenizer(bpe_dir)
    return vocab_tokenizer(meta)


# ------------------------------------------------------------------------------------------- the folder
def check_new_folder(hf_dir):
    """ValueError, naming the fix, unless hf_dir (convert.py hf's --out) is absent and can be made."""
    if os.path.lexists(hf_dir):
        raise ValueError(f"{hf_dir} exists; choose a new --out folder (or delete the old one)")


def normal_permissions(folder):
    """Give folder, and everything in it, the modes a plain mkdir and open would: 0o777 and 0o666 less the
    umask (tempfile.mkdtemp makes 0700 and safetensors writes its file 0600, which other users, a shared
    model folder or a web server could not read)."""
    umask = os.umask(0o022)  # the umask can only be read by setting it: set it back at once
    os.umask(umask)
    for root, _, files in os.walk(folder):
        os.chmod(root, 0o777 & ~umask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~umask)


def export(model, meta, hf_dir, bpe_dir=None, code="auto", source=""):
    """Write an nlq GPT (eval mode, any device) and its tokenizer as a transformers folder at hf_dir.

    meta: the dataset's meta.json dict (its tokenizer). code: "auto" = nlq's modeling code only where a plain
    GPT-2 cannot compute the model, "nlq" = always, "gpt2" = never (ValueError naming why, for a model GPT-2
    cannot express).
    The folder is written to a temporary folder next to hf_dir and renamed into place: it is complete or absent,
    with the permissions a plain mkdir and open would give (the umask's). ValueError if hf_dir exists (an empty
    folder too), is an empty string or cannot be made (a file in its path, no permission), or cannot be written
    (a full disk: nothing stays).
    Returns a list of notes (str) for the user.
    """
    t = _transformers()
    cfg = model.config
    check_new_folder(hf_dir)  # before the temporary folder is made next to it
    blockers = gpt2_blockers(cfg)
    if code not in ("auto", "gpt2", "nlq"):
        raise ValueError(f"code={code!r}; use auto, gpt2 or nlq")
    if code == "gpt2" and blockers:
        raise ValueError(f"this model cannot be a plain GPT2LMHeadModel: {'; '.join(blockers)}; export it "
                         f"with its modeling code (--code=auto or --code=nlq)")
    custom = code == "nlq" or bool(blockers)
    query = nlq_model.QUERY_MODES[cfg.query_mode]
    if custom and query.__module__ != nlq_model.__name__:  # modeling_nlq.py is model.py's source text
        raise ValueError(f"query mode {cfg.query_mode!r} ({query.__name__}) is defined in {query.__module__}, "
                         f"not in model.py, so the exported modeling code (model.py's source) could not build "
                         f"it: define the class in model.py and register it there")
    sd = {k: v.detach().cpu().float() for k, v in model.state_dict().items()}
    tokenizer = tokenizer_for(meta, bpe_dir)
    tokenizer.model_max_length = cfg.block_size
    eos = getattr(tokenizer, "eos_token_id", None)
    # generate() never picks the padding rows of the embedding, as GPT.generate does not
    padding = list(range(cfg.data_vocab_size, cfg.vocab_size))
    generation = dict(bos_token_id=eos, eos_token_id=eos, **({"suppress_tokens": padding} if padding else {}))
    parent = os.path.dirname(os.path.abspath(hf_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".hf_export_", dir=parent)
    try:
        if custom:
            with open(os.path.join(tmp, MODELING_FILE), "w", encoding="utf-8") as f:
                f.write(modeling_source())
            args = {k: v for k, v in vars(cfg).items()}
            config = {"architectures": ["NlqForCausalLM"], "model_type": "nlq", "nlq": args,
                      "auto_map": {"AutoConfig": "modeling_nlq.NlqConfig",
                                   "AutoModelForCausalLM": "modeling_nlq.NlqForCausalLM"},
                      "max_position_embeddings": cfg.block_size, "vocab_size": cfg.vocab_size,
                      "hidden_size": cfg.n_embd, "num_hidden_layers": cfg.n_layer,
                      "num_attention_heads": cfg.n_head, "tie_word_embeddings": cfg.tie_weights,
                      "use_cache": True, "bos_token_id": eos, "eos_token_id": eos, "dtype": "float32",
                      "transformers_version": t.__version__}
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(config, f, indent=2)
            from safetensors.torch import save_file
            weights = {k: v.contiguous().clone() for k, v in sd.items()
                       if not (cfg.tie_weights and k == "lm_head.weight")}
            save_file(weights, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
            t.GenerationConfig(use_cache=True, **generation).save_pretrained(tmp)
        else:
            hf_model = t.GPT2LMHeadModel(gpt2_config(cfg, bos_token_id=eos, eos_token_id=eos))
            missing, unexpected = hf_model.load_state_dict(to_gpt2_state_dict(sd, cfg), strict=False)
            missing = [k for k in missing if not (cfg.tie_weights and k == "lm_head.weight")]
            if missing or unexpected:
                raise ValueError(f"GPT-2 state dict mismatch: missing {missing[:4]}, unexpected {unexpected[:4]}")
            hf_model.generation_config = t.GenerationConfig(**generation)
            hf_model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        normal_permissions(tmp)
        os.replace(tmp, hf_dir)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        from safetensors import SafetensorError  # its writer reports a full disk as its own error
        if isinstance(e, (OSError, SafetensorError)):
            raise ValueError(f"cannot write the export to {hf_dir} ({e}); free space or choose another "
                             f"--out") from e
        raise
    kind = ("nlq modeling code (trust_remote_code=True)" + (f": {'; '.join(blockers)}" if blockers else "")
            if custom else "a plain GPT2LMHeadModel (no custom code)")
    notes = [f"exported {source + ' ' if source else ''}-> {hf_dir} as {kind}"]
    if not custom:  # nlq's own code says so in words; transformers' GPT-2 fails with an IndexError
        notes.append(f"it has {cfg.block_size} positions (n_positions): keep a prompt's length + max_new_tokens "
                     f"<= {cfg.block_size + 1} in generate")
    if eos is None:  # byte and char vocabularies: nothing marks where a text starts
        chars = meta.get("chars") or []
        newline = 10 if meta["tokenizer"] == "byte" else chars.index("\n") if "\n" in chars else None
        prefix = (f"prefix_token_id={newline} (a newline)" if newline is not None
                  else "prefix_token_id=ID (a token that starts texts in the training data)")
        notes.append(f"the tokenizer has no BOS/EOS token: lm-evaluation-harness needs one to start a text, so "
                     f"add {prefix} to lm_eval's --model_args")
    if meta["tokenizer"] == "char":  # the Rust tokenizer's own error would say only "Missing [UNK] token"
        notes.append(f"the char tokenizer knows only the {len(meta['chars'])} characters of its training text: a "
                     f"text with any other character fails to encode (tokenizers: 'Missing [UNK] token'); to score "
                     f"other text, train on a byte or gpt2 dataset")
    if cfg.vocab_size > cfg.data_vocab_size:
        notes.append(f"the embedding has {cfg.vocab_size} rows for the tokenizer's {cfg.data_vocab_size} tokens "
                     f"(padding rows, never sampled by nlq): logits have {cfg.vocab_size} entries")
    return notes


# ------------------------------------------------------------------------------------------------ import
# the files from_pretrained reads a local folder's weights from; one of them must be there
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
FROM_GPT2 = "give a GPT-2 folder or a Hub name (gpt2, gpt2-medium, gpt2-large, gpt2-xl)"


def read_folder_config(folder):
    """A local folder's config.json as a dict, read as plain JSON: no code of the folder runs, and transformers
    is not asked (it would offer to run an nlq export's modeling_nlq.py, interactively).

    ValueError naming the problem and the fix for a folder init_from cannot load: no or a damaged config.json,
    an nlq run folder (train.py's config.json), an nlq export (convert.py hf: model_type nlq), any other
    model_type than gpt2, or no weights file (WEIGHT_FILES).
    """
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{folder} has no config.json, so it is not a transformers folder; {FROM_GPT2}") from None
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
        config = None
    if not isinstance(config, dict):
        raise ValueError(f"{path} is damaged (not a JSON object); export or download the folder again")
    model_type = config.get("model_type")
    if model_type is None and "model_args" in config and "out_dir" in config:
        raise ValueError(f"{folder} is an nlq run folder (train.py's config.json), not a transformers folder: "
                         f"continue that run with --init_from=resume --out_dir={folder} (a linear run can "
                         f"also be exported as a GPT-2 folder for init_from: python convert.py hf {folder} "
                         f"--out=NEW_FOLDER)")
    if model_type == "nlq":
        mode = (config.get("nlq") or {}).get("query_mode", "?")
        raise ValueError(f"{folder} is an nlq export (convert.py hf of a {mode} model, with its own modeling "
                         f"code); init_from loads GPT-2 folders only: to train that model on, continue the nlq "
                         f"run it was exported from with --init_from=resume --out_dir=RUN_FOLDER")
    if model_type != "gpt2":
        raise ValueError(f"{folder} holds a {model_type!r} model (config.json's model_type); init_from loads "
                         f"GPT-2 (model_type gpt2) only: {FROM_GPT2}")
    if not any(os.path.isfile(os.path.join(folder, name)) for name in WEIGHT_FILES):
        raise ValueError(f"{folder} has a config.json but no weights (model.safetensors): the folder is "
                         f"incomplete; export or download it again")
    return config


def load_gpt2_config(name_or_path):
    """The GPT2Config of a GPT2_HUB name (downloaded once into the Hugging Face cache) or a local folder
    (checked by read_folder_config first). ValueError naming the problem (not GPT-2, not found, offline
    without a cached copy)."""
    t = _transformers()
    if os.path.isdir(name_or_path):  # transformers reads a local folder before the Hub
        read_folder_config(name_or_path)
    try:
        config = t.AutoConfig.from_pretrained(name_or_path, trust_remote_code=False)
    except OSError as e:
        reason = (str(e).splitlines() or [type(e).__name__])[0].rstrip(".")
        raise ValueError(f"cannot load {name_or_path!r}: {reason}. Give gpt2, gpt2-medium, gpt2-large or gpt2-xl "
                         f"(downloaded once into the Hugging Face cache; offline, HF_HUB_OFFLINE=1 reads the cache "
                         f"without retrying the network), or a local folder with a GPT-2's config.json and "
                         f"model.safetensors (what save_pretrained writes)") from None
    if config.model_type != "gpt2":
        raise ValueError(f"{name_or_path} is a {config.model_type!r} model; init_from loads GPT-2 "
                         f"(model_type gpt2) only")
    return config


def load_gpt2(name_or_path, config=None):
    """A transformers GPT-2 (GPT2LMHeadModel) -> (its state dict, its GPT2Config), float32, on the CPU.

    name_or_path: a GPT2_HUB name (downloaded once into the Hugging Face cache) or a local folder; config: its
    GPT2Config when load_gpt2_config has read it already (else it is read here). ValueError naming the problem
    (not GPT-2, not found, offline without a cached copy, weights missing, truncated or damaged).
    """
    t = _transformers()
    config = config or load_gpt2_config(name_or_path)
    try:
        hf = t.GPT2LMHeadModel.from_pretrained(name_or_path, config=config, dtype=torch.float32,
                                               trust_remote_code=False)
    except Exception as e:  # OSError (no weights), safetensors' SafetensorError (truncated), ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ValueError(f"cannot read the weights of {name_or_path} ({type(e).__name__}: {first}); they are "
                         f"truncated or damaged: export or download them again") from e
    return {k: v.detach() for k, v in hf.state_dict().items()}, config


def folder_tokenizer(folder):
    """The tokenizer a transformers folder ships, read from its tokenizer.json as plain JSON: a meta.json-like
    dict(tokenizer=gpt2 | byte | char | None (one nlq does not make), vocab_size=N), with chars for char;
    None if the folder has no readable tokenizer.json."""
    try:
        with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
            tok = json.load(f)
        model, added = tok["model"], tok.get("added_tokens") or []
        vocab = dict(model["vocab"])
        ids = set(vocab.values()) | {a["id"] for a in added}
    except (OSError, ValueError, TypeError, KeyError):
        return None
    kind, chars = None, None
    if model.get("type") == "BPE" and len(ids) == GPT2_VOCAB and vocab.get("<|endoftext|>") == GPT2_EOT:
        kind = "gpt2"
    elif model.get("type") == "BPE" and not model.get("merges") and len(ids) == 256:
        kind = "byte"
    elif model.get("type") == "WordLevel":  # vocab_tokenizer's char vocabulary: {char: its id}
        kind, chars = "char", [c for c, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    return dict(tokenizer=kind, vocab_size=len(ids), **({"chars": chars} if chars is not None else {}))


# how to prepare a dataset with each tokenizer, for check_tokenizer's messages
PREPARE_FOR = {"gpt2": "e.g. python prepare_data.py shakespeare, then --dataset=shakespeare",
               "byte": "e.g. python prepare_data.py local --input TEXT --name NAME --tokenizer byte, then "
                       "--dataset=NAME",
               "char": "the dataset of the run it was exported from"}


def check_tokenizer(config, cfg, meta):
    """ValueError, naming both and the fix, if the dataset (meta: its meta.json dict) is not tokenized as the
    model of init_from (cfg["init_from"]; config: its GPT2Config) was trained. A folder that ships a tokenizer
    nlq knows (tokenizer.json: GPT-2 BPE, byte or char) is compared token for token; otherwise a GPT-2-sized
    embedding (50257 rows, or more: padded, as nlq's exports of GPT-2 BPE runs are) needs GPT-2 BPE data."""
    data = (f"dataset {cfg['dataset']} is tokenized with {meta.get('tokenizer')!r} "
            f"({meta.get('vocab_size')} tokens)")
    source = cfg["init_from"]
    theirs = folder_tokenizer(source) if os.path.isdir(source) else None
    if theirs is not None and theirs["tokenizer"] is not None:
        kind = theirs["tokenizer"]
        if kind != meta.get("tokenizer") or theirs["vocab_size"] != meta.get("vocab_size"):
            raise ValueError(f"{data}, but init_from {source} reads {kind!r} ids ({theirs['vocab_size']} tokens, "
                             f"its tokenizer.json): the ids would mean other tokens; fine-tune it on data "
                             f"prepared with its tokenizer ({PREPARE_FOR[kind]})")
        if theirs.get("chars") is not None and meta.get("chars") is not None and theirs["chars"] != meta["chars"]:
            raise ValueError(f"{data}, but init_from {source} has another character vocabulary (its "
                             f"tokenizer.json): the ids would mean other characters; fine-tune it on data "
                             f"prepared with its tokenizer ({PREPARE_FOR['char']})")
        return
    if config.vocab_size >= GPT2_VOCAB and meta.get("tokenizer") != "gpt2":
        rows = (f"{config.vocab_size} rows: GPT-2's {GPT2_VOCAB} BPE tokens and padding"
                if config.vocab_size > GPT2_VOCAB else f"{GPT2_VOCAB} tokens")
        raise ValueError(f"{data}, but GPT-2 reads GPT-2 BPE ids (init_from {source}: {rows}); fine-tune it on "
                         f"data prepared with the gpt2 tokenizer ({PREPARE_FOR['gpt2']})")


def gpt2_settings(config, cfg, meta=None):
    """The nlq model keys a GPT-2 config fixes -> (dict of them, notes for the log). cfg: the run's config dict
    (query_mode, attn_scale, qk_norm, block_size are the run's; block_size may not exceed n_positions); meta:
    the dataset's meta.json dict, or None.

    ValueError for a GPT-2 variant nlq cannot compute (another activation, layer-norm epsilon or attention
    scaling), or a dataset whose tokens are not the model's (check_tokenizer)."""
    act = HF_ACTIVATIONS.get(config.activation_function)
    problems = [] if act else [f"activation_function {config.activation_function!r} (nlq computes "
                               f"{', '.join(HF_ACTIVATIONS)})"]
    if not math.isclose(config.layer_norm_epsilon, 1e-5):
        problems.append(f"layer_norm_epsilon {config.layer_norm_epsilon} (nlq's LayerNorm uses 1e-5)")
    if not config.scale_attn_weights or config.scale_attn_by_inverse_layer_idx:
        problems.append("an attention scale other than 1/sqrt(head_dim)")
    if problems:
        raise ValueError(f"this GPT-2 variant has {'; '.join(problems)}: nlq cannot load it exactly")
    if meta is not None:
        check_tokenizer(config, cfg, meta)
    if cfg["block_size"] > config.n_positions:
        raise ValueError(f"block_size={cfg['block_size']} exceeds the model's {config.n_positions} positions; "
                         f"set block_size <= {config.n_positions}")
    C, H = config.n_embd, config.n_head
    settings = dict(n_layer=config.n_layer, n_head=H, n_embd=C, mlp_hidden=config.n_inner or 4 * C,
                    vocab_size=config.vocab_size, bias=True, tie_weights=config.tie_word_embeddings,
                    activation=act)
    mode, standard = cfg["query_mode"], 1 / math.sqrt(C // H)
    mode = nlq_model.QUERY_MODE_ALIASES.get(mode, mode)
    if mode == "residual" and cfg["attn_scale"] is None:
        settings["attn_scale"] = standard
    notes = [f"GPT-2 weights: {config.n_layer} layers x {C}, {H} heads, vocab {config.vocab_size}, "
             f"bias=True, activation={act}, tie_weights={config.tie_word_embeddings}"]
    scale = settings.get("attn_scale", cfg["attn_scale"])
    exact = mode in ("linear", "residual") and not cfg["qk_norm"] and (
        scale is None if mode == "linear" else math.isclose(scale, standard))
    what = {"linear": "W_Q as it is", "residual": "w_q = W_Q - I at attn_scale 1/sqrt(head_dim)",
            "identity": "W_Q dropped (q = x)", "nonlinear": "W_Q dropped; f starts from its random init"}
    notes.append(f"query_mode {mode}: {what.get(mode, 'W_Q dropped')}; the model "
                 + ("computes GPT-2's function exactly" if exact else "does NOT compute GPT-2's function"
                    + (" (qk_norm)" if cfg["qk_norm"] else "")
                    + (" (attn_scale differs from 1/sqrt(head_dim))" if mode in ("linear", "residual")
                       and not cfg["qk_norm"] else "")))
    replaced = [f"{k}={cfg[k]!r} (now {v!r})" for k, v in settings.items()
                if k in GPT2_SHAPE_KEYS and cfg.get(k, DEFAULTS[k]) not in (DEFAULTS[k], v)]
    if replaced:  # set by the config file or the command line, but the weights fix them
        notes.append(f"note: the GPT-2's shape replaces what the config set: {', '.join(replaced)}")
    if cfg["block_size"] < config.n_positions:
        notes.append(f"position embeddings cropped to block_size {cfg['block_size']} of {config.n_positions}")
    return settings, notes


def start_from_gpt2(cfg, meta, log):
    """train.py's init_from=GPT-2: its settings and tokenizer are checked against the run's before its weights
    are read; cfg takes the GPT-2's shape (gpt2_settings) -> the GPT-2's state dict (for load_gpt2_weights)."""
    config = load_gpt2_config(cfg["init_from"])
    settings, notes = gpt2_settings(config, cfg, meta)
    weights, _ = load_gpt2(cfg["init_from"], config)
    cfg.update(settings)
    log("\n".join(notes))
    return weights


def load_gpt2_weights(model, gpt2_sd):
    """Copy a GPT2LMHeadModel state dict into an nlq GPT built from gpt2_settings (in place, no grad).

    Conv1D weights are transposed; c_attn's K, V columns go to c_attn, W_Q's by query mode (see the module
    docstring); wpe is cropped to block_size. ValueError if a shape does not fit.
    """
    cfg, C = model.config, model.config.n_embd
    sd = {k: v for k, v in gpt2_sd.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    mine = model.state_dict()
    out = {}
    for name, t in sd.items():
        if name == "lm_head.weight" and cfg.tie_weights:
            continue
        conv = name.startswith("transformer.h.") and name.endswith(".weight") and t.dim() == 2
        t = t.t() if conv else t
        if name == "transformer.wpe.weight":
            t = t[:cfg.block_size]
        if ".attn.c_attn." in name:
            w_q, kv = t[:C], t[C:]
            out[name] = kv if cfg.query_mode != "linear" else t
            if cfg.query_mode == "residual":
                w_q = w_q - torch.eye(C, dtype=t.dtype) if name.endswith("weight") else w_q
                out[name.replace(".c_attn.", ".query.w_q.")] = w_q
            continue
        out[name] = t
    for name, t in out.items():
        if name not in mine or mine[name].shape != t.shape:
            raise ValueError(f"GPT-2's {name} {tuple(t.shape)} does not fit the nlq model "
                             f"({tuple(mine[name].shape) if name in mine else 'no such parameter'})")
    with torch.no_grad():
        for name, t in out.items():
            mine[name].copy_(t)
    return sorted(set(mine) - set(out) - ({"lm_head.weight"} if cfg.tie_weights else set()))


# ------------------------------------------------------------------------------------------------ usage
USAGE = """usage: hf.py is a library, not a command; these commands use it:
  python convert.py hf RUN_FOLDER --out=NEW_FOLDER       export an nlq run as a transformers folder
                                                         (python convert.py hf --help: its options)
  python train.py --init_from=gpt2 --dataset=shakespeare --out_dir=out/gpt2_shakespeare
                                                         fine-tune GPT-2's weights (gpt2, gpt2-medium, gpt2-large,
                                                         gpt2-xl or a local GPT-2 folder; GPT-2 BPE data)
docs/huggingface.md has the details."""


def main(argv=None):
    """`python hf.py [--help]`: print USAGE; any other argument: USAGE and an error (exit status 1)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["-h"], ["--help"]):
        sys.exit(f"{USAGE}\nerror: hf.py takes no arguments (got {' '.join(argv)})")
    print(USAGE)


if __name__ == "__main__":
    main()
