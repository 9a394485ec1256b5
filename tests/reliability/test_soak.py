"""The soak script (benchmarks/soak.py): its memory verdict (fast) and a short soak of the tiny release (slow)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from locations import REPO_ROOT

SOAK_PATH = REPO_ROOT / "benchmarks" / "soak.py"
_spec = importlib.util.spec_from_file_location("soak", SOAK_PATH)
assert _spec is not None and _spec.loader is not None
soak = importlib.util.module_from_spec(_spec)
sys.modules["soak"] = soak  # dataclasses look their module up
_spec.loader.exec_module(soak)

MIB = 2**20


def _sample(rss: dict[str, int], shm: int) -> object:
    return soak.MemorySample(at=0.0, rss=rss, shm=shm, load=1.0)


def test_memory_within_tolerance_is_stable():
    first = _sample({"tritonserver": 100 * MIB, "draft_0_0": 400 * MIB}, 5 * MIB)
    last = _sample({"tritonserver": 101 * MIB, "draft_0_0": 430 * MIB}, 5 * MIB)
    growth = soak.memory_growth(first, last)
    assert growth["stable"] and growth["rss_growth_bytes"] == 31 * MIB
    assert growth["per_process_growth_bytes"] == {"tritonserver": MIB, "draft_0_0": 30 * MIB}


@pytest.mark.parametrize("rss_after, shm_after, processes", [
    (600 * MIB, 5 * MIB, ("tritonserver", "draft_0_0")),  # rss grew by 100 MiB > max(64 MiB, 10 %)
    (400 * MIB, 20 * MIB, ("tritonserver", "draft_0_0")),  # shm grew by 15 MiB
    (400 * MIB, 5 * MIB, ("tritonserver",)),  # a model process vanished
])
def test_growth_or_a_lost_process_is_flagged(rss_after, shm_after, processes):
    first = _sample({"tritonserver": 100 * MIB, "draft_0_0": 400 * MIB}, 5 * MIB)
    last = _sample({name: (rss_after if name == "draft_0_0" else 100 * MIB) for name in processes}, shm_after)
    assert not soak.memory_growth(first, last)["stable"]


def test_request_mix_is_seeded_and_mixed():
    config = soak.SoakConfig(max_k=4, seed=3)
    take = lambda: [next(gen) for gen in [soak.mixed_requests(config)] for _ in range(40)]  # noqa: E731
    first, again = take(), take()
    assert first == again
    assert {r.stream for r in first} == {True, False}
    assert {r.temperature for r in first} == {None, 0.8}
    assert {r.num_draft_tokens for r in first} <= set(range(5)) and len({r.num_draft_tokens for r in first}) > 2


@pytest.mark.slow
@pytest.mark.e2e
def test_short_soak_serves_everything_without_errors_or_growth(served, tmp_path):
    config = soak.SoakConfig(concurrency=4, duration_s=12, window_s=4, max_tokens=(4, 16), max_k=4)
    report = soak.run_soak(served, config)
    assert report.errors == 0, report.error_messages
    assert report.served >= 4 and report.server_alive
    assert report.growth["stable"], report.growth
    assert report.counters is not None and report.counters["requests"] >= report.served
    assert len(report.memory) >= 3 and report.windows
    json.dumps(report.to_json())  # the --json output is plain JSON
    assert report.ok
