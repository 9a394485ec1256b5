"""Where a round's draft comes from: the draft model, prompt lookup, or the first of them that proposes, and how
many tokens to draft.

A :class:`DraftSource` proposes up to ``k`` tokens after a context, with the distribution they were drawn from,
under its own :attr:`~DraftSource.name` (statistics and metrics are kept by it), and learns each round's outcome
(:meth:`~DraftSource.update`; Hugging Face's ``candidate_generator.py`` has the same split, its
``update_candidate_strategy`` the same hook: the loop verifies, a source proposes). Each source class declares what
it needs: the request settings that shape it (:attr:`~DraftSource.settings`, rows of
:data:`~specbuild.speculation.request_settings.REQUEST_SETTINGS`), whether its tokens cost draft steps for the
break-even (:attr:`~DraftSource.costs_draft_steps`: the cost model's c; else free, ~0) and whether it needs the
target's outputs (:attr:`~DraftSource.needs_target_outputs`), and builds itself for a request
(:meth:`~DraftSource.for_request`), so nothing outside it asks which source it is. :class:`Drafts` is one request's
drafting: its sources in order and the draft length per round (fixed, or adaptive K), told every outcome, so a
per-request policy lives here rather than in the loop. Both callers of the loop, the Triton orchestrator and the
in-process speculator, build it with :func:`draft_sources` from :data:`SOURCE_CLASSES`, so the policy (lookup first,
draft-model fallback, draft down-time after a failure) is the same wherever the loop runs. A new source is one
class and its place in :data:`SOURCE_CLASSES`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, ClassVar, Sequence

import torch

from specbuild.speculation.cost import BreakEvenGate
from specbuild.speculation.engine_call import EngineCall, EngineOutput, EngineRequest
from specbuild.speculation.lookup import PromptLookup
from specbuild.speculation.rules import round_seed
from specbuild.speculation.stats import SpeculationStats

if TYPE_CHECKING:
    from specbuild.speculation.request import TokenRequest
    from specbuild.speculation.round_costs import RoundCosts

DRAFT_ROLE = 0  # the seed stream of draft calls (the target's is 1; see rules.round_seed)
DRAFT_RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class Draft:
    """Proposed tokens and the raw logits they were sampled from.

    ``logits`` None means the proposal is deterministic given the context (prompt lookup): the target then
    accepts by token matching, which for a point-mass draft is exactly rejection sampling (accept ``x`` with
    probability ``p(x)``, else draw from ``p`` without ``x``), so no logits need to be sent at all.
    """

    tokens: list[int]
    logits: torch.Tensor | None
    source: DraftSource  # the source that proposed it (its statistics are kept under its name)
    # the draft model's call followed its call of the round before: it read one round's tokens, so its time is what
    # drafting costs round after round (after a stretch without it, the call also catches up on the tokens it missed)
    steady: bool = False

    def cut(self, length: int) -> Draft | None:
        """Its first ``length`` tokens (with their logits), or None for none."""
        if length >= len(self.tokens):
            return self
        if length <= 0:
            return None
        return replace(self, tokens=self.tokens[:length], logits=None if self.logits is None else self.logits[:length])


class DraftSource(ABC):
    """One way to propose tokens for one request. A subclass sets :attr:`name` and its declarations, and defines
    :meth:`for_request` and :meth:`propose`; the other hooks default to a source that is free and learns nothing."""

    name: ClassVar[str]  # what its statistics are kept under (Prometheus label ``source``)
    settings: ClassVar[tuple[str, ...]] = ()  # the request settings (REQUEST_SETTINGS rows, by name) that shape it
    # its tokens cost the cost model's c each (a draft engine's step; the break-even learns c from its calls' seconds,
    # Draft.steady); False: free, ~0 (prompt lookup: no model call)
    costs_draft_steps: ClassVar[bool] = False
    # the target returns its logits of each new position (generation_logits) in every round of a request drafting
    # from it, handed to observe(): what a head drafting from the target's own outputs (EAGLE-style) reads
    needs_target_outputs: ClassVar[bool] = False
    may_propose: bool = True  # False once it will propose nothing more for the request (the target may run ahead)

    @classmethod
    @abstractmethod
    def for_request(cls, request: TokenRequest, setup: DraftSetup) -> DraftSource | None:
        """This source for ``request``, or None where it does not draft for it."""

    @abstractmethod
    async def propose(self, context: Sequence[int], k: int, round_index: int) -> Draft | None:
        """Up to ``k`` tokens to follow ``context``, or None when this source has nothing to offer."""

    def begin_round(self, context_length: int) -> None:
        """A round drafts after ``context_length`` tokens, whichever source proposes."""

    def update(self, draft: Draft, accepted: int) -> None:
        """The outcome of a round that verified this source's ``draft``: ``accepted`` of its tokens kept."""

    def observe(self, output: EngineOutput) -> None:
        """The target's output of a round, with its logits (:attr:`needs_target_outputs` sources only)."""


@dataclass(frozen=True)
class DraftSetup:
    """What a request's sources are built from besides the request: the draft engine's call (None: no draft model),
    its window (max_seq_len; None: the target's) and how much of the context it reads (``draft_context``, None: all
    that fits), the request's ``stats``, the process's draft ``health`` and failure report, and whether the draft
    model drafts where prompt lookup is on (``lookup_draft_fallback``)."""

    draft: EngineCall | None
    stats: SpeculationStats
    health: DraftHealth
    lookup_draft_fallback: bool = True
    on_failure: Callable[[Exception], None] | None = None
    draft_window: int | None = None
    draft_context: int | None = None


class DraftHealth:
    """Shared across requests: after a draft-model failure, new requests skip the draft for ``retry_seconds``
    (a dead draft makes every call wait for its failure), then try it again."""

    def __init__(self, retry_seconds: float = DRAFT_RETRY_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.retry_seconds = retry_seconds
        self._clock = clock
        self._down_until = 0.0

    @property
    def available(self) -> bool:
        return self._clock() >= self._down_until

    def failed(self) -> None:
        self._down_until = self._clock() + self.retry_seconds


class LookupDrafts(DraftSource):
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the context's suffix n-gram. It
    proposes what the context says, whatever was accepted before."""

    name = "lookup"
    settings = ("prompt_lookup",)

    def __init__(self, lookup: PromptLookup) -> None:
        self.lookup = lookup

    @classmethod
    def for_request(cls, request: TokenRequest, setup: DraftSetup) -> LookupDrafts | None:
        return None if request.prompt_lookup is None else cls(request.prompt_lookup)

    async def propose(self, context: Sequence[int], k: int, round_index: int) -> Draft | None:
        tokens = self.lookup.propose(context, k)
        return Draft(tokens, None, self) if tokens else None


class ModelDrafts(DraftSource):
    """The draft model, called as an engine. A failure ends its use for the request (the loop goes on with the
    target alone, exactly) and is reported to ``health`` and ``on_failure``; its time counts in ``stats``.

    ``window``: the positions the draft engine holds (its max_seq_len; None: as many as the target). A round drafts
    at most what still fits after the context; once nothing fits, the draft model is done for the request (counted
    in ``stats.draft_window``) and the request goes on with its other sources (prompt lookup) or the target alone,
    exactly: the draft is never sent a context it cannot hold. TensorRT-LLM's LLM API stops drafting there too
    (NVIDIA/TensorRT-LLM ``tensorrt_llm/_torch/speculative/model_drafter.py``, ``_prepare_draft_batch``: a request
    whose tokens reach the draft engine's ``max_seq_len`` is skipped). It drafts the same way whatever was accepted
    (its length is :class:`Drafts`'s).

    ``context``: the most recent tokens of the context it reads (None: all). The draft is sent the context from
    :meth:`first_read` on, which moves on by half of ``context`` at a time, so it reads between half of it and all of
    it, at positions from 0, and its prefix cache holds between moves; the call after a move reads that half window
    again, a draft call like any other that the break-even's c includes. A small draft distilled on short prompts
    agrees with its target at least as well from the last few hundred tokens as from 1-2k (the demo draft:
    docs/benchmarks.md, "Long prompts and the draft's window"), and reads a long prompt for a fraction of the cost.
    Within ``context`` it never outgrows its window."""

    name = "model"
    settings = ("use_draft_logits",)
    costs_draft_steps = True

    def __init__(self, call: EngineCall, request: TokenRequest, stats: SpeculationStats, health: DraftHealth,
                 on_failure: Callable[[Exception], None] | None = None, window: int | None = None,
                 context: int | None = None) -> None:
        self.call = call
        self.window = window
        self.context = context
        self.request = request
        # rejection sampling on the draft's own distribution needs its logits; greedy and token matching do not
        self.with_logits = request.use_draft_logits and not request.sampling.is_greedy
        self.stats = stats
        self.health = health
        self.on_failure = on_failure
        self.may_propose = health.available
        if not self.may_propose:
            stats.fallbacks += 1
        self._next_round = -1  # the round a call continues the previous one in

    @classmethod
    def for_request(cls, request: TokenRequest, setup: DraftSetup) -> ModelDrafts | None:
        """The draft model, unless the release drafts by lookup only where lookup is on (``lookup_draft_fallback``
        False); under the guide's masks for a guided request."""
        if setup.draft is None or (request.prompt_lookup is not None and not setup.lookup_draft_fallback):
            return None
        call = setup.draft if request.guide is None else request.guide.constrained(setup.draft)
        return cls(call, request, setup.stats, setup.health, setup.on_failure, setup.draft_window,
                   setup.draft_context)

    def first_read(self, context_length: int) -> int:
        """The index of the first context token the draft reads: 0 within :attr:`context`, else the smallest multiple
        of half of it that leaves at most :attr:`context` tokens."""
        if self.context is None or context_length <= self.context:
            return 0
        step = max(1, self.context // 2)
        return -(-(context_length - self.context) // step) * step

    async def propose(self, context: Sequence[int], k: int, round_index: int) -> Draft | None:
        context = context[self.first_read(len(context)):]
        room = self.room(len(context))
        if not self.may_propose:
            return None
        k = k if room is None else min(k, room)
        steady, self._next_round = round_index == self._next_round, round_index + 1
        request = self.request
        started = time.perf_counter()
        try:
            output = await self.call(EngineRequest(
                input_ids=list(context), max_new_tokens=k, sampling=request.sampling,
                seed=round_seed(request.seed, round_index, DRAFT_ROLE), end_id=request.end_id,
                # NVIDIA's draft-target BLS asks for exactly k tokens (the end token suppressed before that), so a
                # draft does not stop short. Not under rejection sampling: the logits returned must be those the
                # tokens were drawn from, and an engine may report them before the end-token suppression.
                min_new_tokens=0 if self.with_logits else k,
                return_logits=self.with_logits, bad_words=request.bad_words,
            ))
        except Exception as exc:  # noqa: BLE001 - any draft failure falls back to the exact target-only path
            self.may_propose = False
            self.stats.fallbacks += 1
            self.health.failed()
            if self.on_failure is not None:
                self.on_failure(exc)
            return None
        finally:
            self.stats.draft_seconds += time.perf_counter() - started
        tokens = output.tokens[:k]
        logits = output.logits[: len(tokens)] if self.with_logits and output.logits is not None else None
        return Draft(tokens, logits, self, steady) if tokens else None

    def begin_round(self, context_length: int) -> None:
        # a context past the draft's window ends its use, whichever source proposes
        self.room(context_length - self.first_read(context_length))

    def room(self, context_length: int) -> int | None:
        """Draft tokens that still fit the draft's window after a context of ``context_length`` tokens (None: no
        window); none ends the draft model's use for the request, counted once."""
        if self.window is None:
            return None
        room = self.window - context_length
        if room < 1 and self.may_propose:  # past the draft's window: the request goes on without it
            self.may_propose = False
            self.stats.draft_window += 1
        return room


def next_draft_length(current: int, drafted: int, accepted: int, max_draft_len: int) -> int:
    """Adaptive K: two longer after a fully accepted round, one shorter after a rejection (within 1..max)."""
    if drafted == 0:
        return current
    if accepted == drafted:
        return min(current + 2, max_draft_len)
    return max(1, current - 1)


class Drafts:
    """One request's drafting: the first proposal of its sources, in order (prompt lookup first: it costs no model
    call), ``length`` tokens a round (at most ``max_draft_len``); with ``adaptive_draft`` the length follows each
    round's outcome (:func:`next_draft_length`), which the source that proposed learns too. With a ``gate`` (the
    request's break-even, :class:`~specbuild.speculation.cost.BreakEvenGate`) a round drafts at most its best K, and
    nothing while it says drafting does not pay, the target then making its stretch of tokens alone (counted in
    ``stats``)."""

    def __init__(self, sources: Sequence[DraftSource], length: int, max_draft_len: int, *,
                 adaptive_draft: bool = False, gate: BreakEvenGate | None = None,
                 stats: SpeculationStats | None = None) -> None:
        self.sources = tuple(sources)
        self.max_draft_len = max_draft_len
        self.length = min(length, max_draft_len)
        self.adaptive_draft = adaptive_draft
        self.gate = gate
        self.stats = stats if stats is not None else SpeculationStats()
        self._gated = False  # the request has been switched off by its break-even at least once

    @property
    def may_propose(self) -> bool:
        return any(source.may_propose for source in self.sources)

    @property
    def round_length(self) -> int:
        """The draft tokens this round asks for: ``length``, at most the break-even's best K at the request's
        acceptance, or 0 while the break-even has drafting off."""
        if self.gate is None:
            return self.length
        return min(self.length, self.gate.best_k) if self.gate.drafting else 0

    @property
    def alone_tokens(self) -> int:
        """Tokens the target makes in a round without a draft while a source may propose: the rest of the
        break-even's stretch, else one (a source may propose after it)."""
        return 1 if self.gate is None or self.gate.drafting else self.gate.paused_tokens

    def idle(self, tokens: int) -> None:
        """A round ran without a draft and made ``tokens`` tokens (counted when the break-even caused it, or its
        probe of the target-alone cost)."""
        if self.gate is not None and self.gate.probing:
            self.stats.probe_rounds += 1
            self.gate.idle(tokens)
        elif self.gate is not None and not self.gate.drafting:
            self.stats.break_even_rounds += 1
            if not self._gated:
                self._gated = True
                self.stats.break_even_requests += 1
            self.gate.idle(tokens)

    @property
    def needs_target_outputs(self) -> bool:
        """Whether a source reads the target's outputs (:attr:`DraftSource.needs_target_outputs`)."""
        return any(source.needs_target_outputs for source in self.sources)

    async def propose(self, context: Sequence[int], k: int, round_index: int) -> Draft | None:
        for source in self.sources:
            source.begin_round(len(context))
        try:
            for source in self.sources:
                draft = await source.propose(context, k, round_index)
                if draft is not None:
                    return draft
            return None
        finally:
            stepping = [source for source in self.sources if source.costs_draft_steps]
            if self.gate is not None and self.gate.cost.draft_cost and stepping \
                    and not any(source.may_propose for source in stepping):
                # the sources that cost draft steps are done for the request (past the draft's window, or failed):
                # what is left is priced as draft_sources prices a request without them, drafts that cost none
                self.gate.cost = replace(self.gate.cost, draft_cost=0.0)

    def record(self, draft: Draft | None, accepted: int, output: EngineOutput, *, min_tokens_round: bool) -> None:
        """A round's outcome: ``draft`` verified, ``accepted`` of its tokens kept (:meth:`update`), or a round
        without a draft (:meth:`idle`, unless the target made tokens min_tokens still needed,
        ``min_tokens_round``); the target's ``output`` goes to the sources that read it."""
        for source in self.sources:
            if source.needs_target_outputs:
                source.observe(output)
        if draft is not None:
            self.update(draft, accepted)
        elif not min_tokens_round:
            self.idle(len(output.tokens))

    def update(self, draft: Draft, accepted: int) -> None:
        """The outcome of a round that verified ``draft``: ``accepted`` of its tokens kept."""
        draft.source.update(draft, accepted)
        if self.adaptive_draft:
            self.length = next_draft_length(self.length, len(draft.tokens), accepted, self.max_draft_len)
        if self.gate is not None:
            self.gate.observe(len(draft.tokens), accepted)


# The source classes a request drafts from, in the order they are asked each round (the first proposal wins, so a
# free source goes before a model call).
SOURCE_CLASSES: tuple[type[DraftSource], ...] = (LookupDrafts, ModelDrafts)


def draft_sources(request: TokenRequest, draft: EngineCall | None, *, max_draft_len: int,
                  stats: SpeculationStats, health: DraftHealth, lookup_draft_fallback: bool = True,
                  on_failure: Callable[[Exception], None] | None = None,
                  costs: RoundCosts | None = None, draft_window: int | None = None,
                  draft_context: int | None = None,
                  source_classes: Sequence[type[DraftSource]] = SOURCE_CLASSES) -> Drafts | None:
    """The sources a request drafts from: each of ``source_classes`` that drafts for it
    (:meth:`DraftSource.for_request`; by default prompt lookup first when it is on, then the draft model unless the
    release drafts by lookup only, ``lookup_draft_fallback=False``, within ``draft_window`` positions, the draft
    engine's max_seq_len, reading the last ``draft_context`` tokens: :class:`ModelDrafts`), gated by the request's
    break-even when it has one (``request.break_even``: the release's cost model, at this process's own round
    ``costs`` where given); None when nothing drafts (K=0), and for a
    request with sampling penalties, which runs by the target alone (counted in ``stats.unspeculated``): each
    generated token is penalised for the tokens before it, but TensorRT-LLM's penalty kernel gives every
    drafted position of a verification step the same counts (``penaltyKernels.cu``), so only the target alone
    is exact there; and for a guide the target engine applies itself (``stats.guided_target_only``)."""
    if request.num_draft_tokens <= 0 or max_draft_len <= 0:
        return None
    if request.sampling.penalized:
        stats.unspeculated += 1
        return None
    if request.engine_guide is not None:  # the executor's guided decoder takes no draft tokens (backend_guides.py)
        stats.guided_target_only += 1
        return None
    setup = DraftSetup(draft, stats, health, lookup_draft_fallback, on_failure, draft_window, draft_context)
    sources = [source for cls in source_classes if (source := cls.for_request(request, setup)) is not None]
    if not sources:
        return None
    gate = None
    if request.break_even is not None:  # drafts from sources that cost no draft step cost none
        stepping = any(source.costs_draft_steps for source in sources)
        cost = request.break_even if stepping else replace(request.break_even, draft_cost=0.0)
        if not request.sampling.is_greedy and request.seed is not None:
            costs = None  # host timings would make a seeded sample's K, so its text, differ from run to run
        most = max_draft_len if request.adaptive_draft else min(request.num_draft_tokens, max_draft_len)
        gate = BreakEvenGate(cost, most, costs)
    return Drafts(sources, request.num_draft_tokens, max_draft_len, adaptive_draft=request.adaptive_draft, gate=gate,
                  stats=stats)
