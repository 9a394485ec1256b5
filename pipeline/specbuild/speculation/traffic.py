"""The kinds of sampling a release's traffic may use, one row each: every measurement of speed (``bench``, ``tune``,
``demo``) runs greedy and sampled cells from these rows, and a release's expected mix of them
(``speculation.traffic`` in the spec) weighs ``tune``'s choice.

Chat traffic is mostly sampled (temperature 0.6-1.0, top-p about 0.9): there a draft is accepted by rejection
sampling, not by token match, and its acceptance, so speculation's gain, differs from the greedy figures. A sampled
request is seeded (its prompt's index plus :data:`SEED_BASE`), so a run can be repeated; its text depends on K and is
not compared with K=0's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

SEED_BASE = 1000  # a sampled request's seed: this plus its prompt's index, the same in every cell of a run


@dataclass(frozen=True)
class SamplingProfile:
    """A kind of traffic: greedy (``temperature`` None) or sampled at ``temperature`` with nucleus ``top_p``."""

    name: str
    temperature: float | None = None
    top_p: float | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature is None

    def request_fields(self, prompt_index: int) -> dict[str, float | int | None]:
        """The sampling inputs of one request (NVIDIA's names; none for greedy, which is what a request without them
        gets)."""
        if self.greedy:
            return {}
        return {"temperature": self.temperature, "top_p": self.top_p, "seed": SEED_BASE + prompt_index}

    def describe(self) -> str:
        return "greedy" if self.greedy else f"temperature {self.temperature}, top-p {self.top_p}, seeded"


SAMPLING_PROFILES: tuple[SamplingProfile, ...] = (
    SamplingProfile("greedy"),
    SamplingProfile("t0.7", temperature=0.7, top_p=0.9),
    SamplingProfile("t1.0", temperature=1.0, top_p=0.9),
)
GREEDY = SAMPLING_PROFILES[0].name
PROFILE_NAMES = tuple(profile.name for profile in SAMPLING_PROFILES)


def sampling_profile(name: str) -> SamplingProfile:
    """The row named ``name``; a ValueError naming the known ones otherwise."""
    for profile in SAMPLING_PROFILES:
        if profile.name == name:
            return profile
    raise ValueError(f"unknown sampling profile {name!r}: choose from {', '.join(PROFILE_NAMES)}")


def describe_profiles(names: Sequence[str] = PROFILE_NAMES) -> str:
    """e.g. ``greedy; t0.7 (temperature 0.7, top-p 0.9, seeded)``."""
    return "; ".join(name if name == GREEDY else f"{name} ({sampling_profile(name).describe()})" for name in names)


def checked_mix(mix: Mapping[str, float]) -> dict[str, float]:
    """A traffic mix ``{profile: share}``: known profiles, shares above 0 summing to 1 (to 0.001), in the table's
    order; a ValueError saying what is wrong otherwise."""
    if not mix:
        raise ValueError("the traffic mix is empty: give at least one profile, e.g. {greedy: 1.0}")
    for name, share in mix.items():
        sampling_profile(name)
        if share <= 0:
            raise ValueError(f"traffic share of {name!r} is {share}: shares are above 0 (leave a profile out instead)")
    total = sum(mix.values())
    if abs(total - 1.0) > 1e-3:
        raise ValueError(f"the traffic shares sum to {total:g}, not 1: e.g. {{greedy: 0.5, t0.7: 0.5}}")
    return {name: float(mix[name]) for name in PROFILE_NAMES if name in mix}


def parse_mix(text: str) -> dict[str, float]:
    """``greedy=0.5,t0.7=0.5`` (the CLI's form) as a checked mix; a bare ``t0.7`` is all of the traffic."""
    mix: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, share = item.partition("=")
        try:
            mix[name.strip()] = float(share) if share else 1.0
        except ValueError:
            raise ValueError(f"traffic share {share!r} of {name!r} is not a number: e.g. greedy=0.5,t0.7=0.5") from None
    return checked_mix(mix)
