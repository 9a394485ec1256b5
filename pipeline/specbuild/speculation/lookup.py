"""Prompt lookup (n-gram) drafting: propose the tokens that followed the last earlier occurrence of the
context's final n-gram (Saxena 2023; TensorRT-LLM's and vLLM's "NGram" speculative decoding).

The proposal costs no model call. Answers that quote, edit or repeat their prompt (code, summaries,
structured output) often continue an earlier span, and the target verifies the proposal like any draft.
Pure: token ids in, token ids out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class PromptLookup:
    """Lookup settings of one request: suffix n-grams from ``max_ngram`` down to ``min_ngram`` tokens."""

    max_ngram: int = 4
    min_ngram: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"prompt lookup needs max_ngram >= min_ngram >= 1, got max_ngram={self.max_ngram}, "
                             f"min_ngram={self.min_ngram}")

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return propose(context, k, max_ngram=self.max_ngram, min_ngram=self.min_ngram)


def propose(context: Sequence[int], k: int, *, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest suffix n-gram of
    ``context`` (n from ``max_ngram`` down to ``min_ngram``); ``[]`` when none occurs or ``k <= 0``.

    The proposal never runs past the end of ``context``. One vectorised pass over the positions whose
    token equals the last one, then at most ``max_ngram`` narrowing steps: linear in the context length.
    """
    if k <= 0 or len(context) < 2 or not 1 <= min_ngram <= max_ngram:
        return []
    tokens = np.asarray(context, dtype=np.int64)
    last = len(tokens) - 1
    # Candidate occurrences end at ``ends`` (before the last token, so at least one token follows them).
    ends = np.flatnonzero(tokens[:last] == tokens[last])
    lengths = np.ones(len(ends), dtype=np.int64)
    alive = np.ones(len(ends), dtype=bool)
    for back in range(1, max_ngram):
        if back > last:
            break
        reach = ends - back >= 0
        alive &= reach
        alive[reach] &= tokens[ends[reach] - back] == tokens[last - back]
        if not alive.any():
            break
        lengths += alive
    best = int(lengths.max()) if len(lengths) else 0
    if best < min_ngram:
        return []
    end = int(ends[np.flatnonzero(lengths == best)[-1]])  # the most recent of the longest matches
    return [int(t) for t in tokens[end + 1:end + 1 + k]]


# Far below any real logit, yet finite: softmax gives exactly 0 elsewhere in float32 and float64, and no
# inf - inf arithmetic can make a NaN (engines running in float16 see it as -inf).
OFF_TOKEN_LOGIT = -1e30


def point_mass_logits(tokens: Sequence[int], vocab_size: int) -> torch.Tensor:
    """Draft logits ``[len(tokens), vocab_size]`` (float32) of a deterministic proposal: all probability on
    each proposed token. Rejection sampling with this ``q`` accepts ``x`` with probability ``p(x)`` and
    otherwise samples ``p`` without ``x``: the output is distributed exactly as ``p``."""
    logits = torch.full((len(tokens), vocab_size), OFF_TOKEN_LOGIT, dtype=torch.float32)
    logits[torch.arange(len(tokens)), torch.as_tensor(list(tokens), dtype=torch.long)] = 0.0
    return logits
