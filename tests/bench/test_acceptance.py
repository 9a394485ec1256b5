"""Greedy acceptance arithmetic: accepted / drafted tokens per round, as greedy verification counts them."""

from __future__ import annotations

import pytest

from specbuild.bench.acceptance import acceptance_by_k, acceptance_rate


def test_acceptance_counts_runs_per_round():
    # K=2 over [T, T, F, T, F]: round 1 accepts both and the target adds position 2; round 2 accepts
    # position 3 and the target corrects position 4: 3 accepted of 4 drafted.
    assert acceptance_rate([[True, True, False, True, False]], 2) == pytest.approx(3 / 4)
    # K=4 over 8 matches: 4 accepted + the target's token, then the 3 left are drafted and accepted.
    assert acceptance_rate([[True] * 8], 4) == 1.0
    assert acceptance_rate([[True, False, True]], 8) == pytest.approx(2 / 4)  # 1 of 3, then 1 of 1
    assert acceptance_rate([[False] * 5], 3) == 0.0
    assert acceptance_rate([], 3) == 0.0


def test_acceptance_per_k_falls_as_k_grows_for_a_mixed_row():
    rates = acceptance_by_k([[True, True, False, True, True, True, False, False, True]], max_k=4)
    assert list(rates) == ["1", "2", "3", "4"]
    assert rates["1"] >= rates["4"]


def test_acceptance_rejects_k_below_one():
    with pytest.raises(ValueError):
        acceptance_rate([[True]], 0)
