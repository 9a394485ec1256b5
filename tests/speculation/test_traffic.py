"""The sampling profiles and a traffic mix (speculation/traffic.py): what every measurement's sampled cells send."""

from __future__ import annotations

import pytest

from specbuild.speculation.traffic import SAMPLING_PROFILES, SEED_BASE, checked_mix, parse_mix, sampling_profile


def test_greedy_sends_no_sampling_inputs_and_a_sampled_profile_a_seed_per_prompt():
    assert sampling_profile("greedy").request_fields(5) == {}
    assert sampling_profile("t1.0").request_fields(5) == {"temperature": 1.0, "top_p": 0.9, "seed": SEED_BASE + 5}
    assert [p.name for p in SAMPLING_PROFILES] == ["greedy", "t0.7", "t1.0"]


@pytest.mark.parametrize("text,mix", [("greedy", {"greedy": 1.0}), ("t0.7=0.7, greedy=0.3", {"greedy": 0.3, "t0.7": 0.7})])
def test_a_mix_parses_in_the_table_order(text, mix):
    assert parse_mix(text) == mix and list(parse_mix(text)) == list(mix)


@pytest.mark.parametrize("mix,message", [
    ({}, "the traffic mix is empty"), ({"greedy": 0.5}, "sum to 0.5, not 1"), ({"t2": 1.0}, "unknown sampling profile"),
    ({"greedy": 1.0, "t0.7": 0.0}, "shares are above 0"),
])
def test_a_wrong_mix_is_refused_with_what_is_wrong(mix, message):
    with pytest.raises(ValueError, match=message):
        checked_mix(mix)
    with pytest.raises(ValueError, match="is not a number"):
        parse_mix("greedy=half")
