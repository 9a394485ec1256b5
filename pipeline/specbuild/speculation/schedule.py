"""K per load: the most draft tokens a round may have while a given number of requests is in flight.

A :class:`DraftLenSchedule` maps in-flight counts to K: from ``in_flight`` requests on (an orchestrator instance's
``specbuild_requests_in_flight`` gauge), rounds draft at most that many tokens, until the next key; below the
smallest key nothing is capped. A request's own K caps it further (the schedule only lowers K), and K falls (or
stays) as load rises: speculation spends compute a busy server lacks. ``speculation.busy_in_flight`` N is the
simplest schedule, ``{N: 0}``: drafting stops from N requests on. ``specbuild tune --concurrency-schedule``
measures one per release.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass

TUNED_LOADS = (1, 2, 4, 8, 16)  # the in-flight counts `specbuild tune --concurrency-schedule` measures K at


@dataclass(frozen=True)
class DraftLenSchedule:
    """``steps``: ``(from_in_flight, k)`` pairs, ascending in-flight counts (>= 1) with K non-increasing; empty:
    K is the request's at any load."""

    steps: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        counts = [count for count, _ in self.steps]
        if any(count < 1 for count in counts):
            raise ValueError(f"in-flight counts must be 1 or more, got {min(counts)}")
        if counts != sorted(set(counts)):
            raise ValueError("in-flight counts must ascend without repeats")
        ks = [k for _, k in self.steps]
        if any(k < 0 for k in ks):
            raise ValueError(f"draft lengths must be 0 or more, got {min(ks)}")
        for (low, low_k), (high, high_k) in zip(self.steps, self.steps[1:]):
            if high_k > low_k:
                raise ValueError(f"K must not rise with load: {low} in flight K={low_k}, {high} in flight K={high_k}")

    @classmethod
    def from_mapping(cls, mapping: Mapping[int, int]) -> DraftLenSchedule:
        return cls(tuple(sorted((int(count), int(k)) for count, k in mapping.items())))

    @classmethod
    def from_threshold(cls, busy_in_flight: int) -> DraftLenSchedule:
        """``busy_in_flight`` as a schedule: no drafts from that many requests in flight (0: draft at any load)."""
        return cls(((busy_in_flight, 0),) if busy_in_flight > 0 else ())

    @classmethod
    def parse(cls, text: str) -> DraftLenSchedule:
        """The :meth:`__str__` form back: ``"from:k,from:k"`` (empty: no schedule)."""
        try:
            pairs = [item.split(":") for item in text.split(",") if item.strip()]
            return cls.from_mapping({int(count): int(k) for count, k in pairs})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{text!r} is not a draft length schedule 'in_flight:K,...' ({exc})") from None

    def __str__(self) -> str:
        return ",".join(f"{count}:{k}" for count, k in self.steps)

    def as_mapping(self) -> dict[int, int]:
        return dict(self.steps)

    def cap(self, in_flight: int) -> int | None:
        """The most draft tokens a round may have with ``in_flight`` requests being served (None: no cap)."""
        index = bisect_right([count for count, _ in self.steps], in_flight)
        return self.steps[index - 1][1] if index else None

    def draft_len(self, k: int, in_flight: int) -> int:
        """A round's K for a request asking ``k`` at this load."""
        cap = self.cap(in_flight)
        return k if cap is None else min(k, cap)

    def runs(self, k: int, up_to: int) -> list[tuple[int, int, int]]:
        """The K a request asking ``k`` gets, as ``(first, last, K)`` runs of in-flight counts over 1..``up_to``
        (the most requests that can be in flight), adjacent runs of equal K merged."""
        runs: list[tuple[int, int, int]] = []
        bounds = sorted({1, *(count for count, _ in self.steps if count <= up_to)})
        for first, after in zip(bounds, [*bounds[1:], up_to + 1]):
            value = self.draft_len(k, first)
            if runs and runs[-1][2] == value:
                runs[-1] = (runs[-1][0], after - 1, value)
            else:
                runs.append((first, after - 1, value))
        return runs

    def describe(self, k: int) -> str:
        """In words, for a release whose requests ask ``k`` by default."""
        runs = self.runs(k, max([1, *(count for count, _ in self.steps)]))
        if len(runs) == 1:
            return f"K={runs[0][2]} at any load"
        return ", ".join(f"K={value} from {first} in flight" for first, _, value in runs)
