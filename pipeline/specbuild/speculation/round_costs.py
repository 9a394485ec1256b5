"""What this process's rounds cost, learnt as they run, so the break-even judges at the serving host's own costs.

A release's cost model is measured once, on the build host, often in process (``specbuild demo``/``init``) where a
round costs less than through the server: on 2 CPU cores the demo pair measured V(1) = 1.00 in process and
1.12-1.22 through Triton, which moved its break-even acceptance from 0.12 to about 0.3 and left the requests in
between drafting at a loss (chat and rewrites at 0.92x). :class:`RoundCosts` is shared by every request an
orchestrator (or the in-process speculator) runs; the loop reports each round's seconds to it, and each request's
:class:`~specbuild.speculation.cost.BreakEvenGate` decides with :meth:`RoundCosts.model`: c and V(k) from them once
there are enough samples, the release's figures until then.

Only rounds that ran alone count (no other request in flight: under load the load policy decides, and a shared CPU
would blur the figures), and never a request's first round (it prefills the prompt). The target-alone step, the
unit of c and V(k), comes from rounds without drafts (K=0 requests, the break-even's stretches); a server whose
requests all draft gets one by a short probe: a request's second round runs :data:`PROBE_TOKENS` tokens by the target
alone while the samples are too few or older than :data:`REFRESH_SECONDS`. A probe changes K only, never the text.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from specbuild.speculation.cost import CostModel

# An estimate is the mean of its first 1/SMOOTHING samples, then an exponential moving average over about as many
# (the host's costs drift; one round's time varies by half on a busy CPU, so a shorter window flips decisions).
SMOOTHING = 0.05
# Samples of each figure (target-alone tokens; verifications of a k; draft calls) before it replaces the release's.
MIN_SAMPLES = 8
PROBE_TOKENS = 8
REFRESH_SECONDS = 60.0


class _Average:
    """A running mean turning into an exponential moving average after 1/SMOOTHING samples; counts them."""

    def __init__(self) -> None:
        self.value = 0.0
        self.samples = 0

    def add(self, value: float, weight: int = 1) -> None:
        for _ in range(weight):
            self.samples += 1
            self.value += max(1.0 / self.samples, SMOOTHING) * (value - self.value)

    @property
    def ready(self) -> bool:
        return self.samples >= MIN_SAMPLES


class RoundCosts:
    """Seconds per target-alone token, per verification of ``k`` drafted tokens, per draft-model token, from the
    rounds this process ran alone; ``exclusive`` says whether the round just finished ran alone (the orchestrator:
    one request in flight; default: always)."""

    def __init__(self, exclusive: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.exclusive = exclusive
        self.clock = clock
        self.alone_token = _Average()
        self.verification: dict[int, _Average] = {}
        self.draft_token = _Average()
        self._alone_at = -REFRESH_SECONDS  # when the last target-alone sample came
        self.probe_tokens = PROBE_TOKENS

    def alone(self, seconds: float, tokens: int) -> None:
        """A round without drafts made ``tokens`` tokens in ``seconds``."""
        if tokens > 0 and self.exclusive():
            self.alone_token.add(seconds / tokens, tokens)
            self._alone_at = self.clock()

    def verified(self, drafted: int, target_seconds: float, draft_seconds: float | None) -> None:
        """A round verified ``drafted`` tokens in ``target_seconds``; ``draft_seconds``: what the draft model took to
        propose them (None: another source, prompt lookup, which costs no model call, or a draft call that also
        caught up on rounds it missed, :attr:`~specbuild.speculation.drafting.Draft.steady`)."""
        if drafted <= 0 or not self.exclusive():
            return
        self.verification.setdefault(drafted, _Average()).add(target_seconds)
        if draft_seconds is not None:
            self.draft_token.add(draft_seconds / drafted)

    @property
    def wants_probe(self) -> bool:
        """Whether the target-alone step needs a fresh sample (too few, or none for :data:`REFRESH_SECONDS`)."""
        return not self.alone_token.ready or self.clock() - self._alone_at > REFRESH_SECONDS

    def model(self, release: CostModel) -> CostModel:
        """``release`` with c and V(k) from this process's rounds where they are measured enough: V(k) for each k
        verified often enough, the release's V(k) shifted by the mean difference for the others (a round's overhead
        adds); c unless ``release`` has no draft step (lookup only). The release's until a target-alone step is
        known."""
        step = self.alone_token
        measured = {k: average.value / step.value for k, average in self.verification.items() if average.ready}
        if not step.ready or step.value <= 0 or not (measured or self.draft_token.ready):
            return release
        shift = sum(v - release.verify(k) for k, v in measured.items()) / len(measured) if measured else 0.0
        verify_cost = {k: v + shift for k, v in release.verify_cost.items()} | measured
        draft_cost = release.draft_cost
        if self.draft_token.ready and release.draft_cost > 0:
            draft_cost = self.draft_token.value / step.value
        return replace(release, draft_cost=draft_cost, verify_cost=verify_cost, measured=True)
