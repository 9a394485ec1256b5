"""The torch engine: generation and one-pass verification with ``tensorrtllm`` semantics, the prefix KV
cache (reuse, cropping after rejections), request validation, seeded sampling and bad words."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from random_llama import VOCAB
from specbuild.speculation.request import TokenRequest
from specbuild.errors import RequestError
from specbuild.runtimes.torch.inprocess import InProcessSpeculator
from specbuild.speculation.rules import GREEDY, SamplingParams
from specbuild.speculation.engine_call import EngineRequest
from specbuild.runtimes.torch.engine import (
    PackedLinear,
    PrefixCache,
    TorchEngine,
    cache_keyword,
    can_pack_linears,
    mask_bad_words,
    pack_linears,
)

SAMPLING = SamplingParams(temperature=1.0, top_k=12)


@pytest.fixture(scope="module")
def engine(tiny):
    return TorchEngine(tiny.target, max_draft_len=4, max_seq_len=64)


@pytest.fixture(scope="module")
def uncached(tiny):
    return TorchEngine(tiny.target, max_draft_len=4, max_seq_len=64, cache_tokens=0)


def greedy(engine: TorchEngine, prompt: list[int], n: int) -> list[int]:
    return engine.run(EngineRequest(prompt, n)).tokens


# -- generation and verification ------------------------------------------------------------------------
def test_generation_logits_match_an_uncached_full_forward(tiny, engine):
    from transformers import AutoModelForCausalLM

    prompt = [3, 1, 4, 1, 5]
    out = engine.run(EngineRequest(prompt, 6, return_logits=True))
    model = AutoModelForCausalLM.from_pretrained(str(tiny.target)).eval()
    with torch.inference_mode():
        full = model(input_ids=torch.tensor([prompt + out.tokens])).logits[0, len(prompt) - 1:-1]
    torch.testing.assert_close(out.logits, full, atol=1e-4, rtol=1e-4)
    assert out.tokens == full.argmax(-1).tolist()


def test_verification_accepts_the_targets_own_continuation(engine, uncached):
    prompt = [2, 7, 1, 8]
    continuation = greedy(uncached, prompt, 5)
    out = engine.run(EngineRequest(prompt, 5, draft_tokens=continuation[:4]))
    assert out.tokens == continuation  # all four accepted, plus the target's own fifth token
    wrong = (continuation[1] + 1) % VOCAB
    out = engine.run(EngineRequest(prompt, 5, draft_tokens=[continuation[0], wrong, 0, 0]))
    assert out.tokens == continuation[:2]  # one accepted, then the target's own token


def test_packed_linears_compute_what_the_model_computes(tiny):
    """The packed model's logits are the unpacked model's within float32 rounding, and a position's logits from
    a k-row call (verification) pick the same token as from one-row steps (the target alone)."""
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(str(tiny.target)).eval()
    packed = AutoModelForCausalLM.from_pretrained(str(tiny.target)).eval()
    linears = sum(isinstance(module, torch.nn.Linear) for module in model.modules())
    assert can_pack_linears(packed)
    assert pack_linears(packed) == linears > 0
    assert not any(isinstance(module, torch.nn.Linear) for module in packed.modules())
    assert sum(isinstance(module, PackedLinear) for module in packed.modules()) == linears
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3]])
    with torch.inference_mode():
        expected = model(input_ids=ids).logits[0]
        all_rows = packed(input_ids=ids).logits[0]
        cache, argument = DynamicCache(), cache_keyword(packed)
        one_row = torch.cat([packed(input_ids=ids[:, i:i + 1], use_cache=True, **{argument: cache}).logits[0]
                             for i in range(ids.shape[1])])
    torch.testing.assert_close(all_rows, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(one_row, all_rows, atol=1e-5, rtol=1e-5)
    assert one_row.argmax(-1).tolist() == all_rows.argmax(-1).tolist() == expected.argmax(-1).tolist()


def test_packed_and_unpacked_engines_generate_alike(tiny, engine):
    plain = TorchEngine(tiny.target, max_draft_len=4, max_seq_len=64, pack_weights=False)
    assert engine.packed_linears > 0 and plain.packed_linears == 0
    for prompt in ([3, 1, 4], [2, 7, 1, 8, 2, 8]):
        assert greedy(engine, prompt, 12) == greedy(plain, prompt, 12)


def test_end_id_and_min_new_tokens(engine, uncached):
    prompt = [9, 9, 2]
    full = greedy(uncached, prompt, 12)
    end_id = full[3]
    first = full.index(end_id)
    assert greedy_with(engine, prompt, 12, end_id=end_id) == full[: first + 1]  # the engine returns the end token
    # min_tokens, as TensorRT-LLM applies it: no end token before the minimum (its logit masked), so the
    # continuation departs from the unconstrained one where the end token would have been
    held = engine.run(EngineRequest(prompt, 12, end_id=end_id, min_new_tokens=first + 2, return_logits=True))
    assert held.tokens[:first] == full[:first] and end_id not in held.tokens[: first + 2]
    assert held.tokens[first] != end_id and torch.isinf(held.logits[: first + 2, end_id]).all()
    assert not torch.isinf(held.logits[first + 2:, end_id]).any()
    # verification stops at the end token too
    out = engine.run(EngineRequest(prompt, 5, draft_tokens=full[:4], end_id=end_id))
    assert out.tokens == full[: min(first + 1, 5)]


def greedy_with(engine: TorchEngine, prompt: list[int], n: int, **kwargs) -> list[int]:
    return engine.run(EngineRequest(prompt, n, **kwargs)).tokens


# -- the prefix cache -----------------------------------------------------------------------------------
def test_prefix_cache_reuses_the_longest_prefix(tiny):
    engine = TorchEngine(tiny.target, cache_tokens=4096)
    prompt = [1, 2, 3, 4, 5, 6]
    first = greedy(engine, prompt, 4)
    assert (engine.cache.hits, engine.cache.reused_tokens, len(engine.cache)) == (0, 0, 1)
    # the continuation of the same sequence reuses everything that was fed: prompt + 3 generated tokens
    second = greedy(engine, prompt + first, 3)
    assert (engine.cache.hits, engine.cache.reused_tokens) == (1, len(prompt) + 3)
    # a sequence sharing only the first 4 tokens reuses 4 (the entry is cropped)
    greedy(engine, prompt[:4] + [15, 15], 2)
    assert (engine.cache.hits, engine.cache.reused_tokens) == (2, len(prompt) + 3 + 4)
    # results are those of an engine without a cache
    uncached = TorchEngine(tiny.target, cache_tokens=0)
    assert greedy(uncached, prompt, 4) == first and greedy(uncached, prompt + first, 3) == second
    assert len(uncached.cache) == 0 and uncached.cache.hits == 0


def test_verification_crops_rejected_tokens_from_the_cache(tiny):
    engine = TorchEngine(tiny.target, max_draft_len=4, cache_tokens=4096)
    uncached = TorchEngine(tiny.target, max_draft_len=4, cache_tokens=0)
    prompt = [5, 4, 3, 2, 1]
    continuation = greedy(uncached, prompt, 6)
    drafts = [continuation[0], (continuation[1] + 1) % VOCAB, 0, 0]  # accepts 1, rejects 3
    engine.run(EngineRequest(prompt, 5, draft_tokens=drafts))
    # the next round starts from prompt + accepted + the target's token: the cache holds prompt + 1 accepted
    sequence = prompt + continuation[:2]
    out = engine.run(EngineRequest(sequence, 4, return_logits=True))
    assert engine.cache.reused_tokens == len(prompt) + 1
    reference = uncached.run(EngineRequest(sequence, 4, return_logits=True))
    assert out.tokens == reference.tokens == continuation[2:6]
    torch.testing.assert_close(out.logits, reference.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sampling", [None, SAMPLING], ids=["greedy", "sampled"])
@pytest.mark.parametrize("use_draft_logits", [True, False], ids=["draft-logits", "token-match"])
def test_speculation_with_caches_equals_speculation_without(tiny, sampling, use_draft_logits):
    def speculator(tokens: int) -> InProcessSpeculator:
        return InProcessSpeculator(TorchEngine(tiny.target, max_draft_len=6, cache_tokens=tokens),
                                   TorchEngine(tiny.perturbed, cache_tokens=tokens))
    cached, uncached = speculator(4096), speculator(0)
    for seed, prompt in enumerate([[1, 2, 3], [7], [4, 4, 4, 4, 4, 4, 4, 4], [0, 15, 3, 9]]):
        request = TokenRequest(prompt, 20, sampling=sampling or GREEDY, seed=seed,
                                    num_draft_tokens=3 + seed, use_draft_logits=use_draft_logits)
        got, expected = cached.generate(request), uncached.generate(request)
        assert got.tokens == expected.tokens
        assert got.stats.accepted_tokens == expected.stats.accepted_tokens
    assert cached.target.cache.hits > 0 and cached.draft.cache.hits > 0


def prefix_cache_entry(length: int):
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(torch.zeros(1, 1, length, 2), torch.zeros(1, 1, length, 2), 0)
    return cache


def test_a_warmed_up_engine_forgets_the_warm_up_and_answers_as_a_cold_one(tiny, uncached):
    """The engine model warms up before it reports ready: the made-up sequence leaves no cache entry behind, and
    every path (generation, sampling, verification with draft logits) answers as on a cold engine."""
    warm = TorchEngine(tiny.target, max_draft_len=4, max_seq_len=64)
    warm.warm_up()
    assert len(warm.cache) == 0 and warm.cache.hits == 0
    prompt = [5, 9, 14, 3, 7]
    drafts = greedy(uncached, prompt, 3)
    for request in (EngineRequest(prompt, 6), EngineRequest(prompt, 6, sampling=SAMPLING, seed=11),
                    EngineRequest(prompt, 1, draft_tokens=drafts, draft_logits=torch.zeros(3, VOCAB), seed=3)):
        assert warm.run(request).tokens == uncached.run(request).tokens


def test_prefix_cache_unit():
    cache = PrefixCache(max_tokens=6)
    assert cache.take([1, 2, 3]) == (None, 0)
    cache.put([1, 2, 3, 4], prefix_cache_entry(4))
    cache.put([1, 2, 9], prefix_cache_entry(3))  # 7 tokens held: evicts the oldest entry, [1, 2, 3, 4]
    cache.put([5, 6], prefix_cache_entry(2))
    assert len(cache) == 2
    cache.put(list(range(7)), prefix_cache_entry(7))  # larger than the whole budget: not kept
    assert len(cache) == 2
    entry, length = cache.take([1, 2, 9, 9])
    assert length == 3 and entry.get_seq_length() == 3
    assert len(cache) == 1  # taken entries leave the cache until put back
    entry, length = cache.take([5, 6])  # never reuses the whole input: one token must be fed for logits
    assert length == 1 and entry.get_seq_length() == 1
    assert (cache.hits, cache.reused_tokens) == (2, 4)
    PrefixCache(0).put([1], prefix_cache_entry(1))
    assert len(PrefixCache(0)) == 0


def test_prefix_cache_leaves_another_sequences_entry_in_place():
    cache = PrefixCache(max_tokens=64)
    cache.put([1, 2, 3, 4, 5], prefix_cache_entry(5))
    entry, length = cache.take([1, 2, 7, 8])  # another request sharing a prefix (a chat template) gets a copy
    assert length == 2 and entry.get_seq_length() == 2 and len(cache) == 1
    own, length = cache.take([1, 2, 3, 4, 5, 6])  # so the first request's next step still finds its cache
    assert length == 5 and own.get_seq_length() == 5 and len(cache) == 0
    cache.put([1, 2, 3, 4, 5, 6, 7], prefix_cache_entry(7))  # a draft made 6 and 7
    entry, length = cache.take([1, 2, 3, 4, 5, 9])  # 6 rejected, 9 the target's own token: cut in place
    assert length == 5 and entry.get_seq_length() == 5 and len(cache) == 0


# -- validation -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (EngineRequest([1, 2], 5, draft_tokens=[1, 2, 3, 4, 5]),
         r"Number of draft tokens \(5\) is larger than maximum number of draft tokens \(4\)"),
        (EngineRequest([1, VOCAB], 5), rf"token id {VOCAB} is outside the vocabulary \[0, {VOCAB}\)"),
        (EngineRequest([1, -1], 5), r"token id -1 is outside the vocabulary"),
        (EngineRequest([1, 2], 3, draft_tokens=[1, 99]), r"token id 99 is outside the vocabulary"),
        (EngineRequest([1] * 60, 5), r"exceeds the engine's max_seq_len \(64\)"),
        (EngineRequest([1] * 62, 1, draft_tokens=[1, 2, 3]), r"max_seq_len"),
        (EngineRequest([], 5), "input_ids is empty"),
        (EngineRequest([1], 0), "request_output_len must be >= 1"),
        (EngineRequest([1], 3, draft_tokens=[1, 2], draft_logits=torch.zeros(2, VOCAB + 1)), "draft_logits must be"),
        (EngineRequest([1], 3, bad_words=[[1, VOCAB + 5]]), rf"token id {VOCAB + 5} is outside the vocabulary"),
        (EngineRequest([1], 3, bad_words=[[-2]]), r"token id -2 is outside the vocabulary"),
    ],
)
def test_invalid_requests_are_request_errors(engine, request_, message):
    with pytest.raises(RequestError, match=message):
        engine.run(request_)


def test_an_engine_built_without_draft_tokens_says_so(tiny):
    plain = TorchEngine(tiny.perturbed)
    with pytest.raises(RequestError, match=r"larger than maximum number of draft tokens \(0\)") as error:
        plain.run(EngineRequest([1, 2], 3, draft_tokens=[3]))
    assert "max_draft_len" in error.value.fix
    assert greedy(plain, [1, 2], 3)  # still serves after a bad request


# -- sampling -------------------------------------------------------------------------------------------
def test_seeded_sampling_is_reproducible(engine):
    def draw(seed: int | None, **kwargs) -> list[int]:
        return engine.run(EngineRequest([1, 2, 3], 12, sampling=SAMPLING, seed=seed, **kwargs)).tokens
    assert draw(5) == draw(5)
    assert len({tuple(draw(s)) for s in range(6)}) > 1
    verify = dict(draft_tokens=[4, 4, 4], draft_logits=torch.zeros(3, VOCAB))
    assert draw(5, **verify) == draw(5, **verify)


@pytest.mark.parametrize("sampling", [None, SAMPLING, SamplingParams(temperature=3.0)], ids=["greedy", "top-k", "hot"])
def test_bad_words_never_appear(engine, sampling):
    prompt = [1, 2, 3]
    usual = greedy(engine, prompt, 16)
    single = sorted(set(usual))[:3]
    pair = [usual[0], usual[1]]  # usual[1] may still appear, but never right after usual[0]
    bad_words = [[t] for t in single[1:]] + [pair]
    for seed in range(8):
        out = engine.run(EngineRequest(prompt, 16, sampling=sampling or GREEDY,
                                       seed=seed, bad_words=bad_words)).tokens
        sequence = prompt + out
        assert not set(single[1:]) & set(out)
        assert all(sequence[i:i + 2] != pair for i in range(len(prompt) - 1, len(sequence) - 1))


def test_mask_bad_words():
    logits = torch.zeros(5)
    assert mask_bad_words(logits, [1, 2], []) is logits
    masked = mask_bad_words(logits, [1, 2], [[3], [2, 4], [1, 0], [0, 1, 2, 1], []])
    assert torch.isinf(masked).tolist() == [False, False, False, True, True]  # 3 always; 4 after 2
    assert not torch.isinf(logits).any()  # the input is left alone
    assert torch.isinf(mask_bad_words(logits, [0, 1, 2], [[0, 1, 2, 1]]))[1]
    assert not torch.isinf(mask_bad_words(logits, [2], [[0, 2, 3]])).any()  # context shorter than the prefix


# -- TensorRT-LLM's penalties (penaltyKernels.cu) --------------------------------------------------------------
def test_penalize_worked_examples():
    """Each value by hand from the kernel's rules: temperature first (1 / (T + 1e-6)), then for tokens present
    in the context: repetition divides a positive logit and multiplies a negative one (once), presence is
    subtracted once, frequency once per occurrence; tokens absent from the context keep their logit."""
    from specbuild.speculation.rules import penalize

    logits = torch.tensor([2.0, -2.0, 1.0, 0.5])
    context = [0, 1, 1, 1]  # token 0 once, token 1 three times
    got = penalize(logits, context, SamplingParams(repetition_penalty=2.0, presence_penalty=0.25,
                                                   frequency_penalty=0.125))
    torch.testing.assert_close(got, torch.tensor([2.0 / 2 - 0.25 - 0.125, -2.0 * 2 - 0.25 - 0.375, 1.0, 0.5]))
    hot = penalize(logits, context, SamplingParams(temperature=0.5, presence_penalty=1.0))
    scale = 1 / (0.5 + 1e-6)
    torch.testing.assert_close(hot, torch.tensor([2.0 * scale - 1.0, -2.0 * scale - 1.0, scale, 0.5 * scale]))
    torch.testing.assert_close(penalize(logits, context, GREEDY), logits)  # nothing to apply


PENALTIES = SamplingParams(top_k=1, repetition_penalty=3.0, presence_penalty=2.0, frequency_penalty=1.0)


HOT = SamplingParams(temperature=4.0, top_k=1, presence_penalty=2.0)


@pytest.mark.parametrize("sampling", [PENALTIES, HOT], ids=["greedy", "greedy-with-temperature"])
def test_penalised_greedy_follows_the_kernel_step_by_step(tiny, engine, sampling):
    """Greedy with penalties picks, at every step, the argmax of the penalised logits of the sequence so far
    (prompt included), and differs from plain greedy on this prompt. The temperature, applied before the
    penalties, matters even to greedy decoding then."""
    from transformers import AutoModelForCausalLM

    from specbuild.speculation.rules import penalize

    prompt = [5, 5, 6, 5, 7]
    out = engine.run(EngineRequest(prompt, 10, sampling=sampling)).tokens
    model = AutoModelForCausalLM.from_pretrained(str(tiny.target)).eval()
    sequence = list(prompt)
    with torch.inference_mode():
        for _ in range(10):
            logits = model(input_ids=torch.tensor([sequence])).logits[0, -1]
            sequence.append(int(penalize(logits, sequence, sampling).argmax()))
    assert out == sequence[len(prompt):]
    assert out != greedy(engine, prompt, 10)
    if sampling.temperature != 1.0:
        assert out != engine.run(EngineRequest(prompt, 10, sampling=replace(sampling, temperature=1.0))).tokens


def test_penalties_count_the_whole_sequence_so_one_call_equals_many(engine):
    """The orchestrator sends a penalised request in pieces (one token per call when streamed): the input of
    each call holds the tokens generated before, which count as they would in one call."""
    prompt = [3, 3, 9, 1]
    whole = engine.run(EngineRequest(prompt, 8, sampling=PENALTIES)).tokens
    pieces: list[int] = []
    for _ in range(8):
        pieces += engine.run(EngineRequest(prompt + pieces, 1, sampling=PENALTIES)).tokens
    assert pieces == whole


def test_verification_scores_each_position_as_generation_would(engine, uncached):
    """With penalties and min_tokens, a drafted position is judged by the logits generating would have there:
    the target's own continuation is accepted in full; the end token stays out before min_tokens."""
    prompt = [4, 4, 8, 2]
    continuation = uncached.run(EngineRequest(prompt, 5, sampling=PENALTIES)).tokens
    out = engine.run(EngineRequest(prompt, 5, sampling=PENALTIES, draft_tokens=continuation[:4]))
    assert out.tokens == continuation
    plain = greedy(uncached, prompt, 6)
    end_id = plain[2]
    masked = uncached.run(EngineRequest(prompt, 4, end_id=end_id, min_new_tokens=4)).tokens
    verified = engine.run(EngineRequest(prompt, 4, end_id=end_id, min_new_tokens=4, draft_tokens=plain[:2] + [0]))
    assert end_id not in verified.tokens and verified.tokens == masked[: len(verified.tokens)]


# -- a sub-vocabulary head ------------------------------------------------------------------------------
def test_a_sub_vocabulary_head_computes_its_ids_and_returns_the_rest_as_minus_infinity(tiny):
    """The head's logits at its ids are the full draft's; every other id is -inf, so generated tokens (greedy or
    sampled) are always among its ids."""
    from random_llama import SUB_VOCABULARY

    reduced, full = TorchEngine(tiny.sub_vocabulary), TorchEngine(tiny.perturbed)
    assert reduced.head_vocabulary.ids == SUB_VOCABULARY
    assert reduced.model.get_output_embeddings().out_features == len(SUB_VOCABULARY)
    prompt = [4, 13, 6, 1]
    out = reduced.run(EngineRequest(prompt, 8, return_logits=True))
    teacher_forced = full.run(EngineRequest(prompt + out.tokens[:-1], 1, return_logits=True))
    ids = list(SUB_VOCABULARY)
    outside = [token for token in range(VOCAB) if token not in SUB_VOCABULARY]
    assert torch.isinf(out.logits[:, outside]).all() and torch.isfinite(out.logits[:, ids]).all()
    torch.testing.assert_close(out.logits[-1, ids], teacher_forced.logits[0, ids], atol=1e-4, rtol=1e-4)
    sampled = reduced.run(EngineRequest(prompt, 12, sampling=SAMPLING, seed=5))
    assert set(out.tokens + sampled.tokens) <= set(SUB_VOCABULARY)


@pytest.mark.parametrize("use_draft_logits", [True, False], ids=["draft-logits", "token-match"])
def test_a_sub_vocabulary_draft_leaves_greedy_text_as_the_target_alone(tiny, use_draft_logits):
    target = TorchEngine(tiny.target, max_draft_len=4)
    alone = InProcessSpeculator(target, None)
    speculative = InProcessSpeculator(target, TorchEngine(tiny.sub_vocabulary))
    accepted = rejected = 0
    for prompt in ([1, 2, 3], [7], [0, 15, 3, 9], [10, 4, 6, 13, 1]):
        expected = alone.generate(TokenRequest(prompt, 24)).tokens
        got = speculative.generate(TokenRequest(prompt, 24, num_draft_tokens=4,
                                                     use_draft_logits=use_draft_logits))
        assert got.tokens == expected
        accepted += got.stats.accepted_tokens
        rejected += got.stats.drafted_tokens - got.stats.accepted_tokens
    assert accepted > 0 and rejected > 0  # the draft really drafted, and was really checked
