"""How many intra-op threads a torch engine's steps run with.

A decoding step of a small model is a few hundred short operations, each a parallel region of OpenMP. Threads
that sleep between regions (``OMP_WAIT_POLICY=PASSIVE``) pay a wake-up per region: measured on a 2-core AMD EPYC,
the demo target ran 30-36 tok/s with 2 sleeping threads, 41 with one thread and 46-53 with 2 threads that
spin briefly between regions. Spinning threads collapse as soon as anything else wants their cores (another
engine of the release, a neighbour's job, even one at nice 19: 3-16 tok/s), since every region then waits for a
preempted thread. So the engine models spin briefly (:data:`SPIN_COUNT`, set before torch starts) and let a
:class:`ThreadGovernor` run each step with every core while they are free and with one while they are not,
judged by measuring steps (docs/benchmarks.md, "The served path"). Work measured in process rather than served (a
pair's acceptance, step costs) pins a fixed count instead: :func:`torch_threads`.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

# libgomp's spin before a waiting thread sleeps (GOMP_SPINCOUNT, in iterations; its default is 300,000): long
# enough to cover the gap between two operations of one step, short enough that a finished step's threads sleep
# within tens of microseconds rather than spin on the cores the other engine model needs next.
SPIN_COUNT = "3000"
MEASURED_TOKENS = 8  # steps of at most this many tokens are timed (decoding, verification); a prefill is not
RECENT = 5  # steps per (threads, tokens) a judgement reads
FIRST_PROBE = 16  # steps before the first probe of the other thread count, and after each switch
LAST_PROBE = 1024  # the longest wait between probes (it doubles after each probe that loses)
PROBE_STEPS = 2  # steps a probe runs with the other count (the first may pay for waking its threads)
SWITCH_MARGIN = 0.9  # the other count must be this much faster to take over
SLOWDOWN = 1.5  # the current count this much slower than at its last judgement: probe now


def threads(requested: int) -> int:
    """Intra-op threads for an engine: ``requested``, or for 0 every core this process may run on."""
    return requested or len(os.sched_getaffinity(0))


def spin_briefly() -> None:
    """Before torch starts: waiting threads spin :data:`SPIN_COUNT` iterations, then sleep (unless this process's
    environment already says how OpenMP threads wait)."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)


def wait_policy() -> str:
    """How this process's OpenMP threads wait, for the engine model's log line."""
    if "OMP_WAIT_POLICY" in os.environ:
        return f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}"
    return f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'default')}"


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run with ``count`` intra-op threads (reproducible timings on a shared machine), then restore."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@dataclass
class ThreadGovernor:
    """Chooses each step's thread count between one and ``most`` by measuring steps (``adaptive``), or runs every
    step with ``most``: an engine sets its count before each step, so engines sharing a process keep their own.

    It runs with its current count, and now and then (a *probe*) a few steps with the other; the other takes
    over when its step is at least ``1 - SWITCH_MARGIN`` faster than the current count's recent steps of the same
    size. Probes come after :data:`FIRST_PROBE` steps, then ever less often while the current count keeps
    winning (at most every :data:`LAST_PROBE` steps), and at once when the current count's steps slow down by
    :data:`SLOWDOWN` (a neighbour started). A probe on a busy host costs a few slow steps per thousand. Output is
    unchanged by the count: the kernels split no reduction across threads (tested in
    ``tests/runtimes/torch_runtime/test_threads.py``)."""

    most: int
    adaptive: bool = True  # False: always ``most`` threads, never probing
    current: int = 0
    switches: int = 0
    _steps: dict[tuple[int, int], deque[float]] = field(default_factory=dict)
    _until_probe: int = FIRST_PROBE
    _interval: int = FIRST_PROBE
    _probing: int = 0
    _judged: float | None = None  # the current count's typical step at the last judgement

    def __post_init__(self) -> None:
        self.current = self.current or self.most

    @property
    def other(self) -> int:
        return 1 if self.current != 1 else self.most

    def describe(self) -> str:
        """The counts it chooses from, for a log line."""
        return f"1 or {self.most} (by measured steps)" if self.adaptive and self.most > 1 else str(self.most)

    def choose(self) -> int:
        """The thread count for the next step."""
        return self.other if self._probing else self.current

    def observe(self, threads_used: int, tokens: int, seconds: float) -> None:
        """A step of ``tokens`` new tokens took ``seconds`` with ``threads_used`` threads."""
        if not self.adaptive or self.most == 1 or tokens > MEASURED_TOKENS:
            return
        self._steps.setdefault((threads_used, tokens), deque(maxlen=RECENT)).append(seconds)
        if self._probing:
            self._probing -= 1
            if not self._probing:
                self._judge(tokens)
            return
        typical = self._typical(self.current, tokens)
        if self._judged is not None and typical is not None and typical > SLOWDOWN * self._judged:
            self._until_probe = 0
        self._until_probe -= 1
        if self._until_probe <= 0:
            self._probing = PROBE_STEPS

    def _typical(self, count: int, tokens: int) -> float | None:
        recent = self._steps.get((count, tokens))
        return statistics.median(recent) if recent and len(recent) >= 3 else None

    def _judge(self, tokens: int) -> None:
        probe = min(list(self._steps[(self.other, tokens)])[-PROBE_STEPS:])
        typical = self._typical(self.current, tokens)
        if typical is not None and probe < SWITCH_MARGIN * typical:
            self.current = self.other
            self.switches += 1
            self._interval = FIRST_PROBE
            self._judged = probe
        else:
            self._interval = min(2 * self._interval, LAST_PROBE)
            self._judged = typical
        self._until_probe = self._interval
