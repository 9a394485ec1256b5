"""The prompts a distillation pool (:mod:`specbuild.drafts.distill_prompts`) holds out: every benchmark prompt (the bundled
general and structured sets and the repository's held-out set), and any prompt too similar to one by word trigrams
(:func:`too_similar`)."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from specbuild.bench import BUNDLED

HELDOUT_FILE = Path(__file__).resolve().parents[3] / "benchmarks" / "heldout_prompts.jsonl"  # in a checkout
SIMILAR_WORDS = 3
SIMILAR = 0.5  # word-trigram Jaccard similarity to a benchmark prompt that makes a prompt too similar
CONTAINED = 0.8  # ... or the share of a benchmark prompt's trigrams it contains


@dataclass(frozen=True)
class HeldOut:
    """The word trigrams of every benchmark prompt, and which prompts hold each trigram."""

    trigrams: tuple[frozenset[str], ...]
    index: Mapping[str, tuple[int, ...]]


def benchmark_texts() -> dict[str, list[str]]:
    """The benchmark prompts by set: the bundled ``general`` and ``structured`` workloads and ``heldout``, the
    repository's ``benchmarks/heldout_prompts.jsonl`` (empty in an installed package, which has no copy of it).
    Read as plain JSON lines: a GPU machine's bare environment may lack the pydantic that
    :mod:`specbuild.bench.prompts` needs."""
    bench = resources.files("specbuild.bench")
    texts = {name: bench.joinpath(BUNDLED[name]).read_text(encoding="utf-8") for name in ("general", "structured")}
    texts["heldout"] = HELDOUT_FILE.read_text(encoding="utf-8") if HELDOUT_FILE.is_file() else ""
    return {name: [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]
            for name, text in texts.items()}


@lru_cache(maxsize=1)
def benchmark_prompts() -> HeldOut:
    """Every benchmark prompt's trigrams (:func:`benchmark_texts`), indexed."""
    prompts = [trigrams(prompt) for texts in benchmark_texts().values() for prompt in texts]
    index: dict[str, list[int]] = {}
    for number, grams in enumerate(prompts):
        for gram in grams:
            index.setdefault(gram, []).append(number)
    return HeldOut(tuple(prompts), {gram: tuple(numbers) for gram, numbers in index.items()})


def too_similar(prompt: str, held_out: HeldOut) -> bool:
    """Whether ``prompt`` nearly equals a benchmark prompt (:data:`SIMILAR`) or contains most of one
    (:data:`CONTAINED`): a template that is a benchmark prompt with one word changed is held out too."""
    mine = trigrams(prompt)
    shared = Counter(number for gram in mine for number in held_out.index.get(gram, ()))
    return any(count >= min(SIMILAR * len(mine | held_out.trigrams[number]), CONTAINED * len(held_out.trigrams[number]))
               for number, count in shared.items())


def trigrams(text: str) -> frozenset[str]:
    words = re.sub(r"[^\w\s]", " ", text.lower()).split()
    return frozenset(" ".join(words[i:i + SIMILAR_WORDS]) for i in range(max(1, len(words) - SIMILAR_WORDS + 1)))
