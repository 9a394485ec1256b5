"""Prompt lookup (n-gram) drafting: propose the tokens that followed the last earlier occurrence of the
context's final n-gram (Saxena 2023; TensorRT-LLM's and vLLM's "NGram" speculative decoding).

The proposal costs no model call. Answers that quote, edit or repeat their prompt (code, summaries,
structured output) often continue an earlier span, and the target verifies the proposal like any draft: by
token matching, which for a deterministic proposal is exact rejection sampling (see
:class:`specbuild.speculation.drafting.Draft`). Pure: token ids in, token ids out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class PromptLookup:
    """Lookup settings of one request: suffix n-grams from ``max_ngram`` down to ``min_ngram`` tokens."""

    max_ngram: int = 4
    min_ngram: int = 2

    def __post_init__(self) -> None:
        propose((), 0, max_ngram=self.max_ngram, min_ngram=self.min_ngram)  # validates the range

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        return propose(context, k, max_ngram=self.max_ngram, min_ngram=self.min_ngram)


def propose(context: Sequence[int], k: int, *, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest suffix n-gram of
    ``context`` (n from ``max_ngram`` down to ``min_ngram``); ``[]`` when none occurs or ``k <= 0``.

    The proposal never runs past the end of ``context``. One vectorised pass over the positions whose
    token equals the last one, then at most ``max_ngram`` narrowing steps: linear in the context length.
    """
    import numpy as np  # here, not at the top: the spec validates n-gram ranges through PromptLookup

    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"prompt lookup needs max_ngram >= min_ngram >= 1, got max_ngram={max_ngram}, "
                         f"min_ngram={min_ngram}")
    if k <= 0 or len(context) < 2:
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
