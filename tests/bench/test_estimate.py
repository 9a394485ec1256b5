"""The in-process speedup prediction: one formula (speculation.cost.expected_speedup) for every prediction, and step
costs that hold together on a busy machine."""

from __future__ import annotations

import pytest

from specbuild.bench import acceptance, estimate
from specbuild.speculation.cost import expected_speedup
from specbuild.drafts import demo_models, distill, distill_data, distill_training, model_pairs


def test_a_greedy_acceptance_rate_goes_through_the_bench_formula():
    assert estimate.predicted_speedup(0.5, 2, 0.1) == expected_speedup(2.0, 2, 0.1) == pytest.approx(2.0 / 1.2)
    assert estimate.predicted_speedup(1.0, 4, 0.0) == pytest.approx(5.0)
    assert estimate.predicted_speedup(0.0, 4, 0.25) == pytest.approx(0.5)  # nothing accepted, draft work wasted
    assert estimate.predicted_speedup(0.5, 2, 0.1, verify_cost=1.5) == pytest.approx(2.0 / 1.7)


def test_no_module_keeps_its_own_speedup_formula():
    for module in (acceptance, model_pairs, demo_models, distill, distill_data, distill_training):
        assert not hasattr(module, "expected_speedup"), module.__name__


def test_predicted_speedups_per_k():
    costs = estimate.StepCosts(target_step_ms=10.0, draft_step_ms=2.0, verify_cost={1: 1.0, 2: 1.5})
    assert costs.cost_ratio == pytest.approx(0.2)
    speedups = estimate.predicted_speedups({"1": 0.5, "2": 0.5, "3": 0.5}, costs)  # no V(3): K=3 is not predicted
    assert speedups == pytest.approx({1: 1.5 / 1.2, 2: 2.0 / 1.9})


@pytest.mark.slow
def test_step_costs_of_real_models_are_positive_and_verification_never_cheaper(tiny_pair):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir).eval()
    draft = AutoModelForCausalLM.from_pretrained(tiny_pair.draft_dir).eval()
    ticks = []
    costs = estimate.measure_step_costs(target, draft, 4, context=32, repeats=3, advance=ticks.append)
    assert len(ticks) == 3 and costs.target_step_ms > 0 and costs.draft_step_ms > 0
    verify = [costs.verify_cost[k] for k in range(1, 5)]
    assert verify == sorted(verify) and verify[0] >= 1.0  # never cheaper than the one-token step


@pytest.mark.slow
def test_acceptance_is_measured_in_token_ids_with_a_sub_vocabulary_head(tiny_pair, tmp_path):
    """A head over every id in reverse order computes the same distribution as the full head: its acceptance must
    be the same. Scored on the head's own indices instead of token ids, it would be about zero (as the demo's
    measurement once was)."""
    import shutil

    from specbuild.checkpoint.head_vocabulary import HeadVocabulary
    from specbuild.runtimes.torch.engine import TorchEngine

    draft = tmp_path / "draft"
    shutil.copytree(tiny_pair.draft_dir, draft)
    vocab_size = TorchEngine(tiny_pair.draft_dir).vocab_size
    HeadVocabulary.of(reversed(range(vocab_size)), {"made_by": "test"}).write(draft)
    plain = estimate.estimate_pair(tiny_pair.target_dir, tiny_pair.draft_dir, prompts=2, new_tokens=8, repeats=1)
    reversed_head = estimate.estimate_pair(tiny_pair.target_dir, draft, prompts=2, new_tokens=8, repeats=1)
    assert plain.acceptance["1"] > 0.2
    assert reversed_head.acceptance == plain.acceptance
