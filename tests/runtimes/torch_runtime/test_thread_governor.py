"""The thread governor: every core while they are free, one while other work competes for them, judged by
measured steps; and an engine whose steps change thread count computes what a fixed count does."""

from __future__ import annotations

import os

import pytest
import torch

from specbuild.runtimes.torch.threads import (
    FIRST_PROBE,
    LAST_PROBE,
    MEASURED_TOKENS,
    PROBE_STEPS,
    ThreadGovernor,
    spin_briefly,
    threads,
    wait_policy,
)
from specbuild.speculation.engine_call import EngineRequest


def run(governor: ThreadGovernor, seconds: dict[int, float], steps: int, tokens: int = 1) -> list[int]:
    """``steps`` steps whose time depends only on the thread count; the counts the governor chose."""
    chosen = []
    for _ in range(steps):
        count = governor.choose()
        chosen.append(count)
        governor.observe(count, tokens, seconds[count])
    return chosen


def test_zero_threads_means_every_core_this_process_may_use():
    assert threads(0) == len(os.sched_getaffinity(0))
    assert threads(3) == 3


def test_it_keeps_every_core_while_they_are_faster_and_probes_ever_less_often():
    governor = ThreadGovernor(4)
    chosen = run(governor, {4: 0.020, 1: 0.040}, 4000)
    assert governor.current == 4 and governor.switches == 0
    probes = sum(count == 1 for count in chosen)
    # FIRST_PROBE, 2x, 4x ... up to LAST_PROBE: a handful of probes in 4000 steps, each PROBE_STEPS long
    assert PROBE_STEPS * 4 <= probes <= PROBE_STEPS * 12
    assert max(len(run) for run in "".join(map(str, chosen)).split("1") if run) >= LAST_PROBE


def test_it_takes_one_thread_when_every_core_turns_slow_and_goes_back_when_they_are_free():
    governor = ThreadGovernor(2)
    run(governor, {2: 0.020, 1: 0.025}, 600)
    assert governor.current == 2
    chosen = run(governor, {2: 0.200, 1: 0.025}, 20)  # a neighbour starts: steps with 2 threads 10x slower
    assert governor.current == 1 and governor.switches == 1
    assert chosen.count(2) <= 2 * PROBE_STEPS + 3  # the slowdown is seen within a few steps, not at the next probe
    run(governor, {2: 0.020, 1: 0.025}, 2 * LAST_PROBE + 10)  # the neighbour is gone
    assert governor.current == 2


def test_small_differences_do_not_make_it_switch():
    governor = ThreadGovernor(2)
    run(governor, {2: 0.020, 1: 0.019}, 2000)
    assert governor.switches == 0


def test_prefills_are_not_judged_and_one_core_is_one_thread():
    governor = ThreadGovernor(2)
    run(governor, {2: 1.0, 1: 0.01}, 100, tokens=MEASURED_TOKENS + 1)  # long prompts, any time: not measured
    assert governor.current == 2 and governor.switches == 0
    single = ThreadGovernor(1)
    assert set(run(single, {1: 0.01}, FIRST_PROBE * 4)) == {1}


def test_steps_are_judged_against_steps_of_their_own_size():
    """A verification of 4 tokens costs more than a decoding step; a probe of one size is compared with the
    current count's steps of the same size, so the mix alone never makes it switch."""
    governor = ThreadGovernor(2)
    for step in range(3000):
        count = governor.choose()
        tokens = 1 if step % 2 else 4
        governor.observe(count, tokens, (0.020 if tokens == 1 else 0.030) * (1.0 if count == 2 else 1.05))
    assert governor.switches == 0


def test_the_wait_policy_a_user_sets_is_kept(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    spin_briefly()
    assert "GOMP_SPINCOUNT" not in os.environ and wait_policy() == "OMP_WAIT_POLICY=PASSIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    spin_briefly()
    assert wait_policy() == "GOMP_SPINCOUNT=3000"


class Alternating:
    """A governor that runs every other step with one thread."""

    def __init__(self, most: int) -> None:
        self.most, self.steps = most, 0

    def choose(self) -> int:
        self.steps += 1
        return 1 if self.steps % 2 else self.most

    def observe(self, threads_used: int, tokens: int, seconds: float) -> None:
        pass


@pytest.mark.slow
def test_changing_the_thread_count_between_steps_changes_no_output(demo_pair):
    """On the demo target (large enough that its products run on several threads): a prefill, decoding steps and a
    verification with the thread count changing every step give the tokens and logits of a fixed count."""
    from specbuild.runtimes.torch.engine import TorchEngine

    most = len(os.sched_getaffinity(0))
    if most < 2:
        pytest.skip("one core: nothing to alternate")
    prompt = [1 + (index * 37) % 40000 for index in range(48)]
    outputs = []
    previous = torch.get_num_threads()
    try:
        for governor in (None, Alternating(most)):
            torch.set_num_threads(most)
            engine = TorchEngine(demo_pair.target_dir, max_draft_len=3, cache_tokens=0, governor=governor)
            generated = engine.run(EngineRequest(prompt, 6, return_logits=True))
            verified = engine.run(EngineRequest(prompt, 1, draft_tokens=generated.tokens[:3], return_logits=True))
            outputs.append((generated, verified))
    finally:
        torch.set_num_threads(previous)
    (fixed, fixed_verified), (alternating, alternating_verified) = outputs
    assert alternating.tokens == fixed.tokens and alternating_verified.tokens == fixed_verified.tokens
    torch.testing.assert_close(alternating.logits, fixed.logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(alternating_verified.logits, fixed_verified.logits, atol=1e-4, rtol=1e-4)
