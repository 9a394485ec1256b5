"""Greedy acceptance measured in process, without a speculative loop or a server.

While the draft's tokens are accepted they equal the target's, so the draft's proposal at every position of the
target's own greedy continuation decides each round. One teacher-forced draft pass over that continuation gives
:func:`acceptance_rate` for every K.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # heavy imports stay lazy: importing specbuild must not load torch
    import torch
    from transformers import PreTrainedModel


def greedy_continuations(model: PreTrainedModel, prompts: Sequence[Sequence[int]], new_tokens: int,
                         advance: Callable[[float], None] = lambda amount=1: None) -> list[torch.Tensor]:
    """Each prompt plus the model's greedy continuation (stopping early at end-of-sequence), 1-D."""
    import torch

    sequences = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([list(prompt)], dtype=torch.long)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 do_sample=False, temperature=None, top_p=None, top_k=None)
            sequences.append(out[0])
            advance(1)
    return sequences


def draft_matches(draft_logits: torch.Tensor, sequence: torch.Tensor, prompt_len: int) -> list[bool]:
    """Whether the draft's argmax (teacher-forced on ``sequence``) equals each generated token.

    ``draft_logits`` are the draft's logits for every position of ``sequence`` (shape ``[len, vocab]``).
    """
    predicted = draft_logits[prompt_len - 1:-1].argmax(dim=-1)
    return (predicted == sequence[prompt_len:]).tolist()


def acceptance_rate(matches: Sequence[Sequence[bool]], k: int) -> float:
    """Greedy speculative decoding's accepted / drafted tokens at ``k`` drafts per round.

    Each round drafts ``k`` tokens at the current position (fewer where the row ends, so the figure has no
    end-of-text bias), accepts the run of matches, and advances past it plus the target's own token,
    exactly as greedy verification does.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    accepted = drafted = 0
    for row in matches:
        position = 0
        while position < len(row):
            run = 0
            while run < k and position + run < len(row) and row[position + run]:
                run += 1
            accepted += run
            drafted += min(k, len(row) - position)
            position += run + 1
    return accepted / drafted if drafted else 0.0


def acceptance_by_k(matches: Sequence[Sequence[bool]], max_k: int = 8) -> dict[str, float]:
    """:func:`acceptance_rate` for K = 1..max_k, keyed by K as text (JSON-ready)."""
    return {str(k): round(acceptance_rate(matches, k), 3) for k in range(1, max_k + 1)}


def model_logits(model: PreTrainedModel) -> Callable[[torch.Tensor], torch.Tensor]:
    """``model``'s logits at every position of one token sequence (``[len, vocab]``), for :func:`sequence_matches`."""
    return lambda sequence: model(input_ids=sequence[None].to(model.device)).logits[0]


def sequence_matches(draft_logits: Callable[[torch.Tensor], torch.Tensor],
                     sequences: Iterable[tuple[torch.Tensor, int]],
                     advance: Callable[[float], None] = lambda amount=1: None) -> list[list[bool]]:
    """:func:`draft_matches` for each (prompt + answer, prompt length), teacher-forced in one pass each.

    ``draft_logits`` gives the draft's vocabulary-wide logits for a sequence: :func:`model_logits`, or a torch
    engine's ``sequence_logits``, which scatters a sub-vocabulary head's logits back to their token ids (the
    head's own indices are not token ids)."""
    import torch

    matches = []
    with torch.no_grad():
        for sequence, prompt_len in sequences:
            matches.append(draft_matches(draft_logits(sequence).to(sequence.device), sequence, prompt_len))
            advance(1)
    return matches


def measure_acceptance(target: PreTrainedModel, draft_logits: Callable[[torch.Tensor], torch.Tensor],
                       prompts: Sequence[Sequence[int]], new_tokens: int,
                       advance: Callable[[float], None] = lambda amount=1: None) -> dict[str, float]:
    """Greedy acceptance per drafted token at K=1..8 on the target's own continuations of ``prompts``
    (``draft_logits`` as for :func:`sequence_matches`)."""
    continuations = greedy_continuations(target, prompts, new_tokens, advance)
    return acceptance_by_k(sequence_matches(draft_logits, zip(continuations, map(len, prompts))))
