"""hf.py, convert.py hf and init_from=gpt2: nlq -> transformers -> the same logits and greedy tokens, for every
query mode, with and without biases, tied and untied; a transformers GPT-2 -> nlq (train.py --init_from=DIR)
exactly; the exported tokenizers encode as nlq's do. Tiny random models, saved locally; no network
(conftest.py sets the Hugging Face libraries offline)."""
import json
import os
import re

import numpy as np
import pytest
import torch
from conftest import ROOT
from test_sample_eval import TEXT, small_cfg

import model as nlq_model
import train
from interop import convert, hf, pretrained
from model import GPT, QUERY_MODES, GPTConfig
from nlq import checkpoint, settings
from nlq import tokenizers


def random_gpt(seed=0, **kw):
    """A tiny nlq GPT in eval mode with random weights everywhere (LayerNorm gains and biases too)."""
    torch.manual_seed(seed)
    cfg = dict(block_size=16, vocab_size=64, data_vocab_size=60, n_layer=2, n_head=2, n_embd=16)
    model = GPT(GPTConfig(**{**cfg, **kw})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def load_hf(folder):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True).eval()


def nlq_logits(model, x):
    with torch.no_grad():
        return model(x, targets=x)[0]  # all positions


BYTE_META = dict(tokenizer="byte", vocab_size=256)


# ------------------------------------------------------------------------------------------------ export
# per query mode, each of qk_norm, bias and tie_weights on and off (every pair of them once), and rotary positions
VARIANTS = [dict(qk_norm=False, bias=False, tie_weights=True), dict(qk_norm=False, bias=True, tie_weights=False),
            dict(qk_norm=True, bias=False, tie_weights=False), dict(qk_norm=True, bias=True, tie_weights=True),
            dict(qk_norm=True, bias=False, tie_weights=False, pos_embedding="rope", activation="relu2")]


def left_padded(prompts, pad=0):
    """A batch of 1-D id tensors, padded on the left -> (ids, attention_mask), (B, longest) each."""
    T = max(len(p) for p in prompts)
    ids, mask = torch.full((len(prompts), T), pad), torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p):], mask[i, T - len(p):] = p, 1
    return ids, mask


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
@pytest.mark.parametrize("mode", QUERY_MODES)
def test_an_export_computes_generates_and_trains_as_gpt2_does(mode, variant, tmp_path):
    """The export's logits are nlq's; with the KV cache they are the same; greedy generation from a left-padded
    batch with its attention_mask gives each prompt's tokens alone, nlq's own; resize_token_embeddings keeps the
    old logits and the resized model trains a step (with gradient checkpointing)."""
    import transformers
    model = random_gpt(query_mode=mode, **VARIANTS[variant])
    hf.export(model, BYTE_META, str(tmp_path / "hf"), code="nlq" if variant == 1 else "auto")
    h = load_hf(tmp_path / "hf")
    plain = mode == "linear" and not VARIANTS[variant]["qk_norm"] and variant != 1  # linear at GPT-2's scale
    assert type(h).__name__ == ("GPT2LMHeadModel" if plain else "NlqForCausalLM")
    assert (tmp_path / "hf" / hf.MODELING_FILE).exists() == (not plain)
    x = torch.randint(0, 60, (3, 16), generator=torch.Generator().manual_seed(1))
    eager = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True,
                                                              attn_implementation="eager").eval()
    with torch.no_grad():
        full = h(x).logits  # SDPA, transformers' default
        assert full.shape == (3, 16, 64) and (full - nlq_logits(model, x)).abs().max().item() <= 1e-5
        assert (eager(x).logits - full).abs().max().item() <= 1e-5
        past = h(x[:, :10], use_cache=True).past_key_values
        assert (h(x[:, 10:], past_key_values=past).logits - full[:, 10:]).abs().max().item() <= 1e-5
    prompts = [x[0, :3], x[1, :7], x[2, :5]]
    ids, mask = left_padded(prompts)
    for use_cache in (True, False):
        got = h.generate(ids, attention_mask=mask, max_new_tokens=9, do_sample=False, use_cache=use_cache)
        for row, p in zip(got[:, 7:].tolist(), prompts):  # never the embedding's padding rows (ids 60..63)
            alone = h.generate(p[None], attention_mask=torch.ones(1, len(p), dtype=torch.long), max_new_tokens=9,
                               do_sample=False, use_cache=use_cache)[0, len(p):].tolist()
            assert row == alone == model.generate(p[None], 9, temperature=0)[0, len(p):].tolist(), use_cache
    h.resize_token_embeddings(80)  # 16 new tokens, tied or not as exported
    assert h.lm_head.weight.shape == (80, 16)
    assert (h.lm_head.weight.data_ptr() == h.transformer.wte.weight.data_ptr()) == VARIANTS[variant]["tie_weights"]
    with torch.no_grad():
        assert (h(x).logits[..., :64] - full).abs().max().item() <= 1e-5
    new = x.clone()
    new[:, ::4] = 64 + x[:, ::4] % 16  # the new tokens, in the input and the labels
    h.train()
    h.activation_checkpointing_enable()  # transformers' gradient checkpointing, as for GPT-2
    new_rows = h.lm_head.weight[64:].detach().clone()
    loss = h(new, labels=new).loss
    loss.backward()
    torch.optim.SGD(h.parameters(), lr=1e-2).step()
    assert not torch.equal(h.lm_head.weight[64:], new_rows) and h(new, labels=new).loss < loss


@pytest.mark.parametrize("mode", QUERY_MODES)
def test_the_text_generation_pipeline_on_a_batch_of_prompts(mode, shipped_data, tmp_path):
    """pipeline("text-generation") on a GPT-2 BPE export pads a batch of prompts on the left (the export's
    tokenizer pads with <|endoftext|>) and gives each prompt's text alone: nlq's greedy tokens."""
    import transformers
    meta = dict(tokenizer="gpt2", vocab_size=50257)
    model = random_gpt(query_mode=mode, vocab_size=50304, data_vocab_size=50257)
    hf.export(model, meta, str(tmp_path / "hf"), bpe_dir=shipped_data / "gpt2")
    pipe = transformers.pipeline("text-generation", model=str(tmp_path / "hf"), trust_remote_code=True,
                                 device="cpu")
    prompts = ["Hello", "The quick brown fox jumps", "A cat"]
    batched = pipe(prompts, batch_size=3, max_new_tokens=6, do_sample=False)
    encode, decode = tokenizers.get_codec(meta, str(shipped_data / "gpt2"))
    for prompt, out in zip(prompts, batched):
        assert out == pipe(prompt, max_new_tokens=6, do_sample=False)
        want = model.generate(torch.tensor([encode(prompt)]), 6, temperature=0)[0].tolist()
        assert out[0]["generated_text"] == decode(want)


def test_a_query_mode_defined_outside_model_py_is_not_exported(tmp_path, monkeypatch):
    """The export's modeling code is model.py's source: a mode registered from elsewhere would give a folder
    that cannot load ('unknown query_mode'), so it is refused before anything is written."""
    class Elsewhere(nlq_model.QueryMode):
        scale_factor = 0.5
        def forward(self, x):
            return 2 * x
    monkeypatch.setitem(nlq_model.QUERY_MODES, "elsewhere", Elsewhere)
    with pytest.raises(ValueError, match="query mode 'elsewhere' \\(Elsewhere\\) is defined in test_hf, not in "
                                         "model.py, whose source the export's modeling code is: define the "
                                         "class there"):
        hf.export(random_gpt(query_mode="elsewhere"), BYTE_META, str(tmp_path / "hf"))
    assert os.listdir(tmp_path) == []


def test_export_gelu_tanh_and_other_scales(tmp_path):
    """gelu_tanh exports as gelu_pytorch_tanh (the same F.gelu call), with GPT-2's code or nlq's; a linear
    model at another scale needs nlq's code, and --code=gpt2 says why, for qk_norm too."""
    x = torch.randint(0, 60, (2, 16))
    for kw in (dict(activation="gelu_tanh", bias=True), dict(activation="gelu_tanh", query_mode="nonlinear"),
               dict(attn_scale=0.1)):
        model = random_gpt(**kw)
        folder = tmp_path / f"{len(os.listdir(tmp_path))}"
        hf.export(model, BYTE_META, str(folder))
        assert json.loads((folder / "config.json").read_text())["activation_function"] == \
            {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}[model.config.activation]
        assert (load_hf(folder)(x).logits - nlq_logits(model, x)).abs().max().item() <= 1e-5
    assert (folder / hf.MODELING_FILE).exists()  # attn_scale 0.1
    for kw, why in ((dict(attn_scale=0.1), r"attn_scale 0.1 \(GPT-2 uses 1/sqrt\(head_dim\) = 0.353553\)"),
                    (dict(qk_norm=True), r"qk_norm \(GPT-2 has none\)")):
        with pytest.raises(ValueError, match=r"cannot be a plain GPT2LMHeadModel: " + why + r".*--code=auto"):
            hf.export(random_gpt(**kw), BYTE_META, str(tmp_path / "plain"), code="gpt2")
    assert not (tmp_path / "plain").exists()
    with pytest.raises(ValueError, match=r"2 exists; choose a new --out"):
        hf.export(random_gpt(), BYTE_META, str(folder))


@pytest.mark.parametrize("error", ["SafetensorError", "OSError"])
def test_a_full_disk_is_one_error_and_leaves_no_folder(error, tmp_path, monkeypatch):
    """safetensors, which writes the weights, reports a full disk as its own SafetensorError (a traceback in an
    adversarial trial), other writers as an OSError: either way one error naming the fix, and nothing written."""
    import transformers.modeling_utils
    from safetensors import SafetensorError
    def full(*a, **k):
        if error == "OSError":
            raise OSError(28, "No space left on device")
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)  # save_pretrained's reference
    with pytest.raises(ValueError, match=f"cannot write the export to {tmp_path / 'hf'} \\(.*(StorageFull|No space "
                                         f"left on device).*\\); free space or choose another --out"):
        hf.export(random_gpt(query_mode="nonlinear"), BYTE_META, str(tmp_path / "hf"))
    assert os.listdir(tmp_path) == []


def test_the_exported_tokenizers_encode_as_nlq_does(shipped_data, tmp_path):
    import transformers
    bpe = str(shipped_data / "gpt2")
    text = "Hello world! It's 2026 -- naïve café,\n\n  spaces   and\ttabs. Ünïcödé 😀 ÿ"
    literal = "a <|endoftext|> b"  # GPT-2's tokenizer makes it one token, as in transformers; byte and char do not
    chars = sorted(set(text + literal))
    for meta, eos in ((dict(tokenizer="gpt2", vocab_size=50257), 50256), (dict(tokenizer="byte", vocab_size=256), 255),
                      (dict(tokenizer="char", vocab_size=len(chars), chars=chars), len(chars))):
        folder = tmp_path / meta["tokenizer"]
        hf.tokenizer_for(meta, bpe).save_pretrained(str(folder))
        tok = transformers.AutoTokenizer.from_pretrained(str(folder))
        encode, decode = tokenizers.get_codec(meta, bpe)
        assert tok.encode(text) == encode(text), meta["tokenizer"]
        assert tok.decode(encode(text)) == decode(encode(text)) == text
        assert meta["tokenizer"] == "gpt2" or tok.encode(literal) == encode(literal)
        # the end-of-text token pads batches (masked) and ends generation; no text encodes to it
        assert tok.eos_token_id == tok.pad_token_id == eos and eos not in encode(text)
        assert tok.decode([*encode("ab"), eos], skip_special_tokens=True) == "ab"



def test_a_char_export_says_which_text_it_cannot_encode(tmp_path):
    """A char vocabulary has no unknown token: the exported tokenizer fails on a character the training text
    lacked, with the tokenizers library's terse error; the export's note says so first, in words."""
    import transformers
    chars = sorted(set("hello world\n"))
    meta = dict(tokenizer="char", vocab_size=len(chars), chars=chars)
    notes = hf.export(random_gpt(vocab_size=64, data_vocab_size=len(chars)), meta, str(tmp_path / "hf"))
    assert (f"the char tokenizer knows only the {len(chars)} characters of its training text: a text with any "
            f"other character fails to encode (tokenizers: 'Missing [UNK] token'); to score other text, train on "
            f"a byte or gpt2 dataset") in notes
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert tok.encode("hello") == [chars.index(c) for c in "hello"]
    with pytest.raises(Exception, match="Missing \\[UNK\\] token"):
        tok.encode("hello!")
    assert tok.eos_token_id == len(chars) < 64  # a padding row of the embedding


def test_a_char_export_without_a_row_to_spare_says_it_cannot_run_generation_tasks(tmp_path):
    """The end-of-text token of a char export takes the id after its characters, which a model whose embedding
    has no padding rows lacks: then there is none, and the note says what that costs in the harness."""
    import transformers
    chars = sorted(set("hello world\n"))
    meta = dict(tokenizer="char", vocab_size=len(chars), chars=chars)
    notes = hf.export(random_gpt(vocab_size=len(chars), data_vocab_size=len(chars)), meta, str(tmp_path / "hf"))
    note = next(n for n in notes if n.startswith("lm-evaluation-harness starts a text without context"))
    assert note.endswith("add prefix_token_id=0 (a newline, or a token that starts texts in the training data) to "
                         "lm_eval's --model_args; the tokenizer has no end-of-text token (the embedding has no row to "
                         "spare for one: export a model with vocab_size > 9), so generation tasks (generate_until) "
                         "cannot run")
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf")).eos_token_id is None


def write_byte_dataset(folder):
    """A prepared byte-level dataset of TEXT in folder: 3000 train and 700 val bytes."""
    folder.mkdir()
    data = np.frombuffer(TEXT * 50, np.uint8).astype(np.uint16)
    data[:3000].tofile(folder / "train.bin")
    data[3000:3700].tofile(folder / "val.bin")
    (folder / "meta.json").write_text(json.dumps(
        dict(name="tiny", tokenizer="byte", vocab_size=256, dtype="uint16", eot_token=None)))


def test_convert_hf_command_and_text_generation_pipeline(shipped_data, tmp_path):
    """convert.py hf on a train.py run (byte data): a plain GPT-2 folder whose pipeline continues a prompt with
    nlq's greedy text; the checkpoint's recorded tokenizer is used, no dataset needed."""
    import transformers
    write_byte_dataset(tmp_path / "tiny")
    train.train(small_cfg(tmp_path, tmp_path / "out", max_iters=2, eval_interval=2))
    os.rename(tmp_path / "tiny", tmp_path / "moved")  # the export reads the checkpoint only
    notes = convert.main(["hf", str(tmp_path / "out"), f"--out={tmp_path / 'hf'}"])
    assert "as a plain GPT2LMHeadModel (no custom code)" in notes[0]
    assert notes[1] == "it has 16 positions (n_positions): keep a prompt's length + max_new_tokens <= 17 in generate"
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "generation_config.json", "model.safetensors",
                                                   "tokenizer.json", "tokenizer_config.json"]
    pipe = transformers.pipeline("text-generation", model=str(tmp_path / "hf"), device="cpu")
    got = pipe("the quick", max_new_tokens=6, do_sample=False)[0]["generated_text"]
    model = checkpoint.model_from_checkpoint(checkpoint.load_checkpoint(str(tmp_path / "out" / "ckpt.pt")), "")
    want = model.generate(torch.tensor([list(b"the quick")]), 6, temperature=0)[0].tolist()
    assert got == bytes(want).decode()
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at .*nope.ckpt.pt"):
        convert.main(["hf", str(tmp_path / "nope"), f"--out={tmp_path / 'x'}"])
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------------------ import
def tiny_gpt2(folder, seed=0, **kw):
    """A random transformers GPT2LMHeadModel (GPT-2's own gelu_new activation), saved to folder."""
    import transformers
    torch.manual_seed(seed)
    cfg = dict(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=None,
               eos_token_id=None)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**cfg, **kw})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(str(folder))
    return model


@pytest.mark.parametrize("mode", QUERY_MODES)
def test_gpt2_weights_load_exactly(mode, tmp_path):
    """linear and linear_residual (w_q = W_Q - I at 1/sqrt(hd)) compute GPT-2's logits; identity and nonlinear keep
    everything but W_Q (f: its random init)."""
    for tie in (True, False):
        ref = tiny_gpt2(tmp_path / f"gpt2{tie}", tie_word_embeddings=tie)
        sd, config = hf.load_gpt2(str(tmp_path / f"gpt2{tie}"))
        cfg = dict(settings.DEFAULTS, query_mode=mode, block_size=32)
        shape, notes = hf.gpt2_settings(config, cfg, dict(tokenizer="byte", vocab_size=256))
        model = GPT(settings.model_config({**cfg, **shape}, 256)).eval()
        fresh = pretrained.load_weights(model, sd)
        x = torch.randint(0, 256, (2, 32))
        with torch.no_grad():
            want = ref(x).logits
        diff = (nlq_logits(model, x) - want).abs().max().item()
        if mode in ("linear", "linear_residual"):
            assert diff <= 1e-5 and fresh == [] and "computes GPT-2's function exactly" in notes[1]
            assert model.generate(x[:, :5], 12, temperature=0).tolist() == \
                ref.generate(x[:, :5], max_new_tokens=12, do_sample=False).tolist()
        else:
            assert diff > 1e-3 and "does NOT compute GPT-2's function" in notes[1]
            assert all(".attn.query." in k for k in fresh) and (mode == "identity") == (fresh == [])
        assert (model.config.bias, model.config.activation, model.config.tie_weights) == (True, "gelu_tanh", tie)


def test_a_custom_code_export_says_to_trust_it_for_the_tokenizer_too(shipped_data, tmp_path, capsys, monkeypatch):
    """AutoTokenizer reads config.json, whose model_type only modeling_nlq.py knows: without trust_remote_code it
    asked 'Do you wish to run the custom code? [y/N]' (a new user's trial). The load line says so for both."""
    import builtins

    import transformers
    write_byte_dataset(tmp_path / "tiny")
    train.train(small_cfg(tmp_path, tmp_path / "out", max_iters=1, eval_interval=1, query_mode="nonlinear"))
    capsys.readouterr()
    out = str(tmp_path / "hf")
    convert.main(["hf", str(tmp_path / "out"), f"--out={out}"])
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"load: AutoModelForCausalLM.from_pretrained({out!r}, trust_remote_code=True), "
        f"AutoTokenizer.from_pretrained({out!r}, trust_remote_code=True)")
    monkeypatch.setattr(builtins, "input", lambda *a: pytest.fail("transformers asked a question"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    assert tokenizer("the quick")["input_ids"] == list(b"the quick")


def test_train_init_from_a_gpt2_folder_then_resume(tmp_path, capsys):
    write_byte_dataset(tmp_path / "tiny")
    ref = tiny_gpt2(tmp_path / "gpt2", tie_word_embeddings=False)
    out = tmp_path / "out"
    cfg = small_cfg(tmp_path, out, init_from=str(tmp_path / "gpt2"), max_iters=0, block_size=16)
    train.train(settings.parse_config([f"--{k}={v}" for k, v in cfg.items() if k != "init_from"]
                                    + [f"--init_from={tmp_path / 'gpt2'}"]))
    log = capsys.readouterr().out
    assert "GPT-2 weights: 2 layers x 32, 4 heads, vocab 256, bias=True, activation=gelu_tanh" in log
    assert "query_mode linear: W_Q as it is; the model computes GPT-2's function exactly" in log
    # small_cfg's n_head=2 cannot hold: the weights have 4 heads (its n_layer and n_embd are the GPT-2's own)
    assert "\nnote: the GPT-2's shape replaces what the config set: n_head=2 (now 4)\n" in log
    model, _ = checkpoint.load_run(str(out))  # iter 0: the imported weights as they are
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert (nlq_logits(model, x) - ref(x).logits).abs().max().item() <= 1e-5
    # resumed with the first run's command (the GPT-2 set the model keys then, the checkpoint sets them now)
    cfg.update(max_iters=2, eval_interval=2)
    resumed = settings.parse_config([f"--{k}={v}" for k, v in cfg.items() if k != "init_from"]
                                  + ["--init_from=resume"])
    assert np.isfinite(train.train(resumed)["val"])
    # linear_residual: the GPT-2 also set attn_scale (1/sqrt(head_dim), not the mode's 1/(2 sqrt(head_dim)))
    first = {**cfg, "out_dir": str(tmp_path / "res"), "query_mode": "linear_residual", "max_iters": 0}
    train.train(settings.parse_config([f"--{k}={v}" for k, v in first.items() if k != "init_from"]
                                    + [f"--init_from={tmp_path / 'gpt2'}"]))
    again = settings.parse_config([f"--{k}={v}" for k, v in {**first, "max_iters": 1}.items() if k != "init_from"]
                                + ["--init_from=resume"])
    assert again["attn_scale"] is None and np.isfinite(train.train(again)["val"])
    args = torch.load(tmp_path / "res" / "ckpt.pt", weights_only=True)["model_args"]
    assert args["attn_scale"] == pytest.approx(8 ** -0.5)  # head_dim 8
    saved = json.loads((out / "config.json").read_text())  # resumed, the record still says where it started
    assert saved["init_from"] == "resume" and saved["initialised_from"] == str(tmp_path / "gpt2")
    with pytest.raises(ValueError, match=r"init_from='gpt3'; use scratch, resume, a GPT-2 name \(gpt2, gpt2-m"):
        settings.parse_config(["--init_from=gpt3"])
    with pytest.raises(ValueError, match=r"tokenized with 'byte' \(256 tokens\), but GPT-2 reads GPT-2 BPE ids "
                                         r"\(init_from scratch: 50257 rows\)"):
        hf.gpt2_settings(hf._transformers().GPT2Config(), settings.DEFAULTS, dict(tokenizer="byte", vocab_size=256))


# ------------------------------------------------------------------------------------ bad input: import
def write_char_dataset(folder, chars=None):
    """A prepared char-level dataset of TEXT in folder (prepare_data.py's sorted characters, or chars);
    returns its meta.json dict."""
    chars = chars or sorted(set(TEXT.decode()))
    folder.mkdir()
    ids = np.array([chars.index(c) for c in TEXT.decode() * 50], np.uint16)
    ids[:3000].tofile(folder / "train.bin")
    ids[3000:3700].tofile(folder / "val.bin")
    meta = dict(name="tiny", tokenizer="char", vocab_size=len(chars), chars=chars, dtype="uint16", eot_token=None)
    (folder / "meta.json").write_text(json.dumps(meta))
    return meta


def test_init_from_a_folder_of_another_tokenizer_is_refused(shipped_data, tmp_path):
    """Char data and a GPT-2 BPE export with the padded vocabulary (50304 rows) trained before with no error;
    a folder's tokenizer.json is compared with the dataset's, and without one a GPT-2-sized embedding needs
    GPT-2 BPE data. A folder whose characters are the dataset's trains."""
    meta = write_char_dataset(tmp_path / "tiny")
    out = tmp_path / "out"
    cfg = lambda folder, **kw: small_cfg(tmp_path, out, init_from=str(tmp_path / folder), **kw)
    bpe = random_gpt(vocab_size=50304, data_vocab_size=50257)
    hf.export(bpe, dict(tokenizer="gpt2", vocab_size=50257), str(tmp_path / "bpe"), bpe_dir=shipped_data / "gpt2")
    with pytest.raises(ValueError, match=r"dataset tiny is tokenized with 'char' \(30 tokens\), but init_from "
                                         r".*bpe has another vocabulary \(50257 tokens, its tokenizer.json\): the "
                                         r"ids would mean other tokens; fine-tune it on data prepared with its "
                                         r"tokenizer$"):
        train.train(cfg("bpe"))
    (tmp_path / "bpe" / "tokenizer.json").unlink()  # no tokenizer: the embedding's size tells
    with pytest.raises(ValueError, match=r"tokenized with 'char' \(30 tokens\), but GPT-2 reads GPT-2 BPE ids "
                                         r"\(init_from .*bpe: 50304 rows\); fine-tune it on GPT-2 BPE data"):
        train.train(cfg("bpe"))
    hf.export(random_gpt(vocab_size=256, data_vocab_size=256), BYTE_META, str(tmp_path / "byte"))
    with pytest.raises(ValueError, match=r"but init_from .*byte has another vocabulary \(256 tokens"):
        train.train(cfg("byte"))
    other = dict(meta, chars=meta["chars"][::-1])  # the same characters, other ids
    hf.export(random_gpt(vocab_size=64, data_vocab_size=30), other, str(tmp_path / "shuffled"))
    with pytest.raises(ValueError, match=r"but init_from .*shuffled has another vocabulary \(31 tokens"):
        train.train(cfg("shuffled"))
    assert not out.exists()
    model = random_gpt(vocab_size=64, data_vocab_size=30)
    hf.export(model, meta, str(tmp_path / "same"))
    train.train(cfg("same", max_iters=0))
    x = torch.randint(0, 30, (2, 16))
    loaded, _ = checkpoint.load_run(str(out))
    assert (nlq_logits(loaded, x) - nlq_logits(model, x)).abs().max().item() <= 1e-5


def test_init_from_an_nlq_export_loads_it_exactly_without_running_its_code(tmp_path, capsys, monkeypatch):
    """An nlq export is read as JSON and safetensors: none of modeling_nlq.py runs and transformers asks
    nothing. The run starts from the export's function exactly, in its query mode with its settings (they
    replace the config's), and a resume with the first command keeps them."""
    import builtins
    model = random_gpt(query_mode="nonlinear", query_hidden=4, qk_norm=True, bias=False, tie_weights=False,
                       vocab_size=256, data_vocab_size=256)
    hf.export(model, BYTE_META, str(tmp_path / "nl"))
    ran = tmp_path / "modeling_nlq_ran"
    with open(tmp_path / "nl" / hf.MODELING_FILE, "a") as f:
        f.write(f"\nopen({str(ran)!r}, 'w').close()\n")
    monkeypatch.setattr(builtins, "input", lambda *a: pytest.fail("transformers asked a question"))
    write_byte_dataset(tmp_path / "tiny")
    cfg = small_cfg(tmp_path, tmp_path / "out", init_from=str(tmp_path / "nl"), max_iters=0, query_mode="identity")
    train.train(cfg)
    log = capsys.readouterr().out
    assert ("query_mode nonlinear: the nlq export's own query and its settings; the model computes the export's "
            "function exactly") in log
    assert ("note: the GPT-2's shape replaces what the config set: n_embd=32 (now 16), query_mode='identity' "
            "(now 'nonlinear')") in log
    loaded, _ = checkpoint.load_run(str(tmp_path / "out"))
    x = torch.randint(0, 256, (2, 16))
    assert (nlq_logits(loaded, x) - nlq_logits(model, x)).abs().max().item() <= 1e-5
    assert not ran.exists()
    assert np.isfinite(train.train(dict(cfg, init_from="resume", max_iters=1))["val"])
    args = torch.load(tmp_path / "out" / "ckpt.pt", weights_only=True)["model_args"]
    assert {k: args[k] for k in hf.QUERY_KEYS} == {k: getattr(model.config, k) for k in hf.QUERY_KEYS}


def test_init_from_an_export_that_transformers_resaved_in_shards(tmp_path):
    """save_pretrained(max_shard_size=...), as the HF Trainer re-saves a model, writes model.safetensors.index.json
    and shards instead of model.safetensors: init_from merges the shards and starts from the export's logits,
    exactly those of the unsharded export (it read only model.safetensors: "truncated or damaged")."""
    import transformers
    model = random_gpt(query_mode="nonlinear", vocab_size=256, data_vocab_size=256)
    hf.export(model, BYTE_META, str(tmp_path / "export"))
    load_hf(tmp_path / "export").save_pretrained(str(tmp_path / "sharded"), max_shard_size="20KB")
    transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export")).save_pretrained(str(tmp_path / "sharded"))
    shards = [f for f in os.listdir(tmp_path / "sharded") if re.fullmatch(r"model-\d+-of-\d+\.safetensors", f)]
    assert len(shards) >= 2 and not (tmp_path / "sharded" / "model.safetensors").exists()
    write_byte_dataset(tmp_path / "tiny")
    x, logits = torch.randint(0, 256, (2, 16)), {}
    for folder in ("export", "sharded"):
        train.train(small_cfg(tmp_path, tmp_path / f"run_{folder}", init_from=str(tmp_path / folder), max_iters=0))
        logits[folder] = nlq_logits(checkpoint.load_run(str(tmp_path / f"run_{folder}"))[0], x)
    assert torch.equal(logits["sharded"], logits["export"])
    assert (logits["export"] - nlq_logits(model, x)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("targets", ["c_attn", "all-linear"])
def test_a_lora_fine_tune_of_a_nonlinear_export_merges_and_loads_back_exactly(targets, tmp_path):
    """peft's LoRA on a nonlinear export: on c_attn, peft's GPT-2 target (it failed: the attention read
    c_attn.nf, which peft's wrapper lacks), or on every linear layer, f's w1 and w2 included, with gradient
    checkpointing. A few steps, then what a user does: the adapter saved and loaded again gives the same logits;
    merge_and_unload and save_pretrained give a folder that generates as the tuned model and that train.py
    --init_from loads into nlq with the same logits."""
    import peft
    import transformers
    model = random_gpt(query_mode="nonlinear", vocab_size=256, data_vocab_size=256)
    hf.export(model, BYTE_META, str(tmp_path / "export"))
    h = load_hf(tmp_path / "export")
    if targets == "all-linear":
        h.activation_checkpointing_enable()
    tuned = peft.get_peft_model(h, peft.LoraConfig(r=4, target_modules=[targets] if targets == "c_attn" else targets))
    assert {n.split(".lora_")[0].split(".")[-1] for n, _ in tuned.named_parameters() if "lora_" in n} == (
        {"c_attn"} if targets == "c_attn" else {"c_attn", "c_proj", "c_fc", "w1", "w2"})
    x = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(2))
    tuned.train()
    opt = torch.optim.AdamW([p for p in tuned.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        tuned(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    tuned.eval()
    with torch.no_grad():
        want = tuned(x).logits
        assert (want - nlq_logits(model, x)).abs().max().item() > 1e-3  # the fine-tune changed the model
        tuned.save_pretrained(str(tmp_path / "adapter"))
        again = peft.PeftModel.from_pretrained(load_hf(tmp_path / "export"), str(tmp_path / "adapter")).eval()
        assert (again(x).logits - want).abs().max().item() <= 1e-5
        tuned.merge_and_unload().save_pretrained(str(tmp_path / "merged"))
        transformers.AutoTokenizer.from_pretrained(str(tmp_path / "export")).save_pretrained(str(tmp_path / "merged"))
        merged = load_hf(tmp_path / "merged")
        assert (merged(x).logits - want).abs().max().item() <= 1e-5
    write_byte_dataset(tmp_path / "tiny")
    train.train(small_cfg(tmp_path, tmp_path / "run", init_from=str(tmp_path / "merged"), max_iters=0))
    loaded, _ = checkpoint.load_run(str(tmp_path / "run"))
    assert (nlq_logits(loaded, x) - want).abs().max().item() <= 1e-5
    greedy = merged.generate(x[:1, :5], attention_mask=torch.ones(1, 5, dtype=torch.long), max_new_tokens=8,
                             do_sample=False)
    assert greedy.tolist() == loaded.generate(x[:1, :5], 8, temperature=0).tolist()


def test_init_from_refuses_other_folders_before_transformers_reads_them(tmp_path):
    """An nlq run folder, another model type or a damaged config.json: one line naming the fix, from
    config.json read as JSON."""
    write_byte_dataset(tmp_path / "tiny")
    train.train(small_cfg(tmp_path, tmp_path / "run", max_iters=0))
    with pytest.raises(ValueError, match=r"run is an nlq run folder \(train.py's config.json\), not a "
                                         r"transformers folder: continue that run with --init_from=resume "
                                         r"--out_dir=.*run"):
        hf.load_gpt2(str(tmp_path / "run"))
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match=r"holds a 'llama' model \(config.json's model_type\); init_from loads "
                                         r"GPT-2 \(model_type gpt2\) and nlq's exports \(nlq\) only$"):
        hf.load_gpt2(str(tmp_path / "llama"))
    (tmp_path / "llama" / "config.json").write_text('{"model_type": "gpt')
    with pytest.raises(ValueError, match=r"llama.config.json is damaged \(not a JSON object\); export or "
                                         r"download the folder again"):
        hf.load_gpt2(str(tmp_path / "llama"))


def test_a_gpt2_folder_without_or_with_damaged_weights_is_one_error(tmp_path):
    """Was OSError (no model.safetensors) and SafetensorError (incomplete metadata) tracebacks."""
    tiny_gpt2(tmp_path / "gpt2")
    (tmp_path / "config_only").mkdir()
    (tmp_path / "config_only" / "config.json").write_bytes((tmp_path / "gpt2" / "config.json").read_bytes())
    with pytest.raises(ValueError, match=r"cannot read the weights of .*config_only \(OSError: .*\); they are "
                                         r"missing, truncated or damaged: export or download them again"):
        hf.load_gpt2(str(tmp_path / "config_only"))
    weights = tmp_path / "gpt2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cannot read the weights of .*gpt2 \(SafetensorError: .*incomplete "
                                         r"metadata.*\); they are missing, truncated or damaged"):
        hf.load_gpt2(str(tmp_path / "gpt2"))


def test_a_hub_name_that_cannot_be_fetched_says_how_to_work_offline(monkeypatch):
    """Offline, transformers retries the Hub for ~30 s, then says it could not connect: nlq's error names the
    cache switch that fails at once and what a local folder must hold (the tests have no network: the error is
    transformers' own, raised here as its AutoConfig raises it)."""
    def offline(name, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them "
                      "in the cached files.\nCheck your internet connection.")
    monkeypatch.setattr(hf._transformers().AutoConfig, "from_pretrained", offline)
    with pytest.raises(ValueError) as e:
        hf.load_gpt2_config("gpt2")
    assert str(e.value) == (
        "cannot load 'gpt2': We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find "
        "them in the cached files. Give gpt2, gpt2-medium, gpt2-large or gpt2-xl (downloaded once into the Hugging "
        "Face cache; offline, HF_HUB_OFFLINE=1 reads the cache without retrying the network), or a local folder "
        "with a GPT-2's config.json and model.safetensors (what save_pretrained writes)")


def test_a_run_never_writes_into_an_export_or_its_init_from_folder(tmp_path):
    """train.py's config.json would replace an export's (transformers could no longer load it): refused before
    anything is written, as is out_dir = init_from. A run interrupted before its first checkpoint (train.py's
    config.json and metrics.jsonl, no ckpt.pt) starts again."""
    write_byte_dataset(tmp_path / "tiny")
    tiny_gpt2(tmp_path / "gpt2")
    export_config = (tmp_path / "gpt2" / "config.json").read_bytes()
    for out, init_from, message in (
            ("gpt2", "scratch", r"out_dir .*gpt2 holds another program's files"),
            ("gpt2", "gpt2", r"out_dir .*gpt2 holds another program's files")):
        with pytest.raises(ValueError, match=message):
            train.train(small_cfg(tmp_path, tmp_path / out, max_iters=0, block_size=16,
                                  init_from=str(tmp_path / init_from) if init_from != "scratch" else init_from))
    (tmp_path / "gpt2" / "model.safetensors").unlink()  # a config.json alone is refused too
    with pytest.raises(ValueError, match=r"holds another program's files"):
        train.train(small_cfg(tmp_path, tmp_path / "gpt2"))
    assert sorted(os.listdir(tmp_path / "gpt2")) == ["config.json", "generation_config.json"]
    assert (tmp_path / "gpt2" / "config.json").read_bytes() == export_config
    cfg = small_cfg(tmp_path, tmp_path / "out", max_iters=2, eval_interval=2)
    first = train.train(cfg)
    (tmp_path / "out" / "ckpt.pt").unlink()  # as if stopped before its first checkpoint: after the iter-0 eval
    rows = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "out" / "metrics.jsonl").write_text(rows[0] + "\n")
    assert train.train(cfg) == first


# ------------------------------------------------------------------------------------ bad input: export
def test_an_out_folder_that_cannot_be_made_is_one_line_before_the_checkpoint_is_read(tmp_path, monkeypatch):
    """--out under a file was a FileExistsError traceback; an empty --out staged a temporary folder in the parent
    of the working folder and failed renaming it to ''; a folder that may not be written was a PermissionError
    traceback (here a file where the folder would be: chmod does not stop root, who runs CI). Now each is named
    before the run folder is read."""
    (tmp_path / "file.txt").write_text("x")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for out, message in ((str(tmp_path / "file.txt"), r"file.txt exists; choose a new --out folder"),
                         (str(tmp_path / "file.txt" / "hf"), r"cannot write to --out's parent folder .*file.txt "
                                                             r"\(Not a directory\); choose another")):
        with pytest.raises(ValueError, match=message):
            convert.main(["hf", str(tmp_path / "no_run"), f"--out={out}"])  # --out first: no run needed
        with pytest.raises(ValueError, match=message):
            hf.export(random_gpt(), BYTE_META, out)
    assert sorted(os.listdir(tmp_path)) == ["file.txt", "work"] and os.listdir(work) == []


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask022", "umask027"])
def test_an_export_gets_the_permissions_of_a_plain_folder(umask, tmp_path):
    """safetensors' 0600 file became the export's: now the umask's, as mkdir and
    open give (0755 and 0644 for the usual 022)."""
    old = os.umask(umask)
    try:
        hf.export(random_gpt(), BYTE_META, str(tmp_path / "linear"))
        hf.export(random_gpt(query_mode="nonlinear"), BYTE_META, str(tmp_path / "nonlinear"))
    finally:
        os.umask(old)
    for folder in ("linear", "nonlinear"):
        assert oct((tmp_path / folder).stat().st_mode & 0o777) == oct(0o777 & ~umask)
        modes = {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / folder).iterdir()}
        assert "model.safetensors" in modes and set(modes.values()) == {oct(0o666 & ~umask)}, modes


def test_hf_docstring_cites_real_commands_and_files():
    """hf.py's docstring names the commands that use it and files that exist."""
    commands = re.findall(r"python (?:-m )?([\w/.]+)", hf.__doc__)
    cited = re.findall(r"\b\w+/[\w/.]+\.(?:py|md)\b", hf.__doc__)
    assert commands == ["interop.convert", "train.py"] and "docs/huggingface.md" in cited
    assert [p for p in cited if not (ROOT / p).is_file()] == []
