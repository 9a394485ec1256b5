"""Attention over a grouped KV cache without copying it: the query heads that share a key/value head become rows.

A model with grouped-query attention (the demo target: 9 query heads over 3 key/value heads) has transformers'
``sdpa`` path copy every key and value head ``groups`` times (``repeat_kv``) for any call of more than one query
row with a mask: exactly a verification, which scores K+1 rows against the whole cached sequence. That copy grows
with the context: on a 2-core AMD EPYC the demo target verified 3 drafted tokens after 2048 cached tokens at 1.53
target steps against 1.25 after 256 (``docs/benchmarks.md``, "Long prompts and the draft's window"), while a
one-row step already avoids it (transformers 5.x ``pack_gqa``). Here every masked call packs the ``groups`` query
heads of a key/value head into ``groups x rows`` rows of that head and repeats the mask to match, so attention
reads each key and value once; each row's softmax is over the same keys with the same mask as before, and the
logits came out bit for bit those of ``sdpa`` on that machine (V(3) at 2048 tokens: 1.27). A one-row step is
packed too, with or without a mask, as transformers 5.x does and 4.57 (TensorRT-LLM 1.2 images) does not. Other
unmasked calls (a causal prefill, where packed rows would see each other's positions) go to ``sdpa`` as they are.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "specbuild_packed_gqa"


def packed_gqa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` ``[batch, heads, rows, dim]``, ``key``/``value``
    ``[batch, kv_heads, length, dim]``, ``attention_mask`` ``[batch, 1, rows, length]``; returns ``[batch, rows,
    heads, dim]``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, rows, dim = query.shape
    masked = attention_mask is not None and attention_mask.shape[1] == 1
    if groups == 1 or not (masked or rows == 1) or dropout or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    packed = query.reshape(batch, heads // groups, groups * rows, dim)  # head h uses key/value head h // groups
    mask = None
    if attention_mask is not None:
        mask = attention_mask.expand(batch, 1, rows, attention_mask.shape[-1]).repeat(1, 1, groups, 1)
    output = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return output.reshape(batch, heads, rows, dim).transpose(1, 2).contiguous(), None


def use_packed_gqa(model: Any) -> bool:
    """Switch ``model`` from ``sdpa`` to :func:`packed_gqa_attention` (transformers 4.57 and 5.x register both the
    function and its mask, which is ``sdpa``'s); False where it runs another implementation or has no groups."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = model.config
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if config._attn_implementation != "sdpa" or not heads or not kv_heads or heads == kv_heads:
        return False
    AttentionInterface.register(NAME, packed_gqa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return True
