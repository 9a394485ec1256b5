"""The speculative loop for one request, independent of where the engines run.

:func:`speculate` drives a target engine call and a :class:`~specbuild.speculation.drafting.DraftSource`. The
Triton orchestrator passes calls that go through BLS to the ``target``/``draft`` models (TensorRT-LLM or
torch), the in-process speculator passes :class:`~specbuild.runtimes.torch.engine.TorchEngine` methods,
so the server and the in-process baseline run the very same loop.

One round: a source proposes up to ``k`` tokens; the target verifies them in one pass and returns the
accepted prefix plus one token of its own (:mod:`specbuild.speculation.rules`); the outcome is recorded; the round
says whether the request is done (:func:`finish_reason`). Without a proposal the target generates alone, as it does
in a request's first round: the first token is the one its reading of the prompt makes, as TensorRT-LLM's draft
requests start from the target's first token (``tensorrt_llm/_torch/speculative/model_drafter.py``,
``get_draft_model_prompt``), so the time to the first token is the target's alone, and an answer of one token never
waits for a draft model to read a long prompt (the long workload's one-token code edits ran at 0.45x of K=0 with
the draft in the first round: docs/benchmarks.md, "Long prompts and the draft's window"). Rounds are
yielded as they finish so callers can stream them. What else a request's rounds need sits behind one small hook each:
the load's cap on K (:class:`LoadCap`), host timing and round costs (:class:`RoundTiming`), the grammar of a guided
request (:class:`GuideHooks`).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from specbuild.speculation.drafting import Draft, Drafts
from specbuild.speculation.engine_call import EngineCall, EngineOutput, EngineRequest
from specbuild.speculation.request import TokenRequest
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
    drafted: int = 0  # draft tokens the target verified this round
    accepted: int = 0  # of those, the ones accepted


async def speculate(request: TokenRequest, target: EngineCall, drafts: Drafts | None, *,
                    stats: SpeculationStats | None = None,
                    load_cap: Callable[[], int | None] | None = None,
                    costs: RoundCosts | None = None) -> AsyncIterator[Round]:
    """Run the loop for one request, yielding each round's new tokens; ``stats`` is updated in place.

    ``drafts`` None runs the target alone; see :func:`~specbuild.speculation.drafting.draft_sources` (which also
    says how many tokens a round drafts, and learns each round's outcome). ``load_cap``: the most draft tokens the
    load allows now (:class:`LoadCap`); ``costs``: told what this host's rounds cost (:class:`RoundTiming`).
    """
    stats = stats if stats is not None else SpeculationStats()
    cap, timing = LoadCap(request, load_cap, stats), RoundTiming(request, stats, costs)
    guide = GuideHooks(request, stats)  # its masks go with every call; the draft's: ModelDrafts.for_request
    target = guide.constrained(target)
    generated: list[int] = []
    for round_index in itertools.count():
        remaining = request.max_tokens - len(generated)
        context = request.prompt_ids + generated
        # Until min_tokens, the target alone: only it knows its distribution without the end token there.
        unfinished = min(max(0, request.min_tokens - len(generated)), remaining)
        k = min(drafts.round_length, remaining - 1) if drafts is not None and not unfinished else 0
        k, sources = cap.limit(k, drafts)
        k = k if round_index else 0  # the first token is the target's alone (at a cap of 0: the whole answer)
        # propose
        draft = guide.cut(await timing.propose(sources, context, k, round_index))
        # verify: the accepted prefix plus one token of the target's own comes back
        engine_request = _target_request(request, context, draft, remaining, unfinished, round_index, sources)
        verdict = await timing.verify(target, engine_request, draft, round_index)
        # record
        accepted = _accepted_prefix(draft.tokens, verdict.tokens, request.end_id) if draft else 0
        drafted = len(draft.tokens) if draft else 0
        stats.record_round(drafted, accepted, source=draft.source.name if draft else None)
        if sources is not None:
            sources.record(draft, accepted, verdict, min_tokens_round=bool(unfinished))
        # stop
        new_tokens, ended, stopped = _append(generated, verdict.tokens[:remaining], request)
        reason = finish_reason(request, new_tokens, len(generated), ended=ended, stopped=stopped,
                               grammar_complete=guide.accept(new_tokens))
        yield Round(new_tokens, reason is not None, reason, drafted, accepted)
        if reason is not None:
            return


class LoadCap:
    """The most draft tokens the load allows a round now (``cap``: the orchestrator's load policy,
    :class:`~specbuild.speculation.schedule.DraftLenSchedule`; None: no cap), since on a busy server drafting and
    verifying cost more of the shared compute than they save. Not for a seeded sampled request: its output depends on
    K, and the same seed must give the same text at any load."""

    def __init__(self, request: TokenRequest, cap: Callable[[], int | None] | None,
                 stats: SpeculationStats) -> None:
        seeded = not request.sampling.is_greedy and request.seed is not None
        self.cap = None if seeded else cap  # another K would change a seeded request's random draws
        self.stats = stats

    def limit(self, k: int, drafts: Drafts | None) -> tuple[int, Drafts | None]:
        """The round's K under the cap (asked only for a round that would draft; a shorter K counted in
        ``stats.load_rounds``) and its drafts: None at a cap of 0, which runs the round as K=0 does (no draft call,
        the target makes ``target_only_chunk`` tokens or the rest)."""
        cap = self.cap() if self.cap is not None and k > 0 else None
        if cap is not None and cap < k:
            self.stats.load_rounds += 1
            k = cap
        return k, None if cap == 0 else drafts


class RoundTiming:
    """One request's host timing: the target's seconds into ``stats.target_seconds`` and each round's costs after
    the first (which prefills the prompt) into ``costs``, for unguided requests only (a guide's masks add their own
    time), so the break-even learns what rounds cost here
    (:class:`~specbuild.speculation.round_costs.RoundCosts`)."""

    def __init__(self, request: TokenRequest, stats: SpeculationStats, costs: RoundCosts | None) -> None:
        self.stats = stats
        self.costs = costs if request.guide is None and request.engine_guide is None else None
        self._draft_seconds = 0.0  # the draft model's in the round's proposal

    async def propose(self, drafts: Drafts | None, context: list[int], k: int, round_index: int) -> Draft | None:
        """The proposal of ``drafts`` for ``k`` tokens (none for none)."""
        before = self.stats.draft_seconds
        draft = await drafts.propose(context, k, round_index) if drafts is not None and k > 0 else None
        self._draft_seconds = self.stats.draft_seconds - before
        return draft

    async def verify(self, target: EngineCall, request: EngineRequest, draft: Draft | None,
                     round_index: int) -> EngineOutput:
        """The target's answer to ``request``, which verifies ``draft`` (or generates without one)."""
        started = time.perf_counter()
        verdict = await target(request)
        seconds = time.perf_counter() - started
        self.stats.target_seconds += seconds
        if self.costs is not None and round_index > 0:
            if draft is None:
                self.costs.alone(seconds, len(verdict.tokens))
            else:
                self.costs.verified(len(draft.tokens), seconds, self._draft_seconds if draft.steady else None)
        return verdict


class GuideHooks:
    """A guided request's grammar around its rounds (:mod:`specbuild.speculation.guide`): reset at the prompt's end
    (a request may be run again), its masks on every target call (the draft's: ``ModelDrafts.for_request``), a
    proposal cut to what it admits, each round's tokens accepted. Without a guide each hook passes through."""

    def __init__(self, request: TokenRequest, stats: SpeculationStats) -> None:
        self.guide = request.guide
        self.stats = stats
        if self.guide is not None:
            self.guide.reset()

    def constrained(self, target: EngineCall) -> EngineCall:
        return target if self.guide is None else self.guide.constrained(target)

    def cut(self, draft: Draft | None) -> Draft | None:
        """``draft`` up to what the grammar admits from here (a proposal it forbids: None)."""
        return draft if draft is None or self.guide is None else draft.cut(self.guide.admissible(draft.tokens))

    def accept(self, tokens: list[int]) -> bool:
        """Advance the grammar over a round's ``tokens``; whether it is complete after them."""
        if self.guide is None:
            return False
        self.guide.accept(tokens)
        self.stats.guide_seconds = self.guide.seconds  # this request's, masks for the draft's calls included
        return self.guide.finished


def _append(generated: list[int], returned: list[int], request: TokenRequest) -> tuple[list[int], bool, bool]:
    """Append a round's ``returned`` tokens to ``generated``, up to the end token (``ended``) and up to and including
    the first stop word (``stopped``); the tokens appended, ended, stopped."""
    ended = request.end_id is not None and request.end_id in returned
    if ended:
        returned = returned[: returned.index(request.end_id)]
    start = len(generated)
    generated.extend(returned)
    stop_at = _stop_index(generated, start, request.stop_words)
    if stop_at is not None:
        del generated[stop_at:]
    return generated[start:], ended, stop_at is not None


def _stop_index(generated: list[int], start: int, stop_words: list[list[int]]) -> int | None:
    """Length of ``generated`` up to and including the first stop word ending at or after ``start``."""
    for end in range(start + 1, len(generated) + 1):
        for word in stop_words:
            if word and end >= len(word) and generated[end - len(word):end] == word:
                return end
    return None


def finish_reason(request: TokenRequest, new_tokens: list[int], generated: int, *, ended: bool, stopped: bool,
                  grammar_complete: bool) -> str | None:
    """Why the request is done after a round that appended ``new_tokens`` (``generated`` tokens in all), or None."""
    if stopped:
        return "stop_words"
    if ended or grammar_complete:  # a complete grammar ends the answer as the end token does
        return "end_id"
    if generated >= request.max_tokens:
        return "length"
    if not new_tokens:
        return "no_progress"  # an engine returned nothing: stop rather than loop forever
    if request.engine_guide is not None:
        return "end_id"  # the engine's guided answer came whole: it stopped short at a complete grammar
    return None


def _target_request(request: TokenRequest, context: list[int], draft: Draft | None, remaining: int,
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
