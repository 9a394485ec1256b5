"""K per load (speculation.schedule.DraftLenSchedule): validation, lookup, its form in the orchestrator's
parameters, and the spec keys it comes from (draft_len_schedule, or busy_in_flight as its simplest case)."""

from __future__ import annotations

import pytest

from specbuild.errors import SpecError
from specbuild.spec import load_spec
from specbuild.speculation.schedule import DraftLenSchedule

SCHEDULE = DraftLenSchedule.from_mapping({4: 2, 1: 4, 8: 0})


def spec_with(**speculation: object):
    return load_spec(None, {"target.checkpoint": "t", "draft.checkpoint": "d",
                            **{f"speculation.{key}": value for key, value in speculation.items()}})


@pytest.mark.parametrize(("in_flight", "cap", "k_asked", "k"), [
    (1, 4, 6, 4), (3, 4, 2, 2), (4, 2, 6, 2), (7, 2, 1, 1), (8, 0, 4, 0), (64, 0, 4, 0),
])
def test_lookup_takes_the_largest_count_at_or_below_the_load_and_the_request_caps_it(in_flight, cap, k_asked, k):
    assert SCHEDULE.cap(in_flight) == cap
    assert SCHEDULE.draft_len(k_asked, in_flight) == k


def test_below_the_smallest_count_nothing_is_capped():
    later = DraftLenSchedule.from_mapping({3: 1})
    assert later.cap(2) is None and later.draft_len(5, 2) == 5 and later.draft_len(5, 3) == 1
    assert DraftLenSchedule().cap(100) is None


@pytest.mark.parametrize(("mapping", "message"), [
    ({0: 4}, "1 or more"), ({1: -1}, "0 or more"), ({1: 2, 4: 3}, "must not rise with load: 1 in flight K=2, 4 in"),
])
def test_bad_schedules_are_refused_naming_the_problem(mapping, message):
    with pytest.raises(ValueError, match=message):
        DraftLenSchedule.from_mapping(mapping)


def test_its_parameter_form_reads_back():
    assert str(SCHEDULE) == "1:4,4:2,8:0"
    assert DraftLenSchedule.parse(str(SCHEDULE)) == SCHEDULE and DraftLenSchedule.parse("") == DraftLenSchedule()
    with pytest.raises(ValueError, match="not a draft length schedule"):
        DraftLenSchedule.parse("1:4,x")


def test_busy_in_flight_is_the_simplest_schedule():
    assert DraftLenSchedule.from_threshold(2) == DraftLenSchedule(((2, 0),))
    assert DraftLenSchedule.from_threshold(0) == DraftLenSchedule()
    assert spec_with(busy_in_flight=5).speculation.load_schedule(16).as_mapping() == {5: 0}
    assert spec_with().speculation.load_schedule(16).as_mapping() == {16: 0}  # unset: the runtime's default
    assert spec_with(draft_len_schedule={1: 4, 8: 1}).speculation.load_schedule(16).as_mapping() == {1: 4, 8: 1}


def test_runs_and_words_give_the_k_a_request_gets_at_each_load():
    assert SCHEDULE.runs(4, 16) == [(1, 3, 4), (4, 7, 2), (8, 16, 0)]
    assert SCHEDULE.runs(2, 16) == [(1, 7, 2), (8, 16, 0)]  # a request asking 2 is not lowered until 8
    assert SCHEDULE.runs(4, 6) == [(1, 3, 4), (4, 6, 2)]  # counts above what can be in flight never apply
    assert SCHEDULE.describe(4) == "K=4 from 1 in flight, K=2 from 4 in flight, K=0 from 8 in flight"
    assert DraftLenSchedule().describe(3) == "K=3 at any load"


@pytest.mark.parametrize(("speculation", "message"), [
    ({"draft_len_schedule": {1: 4, 8: 0}, "busy_in_flight": 8}, "busy_in_flight and draft_len_schedule are both"),
    ({"draft_len_schedule": {1: 9}}, r"more than max_draft_len \(8\)"),
    ({"draft_len_schedule": {1: 2, 4: 4}}, "make K fall"),
    ({"draft_len_schedule": {0: 2}}, "draft_len_schedule"),
])
def test_the_spec_refuses_a_schedule_it_cannot_serve(speculation, message):
    with pytest.raises(SpecError, match=message):
        spec_with(**speculation)
