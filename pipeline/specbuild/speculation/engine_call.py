"""What the speculative loop asks of an engine, whichever runtime serves it.

An :class:`EngineRequest` is one call of a ``target`` or ``draft`` engine model in the terms of TensorRT-LLM's
``tensorrtllm`` backend (``request_output_len``, ``draft_input_ids``, ``min_tokens``, ...); an
:class:`EngineOutput` is its answer. The orchestrator turns them into the backend's tensors
(:mod:`specbuild.triton_models.engine_io`), the torch runtime's engine model turns those tensors back into requests
for :class:`~specbuild.runtimes.torch.engine.TorchEngine`, and the in-process speculator hands them to a
:class:`TorchEngine` directly: the same loop drives all three.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Awaitable, Callable

import torch

from specbuild.speculation.guide_spec import GuideSpec
from specbuild.speculation.modes import VerificationMode
from specbuild.speculation.rules import GREEDY, SamplingParams


@dataclass
class EngineRequest:
    """One call of an engine model."""

    input_ids: list[int]
    max_new_tokens: int  # request_output_len
    sampling: SamplingParams = GREEDY
    seed: int | None = None
    end_id: int | None = None
    min_new_tokens: int = 0  # min_tokens: the end token is not generated before this many tokens
    draft_tokens: list[int] | None = None  # draft_input_ids: verify these instead of generating
    # draft_logits: the raw logits the draft sampled ``draft_tokens`` from, [k, vocab] (or, with TensorRT-LLM's
    # fast logits, the draft engine's opaque handle, passed through unchanged); None: accept by token matching
    draft_logits: torch.Tensor | None = None
    # how the target judges draft_logits (rules.verify's mode); block: specbuild's own engine models only
    verification: VerificationMode = "token"
    return_logits: bool = False  # return_generation_logits
    bad_words: list[list[int]] = field(default_factory=list)
    # the tokens a guide allows at each new position (speculation/guide.py): int32 bitmask rows
    # [positions, ceil(vocab / 32)], bit j of word i allowing token 32 i + j; None: no guide
    token_masks: torch.Tensor | None = None
    # guided_decoding_guide_type / guided_decoding_guide: a guide the engine applies itself from its first new token
    # (the tensorrtllm backend's own guided decoding, package/backend_guides.py); None: no guide
    guide: GuideSpec | None = None


@dataclass
class EngineOutput:
    tokens: list[int]  # generated tokens only (never the input)
    logits: torch.Tensor | None = None  # generation_logits: [len(tokens), vocab] raw logits of each new position


EngineCall = Callable[[EngineRequest], Awaitable[EngineOutput]]
