"""Benchmark prompts: the set bundled with specbuild, or a user's JSONL file.

The bundled set (``bundled_prompts.jsonl``, written for this project) holds chat, code, summarization, reasoning
and extraction prompts of varied length: real text, since random tokens overstate speculative throughput.
Each line is ``{"category": ..., "prompt": ...}``.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specbuild.errors import UsageError

BUNDLED = "bundled_prompts.jsonl"
CATEGORIES = ("chat", "code", "summarization", "reasoning", "extraction")


class Prompt(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    category: str = Field("custom", min_length=1)
    prompt: str = Field(min_length=1)


def parse_jsonl(text: str, source: str) -> list[Prompt]:
    """Prompts from JSONL text; a bad line is a :class:`UsageError` naming its line number."""
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            prompts.append(Prompt.model_validate(json.loads(line)))
        except (ValueError, ValidationError) as exc:
            detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            raise UsageError(f"{source} line {number} is not a prompt record: {detail}",
                             'write one JSON object per line: {"category": "chat", "prompt": "..."}') from None
    if not prompts:
        raise UsageError(f"{source} holds no prompts", "add at least one JSON line with a \"prompt\" field")
    return prompts


def load_prompts(path: str | Path | None = None, *, categories: Sequence[str] | None = None,
                 limit: int | None = None) -> list[Prompt]:
    """The bundled prompts (``path`` None) or a user's JSONL, optionally filtered by category and cut to
    ``limit``, taken round-robin across categories so a short run still sees every kind of prompt."""
    if path is None:
        text = resources.files(__package__).joinpath(BUNDLED).read_text(encoding="utf-8")
        prompts = parse_jsonl(text, f"bundled {BUNDLED}")
    else:
        file = Path(path)
        if not file.is_file():
            raise UsageError(f"prompt file {path} does not exist", "pass a JSONL file, or omit it for the bundled set")
        prompts = parse_jsonl(file.read_text(encoding="utf-8"), str(path))
    if categories:
        prompts = [p for p in prompts if p.category in categories]
        if not prompts:
            raise UsageError(f"no prompts in the categories {', '.join(categories)}",
                             f"choose among the file's categories (bundled: {', '.join(CATEGORIES)})")
    ordered = interleave(prompts)
    return ordered[:limit] if limit is not None else ordered


def interleave(prompts: Sequence[Prompt]) -> list[Prompt]:
    """Round-robin over categories, keeping each category's order."""
    by_category: dict[str, list[Prompt]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    queues = list(by_category.values())
    ordered: list[Prompt] = []
    for index in range(max(len(q) for q in queues)):
        ordered.extend(q[index] for q in queues if index < len(q))
    return ordered
