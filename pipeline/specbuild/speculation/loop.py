"""The speculative loop for one request, independent of where the engines run.

:func:`speculate` drives a target engine call and a :class:`~specbuild.speculation.drafting.DraftSource`. The
Triton orchestrator passes calls that go through BLS to the ``target``/``draft`` models (TensorRT-LLM or
torch), the in-process speculator passes :class:`~specbuild.runtimes.torch.engine.TorchEngine` methods,
so the server and the in-process baseline run the very same loop.

One round: a source proposes up to ``k`` tokens; the target verifies them in one pass and returns the
accepted prefix plus one token of its own (:mod:`specbuild.speculation.rules`). Without a proposal the target
generates alone. Rounds are yielded as they finish so callers can stream them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from specbuild.speculation.drafting import Draft, Drafts
from specbuild.speculation.engine import EngineCall, EngineRequest
from specbuild.speculation.request import GenerationRequest
from specbuild.speculation.round_costs import RoundCosts
from specbuild.speculation.rules import round_seed
from specbuild.speculation.stats import SpeculationStats

TARGET_ROLE = 1  # the seed stream of target calls (the draft's is 0)


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


async def speculate(request: GenerationRequest, target: EngineCall, drafts: Drafts | None, *,
                    stats: SpeculationStats | None = None,
                    load_cap: Callable[[], int | None] | None = None,
                    costs: RoundCosts | None = None) -> AsyncIterator[Round]:
    """Run the loop for one request, yielding each round's new tokens; ``stats`` is updated in place.

    ``drafts`` None runs the target alone; see :func:`~specbuild.speculation.drafting.draft_sources` (which also
    says how many tokens a round drafts, and learns each round's outcome).
    ``load_cap``, asked before each round that would draft: the most draft tokens the load allows now (the
    orchestrator's load policy, :class:`~specbuild.speculation.schedule.DraftLenSchedule`; None: no cap), since on
    a busy server drafting and verifying cost more of the shared compute than they save. A cap below the round's K
    shortens it (counted in ``stats.load_rounds``); 0 runs the round as K=0 does (no draft call, the target makes
    ``target_only_chunk`` tokens or the rest). Not for a seeded sampled request: its output depends on K, and
    the same seed must give the same text at any load.
    ``costs``: told each round's seconds after the first (which prefills the prompt), unguided requests only (a
    guide's masks add their own time), so the break-even learns what rounds cost here
    (:class:`~specbuild.speculation.round_costs.RoundCosts`).
    """
    if load_cap is not None and not request.sampling.is_greedy and request.seed is not None:
        load_cap = None  # another K would change a seeded request's random draws: it keeps its K to be reproducible
    stats = stats if stats is not None else SpeculationStats()
    guide = request.guide  # its masks go with every call (speculation/guide.py); the draft's: draft_sources
    if guide is not None:
        guide.reset()  # at the prompt's end: a request may be run again
        target = guide.constrained(target)
    generated: list[int] = []
    round_index = 0
    while True:
        remaining = request.max_tokens - len(generated)
        context = request.prompt_ids + generated
        # Until min_tokens, the target alone: only it knows its distribution without the end token there.
        unfinished = min(max(0, request.min_tokens - len(generated)), remaining)
        k = min(drafts.round_length, remaining - 1) if drafts is not None and not unfinished else 0
        cap = load_cap() if load_cap is not None and k > 0 else None
        if cap is not None and cap < k:
            stats.load_rounds += 1
            k = cap
        sources = None if cap == 0 else drafts
        draft_seconds = stats.draft_seconds
        draft = await sources.propose(context, k, round_index) if k > 0 else None
        draft_seconds = stats.draft_seconds - draft_seconds
        if draft is not None and guide is not None:
            draft = draft.cut(guide.admissible(draft.tokens))  # a proposal the grammar forbids from here: cut
        started = time.perf_counter()
        verdict = await target(_target_request(request, context, draft, remaining, unfinished, round_index, sources))
        target_seconds = time.perf_counter() - started
        stats.target_seconds += target_seconds
        drafted = len(draft.tokens) if draft else 0
        if costs is not None and round_index > 0 and guide is None and request.engine_guide is None:
            if draft is None:
                costs.alone(target_seconds, len(verdict.tokens))
            else:
                costs.verified(drafted, target_seconds, draft_seconds if draft.steady else None)
        accepted = _accepted_prefix(draft.tokens, verdict.tokens, request.end_id) if draft else 0
        stats.record_round(drafted, accepted, source=draft.source.name if draft else None)
        if sources is not None:
            sources.record(draft, accepted, verdict, min_tokens_round=unfinished > 0)
        round_index += 1

        new_tokens = verdict.tokens[:remaining]
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
        if guide is not None:
            guide.accept(new_tokens)
            stats.guide_seconds = guide.seconds  # this request's, masks for the draft's calls included
            if finish_reason is None and guide.finished:
                finish_reason = "end_id"  # a complete grammar ends the answer as the end token does
        if finish_reason is None and len(generated) >= request.max_tokens:
            finish_reason = "length"
        if finish_reason is None and not new_tokens:
            finish_reason = "no_progress"  # an engine returned nothing: stop rather than loop forever
        if finish_reason is None and request.engine_guide is not None:
            finish_reason = "end_id"  # the engine's guided answer came whole: it stopped short at a complete grammar
        yield Round(new_tokens, finish_reason is not None, finish_reason)
        if finish_reason is not None:
            return


def _target_request(request: GenerationRequest, context: list[int], draft: Draft | None, remaining: int,
                    unfinished: int, round_index: int, drafts: Drafts | None) -> EngineRequest:
    """Verify ``draft`` (the accepted prefix plus one token of the target's own comes back), or, without one,
    generate: up to the ``unfinished`` tokens min_tokens still needs (none of them the end token) while a source
    may propose afterwards, else one token while a source may still propose next round (the rest of the
    break-even's stretch while it has drafting off, in ``target_only_chunk`` pieces), else
    ``target_only_chunk`` (or all)."""
    chunk = request.target_only_chunk
    if draft is not None:
        new_tokens = len(draft.tokens) + 1
    elif drafts is not None and drafts.may_propose:
        alone = min(chunk or drafts.alone_tokens, drafts.alone_tokens, remaining)
        new_tokens = min(chunk or unfinished, unfinished) if unfinished else alone
    else:
        new_tokens = min(chunk or remaining, remaining)
    return EngineRequest(
        input_ids=context, max_new_tokens=new_tokens, sampling=request.sampling,
        seed=round_seed(request.seed, round_index, TARGET_ROLE), end_id=request.end_id,
        min_new_tokens=min(new_tokens, unfinished),
        draft_tokens=draft.tokens if draft else None, draft_logits=draft.logits if draft else None,
        verification=request.verification, return_logits=drafts is not None and drafts.needs_target_outputs,
        bad_words=request.bad_words, guide=request.engine_guide,
    )


def _accepted_prefix(drafted: list[int], returned: list[int], end_id: int | None) -> int:
    """Drafted tokens the target accepted: their common prefix, but for the round's last token, the target's own
    (block verification's correction may equal the drafted token there; the other rules' never does), unless that
    is an end token the draft proposed, after which the target returns no token of its own."""
    accepted = 0
    while accepted < min(len(drafted), len(returned)) and drafted[accepted] == returned[accepted]:
        accepted += 1
    if returned and returned[-1] == end_id:
        return accepted
    return min(accepted, len(returned) - 1)
