"""Benchmark prompts: a workload bundled with specbuild, or a user's JSONL file.

The bundled workloads (written for this project; real text, since random tokens overstate speculative
throughput):

* ``general`` (``bundled_prompts.jsonl``): chat, code, summarization, reasoning and extraction prompts of varied
  length;
* ``structured`` (``structured_prompts.jsonl``): prompts whose answer is JSON, each with its JSON schema; each is
  sent twice, held to its schema (category ``<kind>+schema``) and unconstrained (``<kind>``), interleaved, so one
  run measures what the grammar does to acceptance and speed;
* ``long`` (built at load, :mod:`specbuild.bench.long_prompts`): prompts of 1k-2k tokens from text every machine has,
  grounded QA over long passages, long multi-turn chats and whole-file code edits.

Each line is ``{"category": ..., "prompt": ...}``, optionally with ``"json_schema": {...}`` (the request is then
guided decoding, NVIDIA's ``json_schema`` guide type).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specbuild.bench import BUNDLED
from specbuild.bench.long_prompts import long_prompts
from specbuild.errors import UsageError

Workload = Literal["general", "structured", "long"]
CATEGORIES = ("chat", "code", "summarization", "reasoning", "extraction")
SCHEMA_SUFFIX = "+schema"  # the category of a structured prompt sent with its schema


class Prompt(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    category: str = Field("custom", min_length=1)
    prompt: str = Field(min_length=1)
    json_schema: dict[str, Any] | None = None

    @property
    def guide(self) -> dict[str, str]:
        """The request's guided decoding inputs: its schema, or none."""
        if self.json_schema is None:
            return {}
        return {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": json.dumps(self.json_schema)}


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


def load_prompts(path: str | Path | None = None, *, workload: Workload = "general",
                 categories: Sequence[str] | None = None, limit: int | None = None) -> list[Prompt]:
    """The bundled ``workload`` (``path`` None) or a user's JSONL, optionally filtered by category and cut to
    ``limit``, taken round-robin across categories so a short run still sees every kind of prompt; the structured
    workload's prompts each twice, with their schema and without (``limit`` counts the pairs)."""
    if path is None and workload == "long":
        prompts = [Prompt(category=kind, prompt=text) for kind, text in long_prompts()]
    elif path is None:
        name = BUNDLED[workload]
        prompts = parse_jsonl(resources.files(__package__).joinpath(name).read_text(encoding="utf-8"),
                              f"bundled {name}")
    elif workload != "general":
        raise UsageError(f"the {workload} workload is bundled, and a prompt file was given too",
                         "give --prompts FILE (its lines may carry a json_schema each) or --workload, not both")
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
    ordered = ordered[:limit] if limit is not None else ordered
    return [sent for p in ordered for sent in with_and_without_schema(p)] if workload == "structured" else ordered


def with_and_without_schema(prompt: Prompt) -> tuple[Prompt, Prompt]:
    """``prompt`` held to its schema and unconstrained, told apart by their categories."""
    return (prompt.model_copy(update={"category": prompt.category + SCHEMA_SUFFIX}),
            prompt.model_copy(update={"json_schema": None}))


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
