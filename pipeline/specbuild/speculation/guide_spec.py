"""A request's guide as NVIDIA's two inputs name it (``guided_decoding_guide_type``, ``guided_decoding_guide``),
checked by the public rules before anything runs: the value the loop, the orchestrator and packaging share (no
torch, no xgrammar: compiling and matching are :mod:`specbuild.speculation.guide`'s).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specbuild.errors import RequestError

# NVIDIA's guided_decoding_guide_type values (the tensorrtllm backend's GuidedDecodingParams::GuideType):
# json is any JSON (xgrammar's builtin grammar, no guide), the others compile their guide.
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
GUIDE_INPUT, TYPE_INPUT = "guided_decoding_guide", "guided_decoding_guide_type"
MAX_GUIDE_BYTES = 16 * 1024  # refused before compiling: a schema's or grammar's size bounds most of its cost


@dataclass(frozen=True)
class GuideSpec:
    """A guide as a client sent it, checked: its type and its text (empty for ``json``)."""

    type: str
    text: str = ""

    @classmethod
    def parse(cls, guide_type: str | None, guide: str | None) -> GuideSpec | None:
        """NVIDIA's two inputs as a guide, or None without either; what cannot be one is a
        :class:`~specbuild.errors.RequestError` naming the input."""
        guide_type = (guide_type or "").strip()
        guide = guide or ""
        if not guide_type:
            if guide:
                raise RequestError(f"{GUIDE_INPUT} was sent without {TYPE_INPUT}",
                                   f"send {TYPE_INPUT} too: one of {', '.join(GUIDE_TYPES)}")
            return None
        if guide_type not in GUIDE_TYPES:
            raise RequestError(f"{TYPE_INPUT} {guide_type!r} is not a guide type",
                               f"use one of {', '.join(GUIDE_TYPES)}")
        if guide_type == "json":
            if guide:
                raise RequestError(f"{TYPE_INPUT} json takes no {GUIDE_INPUT} (it allows any JSON)",
                                   f"send {TYPE_INPUT} json_schema to hold the answer to a schema")
            return cls("json")
        if not guide.strip():
            raise RequestError(f"{TYPE_INPUT} {guide_type} needs a {GUIDE_INPUT}, got none",
                               f"send the {guide_type.replace('_', ' ')} as {GUIDE_INPUT}")
        size = len(guide.encode("utf-8"))
        if size > MAX_GUIDE_BYTES:
            raise RequestError(f"{GUIDE_INPUT} is {size} bytes, more than the {MAX_GUIDE_BYTES} a guide may have",
                               "send a smaller schema, regular expression or grammar")
        if guide_type == "json_schema":
            try:
                schema = json.loads(guide)
            except json.JSONDecodeError as exc:
                raise RequestError(f"{GUIDE_INPUT} is not a JSON schema: {exc}", "send the schema as JSON") from None
            if not isinstance(schema, (dict, bool)):
                raise RequestError(f"{GUIDE_INPUT} is not a JSON schema: a {type(schema).__name__}, not an object",
                                   "send the schema as a JSON object")
        return cls(guide_type, guide)
