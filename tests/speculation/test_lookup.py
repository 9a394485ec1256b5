"""Prompt lookup (``specbuild.speculation.lookup``): worked examples and properties against a brute-force reference
(its exactness under sampling is in test_rules.py: token matching of a deterministic draft)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specbuild.speculation.lookup import PromptLookup, propose

DETERMINISTIC = settings(derandomize=True, deadline=None, max_examples=300)


def reference(context: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The definition, literally: for n from max_ngram down, the latest earlier start of the suffix n-gram."""
    if k <= 0:
        return []
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= len(context):
            continue
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start:start + n] == suffix:
                return context[start + n:start + n + k]
    return []


@pytest.mark.parametrize(("context", "k", "expected"), [
    ([1, 2, 3, 4, 1, 2], 2, [3, 4]),            # the bigram "1 2" occurred before: what followed it
    ([1, 2, 3, 4, 1, 2], 9, [3, 4, 1, 2]),      # never past the end of the context
    ([7, 1, 2, 3, 9, 1, 2, 5, 1, 2], 1, [5]),   # the most recent earlier occurrence wins
    ([8, 1, 2, 3, 9, 1, 2, 5, 8, 1, 2], 2, [3, 9]),  # a longer match ("8 1 2") beats a more recent shorter one
    ([5, 5, 5, 5], 3, [5]),                     # overlapping occurrences: only what really follows
    ([1, 2, 3, 4], 2, []),                      # nothing repeats
    ([3, 1, 4, 1], 2, []),                      # a unigram match is below min_ngram=2
    ([1, 2, 1, 2], 0, []),
    ([1], 3, []),
    ([], 3, []),
])
def test_worked_examples(context, k, expected):
    assert propose(context, k, max_ngram=3, min_ngram=2) == expected
    assert propose(context, k, max_ngram=3, min_ngram=2) == reference(context, k, 3, 2)


def test_min_ngram_one_allows_unigrams_and_max_ngram_caps_the_match():
    assert propose([3, 1, 4, 1], 2, max_ngram=3, min_ngram=1) == [4, 1]
    # "9 1 2" matches at the start with n=3, but max_ngram=2 only sees "1 2", whose latest occurrence is later
    context = [9, 1, 2, 6, 7, 1, 2, 8, 9, 1, 2]
    assert propose(context, 1, max_ngram=3, min_ngram=2) == [6]
    assert propose(context, 1, max_ngram=2, min_ngram=2) == [8]


contexts = st.lists(st.integers(0, 5), max_size=60)  # a small alphabet: repeats are common


@DETERMINISTIC
@given(contexts, st.integers(-1, 6), st.integers(1, 5), st.integers(1, 5))
def test_matches_the_definition(context, k, a, b):
    max_ngram, min_ngram = max(a, b), min(a, b)
    assert propose(context, k, max_ngram=max_ngram, min_ngram=min_ngram) == reference(context, k, max_ngram, min_ngram)


@DETERMINISTIC
@given(contexts, st.integers(1, 6))
def test_a_proposal_is_a_real_continuation_within_the_context(context, k):
    proposal = propose(context, k, max_ngram=4, min_ngram=2)
    assert len(proposal) <= k
    if not proposal:
        return
    # some earlier span ends with the context's last 2+ tokens and is followed by exactly the proposal
    assert any(context[end - 1:end + 1] == context[-2:] and context[end + 1:end + 1 + len(proposal)] == proposal
               and (len(proposal) == k or end + len(proposal) == len(context) - 1)
               for end in range(1, len(context) - 1))


def test_long_contexts_are_handled():
    context = list(range(4000)) + [10, 11, 12]
    assert propose(context, 3, max_ngram=4, min_ngram=2) == [13, 14, 15]


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(1, 2), (3, 0), (0, 0)])
def test_settings_are_validated(max_ngram, min_ngram):
    with pytest.raises(ValueError, match="max_ngram >= min_ngram >= 1"):
        PromptLookup(max_ngram=max_ngram, min_ngram=min_ngram)


def test_settings_propose():
    assert PromptLookup(max_ngram=2, min_ngram=2).propose([4, 5, 6, 4, 5], 4) == [6, 4, 5]
