"""A draft's agreement with its target on the benchmark prompts, which no distillation trains on.

Drafts agree far more on the kind of prompts they were distilled from than on others, so this is the figure
that says how well a prompt pool generalises. The target answers each benchmark prompt greedily (batched, on
its device, :func:`specbuild.drafts.distill_data.target_answers`); one teacher-forced draft pass over each
answer says, at every answer position, whether the draft's argmax is the target's token. Per prompt set (the
bundled general set; the repository's held-out set where it is present): the share of agreeing positions and
greedy acceptance at K=1..4.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specbuild.bench.acceptance import acceptance_by_k, sequence_matches
from specbuild.drafts.distill_data import chat_encode, target_answers
from specbuild.drafts.distill_options import DraftOptions
from specbuild.drafts.held_out import benchmark_texts

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

SETS = ("general", "heldout")  # the structured set's prompts ask for JSON: another kind of answer
MAX_K = 4


def benchmark_answers(target: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, *, max_new_tokens: int = 128,
                      batch: int = 128) -> dict[str, list[tuple[list[int], int]]]:
    """The target's greedy answers to each benchmark set there is: {set: [(prompt + answer, prompt length)]}."""
    answering = DraftOptions(max_new_tokens=max_new_tokens, generate_batch=batch, held_out=1)
    return {name: target_answers(target, tokenizer, chat_encode(tokenizer, texts), answering, math.inf, None)
            for name, texts in benchmark_texts().items() if name in SETS and texts}


def agreement(draft_logits: Callable[[torch.Tensor], torch.Tensor],
              answers: dict[str, list[tuple[list[int], int]]]) -> dict[str, dict[str, Any]]:
    """{set: {prompts, positions, agreement (the share of answer positions where the draft's argmax is the
    target's token), acceptance (greedy, K=1..4)}} for the target's ``answers`` (``draft_logits``: a torch engine's
    ``sequence_logits``, so that a sub-vocabulary head is measured as it is served)."""
    import torch

    figures = {}
    for name, sequences in answers.items():
        matches = sequence_matches(draft_logits, ((torch.tensor(sequence), prompt_len)
                                                  for sequence, prompt_len in sequences))
        positions = sum(map(len, matches))
        figures[name] = {"prompts": len(sequences), "positions": positions,
                         "agreement": round(sum(map(sum, matches)) / positions, 3) if positions else None,
                         "acceptance": acceptance_by_k(matches, MAX_K)}
    return figures
