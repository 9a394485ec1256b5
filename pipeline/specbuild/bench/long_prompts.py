"""The ``long`` workload: prompts of one to two thousand tokens, where prompt lookup should pay most, built from text
every machine has (:mod:`specbuild.bench.passages`: the standard library's docstrings first, then the installed
packages'; the standard library's own source files), so it needs no download and a machine always builds the same
prompts (another Python version builds others: compare figures on one machine).

Kinds (the bench's categories), :data:`PER_KIND` prompts each, sized in characters at :data:`CHARS_PER_TOKEN`:

* ``qa-1k``, ``qa-2k``: grounded QA over numbered passages of about 1k and 2k tokens; the question names a passage
  by its opening words and asks for it word for word, then one sentence on it (the answer copies from the prompt);
* ``chat-long``: a multi-turn chat of about 1.5k tokens, the user sharing notes and the assistant answering with
  their key sentence, ending on a question about an early note;
* ``code-edit``: a whole standard-library module (about 1.2k-1.8k tokens), to be returned entire with one edit.
"""

from __future__ import annotations

import sysconfig
from functools import lru_cache
from pathlib import Path

CHARS_PER_TOKEN = 4  # English prose and Python in a BPE vocabulary of about 50k (SmolLM2's: 3.9-4.3 on these texts)
QA_TOKENS = {"qa-1k": 1000, "qa-2k": 2000}
CHAT_TOKENS = 1500
CODE_TOKENS = (1200, 1800)  # a module's size, in tokens, to be returned whole
PER_KIND = 2
KINDS = (*QA_TOKENS, "chat-long", "code-edit")


def long_prompts(per_kind: int = PER_KIND) -> list[tuple[str, str]]:
    """``per_kind`` prompts of each kind in :data:`KINDS`, as (kind, text), in kind order (the bench interleaves
    them and makes them :class:`~specbuild.bench.prompts.Prompt` records)."""
    from specbuild.bench.passages import local_passages

    texts = [passage.text for passage in local_passages()]
    prompts: list[tuple[str, str]] = []
    start = 0
    for kind, tokens in QA_TOKENS.items():
        for _ in range(per_kind):
            document, start = _take(texts, start, tokens * CHARS_PER_TOKEN)
            prompts.append((kind, _grounded_question(document)))
    for _ in range(per_kind):
        chat, start = _chat(texts, start, CHAT_TOKENS * CHARS_PER_TOKEN)
        prompts.append(("chat-long", chat))
    for path in _modules()[:per_kind]:
        prompts.append(("code-edit", _code_edit(path)))
    return prompts


def _take(texts: list[str], start: int, chars: int) -> tuple[list[str], int]:
    """Consecutive texts from ``start`` (wrapping around) until they hold ``chars`` characters; the next start."""
    taken: list[str] = []
    index = start
    while sum(map(len, taken)) < chars and len(taken) < len(texts):
        taken.append(texts[index % len(texts)])
        index += 1
    return taken, index % len(texts)


def _opening(text: str, words: int = 8) -> str:
    return " ".join(text.split()[:words])


def _grounded_question(passages: list[str]) -> str:
    numbered = "\n\n".join(f"[{number}] {text}" for number, text in enumerate(passages, start=1))
    asked = passages[len(passages) // 2]
    return (f"Answer using only the passages below.\n\n{numbered}\n\n"
            f"Question: which passage begins with \"{_opening(asked)}\"? Give its number, repeat the passage word "
            "for word, then say in one sentence what it describes.")


def _chat(texts: list[str], start: int, chars: int) -> tuple[str, int]:
    """A chat of about ``chars`` characters over the notes from ``start`` (wrapping around); the next start."""
    turns: list[str] = []
    index = start
    while sum(map(len, turns)) < chars:
        note, number = texts[index % len(texts)], len(turns) // 2 + 1
        key = note.split(". ")[0].rstrip(".") + "."
        turns += [f"User: Here is note {number}:\n{note}\nWhat is its key sentence?",
                  f"Assistant: The key sentence of note {number} is: \"{key}\""]
        index += 1
    question = "User: Repeat note 2 word for word, and tell me how it relates to note 1.\n\nAssistant:"
    return "\n\n".join([*turns, question]), index % len(texts)


@lru_cache(maxsize=1)
def _modules() -> tuple[Path, ...]:
    """The standard library's top-level modules of :data:`CODE_TOKENS` size, by name."""
    low, high = (tokens * CHARS_PER_TOKEN for tokens in CODE_TOKENS)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return tuple(path for path in sorted(stdlib.glob("*.py"))
                 if not path.name.startswith("_") and low <= path.stat().st_size <= high)


def _code_edit(path: Path) -> str:
    source = path.read_text(encoding="utf-8")
    # No opening fence after the instruction: in the user's turn of a chat template it does not start the answer, and
    # the demo target took it as the whole of one (one token: 0.9x of K=0 measured nothing but a request's overhead).
    return (f"Here is the whole file {path.name}:\n\n```python\n{source}```\n\n"
            "Return the whole file in one Python code block, unchanged except that every function and method has a "
            "one-line docstring where it lacks one.")
