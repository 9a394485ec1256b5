"""Guided decoding with speculation is exact: the draft proposes under the guide's mask, the target verifies under
the same mask, and rejection sampling on both masked, renormalised distributions outputs tokens distributed as the
target alone under the grammar.

* analytic: with masks that depend on the tokens before (a grammar), the one-step and the two-token output
  distributions of rejection sampling and token matching equal the target's masked distribution to 1e-9;
* greedy: token-identical to the target alone under the same grammar at every K, with prompt lookup too;
* sampled end to end (slow): 4-token continuations from InProcessSpeculator on a 16-token vocabulary follow the
  target's exact constrained distribution (chi-square), through the real TorchEngine masks and xgrammar.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter

import pytest
import torch

from random_llama import END, TOKENS, VOCAB
from specbuild.runtimes.torch.engine import TorchEngine
from specbuild.runtimes.torch.inprocess import InProcessSpeculator
from specbuild.speculation.guide import GuideCompiler
from specbuild.speculation.guide_spec import GuideSpec
from specbuild.speculation.lookup import PromptLookup
from specbuild.speculation.request import TokenRequest
from specbuild.speculation.rules import SamplingParams, allowed_tokens, probabilities, restrict
from test_rules import ALPHA, chi_square_pvalue, rejection_step, token_match_step, two_token_joint

REGEX = r"[ab]+c|[0-3]{2}x?"  # a choice at the first token, then a language of its own per branch


def masked(logits: torch.Tensor, allowed: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    return probabilities(restrict(logits, allowed), params)


# -- analytic ---------------------------------------------------------------------------------------------
def grammar_masks(vocab: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A first mask, and a second one per first token (what a grammar's states give): random, never empty."""
    first = torch.rand(vocab, generator=generator) < 0.6
    first[0] = True
    second = torch.rand(vocab, vocab, generator=generator) < 0.5
    second[:, 1] = True
    return first, second


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.7, top_k=4),
                                    SamplingParams(top_p=0.8)], ids=["plain", "top-k", "top-p"])
def test_masked_rules_output_exactly_the_targets_masked_distribution(seed, params):
    vocab = 6
    g = torch.Generator().manual_seed(seed)
    first, second = grammar_masks(vocab, g)
    target1, draft1 = 2 * torch.randn(vocab, generator=g), 2 * torch.randn(vocab, generator=g)
    target2, draft2 = 2 * torch.randn(vocab, vocab, generator=g), 2 * torch.randn(vocab, vocab, generator=g)
    p1, q1 = masked(target1, first, params), masked(draft1, first, params)
    p2 = torch.stack([masked(target2[a], second[a], params) for a in range(vocab)])
    q2 = torch.stack([masked(draft2[a], second[a], params) for a in range(vocab)])
    assert float(p1[~first].sum()) == 0.0 and torch.allclose(p1.sum(), torch.tensor(1.0, dtype=torch.float64))
    for step in (rejection_step, token_match_step):
        assert torch.allclose(step(p1, q1), p1, atol=1e-9)
    constrained = p1[:, None] * p2  # the target alone under the grammar: each token from its masked distribution
    for rule in ("rejection", "token-match"):
        assert torch.allclose(two_token_joint(rule, p1, p2, q1, q2), constrained, atol=1e-9)


def test_a_draft_masked_when_sampled_but_not_when_verified_would_not_be_exact():
    """The check above can fail: a draft that samples under the mask, verified against its unmasked q (what
    the target would do without masking the draft's logits), does not give the masked target distribution."""
    from specbuild.speculation.rules import acceptance_probability, residual_distribution

    g = torch.Generator().manual_seed(3)
    first = torch.tensor([True, True, False, True, False, True])
    p = masked(2 * torch.randn(6, generator=g), first, SamplingParams())
    draft = 2 * torch.randn(6, generator=g)
    sampled, unmasked = masked(draft, first, SamplingParams()), probabilities(draft, SamplingParams())
    out = torch.zeros_like(p)
    for x in sampled.nonzero().flatten().tolist():
        accept = acceptance_probability(p, unmasked, x)
        out[x] += sampled[x] * accept
        out += sampled[x] * (1 - accept) * residual_distribution(p, unmasked)
    assert not torch.allclose(out, p, atol=1e-3)
    assert torch.allclose(rejection_step(p, sampled), p, atol=1e-9)


# -- on the tiny models, through TorchEngine and xgrammar ---------------------------------------------------
@pytest.fixture(scope="module")
def compiler(tiny_tokenizer):
    return GuideCompiler(tiny_tokenizer[0], VOCAB)


@pytest.fixture(scope="module")
def engines(tiny):
    return TorchEngine(tiny.target, max_draft_len=8), TorchEngine(tiny.perturbed)


def text(tokens: list[int]) -> str:
    return "".join(TOKENS[token] for token in tokens)


@pytest.mark.parametrize("prompt", [[1, 5, 9], [1, 3, 4, 3, 4, 3]])
def test_greedy_output_is_the_targets_alone_under_the_grammar_at_every_k(engines, compiler, prompt):
    target, draft = engines
    guide = compiler.guide(GuideSpec("regex", REGEX), END)
    alone = InProcessSpeculator(target, None).generate(TokenRequest(prompt, 12, end_id=END, guide=guide))
    assert alone.finish_reason == "end_id" and re.fullmatch(REGEX, text(alone.tokens)), text(alone.tokens)
    unguided = InProcessSpeculator(target, None).generate(TokenRequest(prompt, 12, end_id=END))
    assert unguided.tokens != alone.tokens  # the grammar changes the answer: the masks were applied
    for k, lookup in itertools.product((1, 2, 4, 8), (None, PromptLookup(max_ngram=2, min_ngram=1))):
        result = InProcessSpeculator(target, draft).generate(TokenRequest(
            prompt, 12, end_id=END, num_draft_tokens=k, prompt_lookup=lookup, guide=guide))
        assert (result.tokens, result.finish_reason) == (alone.tokens, alone.finish_reason), (k, lookup)
        assert result.stats.drafted_tokens > 0
        assert 0 < result.stats.guide_seconds < result.stats.target_seconds + result.stats.draft_seconds
    assert alone.stats.guide_seconds > 0 and unguided.stats.guide_seconds == 0


def test_a_complete_grammar_ends_the_answer_before_min_tokens_and_a_stop_word_ends_it_inside(engines, compiler):
    target, draft = engines
    guide = compiler.guide(GuideSpec("regex", "ab"), END)
    result = InProcessSpeculator(target, draft).generate(TokenRequest(
        [1, 5], 10, end_id=END, min_tokens=6, num_draft_tokens=3, guide=guide))
    assert (text(result.tokens), result.finish_reason) == ("ab", "end_id")
    stopped = InProcessSpeculator(target, draft).generate(TokenRequest(
        [1, 5], 10, end_id=END, stop_words=[[3]], num_draft_tokens=3, guide=guide))
    assert (text(stopped.tokens), stopped.finish_reason) == ("a", "stop_words")
    short = InProcessSpeculator(target, draft).generate(TokenRequest(
        [1, 5], 1, end_id=END, num_draft_tokens=3, guide=guide))
    assert (text(short.tokens), short.finish_reason) == ("a", "length")


def exact_constrained(model_dir, compiler: GuideCompiler, spec: GuideSpec, prompt: list[int], length: int,
                      params: SamplingParams) -> dict[tuple[int, ...], float]:
    """The target's exact distribution over ``length``-token answers under the guide, by enumeration: each token
    from the target's distribution masked by the grammar after the tokens before it (ending at the end token)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    guide = compiler.guide(spec, END)
    paths, done = {(): 1.0}, {}
    with torch.inference_mode():
        for _ in range(length):
            grown = {}
            for prefix, probability in paths.items():
                guide.reset()
                guide.accept(prefix)
                allowed = allowed_tokens(guide.masks(), VOCAB)[0]
                logits = model(input_ids=torch.tensor([prompt + list(prefix)])).logits[0, -1].float()
                row = masked(logits, allowed, params)
                for token in row.nonzero().flatten().tolist():
                    target = done if token == END else grown
                    key = prefix if token == END else prefix + (token,)
                    target[key] = target.get(key, 0.0) + probability * float(row[token])
            paths = grown
    return {**done, **paths}


@pytest.mark.slow
@pytest.mark.parametrize(("k", "use_draft_logits", "lookup"), [(3, True, False), (2, False, False), (3, True, True)],
                         ids=["3-draft-logits", "2-token-match", "3-draft-logits-lookup+draft"])
def test_sampled_guided_answers_follow_the_targets_constrained_distribution(engines, compiler, k, use_draft_logits,
                                                                           lookup):
    target, draft = engines
    params, prompt, length, draws = SamplingParams(temperature=1.3), [1, 3, 4, 3, 4, 3], 4, 1200
    spec = GuideSpec("regex", REGEX)
    guide = compiler.guide(spec, END)
    speculator = InProcessSpeculator(target, draft)
    outputs, accepted = [], 0
    for seed in range(draws):
        result = speculator.generate(TokenRequest(
            prompt, length, sampling=params, seed=seed, end_id=END, num_draft_tokens=k,
            use_draft_logits=use_draft_logits, guide=guide,
            prompt_lookup=PromptLookup(max_ngram=2, min_ngram=1) if lookup else None))
        outputs.append(tuple(result.tokens))
        accepted += result.stats.accepted_tokens
    assert accepted > draws // 4  # the drafts really contribute tokens
    exact = exact_constrained(target.model.config._name_or_path, compiler, spec, prompt, length, params)
    assert abs(sum(exact.values()) - 1.0) < 1e-6
    assert chi_square_pvalue(Counter(outputs), exact) > ALPHA
