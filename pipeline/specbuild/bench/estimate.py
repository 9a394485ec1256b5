"""Speculation's speedup predicted in process, before any server: the draft's greedy acceptance on the
target's own answers, step costs timed on this machine, and the analytic model of
:func:`specbuild.speculation.cost.expected_speedup` (the one formula; every prediction goes through it).

Used by ``specbuild init`` (the K a starter spec begins with) and ``specbuild draft`` (a new draft's summary).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.speculation.cost import expected_speedup, per_token_acceptance

if TYPE_CHECKING:  # heavy imports stay lazy: importing specbuild must not load torch
    from rich.progress import Progress
    from transformers import PreTrainedModel

MAX_K = 8
COST_CONTEXT, COST_REPEATS = 200, 12  # a timed step feeds its tokens after this many cached ones


def predicted_speedup(acceptance_rate: float, k: int, cost_ratio: float, verify_cost: float = 1.0) -> float:
    """:func:`~specbuild.speculation.cost.expected_speedup` for a greedy acceptance rate (accepted / drafted
    tokens at ``k`` drafts per round, so a round yields ``1 + k * rate`` tokens on average)."""
    return expected_speedup(1 + k * acceptance_rate, k, cost_ratio, verify_cost)


class StepTimer:
    """Times one model's decoding steps: ``new_tokens`` fed after ``context`` cached tokens, the cache cropped
    back after each, so every timing sees the same context."""

    def __init__(self, model: PreTrainedModel, context: int = COST_CONTEXT) -> None:
        import torch
        from transformers import DynamicCache

        from specbuild.runtimes.torch.engine import cache_keyword

        self.model = model
        self.generator = torch.Generator().manual_seed(0)
        self.cache_argument = cache_keyword(model)
        self.cache = DynamicCache()
        with torch.inference_mode():
            model(input_ids=self._tokens(context), use_cache=True, **{self.cache_argument: self.cache})

    def _tokens(self, count: int) -> Any:
        import torch

        ids = torch.randint(0, self.model.config.vocab_size, (1, count), generator=self.generator)
        return ids.to(self.model.device)

    def seconds(self, new_tokens: int) -> float:
        import torch

        step = self._tokens(new_tokens)
        on_gpu = step.device.type == "cuda"  # kernels run asynchronously there: time them to completion
        with torch.inference_mode():
            if on_gpu:
                torch.cuda.synchronize()
            began = time.perf_counter()
            self.model(input_ids=step, use_cache=True, **{self.cache_argument: self.cache})
            if on_gpu:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - began
        self.cache.crop(-new_tokens)
        return elapsed


@dataclass(frozen=True)
class StepCosts:
    """One target decoding step, one draft step, and V(K): the target's call on K drafts plus its own token,
    in target steps (1 on a GPU that verifies K tokens in the time of one; more on a CPU)."""

    target_step_ms: float
    draft_step_ms: float
    verify_cost: dict[int, float]

    @property
    def cost_ratio(self) -> float:
        """A draft step in target steps (``c`` of the analytic model)."""
        return self.draft_step_ms / self.target_step_ms


def measure_step_costs(target: PreTrainedModel, draft: PreTrainedModel, max_k: int = MAX_K, *,
                       context: int = COST_CONTEXT, repeats: int = COST_REPEATS,
                       advance: Callable[[float], None] = lambda amount=1: None) -> StepCosts:
    """Time the target on 1..max_k+1 new tokens and the draft on one, interleaved (``repeats`` rounds after two
    warm-up rounds; ``advance`` after each), keeping each one's fastest time. On one thread: on a busy machine
    a multi-threaded step waits for its slowest thread (tens of times its cost, measured on 2 shared cores),
    while other work only ever adds time to a single thread, so the minimum is the step's own cost."""
    from specbuild.runtimes.torch.threads import torch_threads

    target_s: dict[int, list[float]] = {n: [] for n in range(1, max_k + 2)}
    draft_s: list[float] = []
    with torch_threads(1):
        target_timer, draft_timer = StepTimer(target, context), StepTimer(draft, context)
        for round_index in range(repeats + 2):
            for new_tokens, times in target_s.items():
                times.append(target_timer.seconds(new_tokens))
            draft_s.append(draft_timer.seconds(1))
            if round_index >= 2:
                advance(1)
    target_ms = {n: min(times[2:]) * 1000 for n, times in target_s.items()}
    # Feeding more tokens never costs less: each V(K) is the least measured at K or above, and the one-token step
    # the least of all, which evens out a timing that stayed high through every round (a one-token step inflated
    # by load made V(1) 0.68 on 2 busy cores: a verification cheaper than a step).
    step_ms = min(target_ms.values())
    verify = {k: min(target_ms[n] for n in range(k + 1, max_k + 2)) / step_ms for k in range(1, max_k + 1)}
    return StepCosts(target_step_ms=step_ms, draft_step_ms=min(draft_s[2:]) * 1000, verify_cost=verify)


def predicted_speedups(acceptance: Mapping[str, float], costs: StepCosts) -> dict[int, float]:
    """The predicted speedup per K for greedy acceptance rates keyed by K (as ``acceptance_by_k`` returns)."""
    return {int(k): predicted_speedup(rate, int(k), costs.cost_ratio, costs.verify_cost[int(k)])
            for k, rate in acceptance.items() if int(k) in costs.verify_cost}


@dataclass(frozen=True)
class PairEstimate:
    """What a quick in-process measurement predicts for a target/draft pair."""

    acceptance: dict[str, float]  # greedy accepted / drafted tokens per K ("1".."8")
    costs: StepCosts
    speedups: dict[int, float]  # predicted, per K
    prompts: int
    new_tokens: int
    seconds: float

    @property
    def best_k(self) -> int:
        return max(self.speedups, key=lambda k: (self.speedups[k], -k))

    @property
    def per_token_acceptance(self) -> float:
        """Leviathan's per-token acceptance behind the greedy acceptance at the best K."""
        k = self.best_k
        return per_token_acceptance(1 + k * self.acceptance[str(k)], k)

    def to_dict(self) -> dict[str, Any]:
        return {"acceptance": self.acceptance, "cost_ratio": round(self.costs.cost_ratio, 4),
                "verify_cost": {str(k): round(v, 3) for k, v in self.costs.verify_cost.items()},
                "target_step_ms": round(self.costs.target_step_ms, 2),
                "draft_step_ms": round(self.costs.draft_step_ms, 2),
                "predicted_speedup": {str(k): round(v, 3) for k, v in self.speedups.items()},
                "best_k": self.best_k, "prompts": self.prompts, "new_tokens": self.new_tokens,
                "seconds": round(self.seconds, 1)}


def estimate_pair(target_dir: str | Path, draft_dir: str | Path, *, prompts: int = 4, new_tokens: int = 32,
                  max_k: int = MAX_K, repeats: int = 8, progress: Progress | None = None) -> PairEstimate:
    """Load both checkpoints as the torch runtime does (float32 on the CPU), let the target answer the first
    ``prompts`` bundled benchmark prompts (its chat template applied, encoded as the server's preprocessing
    does) greedily with ``new_tokens`` tokens, score the draft's greedy agreement on those answers for
    K = 1..max_k, time both models' steps and predict the speedup per K. All on one thread, which keeps it
    bounded on a busy machine (SmolLM2-135M and its draft: about 45 s with 2 cores shared by others)."""
    from transformers import AutoTokenizer

    from specbuild.bench.acceptance import measure_acceptance
    from specbuild.bench.prompts import load_prompts
    from specbuild.bench.sweep import chat_prompts
    from specbuild.runtimes.torch.engine import TorchEngine
    from specbuild.runtimes.torch.threads import torch_threads
    from specbuild.terminal import stage

    started = time.perf_counter()
    with torch_threads(1):
        with stage(progress, "measure: load target and draft", 2) as advance:
            target = TorchEngine(target_dir)
            advance(1)
            draft = TorchEngine(draft_dir)
            advance(1)
        tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
        encoded = [tokenizer.encode(text) for text in chat_prompts(target_dir, load_prompts(limit=prompts))]
        with stage(progress, f"measure: the target answers {len(encoded)} prompts, the draft's agreement",
                   len(encoded)) as advance:
            acceptance = measure_acceptance(target.model, draft.sequence_logits, encoded, new_tokens, advance)
        acceptance = {k: rate for k, rate in acceptance.items() if int(k) <= max_k}
        with stage(progress, "measure: step costs", repeats) as advance:
            costs = measure_step_costs(target.model, draft.model, max_k, repeats=repeats, advance=advance)
    return PairEstimate(acceptance=acceptance, costs=costs, speedups=predicted_speedups(acceptance, costs),
                        prompts=len(encoded), new_tokens=new_tokens, seconds=time.perf_counter() - started)
