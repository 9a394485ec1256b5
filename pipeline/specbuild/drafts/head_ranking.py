"""Rank the ids a draft's sub-vocabulary head keeps (:mod:`specbuild.checkpoint.head_vocabulary`).

The ids are ranked by how often they occur in the target's own greedy answers to local distillation prompts
(never a benchmark set), as FR-Spec ranks them for EAGLE heads; ids with equal counts, unseen ones included,
keep the lower id first (byte-level BPE ids rise with merge order, so lower ids are the commoner merges). The
ranking depends on the target alone: one list serves every draft of that target, and costs the target's answers
once (``specbuild head-vocabulary``, :mod:`specbuild.drafts.target_ranking`), or nothing when ``specbuild draft
--head-vocabulary`` ranks from the answers it distils from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specbuild.checkpoint.head_vocabulary import HeadVocabulary
from specbuild.errors import UsageError


def rank_head_vocabulary(answers: Sequence[Sequence[int]], vocab_size: int, size: int,
                         provenance: dict[str, Any] | None = None) -> HeadVocabulary:
    """The ``size`` ids most frequent in ``answers`` (the target's answer tokens, prompts left out), with how
    they were counted and the share of the counted tokens they cover in the provenance."""
    import torch

    if not 1 <= size < vocab_size:
        raise UsageError(f"a head vocabulary of {size} ids for a {vocab_size}-id vocabulary",
                         f"pass a size between 1 and {vocab_size - 1} (the full head needs no list)")
    tokens = torch.tensor([token for answer in answers for token in answer], dtype=torch.long)
    if not len(tokens):
        raise UsageError("no answer tokens to rank a head vocabulary from", "rank from more prompts")
    counts = torch.bincount(tokens, minlength=vocab_size)
    ranking = torch.sort(-counts, stable=True).indices[:size]  # stable: equal counts keep the lower id first
    figures = {"answers": len(answers), "answer_tokens": len(tokens), "distinct_ids": int((counts > 0).sum()),
               "coverage": round(float(counts[ranking].sum()) / len(tokens), 4)}
    return HeadVocabulary.of(ranking.tolist(), {**(provenance or {}), **figures})


def coverage(vocabulary: HeadVocabulary, answers: Sequence[Sequence[int]]) -> float:
    """The share of ``answers``' tokens that ``vocabulary`` holds: a drafted token can only be one of them."""
    kept = set(vocabulary.ids)
    total = sum(len(answer) for answer in answers)
    return round(sum(token in kept for answer in answers for token in answer) / total, 4) if total else 1.0
