"""The speculative loop (``loop.speculate``) and its draft sources, through ``InProcessSpeculator``: greedy output is
token-identical to the target alone for every K, with drafts that disagree often; adaptive K, stop words,
end_id, max_tokens, draft failures, prompt lookup and the acceptance statistics."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest

from random_llama import VOCAB
from specbuild.speculation.cost import CostModel
from specbuild.speculation.drafting import DraftHealth, draft_sources, next_draft_length
from specbuild.speculation.engine_call import EngineOutput, EngineRequest
from specbuild.speculation.modes import VERIFICATION_MODES, VerificationMode
from specbuild.runtimes.torch.inprocess import Generated, InProcessSpeculator
from specbuild.speculation.loop import Round, _accepted_prefix, speculate
from specbuild.speculation.request import TokenRequest
from specbuild.speculation.lookup import PromptLookup
from specbuild.speculation.rules import GREEDY, SamplingParams
from specbuild.speculation.stats import SourceStats, SpeculationStats
from specbuild.runtimes.torch.engine import TorchEngine

MAX_DRAFT_LEN = 8
PROMPTS = [[random.Random(seed).randrange(VOCAB) for _ in range(1 + seed % 9)] for seed in range(12)]
LOOKUP = PromptLookup(max_ngram=3, min_ngram=1)
REPEATING = [[3, 7, 1, 3, 7, 1, 3, 7], [5, 9, 2, 5, 9], [1, 2, 3, 4, 1, 2], *PROMPTS[:4]]


@pytest.fixture(scope="module")
def target(tiny):
    return TorchEngine(tiny.target, max_draft_len=MAX_DRAFT_LEN)


@pytest.fixture(scope="module")
def alone(tiny):
    """The reference: the target alone, without speculation and without a prefix cache."""
    return InProcessSpeculator(TorchEngine(tiny.target, cache_tokens=0), None)


@pytest.fixture(scope="module", params=["perturbed", "unrelated"])
def speculator(request, tiny, target):
    return InProcessSpeculator(target, TorchEngine(getattr(tiny, request.param)))


def run_loop(request: TokenRequest, target_call, draft_call, stats=None, *, health=None,
             lookup_draft_fallback=True, on_draft_failure=None, load_cap=None, draft_window=None,
             draft_context=None) -> list[Round]:
    stats = stats if stats is not None else SpeculationStats()
    drafts = draft_sources(request, draft_call, max_draft_len=MAX_DRAFT_LEN, stats=stats,
                           health=health or DraftHealth(), lookup_draft_fallback=lookup_draft_fallback,
                           on_failure=on_draft_failure, draft_window=draft_window, draft_context=draft_context)

    async def collect():
        return [r async for r in speculate(request, target_call, drafts, stats=stats, load_cap=load_cap)]
    return asyncio.run(collect())


def engine_call(engine: TorchEngine, seen: list[EngineRequest] | None = None):
    async def call(request: EngineRequest) -> EngineOutput:
        if seen is not None:
            seen.append(request)
        return engine.run(request)
    return call


def test_greedy_is_token_identical_to_target_alone_for_every_k(speculator, alone):
    totals = SpeculationStats()
    for prompt in PROMPTS:
        expected = alone.generate(TokenRequest(prompt, 16)).tokens
        assert len(expected) == 16
        for k in range(1, MAX_DRAFT_LEN + 1):
            result = speculator.generate(TokenRequest(prompt, 16, num_draft_tokens=k))
            assert result.tokens == expected, (prompt, k)
            assert result.finish_reason == "length"
            assert result.stats.drafts > 0
            totals.drafted_tokens += result.stats.drafted_tokens
            totals.accepted_tokens += result.stats.accepted_tokens
    # the draft disagrees often (so rejections and cache crops are exercised) but not always
    assert 0.0 < totals.acceptance_rate < 0.5


def test_adaptive_k_stays_within_bounds_and_exact(tiny, target, alone):
    draft = TorchEngine(tiny.perturbed)
    for prompt in PROMPTS[:6]:
        expected = alone.generate(TokenRequest(prompt, 24)).tokens
        seen: list[EngineRequest] = []
        rounds = run_loop(TokenRequest(prompt, 24, num_draft_tokens=3, adaptive_draft=True),
                          engine_call(target), engine_call(draft, seen))
        assert [t for r in rounds for t in r.tokens] == expected
        ks = [r.max_new_tokens for r in seen]
        assert all(1 <= k <= MAX_DRAFT_LEN for k in ks)
    assert len(set(ks)) > 1  # K really adapts


@pytest.mark.parametrize(
    ("current", "drafted", "accepted", "expected"),
    [(3, 3, 3, 5), (7, 7, 7, 8), (8, 8, 8, 8), (3, 3, 1, 2), (1, 1, 0, 1), (4, 0, 0, 4), (5, 2, 2, 7)],
)
def test_next_draft_length(current, drafted, accepted, expected):
    assert next_draft_length(current, drafted, accepted, max_draft_len=8) == expected


@pytest.mark.parametrize("k", [1, 4, 8])
def test_stop_words_end_output_at_first_occurrence(speculator, alone, k):
    prompt = PROMPTS[3]
    full = alone.generate(TokenRequest(prompt, 24)).tokens
    start = 5
    word = full[start:start + 2]
    first = next(i for i in range(len(full) - 1) if full[i:i + 2] == word)
    result = speculator.generate(TokenRequest(prompt, 24, num_draft_tokens=k, stop_words=[[VOCAB + 3], word]))
    assert result.tokens == full[: first + 2]  # the stop word is kept, nothing after it
    assert result.finish_reason == "stop_words"


@pytest.mark.parametrize("k", [1, 4, 8])
def test_end_id_stops_before_the_end_token(speculator, alone, k):
    prompt = PROMPTS[5]
    full = alone.generate(TokenRequest(prompt, 24)).tokens
    end_id = full[6]
    first = full.index(end_id)
    reference = alone.generate(TokenRequest(prompt, 24, end_id=end_id))
    result = speculator.generate(TokenRequest(prompt, 24, num_draft_tokens=k, end_id=end_id))
    assert result.tokens == reference.tokens == full[:first]
    assert result.finish_reason == reference.finish_reason == "end_id"


@pytest.mark.parametrize("max_tokens", [1, 2, 9])
def test_max_tokens(speculator, alone, max_tokens):
    expected = alone.generate(TokenRequest(PROMPTS[0], max_tokens)).tokens
    result = speculator.generate(TokenRequest(PROMPTS[0], max_tokens, num_draft_tokens=8))
    assert result.tokens == expected and len(expected) == max_tokens
    assert result.finish_reason == "length"


@pytest.mark.parametrize("fail_on_call", [1, 3])
def test_failing_draft_falls_back_to_target_alone(tiny, target, alone, fail_on_call):
    draft = TorchEngine(tiny.perturbed)
    calls = 0

    async def flaky_draft(request: EngineRequest) -> EngineOutput:
        nonlocal calls
        calls += 1
        if calls == fail_on_call:
            raise RuntimeError("draft model unavailable")
        return draft.run(request)

    failures: list[Exception] = []
    stats = SpeculationStats()
    prompt = PROMPTS[7]
    rounds = run_loop(TokenRequest(prompt, 20, num_draft_tokens=2), engine_call(target), flaky_draft,
                      stats, on_draft_failure=failures.append)
    assert [t for r in rounds for t in r.tokens] == alone.generate(TokenRequest(prompt, 20)).tokens
    assert stats.fallbacks == 1 and calls == fail_on_call  # never asks the failed draft again
    assert [str(e) for e in failures] == ["draft model unavailable"]
    assert stats.drafts == fail_on_call - 1


def test_target_only_chunk_streams_token_by_token(target, alone):
    rounds = run_loop(TokenRequest(PROMPTS[2], 6, target_only_chunk=1), engine_call(target), None)
    assert [len(r.tokens) for r in rounds] == [1] * 6
    assert [r.finished for r in rounds] == [False] * 5 + [True]
    assert [t for r in rounds for t in r.tokens] == alone.generate(TokenRequest(PROMPTS[2], 6)).tokens


@pytest.mark.parametrize("lookup", [None, LOOKUP], ids=["draft-only", "lookup+draft"])
def test_the_first_token_is_the_target_s_alone(tiny, target, alone, lookup):
    """The first round asks the target for one token and no source for a draft (TensorRT-LLM's draft requests start
    from the target's first token): a draft model first reads the prompt in round two, and a one-token answer never
    calls it."""
    draft = TorchEngine(tiny.perturbed)
    prompt = REPEATING[0]  # lookup finds its suffix earlier in the prompt from the first round on
    assert lookup is None or lookup.propose(prompt, 3)
    targets: list[EngineRequest] = []
    drafts: list[EngineRequest] = []
    rounds = run_loop(TokenRequest(prompt, 16, num_draft_tokens=3, prompt_lookup=lookup),
                      engine_call(target, targets), engine_call(draft, drafts))
    assert [t for r in rounds for t in r.tokens] == alone.generate(TokenRequest(prompt, 16)).tokens
    assert targets[0].draft_tokens is None and targets[0].max_new_tokens == 1 and rounds[0].drafted == 0
    assert any(r.draft_tokens for r in targets[1:])
    assert not drafts or drafts[0].input_ids == prompt + rounds[0].tokens
    targets.clear()
    drafts.clear()
    run_loop(TokenRequest(prompt, 1, num_draft_tokens=3, prompt_lookup=lookup), engine_call(target, targets),
             engine_call(draft, drafts))
    assert drafts == [] and [r.draft_tokens for r in targets] == [None]


def test_rounds_run_as_k0_while_the_server_is_busy(tiny, target, alone):
    """The load policy's hook: a round capped at 0 calls no draft and asks the target alone for its chunk;
    drafting resumes when the load falls; the output stays the target's own."""
    draft = TorchEngine(tiny.perturbed)
    prompt = PROMPTS[4]
    expected = alone.generate(TokenRequest(prompt, 12)).tokens
    load = iter([None, 0, 0, None] + [None] * 12)
    targets: list[EngineRequest] = []
    drafts: list[EngineRequest] = []
    rounds = run_loop(TokenRequest(prompt, 12, num_draft_tokens=3, target_only_chunk=1),
                      engine_call(target, targets), engine_call(draft, drafts), load_cap=lambda: next(load))
    assert [t for r in rounds for t in r.tokens] == expected
    assert [bool(r.draft_tokens) for r in targets[:4]] == [False, False, False, True]  # the first: the target's
    assert [r.max_new_tokens for r in targets[:3]] == [1, 1, 1]
    assert len(drafts) == sum(bool(r.draft_tokens) for r in targets)  # no draft call in a busy round

    targets.clear()
    drafts.clear()
    rounds = run_loop(TokenRequest(prompt, 12, num_draft_tokens=3), engine_call(target, targets),
                      engine_call(draft, drafts), load_cap=lambda: 0)
    assert [t for r in rounds for t in r.tokens] == expected
    assert drafts == [] and len(targets) == 1 and targets[0].max_new_tokens == 12  # as K=0 runs


def test_a_load_cap_shortens_the_rounds_it_lowers_and_counts_them(tiny, target, alone):
    """The schedule's K below the request's: those rounds draft the cap (counted, but not the rounds max_tokens cuts
    to the cap anyway); one above it changes nothing."""
    draft = TorchEngine(tiny.perturbed)
    prompt, request = PROMPTS[4], TokenRequest(PROMPTS[4], 12, num_draft_tokens=3)
    for cap, asked, lowered in ((1, 1, True), (5, 3, False)):
        drafts: list[EngineRequest] = []
        stats = SpeculationStats()
        rounds = run_loop(request, engine_call(target), engine_call(draft, drafts), stats, load_cap=lambda: cap)
        assert [t for r in rounds for t in r.tokens] == alone.generate(TokenRequest(prompt, 12)).tokens
        assert max(r.max_new_tokens for r in drafts) == asked  # the last ones may be cut by max_tokens
        assert stats.drafts > 0 and (0 < stats.load_rounds <= stats.drafts if lowered else stats.load_rounds == 0)


def test_a_seeded_sampled_request_keeps_its_k_when_the_server_is_busy(tiny, target):
    """Its text depends on K; the same seed must give the same text whatever the load."""
    draft = TorchEngine(tiny.perturbed)
    request = TokenRequest(PROMPTS[4], 12, sampling=SamplingParams(temperature=1.0, top_k=10), seed=7,
                                num_draft_tokens=3)
    quiet = run_loop(request, engine_call(target), engine_call(draft))
    drafts: list[EngineRequest] = []
    busy = run_loop(request, engine_call(target), engine_call(draft, drafts), load_cap=lambda: 0)
    assert [t for r in busy for t in r.tokens] == [t for r in quiet for t in r.tokens]
    assert drafts


def test_an_engine_that_returns_nothing_ends_the_request():
    async def silent(request: EngineRequest) -> EngineOutput:
        return EngineOutput([])

    rounds = run_loop(TokenRequest([1, 2], 5), silent, None)
    assert rounds == [Round([], True, "no_progress")]


def test_sampled_generation_is_reproducible_by_seed(speculator):
    params = SamplingParams(temperature=1.0, top_k=10)
    def draw(seed: int, use_draft_logits: bool, verification: VerificationMode = "token") -> Generated:
        return speculator.generate(TokenRequest(PROMPTS[1], 20, sampling=params, seed=seed, num_draft_tokens=3,
                                                     use_draft_logits=use_draft_logits, verification=verification))
    for mode in ((True,), (False,), (True, "block")):
        assert draw(7, *mode).tokens == draw(7, *mode).tokens
        assert len({tuple(draw(seed, *mode).tokens) for seed in range(5)}) > 1


@pytest.mark.parametrize(("returned", "end_id", "accepted"), [
    ([4, 5, 6, 9], None, 3),  # every draft accepted, then the target's bonus token
    ([4, 5, 8], None, 2),  # rejected at the third: the target's own token differs
    ([4, 6], None, 1),  # block verification's correction may equal the drafted token: still the target's own
    ([4, 5, 6], None, 2),
    ([4, 5], 5, 2),  # a drafted end token accepted: the target adds nothing after it
    ([4, 5], 2, 1),
])
def test_a_round_counts_the_drafted_tokens_the_target_accepted(returned, end_id, accepted):
    assert _accepted_prefix([4, 5, 6], returned, end_id) == accepted


def test_the_target_verifies_by_the_request_s_rule(tiny, target):
    """The request's verification reaches every target call that verifies a draft."""
    draft = TorchEngine(tiny.perturbed)
    for verification in VERIFICATION_MODES:
        targets: list[EngineRequest] = []
        run_loop(TokenRequest(PROMPTS[4], 12, sampling=SamplingParams(), seed=3, num_draft_tokens=3,
                                   verification=verification), engine_call(target, targets), engine_call(draft))
        assert any(r.draft_tokens for r in targets)
        assert all(r.verification == verification for r in targets)


def test_bad_words_never_appear_and_greedy_stays_exact(speculator, alone):
    prompt = PROMPTS[4]
    full = alone.generate(TokenRequest(prompt, 24)).tokens
    banned = sorted(set(full[:6]))[:2]
    bad_words = [[t] for t in banned]
    reference = alone.generate(TokenRequest(prompt, 24, bad_words=bad_words)).tokens
    assert reference != full
    for k in (1, 4):
        greedy = speculator.generate(TokenRequest(prompt, 24, num_draft_tokens=k, bad_words=bad_words)).tokens
        assert greedy == reference
        sampled = speculator.generate(TokenRequest(prompt, 24, num_draft_tokens=k, bad_words=bad_words,
                                                        sampling=SamplingParams(), seed=k)).tokens
        assert not set(banned) & set(greedy + sampled)


def test_stats_record_rounds():
    stats = SpeculationStats()
    stats.record_round(drafted=4, accepted=2)
    stats.record_round(drafted=2, accepted=2)
    stats.record_round(drafted=0, accepted=0)  # a target-only round
    assert (stats.rounds, stats.drafts, stats.drafted_tokens, stats.accepted_tokens) == (3, 2, 6, 4)
    assert stats.drafted_per_position == [2, 2, 1, 1]
    assert stats.accepted_per_position == [2, 2]
    assert stats.acceptance_rate == pytest.approx(4 / 6)
    assert stats.mean_acceptance_length == pytest.approx(1 + 4 / 2)
    assert SpeculationStats().acceptance_rate == 0.0 and SpeculationStats().mean_acceptance_length == 1.0


def test_stats_count_what_the_engines_did(tiny, target):
    draft = TorchEngine(tiny.perturbed)
    seen_draft: list[EngineRequest] = []
    seen_target: list[EngineRequest] = []
    stats = SpeculationStats()
    rounds = run_loop(TokenRequest(PROMPTS[6], 20, num_draft_tokens=4), engine_call(target, seen_target),
                      engine_call(draft, seen_draft), stats)
    assert stats.rounds == len(rounds) == len(seen_target)
    assert stats.drafts == len(seen_draft)
    assert stats.drafted_tokens == sum(len(r.draft_tokens or []) for r in seen_target)
    # every round yields its accepted drafts plus one target token (the last round may be cut by max_tokens)
    assert sum(len(r.tokens) for r in rounds[:-1]) == sum(
        1 + a for a in _accepted_per_round(seen_target[:-1], rounds[:-1]))
    assert stats.accepted_tokens == sum(_accepted_per_round(seen_target, rounds))


def _accepted_per_round(requests: list[EngineRequest], rounds: list[Round]) -> list[int]:
    accepted = []
    for request, round_ in zip(requests, rounds):
        drafts = request.draft_tokens or []
        n = 0
        while n < len(drafts) and n < len(round_.tokens) - 1 and drafts[n] == round_.tokens[n]:
            n += 1
        accepted.append(n)
    return accepted


def test_a_draft_identical_to_the_target_is_always_accepted_up_to_the_end_token(tiny, target, alone):
    """The end token ends the target's output early: an accepted drafted end token still counts as accepted.
    (A draft engine that ignores ``min_tokens``, so that the twin may draft the end token.)"""
    twin = TorchEngine(tiny.target)

    async def twin_draft(request: EngineRequest) -> EngineOutput:
        return twin.run(replace(request, min_new_tokens=0))

    prompt, full, end_id = next(
        (prompt, full, token) for prompt in PROMPTS
        for full in [alone.generate(TokenRequest(prompt, 16)).tokens]
        for i, token in enumerate(full) if i >= 3 and token not in full[:i]
    )  # an end token the target reaches after a few tokens
    stats = SpeculationStats()
    rounds = run_loop(TokenRequest(prompt, 16, num_draft_tokens=4, end_id=end_id, adaptive_draft=True),
                      engine_call(target), twin_draft, stats)
    assert [t for r in rounds for t in r.tokens] == full[: full.index(end_id)]
    assert rounds[-1].finish_reason == "end_id" and stats.acceptance_rate == 1.0


def test_from_checkpoints_caps_k_at_the_targets_max_draft_len(tiny, alone):
    speculator = InProcessSpeculator.from_checkpoints(tiny.target, tiny.perturbed, max_draft_len=3)
    result = speculator.generate(TokenRequest(PROMPTS[9], 12, num_draft_tokens=8))
    assert result.tokens == alone.generate(TokenRequest(PROMPTS[9], 12)).tokens
    assert len(result.stats.drafted_per_position) == 3 and result.stats.drafts > 0  # never more than 3 drafted


# --- prompt lookup ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_draft", [True, False], ids=["lookup+draft", "lookup-only"])
def test_greedy_with_prompt_lookup_is_token_identical(tiny, target, alone, with_draft):
    draft = InProcessSpeculator(target, TorchEngine(tiny.unrelated) if with_draft else None)
    totals = SpeculationStats()
    for prompt in REPEATING:
        expected = alone.generate(TokenRequest(prompt, 20)).tokens
        for k in (1, 3):
            result = draft.generate(TokenRequest(prompt, 20, num_draft_tokens=k, prompt_lookup=LOOKUP))
            assert result.tokens == expected, (prompt, k)
            totals += result.stats
    lookup = totals.source("lookup")
    assert 0 < lookup.accepted_tokens < lookup.drafted_tokens  # accepted and rejected lookups
    assert 0 < lookup.drafts <= totals.drafts
    assert (lookup.drafts < totals.drafts) == with_draft  # the draft model fills in when lookup finds nothing
    assert (totals.source("model").drafts == totals.drafts - lookup.drafts)  # every draft has its source
    assert sum(source.drafted_tokens for source in totals.by_source.values()) == totals.drafted_tokens


def test_a_lookup_round_calls_no_draft_model(tiny, target):
    draft = TorchEngine(tiny.perturbed)
    seen_draft: list[EngineRequest] = []
    seen_target: list[EngineRequest] = []
    stats = SpeculationStats()
    run_loop(TokenRequest(REPEATING[0], 20, num_draft_tokens=2, prompt_lookup=LOOKUP),
             engine_call(target, seen_target), engine_call(draft, seen_draft), stats)
    assert stats.source("lookup").drafts > 0
    assert len(seen_draft) == stats.drafts - stats.source("lookup").drafts
    assert stats.drafted_tokens == sum(len(r.draft_tokens or []) for r in seen_target)


def test_lookup_keeps_drafting_after_the_draft_model_fails(target, alone):
    async def broken(request: EngineRequest) -> EngineOutput:
        raise RuntimeError("draft model unavailable")

    stats = SpeculationStats()
    prompt = REPEATING[0]
    rounds = run_loop(TokenRequest(prompt, 20, num_draft_tokens=3, prompt_lookup=LOOKUP),
                      engine_call(target), broken, stats)
    assert [t for r in rounds for t in r.tokens] == alone.generate(TokenRequest(prompt, 20)).tokens
    assert stats.fallbacks == 1 and stats.source("lookup").drafts > 0 and stats.drafts == stats.source("lookup").drafts


DRAFT_WINDOW = 14


@pytest.mark.parametrize("lookup", [None, LOOKUP], ids=["draft-only", "lookup+draft"])
def test_past_the_draft_window_the_request_goes_on_exactly_without_the_draft_model(tiny, target, alone, lookup):
    """A draft engine that holds fewer positions than the request is sent only contexts and drafts that fit; past its
    window the request goes on (lookup still drafting), token-identical to the target alone, counted once."""
    draft = TorchEngine(tiny.perturbed, max_seq_len=DRAFT_WINDOW)  # refuses anything longer: a fallback if sent
    for prompt in REPEATING[:3]:
        seen_draft: list[EngineRequest] = []
        seen_target: list[EngineRequest] = []
        stats = SpeculationStats()
        request = TokenRequest(prompt, 24, num_draft_tokens=4, prompt_lookup=lookup)
        rounds = run_loop(request, engine_call(target, seen_target), engine_call(draft, seen_draft), stats,
                          draft_window=DRAFT_WINDOW)
        assert [t for r in rounds for t in r.tokens] == alone.generate(TokenRequest(prompt, 24)).tokens
        assert stats.fallbacks == 0 and stats.draft_window == 1
        assert seen_draft and all(len(r.input_ids) + r.max_new_tokens <= DRAFT_WINDOW for r in seen_draft)
        past = [r for r in seen_target if len(r.input_ids) >= DRAFT_WINDOW]
        assert past  # the request ran on past the draft's window
        drafted = [r for r in past if r.draft_tokens]  # by lookup only: what it proposes for that context
        assert all(lookup is not None and r.draft_tokens == lookup.propose(r.input_ids, len(r.draft_tokens))
                   for r in drafted)


def test_past_the_draft_window_the_break_even_prices_lookup_drafts_at_no_draft_cost(tiny, target):
    """Lookup is what drafts past the window: the request's break-even stops charging it the draft model's steps."""
    draft = TorchEngine(tiny.perturbed, max_seq_len=DRAFT_WINDOW)
    cost = CostModel(draft_cost=0.18, verify_cost={1: 1.15})
    prompt = REPEATING[0] * 2  # past the window from round one, whatever the break-even decides later
    assert len(prompt) > DRAFT_WINDOW
    request = TokenRequest(prompt, 8, num_draft_tokens=4, prompt_lookup=LOOKUP, break_even=cost)
    stats = SpeculationStats()
    drafts = draft_sources(request, engine_call(draft), max_draft_len=MAX_DRAFT_LEN, stats=stats,
                           health=DraftHealth(), draft_window=DRAFT_WINDOW)
    assert drafts.gate.cost.draft_cost == 0.18

    async def run():
        return [r async for r in speculate(request, engine_call(target), drafts, stats=stats)]
    asyncio.run(run())
    assert stats.draft_window == 1 and drafts.gate.cost.draft_cost == 0.0


DRAFT_CONTEXT = 8


@pytest.mark.parametrize("window", [None, DRAFT_WINDOW], ids=["no-window", "draft-window"])
def test_the_draft_reads_the_most_recent_tokens_of_its_context_budget(tiny, target, alone, window):
    """With ``draft_context`` the draft engine is sent the context from a start that moves on by half the budget at a
    time: between half of it and all of it, the last tokens of the context, and it keeps drafting past its own window;
    the output is the target's."""
    draft = TorchEngine(tiny.perturbed, max_seq_len=window or 128)
    for prompt in PROMPTS[:4]:
        seen_draft: list[EngineRequest] = []
        seen_target: list[EngineRequest] = []
        stats = SpeculationStats()
        rounds = run_loop(TokenRequest(prompt, 24, num_draft_tokens=3), engine_call(target, seen_target),
                          engine_call(draft, seen_draft), stats, draft_window=window, draft_context=DRAFT_CONTEXT)
        assert [t for r in rounds for t in r.tokens] == alone.generate(TokenRequest(prompt, 24)).tokens
        assert stats.draft_window == 0 and stats.fallbacks == 0
        contexts = [r.input_ids for r in seen_target if r.draft_tokens]
        assert len(contexts) == len(seen_draft)
        assert len(contexts[-1]) > max(window or 0, DRAFT_CONTEXT)  # it drafted past its budget (and window)
        for context, sent in zip(contexts, seen_draft):
            read = len(sent.input_ids)
            assert sent.input_ids == context[-read:]  # its most recent tokens
            assert read == len(context) or DRAFT_CONTEXT // 2 < read <= DRAFT_CONTEXT
            assert (len(context) - read) % (DRAFT_CONTEXT // 2) == 0  # the start moves by half the budget


@pytest.mark.parametrize(("length", "first"), [(5, 0), (8, 0), (9, 4), (12, 4), (13, 8), (100, 92)])
def test_the_draft_s_first_read_moves_by_half_its_budget(length, first):
    from specbuild.speculation.drafting import ModelDrafts

    drafts = ModelDrafts(engine_call(None), TokenRequest([1], 1), SpeculationStats(), DraftHealth(),
                         context=DRAFT_CONTEXT)
    assert drafts.first_read(length) == first
    assert ModelDrafts(engine_call(None), TokenRequest([1], 1), SpeculationStats(), DraftHealth()).first_read(
        length) == 0


def test_the_in_process_speculator_drafts_within_its_draft_engine_s_window(tiny, target, alone):
    speculator = InProcessSpeculator(target, TorchEngine(tiny.perturbed, max_seq_len=DRAFT_WINDOW))
    prompt = PROMPTS[5]
    result = speculator.generate(TokenRequest(prompt, 24, num_draft_tokens=4))
    assert result.tokens == alone.generate(TokenRequest(prompt, 24)).tokens
    assert result.stats.draft_window == 1 and result.stats.fallbacks == 0 and result.stats.drafts > 0


def test_sampled_lookup_drafts_are_verified_by_token_matching(tiny, target):
    """Lookup drafts carry no logits, even under draft-logits acceptance (test_speculative proves it exact), while
    the draft model's drafts in the same request carry the logits they were sampled from."""
    seen: list[EngineRequest] = []
    request = TokenRequest(REPEATING[1], 16, sampling=SamplingParams(), seed=3, num_draft_tokens=3,
                                prompt_lookup=LOOKUP, use_draft_logits=True)
    stats = SpeculationStats()
    run_loop(request, engine_call(target, seen), engine_call(TorchEngine(tiny.unrelated)), stats)
    verified = [r for r in seen if r.draft_tokens]
    by_logits = [r for r in verified if r.draft_logits is not None]
    assert stats.source("lookup").drafts > 0 and len(verified) - len(by_logits) == stats.source("lookup").drafts
    assert len(by_logits) == stats.drafts - stats.source("lookup").drafts > 0
    assert all(tuple(r.draft_logits.shape) == (len(r.draft_tokens), VOCAB) for r in by_logits)


@pytest.mark.parametrize(("sampling", "use_draft_logits", "min_tokens"), [
    (None, True, True), (SamplingParams(), False, True), (SamplingParams(), True, False)],
    ids=["greedy", "token-match", "draft-logits"])
def test_draft_requests_ask_for_exactly_k_tokens_unless_their_logits_are_used(tiny, target, sampling,
                                                                             use_draft_logits, min_tokens):
    """As NVIDIA's draft-target BLS: ``min_tokens = k`` keeps a draft from stopping short; not when its logits
    drive rejection sampling, which needs the distribution the tokens were really drawn from."""
    seen: list[EngineRequest] = []
    request = TokenRequest(PROMPTS[3], 12, sampling=sampling or GREEDY, seed=1,
                                num_draft_tokens=3, use_draft_logits=use_draft_logits)
    run_loop(request, engine_call(target), engine_call(TorchEngine(tiny.perturbed), seen))
    assert seen and all(r.min_new_tokens == (r.max_new_tokens if min_tokens else 0) for r in seen)
    assert all(r.return_logits == (not min_tokens) for r in seen)


def test_a_lookup_only_release_never_calls_the_draft_model(tiny, target, alone):
    seen: list[EngineRequest] = []
    stats = SpeculationStats()
    rounds = run_loop(TokenRequest(REPEATING[0], 20, num_draft_tokens=2, prompt_lookup=LOOKUP),
                      engine_call(target), engine_call(TorchEngine(tiny.perturbed), seen), stats,
                      lookup_draft_fallback=False)
    assert not seen and stats.drafts == stats.source("lookup").drafts > 0
    assert [t for r in rounds for t in r.tokens] == alone.generate(TokenRequest(REPEATING[0], 20)).tokens


def test_after_a_draft_failure_new_requests_skip_the_draft_for_a_while(tiny, target):
    now = [100.0]
    health = DraftHealth(retry_seconds=5.0, clock=lambda: now[0])

    async def broken(request: EngineRequest) -> EngineOutput:
        raise RuntimeError("draft model unavailable")

    seen: list[EngineRequest] = []
    first, second, third = SpeculationStats(), SpeculationStats(), SpeculationStats()
    run_loop(TokenRequest(PROMPTS[5], 8, num_draft_tokens=2), engine_call(target), broken, first, health=health)
    run_loop(TokenRequest(PROMPTS[5], 8, num_draft_tokens=2), engine_call(target),
             engine_call(TorchEngine(tiny.perturbed), seen), second, health=health)
    assert first.fallbacks == second.fallbacks == 1 and not seen  # the second request did not even try
    now[0] += 5.0
    run_loop(TokenRequest(PROMPTS[5], 8, num_draft_tokens=2), engine_call(target),
             engine_call(TorchEngine(tiny.perturbed), seen), third, health=health)
    assert third.fallbacks == 0 and seen  # tried again after the down-time


def test_lookup_is_off_at_k0_and_counts_only_its_own_rounds(target):
    stats = SpeculationStats()
    run_loop(TokenRequest(REPEATING[0], 8, num_draft_tokens=0, prompt_lookup=LOOKUP), engine_call(target), None,
             stats)
    assert stats.drafts == 0 and stats.source("lookup").drafts == 0 and stats.by_source == {}
    stats = SpeculationStats()
    stats.record_round(drafted=3, accepted=1, source="lookup")
    stats.record_round(drafted=2, accepted=2)
    assert (stats.drafts, stats.drafted_tokens, stats.accepted_tokens) == (2, 5, 3)
    lookup = stats.source("lookup")
    assert (lookup.drafts, lookup.drafted_tokens, lookup.accepted_tokens) == (1, 3, 1)
    stats += stats  # summed over requests, by source too
    assert stats.source("lookup") == SourceStats(2, 6, 2) and set(stats.by_source) == {"lookup"}


# --- min_tokens and penalties: exact as the target alone ------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_min_tokens_keep_the_end_token_out_and_speculation_resumes_after(tiny, target, alone, stream):
    """Until min_tokens the target generates alone with the end token masked (the only distribution it
    defines there), then drafting resumes; greedy output equals the target alone with min_tokens."""
    prompt = PROMPTS[5]
    full = alone.generate(TokenRequest(prompt, 24)).tokens
    end_id = full[3]
    chunk = 1 if stream else None
    reference = alone.generate(TokenRequest(prompt, 24, end_id=end_id, min_tokens=9, target_only_chunk=chunk))
    assert len(reference.tokens) >= 9 and end_id not in reference.tokens[:9]
    seen: list[EngineRequest] = []
    rounds = run_loop(TokenRequest(prompt, 24, end_id=end_id, min_tokens=9, num_draft_tokens=3,
                                        target_only_chunk=chunk),
                      engine_call(target, seen), engine_call(TorchEngine(tiny.perturbed)))
    assert [t for r in rounds for t in r.tokens] == reference.tokens
    for request in seen:  # no draft verified before the ninth token; every call inside it masks the end token
        generated = len(request.input_ids) - len(prompt)
        assert not request.draft_tokens or generated >= 9
        assert request.min_new_tokens == min(request.max_new_tokens, max(0, 9 - generated))
    assert any(request.draft_tokens for request in seen), "drafting never resumed after min_tokens"


def test_a_penalised_request_runs_by_the_target_alone_and_is_counted(tiny, target, alone):
    sampling = SamplingParams(top_k=1, repetition_penalty=3.0, presence_penalty=2.0)
    request = TokenRequest(PROMPTS[2], 16, sampling=sampling, num_draft_tokens=4)
    drafted: list[EngineRequest] = []
    stats = SpeculationStats()
    rounds = run_loop(request, engine_call(target), engine_call(TorchEngine(tiny.perturbed), drafted), stats)
    expected = alone.generate(TokenRequest(PROMPTS[2], 16, sampling=sampling, num_draft_tokens=0)).tokens
    assert [t for r in rounds for t in r.tokens] == expected
    assert expected != alone.generate(TokenRequest(PROMPTS[2], 16)).tokens  # the penalties mattered
    assert not drafted and stats.unspeculated == 1 and stats.drafted_tokens == 0
