"""Grouped-query attention with the query heads packed as rows (runtimes/torch/attention.py): the same attention
as transformers' ``sdpa`` (which copies the keys per query head), for a one-row step, a verification's rows under
their mask, and a causal prefill; engines switch to it where it applies and answer as before."""

from __future__ import annotations

import pytest
import torch

from specbuild.runtimes.torch.attention import NAME, packed_gqa_attention, use_packed_gqa
from specbuild.runtimes.torch.engine import TorchEngine
from specbuild.speculation.engine_call import EngineRequest


class Grouped(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def _tensors(rows: int, length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(1, 6, rows, 16, generator=generator)
    key, value = (torch.randn(1, 2, length, 16, generator=generator) for _ in range(2))
    return query, key, value


def _verification_mask(rows: int, length: int) -> torch.Tensor:
    """``rows`` new positions at the end of ``length``: each sees the cache and the new rows up to itself."""
    positions = torch.arange(length - rows, length)[:, None]
    return (torch.arange(length)[None, :] <= positions)[None, None]


@pytest.mark.parametrize("rows, length, masked", [(1, 40, False), (1, 40, True), (4, 40, True), (9, 300, True),
                                                  (5, 5, False)])
def test_matches_sdpa_with_copied_keys(rows: int, length: int, masked: bool) -> None:
    from transformers.integrations.sdpa_attention import repeat_kv

    query, key, value = _tensors(rows, length)
    mask = _verification_mask(rows, length) if masked else None
    packed, _ = packed_gqa_attention(Grouped(), query, key, value, mask, scaling=0.25)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, repeat_kv(key, 3), repeat_kv(value, 3), attn_mask=mask, scale=0.25,
        is_causal=not masked and rows > 1).transpose(1, 2)
    assert packed.shape == (1, rows, 6, 16)
    torch.testing.assert_close(packed, expected, rtol=0, atol=1e-5)


def test_float_mask_and_broadcast_batch() -> None:
    query, key, value = _tensors(3, 20, seed=1)
    allowed = _verification_mask(3, 20)
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    by_bool, _ = packed_gqa_attention(Grouped(), query, key, value, allowed)
    by_float, _ = packed_gqa_attention(Grouped(), query, key, value, additive)
    torch.testing.assert_close(by_bool, by_float, rtol=0, atol=1e-6)


def test_engines_switch_where_heads_are_grouped(tiny, tmp_path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    grouped = TorchEngine(tiny.target, max_draft_len=4, max_seq_len=64)
    assert grouped.packed_attention and grouped.model.config._attn_implementation == NAME
    ungrouped = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                                             attn_implementation="sdpa"))
    assert not use_packed_gqa(ungrouped)
    assert ungrouped.config._attn_implementation == "sdpa"


def test_engine_answers_as_with_sdpa(tiny) -> None:
    """Generation and a verification of the same tokens with and without packing: the same tokens, logits equal to
    float rounding (different kernels add in another order)."""
    packed = TorchEngine(tiny.target, max_draft_len=4, max_seq_len=128)
    stock = TorchEngine(tiny.target, max_draft_len=4, max_seq_len=128)
    stock.model.set_attn_implementation("sdpa")
    prompt = [1, 3, 4, 5, 6, 7, 8, 3, 4, 5, 9, 10] * 4
    generated = [engine.run(EngineRequest(prompt, 6, return_logits=True)) for engine in (packed, stock)]
    assert generated[0].tokens == generated[1].tokens
    torch.testing.assert_close(generated[0].logits, generated[1].logits, rtol=0, atol=1e-4)
    drafts = generated[1].tokens[:4]
    verified = [engine.run(EngineRequest(prompt, 1, draft_tokens=drafts, return_logits=True))
                for engine in (packed, stock)]
    assert verified[0].tokens == verified[1].tokens
    torch.testing.assert_close(verified[0].logits, verified[1].logits, rtol=0, atol=1e-4)
