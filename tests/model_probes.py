"""What a test needs from the trained tiny model, chosen by what that model does.

The tiny pair trains at set-up, and another CPU's kernels (or ``SPECBUILD_TINY_SEED``) train another model: a test
never assumes what one machine's model says. It picks its prompt, its stop word or its pair of inputs from
candidates by the model's own answers, and fails naming what it looked for when no candidate fits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import pytest

T = TypeVar("T")

# Prompts of the kinds the tiny model was trained on (Python source), for tests that pick one by its answer.
CODE_PROMPTS = ("import os\nimport sys\n\n", "def main():\n    ", "class Config:\n    def __init__(self",
                "for name in sorted(", "    return self.", "if __name__ == ", "        raise ValueError(",
                "    def __repr__(self):\n        return ")


def first(candidates: Iterable[T], fits: Callable[[T], bool], need: str) -> T:
    """The first candidate that ``fits``; fails the test naming ``need`` when none does (a model that answers
    so little would not exercise the test anyway)."""
    tried = []
    for candidate in candidates:
        if fits(candidate):
            return candidate
        tried.append(candidate)
    pytest.fail(f"no candidate gives {need} with this tiny model (tried {tried!r}); rebuild the pair or add "
                "candidates")


def one_token_word(tokens: Sequence[int], tokenizer, start: int = 1) -> int | None:
    """The first token at or after ``start`` whose text is a word of its own: not blank, and encoded again it is
    that one token (so a stop word of that text ends the answer right after it); None if there is none."""
    for token in tokens[start:]:
        text = tokenizer.decode([token])
        if text.strip() and tokenizer.encode(text, add_special_tokens=False) == [token]:
            return token
    return None
