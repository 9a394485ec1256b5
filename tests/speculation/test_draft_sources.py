"""Draft sources are open: a source class defined here, with its own declarations, drafts through
``draft_sources`` and ``speculate`` beside the built-in ones, without a change to ``drafting.py`` or ``loop.py``; and
the loop stays propose -> verify -> record -> stop."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Sequence

import pytest

from random_llama import VOCAB
from specbuild.runtimes.torch.engine import TorchEngine
from specbuild.runtimes.torch.inprocess import InProcessSpeculator
from specbuild.speculation.cost import CostModel
from specbuild.speculation.drafting import (SOURCE_CLASSES, Draft, DraftHealth, DraftSetup, DraftSource,
                                            ModelDrafts, draft_sources)
from specbuild.speculation.engine_call import EngineOutput, EngineRequest
from specbuild.speculation.loop import Round, speculate
from specbuild.speculation.request import TokenRequest
from specbuild.speculation.request_settings import REQUEST_SETTINGS
from specbuild.speculation.stats import SpeculationStats

PROMPTS = [[3, 5, 5, 7], [9, 9, 9], [4, 11, 2, 6, 6, 1], [8]]


class RunDrafts(DraftSource):
    """A new source: the context's last token again, ``k`` times, where the context ends in a run of it (two alike);
    free, and reading the target's outputs (what an EAGLE-style head would draft from)."""

    name = "run"
    needs_target_outputs = True

    def __init__(self) -> None:
        self.outputs: list[EngineOutput] = []
        self.outcomes: list[tuple[int, int]] = []

    @classmethod
    def for_request(cls, request: TokenRequest, setup: DraftSetup) -> RunDrafts:
        return cls()

    async def propose(self, context: Sequence[int], k: int, round_index: int) -> Draft | None:
        if len(context) < 2 or context[-1] != context[-2]:
            return None
        return Draft([context[-1]] * k, None, self)

    def update(self, draft: Draft, accepted: int) -> None:
        self.outcomes.append((len(draft.tokens), accepted))

    def observe(self, output: EngineOutput) -> None:
        self.outputs.append(output)


@pytest.fixture(scope="module")
def target(tiny):
    return TorchEngine(tiny.target, max_draft_len=8)


@pytest.fixture(scope="module")
def alone(tiny):
    return InProcessSpeculator(TorchEngine(tiny.target, cache_tokens=0), None)


def run(request: TokenRequest, target: TorchEngine, draft: TorchEngine | None,
        source_classes: Sequence[type[DraftSource]]) -> tuple[list[Round], SpeculationStats, list[DraftSource]]:
    stats = SpeculationStats()

    async def call_target(engine_request: EngineRequest) -> EngineOutput:
        return target.run(engine_request)

    async def call_draft(engine_request: EngineRequest) -> EngineOutput:
        assert draft is not None
        return draft.run(engine_request)

    drafts = draft_sources(request, call_draft if draft else None, max_draft_len=8, stats=stats,
                           health=DraftHealth(), source_classes=source_classes)
    assert drafts is not None

    async def collect() -> list[Round]:
        return [step async for step in speculate(request, call_target, drafts, stats=stats)]
    return asyncio.run(collect()), stats, list(drafts.sources)


@pytest.mark.parametrize("k", [1, 3])
def test_a_new_source_class_drafts_exactly_and_reads_the_targets_outputs(target, alone, k):
    proposed = 0
    for prompt in PROMPTS:
        request = TokenRequest(prompt, 16, num_draft_tokens=k)
        rounds, stats, sources = run(request, target, None, [RunDrafts])
        assert [t for step in rounds for t in step.tokens] == alone.generate(TokenRequest(prompt, 16)).tokens
        (source,) = sources
        assert isinstance(source, RunDrafts)
        counted = stats.source("run")
        assert len(source.outcomes) == counted.drafts == stats.drafts  # its rounds are its own, under its name
        assert sum(accepted for _, accepted in source.outcomes) == counted.accepted_tokens
        assert len(source.outputs) == len(rounds)  # every round's target output, with its logits
        assert all(output.logits is not None and output.logits.shape == (len(output.tokens), VOCAB)
                   for output in source.outputs)
        proposed += counted.drafts
    assert proposed > 0


def test_a_new_source_goes_before_the_draft_model_and_the_model_fills_in(tiny, target, alone):
    draft = TorchEngine(tiny.perturbed)
    totals = SpeculationStats()
    for prompt in PROMPTS:
        request = TokenRequest(prompt, 16, num_draft_tokens=3)
        rounds, stats, sources = run(request, target, draft, [RunDrafts, *SOURCE_CLASSES])
        assert [type(source) for source in sources] == [RunDrafts, ModelDrafts]  # no lookup: the request has none
        assert [t for step in rounds for t in step.tokens] == alone.generate(TokenRequest(prompt, 16)).tokens
        totals += stats
    assert totals.source("run").drafts > 0 and totals.source("model").drafts > 0
    assert totals.source("run").drafts + totals.source("model").drafts == totals.drafts


def test_the_break_even_prices_a_source_by_its_declared_cost():
    """A request drafting from free sources only costs no draft step; one with the draft model costs its c."""
    cost = CostModel(draft_cost=0.4, measured=True)
    request = TokenRequest([1, 2, 3], 16, break_even=cost)

    async def never(engine_request: EngineRequest) -> EngineOutput:
        raise AssertionError("not called")

    def priced(source_classes: Sequence[type[DraftSource]]) -> float:
        drafts = draft_sources(request, never, max_draft_len=4, stats=SpeculationStats(), health=DraftHealth(),
                               source_classes=source_classes)
        assert drafts is not None and drafts.gate is not None
        return drafts.gate.cost.draft_cost

    assert priced([RunDrafts]) == 0.0
    assert priced([RunDrafts, ModelDrafts]) == 0.4


def test_sources_declare_settings_that_are_rows_of_the_request_settings_table():
    rows = {row.name for row in REQUEST_SETTINGS}
    assert all(set(cls.settings) <= rows for cls in (*SOURCE_CLASSES, RunDrafts))
    assert [cls.costs_draft_steps for cls in SOURCE_CLASSES] == [False, True]  # lookup is free, the model costs c
    assert not any(cls.needs_target_outputs for cls in SOURCE_CLASSES)  # their target calls return no logits


def test_speculate_stays_propose_verify_record_stop():
    """gpt-fast's whole step is about 50 lines; the loop's policies live in hooks (loop.LoadCap, RoundTiming,
    GuideHooks, finish_reason)."""
    assert len(inspect.getsourcelines(speculate)[0]) <= 55
