"""The build spec as the commented YAML file ``specbuild init`` writes: every field under its description, so the file
documents itself and cannot drift from :class:`~specbuild.spec.BuildSpec`."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from specbuild.spec import BuildSpec, ModelSpec, RuntimeChoice, SpeculationSpec

SPEC_HEADER = ("specbuild build spec. Every key is optional except target.checkpoint and draft.checkpoint; flags "
               "override these values (e.g. --set speculation.num_draft_tokens=3). Relative paths are taken from "
               "this file's folder.")
COMMENT_WIDTH = 110


def yaml_scalar(value: Any) -> str:
    """``value`` as one YAML flow scalar: ``null``, ``true``, ``8``, ``models/t``, quoted where YAML needs it."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def render_spec(spec: BuildSpec, notes: Mapping[str, str] | None = None) -> str:
    """``spec`` as YAML holding every field of :class:`BuildSpec`, each under its description (and allowed
    values) as a comment, so the file documents itself and cannot drift from the model. ``notes`` adds
    comments by dotted key (e.g. why ``specbuild init`` chose a setting). The text parses back to ``spec``."""
    lines = _comment(SPEC_HEADER, "")
    _render_fields(spec, "", notes or {}, lines)
    return "\n".join(lines) + "\n"


def _render_fields(model: BaseModel, prefix: str, notes: Mapping[str, str], lines: list[str]) -> None:
    indent = "  " * prefix.count(".")
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        if not prefix:
            lines.append("")
        lines.extend(_comment(_describe_field(field), indent))
        if prefix + name in notes:
            lines.extend(_comment(notes[prefix + name], indent))
        if isinstance(value, BaseModel):
            lines.append(f"{indent}{name}:")
            _render_fields(value, f"{prefix}{name}.", notes, lines)
        else:
            lines.append(f"{indent}{name}: {yaml_scalar(value)}")


def _describe_field(field: FieldInfo) -> str:
    choices = get_args(field.annotation) if get_origin(field.annotation) is Literal else ()
    return (field.description or "") + (f" (one of: {', '.join(choices)})" if choices else "")


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, COMMENT_WIDTH - len(indent) - 2)]


def starter_spec(target: str, draft: str, *, name: str = "specbuild", runtime: RuntimeChoice = "auto",
                 speculation: SpeculationSpec | None = None, notes: Mapping[str, str] | None = None) -> str:
    """The commented spec ``specbuild init`` writes (see :func:`render_spec`), with the model defaults except
    for the checkpoints, name, runtime and (when given) the speculation settings."""
    spec = BuildSpec(name=name, runtime=runtime, target=ModelSpec(checkpoint=target), draft=ModelSpec(checkpoint=draft),
                     speculation=speculation or SpeculationSpec())
    return render_spec(spec, notes)
