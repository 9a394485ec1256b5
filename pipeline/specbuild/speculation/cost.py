"""The analytic cost model of speculation, once: what a round yields against what it costs, in target steps.

A round drafting ``k`` tokens with per-token acceptance ``a`` yields Leviathan et al.'s (2023)
``(1 - a^(k+1)) / (1 - a)`` tokens on average and costs ``k*c + V(k)`` target steps: ``c`` one draft step and
``V(k)`` the target's verification of ``k`` drafted tokens, both in target steps (Leviathan assume V = 1; a CPU does
not give that). :func:`expected_speedup` is the one speedup formula: ``specbuild bench`` reports it, ``init``
predicts with it, ``check``'s break-even inverts it, and the loop's per-request break-even
(:class:`BreakEvenGate`) decides with it.

A release carries its :class:`CostModel`: ``c`` and ``V(k)`` measured on the build host (by ``init``, ``tune`` or
``bench``), or, where nothing was measured, ``c`` from the models' parameter ratio and ``V(k) = 1``, shown as not
measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

# The break-even's prior weighs as many drafted-token trials as this: a request's own first rounds move it, one
# unlucky round does not switch drafting off.
PRIOR_TRIALS = 8.0
# After the first switch-off the request runs this many tokens by the target alone, then drafts one probing round;
# each further switch-off doubles the stretch, up to the last.
FIRST_PAUSE_TOKENS, PAUSE_GROWTH, MAX_PAUSE_TOKENS = 8, 2, 256


def leviathan_tokens_per_step(a: float, k: float) -> float:
    """Expected tokens per target step with per-token acceptance ``a`` and ``k`` draft tokens.

    >>> leviathan_tokens_per_step(0.5, 2)
    1.75
    """
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def per_token_acceptance(mean_acceptance_length: float, k: float, tolerance: float = 1e-9) -> float:
    """The per-token acceptance ``a`` for which Leviathan's formula gives the measured MAL at ``k``.

    The formula rises monotonically from 1 (a=0) to k+1 (a=1), so bisection finds the one solution.

    >>> round(per_token_acceptance(1.75, 2), 6)
    0.5
    """
    if k <= 0 or mean_acceptance_length <= 1.0:
        return 0.0
    if mean_acceptance_length >= k + 1:
        return 1.0
    low, high = 0.0, 1.0
    while high - low > tolerance:
        middle = (low + high) / 2
        if leviathan_tokens_per_step(middle, k) < mean_acceptance_length:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def expected_speedup(mean_acceptance_length: float, k: float, cost_ratio: float, verify_cost: float = 1.0) -> float:
    """Tokens per target step over the cost of one round, in target steps: MAL / (k*c + V(k)).

    >>> expected_speedup(1.75, 2, 0.1)  # the textbook case, V = 1
    1.4583333333333335
    """
    return mean_acceptance_length / (k * cost_ratio + verify_cost)


@dataclass(frozen=True)
class CostModel:
    """A release's cost model. ``draft_cost``: c; ``verify_cost``: V(k) by k where measured (a k not measured
    takes the nearest measured one above it, else the largest, else 1); ``acceptance``: the per-token acceptance
    measured with it (None: not measured); ``measured``: whether c was measured on the build host (False: the
    parameter ratio)."""

    draft_cost: float
    verify_cost: Mapping[int, float] = field(default_factory=dict)
    acceptance: float | None = None
    measured: bool = False

    def verify(self, k: int) -> float:
        """V(k), never below a smaller k's: verifying more tokens does not cost less, whatever a mix of
        measurements says (``tune`` measures V(1) through the server over the others measured in process)."""
        if k in self.verify_cost:
            value = self.verify_cost[k]
        else:
            above = [measured for measured in sorted(self.verify_cost) if measured > k]
            value = self.verify_cost[above[0]] if above else max(self.verify_cost.values(), default=1.0)
        return max([value, *(cost for measured, cost in self.verify_cost.items() if measured < k)])

    def speedup(self, a: float, k: int) -> float:
        """Expected speedup at ``k`` drafts per round with per-token acceptance ``a`` (1 at k=0)."""
        if k <= 0:
            return 1.0
        return expected_speedup(leviathan_tokens_per_step(a, k), k, self.draft_cost, self.verify(k))

    def best(self, a: float, max_k: int) -> tuple[int, float]:
        """The k in 1..max_k with the highest expected speedup at acceptance ``a`` (ties: the smaller), and it."""
        k = max(range(1, max(1, max_k) + 1), key=lambda k: (self.speedup(a, k), -k))
        return k, self.speedup(a, k)

    def break_even_acceptance(self, max_k: int, tolerance: float = 1e-6) -> float | None:
        """The per-token acceptance below which no k in 1..max_k beats the target alone; None where even ``a = 1``
        does not pay."""
        if self.best(1.0, max_k)[1] < 1.0:
            return None
        low, high = 0.0, 1.0
        while high - low > tolerance:
            middle = (low + high) / 2
            low, high = (middle, high) if self.best(middle, max_k)[1] < 1.0 else (low, middle)
        return high

    def describe(self, max_k: int) -> str:
        """One line for ``verify`` and ``serve --dry-run``."""
        if self.measured:
            basis = "measured on the build host"
        else:
            basis = "not measured (c from the parameter ratio, V(K) = 1)"
        verify = ", ".join(f"V({k})={self.verify(k):.2f}" for k in sorted(self.verify_cost)) or "V(K)=1"
        acceptance = f", acceptance a={self.acceptance:.2f}" if self.acceptance is not None else ""
        even = self.break_even_acceptance(max_k)
        even_text = f"breaks even at a={even:.2f}" if even is not None else "never pays"
        return f"cost model {basis}: c={self.draft_cost:.3f}, {verify}{acceptance}; {even_text}"

    def to_dict(self) -> dict[str, Any]:
        return {"draft_cost": self.draft_cost, "verify_cost": {str(k): v for k, v in sorted(self.verify_cost.items())},
                "acceptance": self.acceptance, "measured": self.measured}


class CostCalibration(Protocol):
    """What the break-even asks of the host's measured round costs (:class:`~specbuild.speculation.round_costs.RoundCosts`)."""

    probe_tokens: int

    @property
    def wants_probe(self) -> bool: ...

    def model(self, release: CostModel) -> CostModel: ...


class BreakEvenGate:
    """One request's break-even: its running per-token acceptance (accepted over accepted plus rejections, each
    round's first rejection ending its trials, with a prior of :data:`PRIOR_TRIALS` trials at the release's
    measured acceptance, or at the break-even acceptance where none was measured, so only the request's own rounds
    decide, from its first drafted round on), and its best K there (:attr:`best_k`, the K in 1..``max_k`` with the
    highest expected speedup), which each round drafts at most: a draft that agrees less is worth fewer tokens a
    round. When the expected speedup at the best K falls below 1 the request drafts nothing for a stretch of
    target-alone tokens (:data:`FIRST_PAUSE_TOKENS`, doubling at each switch-off), then probes with one drafted
    round. Only K changes (0 during a stretch), so the output is exactly the target's whatever it decides.
    TensorRT-LLM's ``SpeculationGate`` (``tensorrt_llm/_torch/speculative/speculation_gate.py``) turns speculation
    off for the whole server, for good; this decides per request and looks again.

    With ``calibration`` (the process's :class:`~specbuild.speculation.round_costs.RoundCosts`) it decides at the
    costs this host's rounds actually have and, while those lack a fresh target-alone step, runs one probing stretch
    of ``PROBE_TOKENS`` target-alone tokens after its first round (``probing``: not a switch-off)."""

    def __init__(self, cost: CostModel, max_k: int, calibration: CostCalibration | None = None) -> None:
        self.cost = cost
        self.max_k = max_k
        self.calibration = calibration
        self.probing = False
        self._probed = calibration is None
        prior = cost.acceptance if cost.acceptance is not None else cost.break_even_acceptance(max_k)
        prior = 0.0 if prior is None else prior
        self.accepted, self.trials = prior * PRIOR_TRIALS, PRIOR_TRIALS
        self.paused_tokens = 0  # target-alone tokens left in the current stretch
        self.switch_offs = 0
        self.best_k = max_k  # the most tokens a round drafts, from the request's own rounds on
        if cost.acceptance is not None:  # a measured prior may say at once that this release's draft does not pay
            self._decide()

    @property
    def acceptance(self) -> float:
        return self.accepted / self.trials

    @property
    def drafting(self) -> bool:
        return self.paused_tokens <= 0

    def observe(self, drafted: int, accepted: int) -> None:
        """A verified round: ``accepted`` of ``drafted`` tokens kept."""
        self.accepted += accepted
        self.trials += accepted + (accepted < drafted)
        self._decide()
        if self.drafting and not self._probed and self.calibration is not None and self.calibration.wants_probe:
            self._probed = self.probing = True
            self.paused_tokens = self.calibration.probe_tokens

    def idle(self, tokens: int) -> None:
        """A round without drafts made ``tokens`` tokens."""
        self.paused_tokens -= tokens
        self.probing = self.probing and not self.drafting

    @property
    def current_cost(self) -> CostModel:
        """The cost model it decides with: the release's, at this host's measured costs where it has them."""
        return self.cost if self.calibration is None else self.calibration.model(self.cost)

    def _decide(self) -> None:
        self.best_k, speedup = self.current_cost.best(self.acceptance, self.max_k)
        if speedup < 1.0:
            self.paused_tokens = min(FIRST_PAUSE_TOKENS * PAUSE_GROWTH ** self.switch_offs, MAX_PAUSE_TOKENS)
            self.switch_offs += 1
