"""GPT.generate's KV cache: the same tokens as without it, in every query mode, within and past block_size."""
import pytest
import torch

from model import GPT, QUERY_MODES, GPTConfig

SMALL = dict(block_size=32, vocab_size=96, n_layer=2, n_head=4, n_embd=64)


def build(seed=0, **kw):
    """A small GPT whose matrices are scaled up 5x: at the init scale, greedy decoding repeats one token
    forever, which would make 'same tokens' a weak check."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**SMALL, **kw})).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(5)
    return model


def prompt(B=3, T=20, seed=1):
    return torch.randint(0, SMALL["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("mode", QUERY_MODES)
def test_cached_forward_equals_full_forward(mode, qk_norm, flash):
    """Feeding a sequence in pieces through a cache (a prompt, single tokens, a chunk of 5) gives, at the end
    of each piece, the logits of one forward pass over the whole sequence at that position."""
    model = build(query_mode=mode, qk_norm=qk_norm, flash=flash)
    idx = prompt(T=32)
    with torch.no_grad():
        full = model(idx, targets=idx)[0]  # (B, 32, vocab): logits at every position
        cache, start = model.new_kv_cache(), 0
        for end in (7, 8, 9, 14, 15, 32):
            logits, _ = model(idx[:, start:end], cache=cache)
            torch.testing.assert_close(logits[:, 0], full[:, end - 1], rtol=1e-5, atol=1e-5)
            assert cache[0].length == cache[1].length == end
            start = end


def generate_both(model, idx, n, **kw):
    """generate with and without the cache, from the same RNG state."""
    torch.manual_seed(3)
    cached = model.generate(idx, n, use_cache=True, **kw)
    torch.manual_seed(3)
    return cached, model.generate(idx, n, use_cache=False, **kw)


@pytest.mark.parametrize("flash", [True, False])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("mode", QUERY_MODES)
def test_greedy_same_tokens_with_and_without_cache(mode, qk_norm, flash):
    """20 prompt tokens + 40 new ones at block_size 32: 12 steps within the block, then 28 past it."""
    model = build(query_mode=mode, qk_norm=qk_norm, flash=flash)
    cached, plain = generate_both(model, prompt(), 40, temperature=0)
    assert torch.equal(cached, plain)
    assert all(len(set(row[20:].tolist())) >= 3 for row in cached)  # not one repeated token


@pytest.mark.parametrize("mode", QUERY_MODES)
def test_long_prompt_and_sampling_same_tokens(mode):
    """A prompt longer than block_size (45 > 32) is cropped alike; sampling with the same seed draws alike."""
    model = build(query_mode=mode)
    long = prompt(B=2, T=45, seed=4)
    cached, plain = generate_both(model, long, 10, temperature=0)
    assert torch.equal(cached, plain) and torch.equal(cached[:, :45], long)
    cached, plain = generate_both(model, prompt(), 30, temperature=1.0, top_k=20)
    assert torch.equal(cached, plain)


def test_what_the_model_sees_within_and_past_block_size(monkeypatch):
    """The documented choice: within the block one prefill, then one token per step at the next position;
    once the block is full, every step refills a new cache with the last block_size tokens at positions
    0..block_size-1 (the sliding window of use_cache=False)."""
    model = build()
    calls = []
    forward = model.forward

    def record(idx, targets=None, cache=None):
        calls.append((idx.size(1), cache[0].length if cache else None))
        return forward(idx, targets, cache)
    monkeypatch.setattr(model, "forward", record)
    model.generate(prompt(T=28), 8, temperature=0)  # contexts of 28..32 tokens fit, the last 3 steps slide
    assert calls == [(28, 0), (1, 28), (1, 29), (1, 30), (1, 31), (32, 0), (32, 0), (32, 0)]
    calls.clear()
    model.generate(prompt(T=28), 8, temperature=0, use_cache=False)
    assert calls == [(28, None), (29, None), (30, None), (31, None), (32, None), (32, None), (32, None),
                     (32, None)]


def test_cache_limits_and_dtype():
    model = build()
    cache = model.new_kv_cache()
    model(prompt(T=30), cache=cache)
    with pytest.raises(ValueError, match=r"33 positions exceed block_size 32"):
        model(prompt(T=3), cache=cache)
    assert cache[0].length == 30  # the refused forward changed nothing
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the buffers take the keys' dtype: bf16 under autocast
        cache = model.new_kv_cache()
        model(prompt(T=5), cache=cache)
        model(prompt(T=1), cache=cache)
    assert cache[0].k.dtype == torch.bfloat16 and cache[0].k.shape == (3, 4, 32, 16) and cache[0].length == 6
