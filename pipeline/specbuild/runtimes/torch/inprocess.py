"""Speculative decoding in one Python process: the loop of :mod:`specbuild.speculation.loop` over two
:class:`~specbuild.runtimes.torch.engine.TorchEngine` objects, drafting as the server does
(:func:`~specbuild.speculation.drafting.draft_sources`). Used by tests (exactness), by benchmarks as the
in-process baseline, and by anyone who wants the algorithm without a server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from specbuild.runtimes.torch.engine import TorchEngine
from specbuild.speculation.drafting import DraftHealth, draft_sources
from specbuild.speculation.engine_call import EngineOutput, EngineRequest
from specbuild.speculation.loop import Round, speculate
from specbuild.speculation.request import TokenRequest
from specbuild.speculation.round_costs import RoundCosts
from specbuild.speculation.stats import SpeculationStats


@dataclass
class Generated:
    tokens: list[int]
    stats: SpeculationStats
    finish_reason: str | None


class InProcessSpeculator:
    """Draft-target speculative decoding over two in-process engines (``draft`` None = target alone)."""

    def __init__(self, target: TorchEngine, draft: TorchEngine | None, *, lookup_draft_fallback: bool = True) -> None:
        self.target = target
        self.draft = draft
        self.lookup_draft_fallback = lookup_draft_fallback
        self.health = DraftHealth()
        self.costs = RoundCosts()  # what rounds cost here, for the break-even (one call at a time: every round alone)

    @classmethod
    def from_checkpoints(cls, target_dir: str | Path, draft_dir: str | Path | None, *, max_draft_len: int = 8,
                         dtype: str = "float32", device: str = "cpu") -> InProcessSpeculator:
        target = TorchEngine(target_dir, dtype=dtype, device=device, max_draft_len=max_draft_len)
        draft = TorchEngine(draft_dir, dtype=dtype, device=device) if draft_dir else None
        return cls(target, draft)

    def generate(self, request: TokenRequest) -> Generated:
        return asyncio.run(self._generate(request))

    async def _generate(self, request: TokenRequest) -> Generated:
        stats = SpeculationStats()
        tokens: list[int] = []
        finish_reason = None
        async for step in self.rounds(request, stats):
            tokens.extend(step.tokens)
            finish_reason = step.finish_reason
        return Generated(tokens, stats, finish_reason)

    def rounds(self, request: TokenRequest, stats: SpeculationStats, *,
               offload: bool = False) -> AsyncIterator[Round]:
        """The request's rounds as they finish (``stats`` updated in place); ``offload`` runs each engine call in
        a worker thread, so requests sharing an event loop overlap (the engines take one call at a time)."""
        async def call(engine: TorchEngine, engine_request: EngineRequest) -> EngineOutput:
            return await asyncio.to_thread(engine.run, engine_request) if offload else engine.run(engine_request)

        async def call_target(engine_request: EngineRequest) -> EngineOutput:
            return await call(self.target, engine_request)

        async def call_draft(engine_request: EngineRequest) -> EngineOutput:
            assert self.draft is not None
            return await call(self.draft, engine_request)

        drafts = draft_sources(request, call_draft if self.draft else None, max_draft_len=self.target.max_draft_len,
                               stats=stats, health=self.health,
                               lookup_draft_fallback=self.lookup_draft_fallback, costs=self.costs,
                               draft_window=self.draft.max_seq_len if self.draft else None)
        return speculate(request, call_target, drafts, stats=stats, costs=self.costs)
