"""The speculative loop for one request, independent of where the engines run.

:func:`speculate` drives two engine calls (draft and target) that take an
:class:`~specbuild.speculation.torch_engine.EngineRequest` and return an :class:`~specbuild.speculation.torch_engine.EngineOutput`.
The Triton orchestrator passes calls that go through BLS to the ``draft``/``target`` models (TensorRT-LLM
or torch), and the in-process generator passes :class:`~specbuild.speculation.torch_engine.TorchEngine` methods, so
the server and the in-process baseline run the very same loop.

One round: the draft proposes ``k`` tokens, the target verifies them in one pass and returns the accepted
prefix plus one token of its own. With prompt lookup on, the round's draft is first looked up in the
request's own tokens (:mod:`specbuild.speculation.lookup`, no model call) and the draft model runs only when lookup
finds nothing. With ``k == 0`` (speculation off, or no draft source) the target generates alone. Rounds
are yielded as they finish so callers can stream them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable

from specbuild.speculation.lookup import PromptLookup, point_mass_logits
from specbuild.speculation.rules import GREEDY, SamplingParams, round_seed
from specbuild.speculation.torch_engine import EngineOutput, EngineRequest

EngineCall = Callable[[EngineRequest], Awaitable[EngineOutput]]

DRAFT_ROLE, TARGET_ROLE = 0, 1


@dataclass
class GenerationRequest:
    """What one client asked for, in token ids."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams = GREEDY
    seed: int | None = None
    end_id: int | None = None
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    num_draft_tokens: int = 4
    use_draft_logits: bool = True
    adaptive: bool = False
    prompt_lookup: PromptLookup | None = None  # None: drafts come from the draft model only
    # Tokens the target makes per call when it runs alone: 1 streams token by token.
    target_only_chunk: int | None = None


@dataclass
class SpeculationStats:
    """Acceptance and timing of one request (or, summed, of many)."""

    rounds: int = 0
    drafts: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    fallbacks: int = 0
    # Of the totals above, what prompt lookup drafted (rounds, tokens) and what of it was accepted.
    lookup_drafts: int = 0
    lookup_drafted_tokens: int = 0
    lookup_accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per target step over speculative rounds: 1 + accepted / drafts (counts the bonus token)."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0

    def record_round(self, drafted: int, accepted: int, *, by_lookup: bool = False) -> None:
        self.rounds += 1
        if drafted == 0:
            return
        self.drafts += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        if by_lookup:
            self.lookup_drafts += 1
            self.lookup_drafted_tokens += drafted
            self.lookup_accepted_tokens += accepted
        for counts, upto in ((self.drafted_per_position, drafted), (self.accepted_per_position, accepted)):
            counts.extend([0] * (upto - len(counts)))
            for position in range(upto):
                counts[position] += 1


@dataclass
class Round:
    """Tokens finished in one round, and whether the request is done (``finish_reason`` then says why)."""

    tokens: list[int]
    finished: bool
    finish_reason: str | None = None


def _stop_index(generated: list[int], start: int, stop_words: list[list[int]]) -> int | None:
    """Length of ``generated`` up to and including the first stop word ending at or after ``start``."""
    for end in range(start + 1, len(generated) + 1):
        for word in stop_words:
            if word and end >= len(word) and generated[end - len(word):end] == word:
                return end
    return None


def next_draft_length(current: int, drafted: int, accepted: int, max_draft_len: int) -> int:
    """Adaptive K: two longer after a fully accepted round, one shorter after a rejection (within 1..max)."""
    if drafted == 0:
        return current
    if accepted == drafted:
        return min(current + 2, max_draft_len)
    return max(1, current - 1)


async def speculate(
    request: GenerationRequest,
    target: EngineCall,
    draft: EngineCall | None,
    *,
    max_draft_len: int,
    stats: SpeculationStats | None = None,
    on_draft_failure: Callable[[Exception], None] | None = None,
    vocab_size: int | None = None,
) -> AsyncIterator[Round]:
    """Run the loop for one request, yielding each round's new tokens; ``stats`` is updated in place.

    If a draft call fails, the request carries on with the target alone (exact, only slower), the
    failure is counted in ``stats.fallbacks`` and reported to ``on_draft_failure``; prompt lookup, when
    on, keeps drafting. ``vocab_size`` (the target's) is needed only for lookup drafts under draft-logits
    acceptance, which carry point-mass logits so that rejection sampling stays exact.
    """
    stats = stats if stats is not None else SpeculationStats()
    generated: list[int] = []
    k_wanted = min(request.num_draft_tokens, max_draft_len)
    draft_usable = draft is not None and k_wanted > 0
    lookup = request.prompt_lookup if k_wanted > 0 else None
    want_logits = request.use_draft_logits and not request.sampling.is_greedy
    if lookup is not None and want_logits and vocab_size is None:
        raise ValueError("prompt lookup under draft-logits acceptance needs the target's vocab_size")
    round_index = 0
    while True:
        remaining = request.max_tokens - len(generated)
        sequence = request.prompt_ids + generated
        k = min(k_wanted, remaining - 1) if draft_usable or lookup is not None else 0
        drafted: list[int] = []
        draft_logits = None
        by_lookup = False
        if k > 0 and lookup is not None:
            drafted = lookup.propose(sequence, k)
            by_lookup = bool(drafted)
            if by_lookup and want_logits:
                draft_logits = point_mass_logits(drafted, vocab_size)  # type: ignore[arg-type]
        if k > 0 and not drafted and draft_usable:
            started = time.perf_counter()
            try:
                proposal = await draft(EngineRequest(
                    input_ids=sequence, max_new_tokens=k, sampling=request.sampling,
                    seed=round_seed(request.seed, round_index, DRAFT_ROLE), end_id=request.end_id,
                    return_logits=want_logits, bad_words=request.bad_words,
                ))
                drafted = proposal.tokens[:k]
                draft_logits = proposal.logits[: len(drafted)] if want_logits and proposal.logits is not None else None
            except Exception as exc:  # noqa: BLE001 - any draft failure falls back to the exact target-only path
                draft_usable = False
                stats.fallbacks += 1
                if on_draft_failure is not None:
                    on_draft_failure(exc)
            stats.draft_seconds += time.perf_counter() - started
        started = time.perf_counter()
        if drafted:
            verdict = await target(EngineRequest(
                input_ids=sequence, max_new_tokens=len(drafted) + 1, sampling=request.sampling,
                seed=round_seed(request.seed, round_index, TARGET_ROLE), end_id=request.end_id,
                draft_tokens=drafted, draft_logits=draft_logits, bad_words=request.bad_words,
            ))
            new_tokens = verdict.tokens
            accepted = _accepted_prefix(drafted, new_tokens)
        else:
            # With lookup on, the target makes one token so that the next round can look up again.
            chunk = 1 if lookup is not None else request.target_only_chunk or remaining
            verdict = await target(EngineRequest(
                input_ids=sequence, max_new_tokens=min(chunk, remaining), sampling=request.sampling,
                seed=round_seed(request.seed, round_index, TARGET_ROLE), end_id=request.end_id,
                bad_words=request.bad_words,
            ))
            new_tokens, accepted = verdict.tokens, 0
        stats.target_seconds += time.perf_counter() - started
        stats.record_round(len(drafted), accepted, by_lookup=by_lookup)
        round_index += 1
        if request.adaptive:
            k_wanted = next_draft_length(k_wanted, len(drafted), accepted, max_draft_len)

        new_tokens = new_tokens[:remaining]
        finish_reason = None
        if request.end_id is not None and request.end_id in new_tokens:
            new_tokens = new_tokens[: new_tokens.index(request.end_id)]
            finish_reason = "end_id"
        start = len(generated)
        generated.extend(new_tokens)
        stop_at = _stop_index(generated, start, request.stop_words)
        if stop_at is not None:
            del generated[stop_at:]
            new_tokens = generated[start:]
            finish_reason = "stop_words"
        if finish_reason is None and len(generated) >= request.max_tokens:
            finish_reason = "length"
        if finish_reason is None and not new_tokens:
            finish_reason = "no_progress"  # an engine returned nothing: stop rather than loop forever
        yield Round(new_tokens, finish_reason is not None, finish_reason)
        if finish_reason is not None:
            return


def _accepted_prefix(drafted: list[int], returned: list[int]) -> int:
    """Drafted tokens the target accepted: their common prefix, since every rule's own token at a mismatch
    differs from the drafted one. (Capping at ``len(returned) - 1`` would miss an accepted end token, after
    which the target returns no token of its own.)"""
    accepted = 0
    while accepted < min(len(drafted), len(returned)) and drafted[accepted] == returned[accepted]:
        accepted += 1
    return accepted
