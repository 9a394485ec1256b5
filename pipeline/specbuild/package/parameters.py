"""Typed model-config ``parameters``: one dataclass per model, rendered and parsed by the same code.

Triton hands a model its ``config.pbtxt`` parameters as strings. A :class:`ModelParameters` subclass names
each key once, as a field with a type and (maybe) a default; :meth:`~ModelParameters.as_parameters` renders
it for the repository and :meth:`~ModelParameters.from_parameters` parses it back inside the model, so the
two sides cannot disagree. Parsing follows the rules of TensorRT-LLM's ``tensorrtllm`` backend
(``triton_backend/inflight_batcher_llm/src/model_state.cc``, ``GetParameter<T>``), which the engine models
must match: a missing key is an error ("Cannot find parameter with name: ...") unless the field is marked
optional, booleans are ``true/True/TRUE/1`` or ``false/False/FALSE/0``, id lists are comma-separated; an
optional key the backend cannot parse falls back to its default with a warning.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar

from specbuild.errors import SpecError

OPTIONAL = {"optional": True}  # field metadata: the backend reads this key inside a try/catch (a default applies)
TRUE_WORDS = ("true", "True", "TRUE", "1")
FALSE_WORDS = ("false", "False", "FALSE", "0")

P = TypeVar("P", bound="ModelParameters")


class ParameterError(SpecError):
    """A model's parameters are missing or malformed: the model must not load."""


@dataclasses.dataclass(frozen=True)
class ModelParameters:
    """Base of a model's typed parameters; subclasses are frozen dataclasses whose fields are the keys."""

    MODEL: ClassVar[str] = "model"  # who reads these parameters, for error messages

    def as_parameters(self) -> dict[str, str]:
        """``{key: string_value}`` for ``config.pbtxt``; optional fields left at None are omitted."""
        rendered = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if value is not None:
                rendered[item.name] = _render(value)
        return rendered

    @classmethod
    def from_parameters(cls: type[P], values: Mapping[str, str], warnings: list[str] | None = None) -> P:
        """Parse a model's ``{key: string_value}`` parameters; extra keys are ignored, as Triton's backends do.

        Raises :class:`ParameterError` for a missing or unparsable required key; an unparsable optional one
        takes its default and adds a line to ``warnings``.
        """
        hints = typing.get_type_hints(cls)
        parsed: dict[str, Any] = {}
        for item in dataclasses.fields(cls):
            optional = item.metadata.get("optional", False)
            if item.name not in values:
                if optional:
                    continue
                raise ParameterError(f"{cls.MODEL}: Cannot find parameter with name: {item.name}",
                                     "re-package the release (specbuild package) so every parameter is rendered")
            try:
                parsed[item.name] = _parse(values[item.name], hints[item.name])
            except ValueError as exc:
                if not optional:
                    raise ParameterError(f"{cls.MODEL}: parameter {item.name}={values[item.name]!r}: {exc}",
                                         "re-package the release (specbuild package)") from None
                if warnings is not None:
                    warnings.append(f"{cls.MODEL}: parameter {item.name}={values[item.name]!r} ignored ({exc}); "
                                    "using the default")
        try:
            return cls(**parsed)
        except (TypeError, ValueError) as exc:
            raise ParameterError(f"{cls.MODEL}: {exc}", "re-package the release (specbuild package)") from None


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(_render(item) for item in value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _parse(text: str, annotation: Any) -> Any:
    """``text`` as the annotated type: str, int, float, bool, a Literal of strings, ``tuple[int, ...]`` (or of
    floats), or
    any of those ``| None`` (an absent key; a present one must parse)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return _parse(text, next(arg for arg in typing.get_args(annotation) if arg is not type(None)))
    if origin is Literal:
        allowed = typing.get_args(annotation)
        if text not in allowed:
            raise ValueError(f"must be one of {', '.join(map(str, allowed))}")
        return text
    if origin is tuple:
        item_type = typing.get_args(annotation)[0]
        if not text.strip():
            raise ValueError(f"must be a comma-separated list of {item_type.__name__}s")
        return tuple(item_type(item) for item in text.split(","))
    if annotation is bool:
        if text in TRUE_WORDS:
            return True
        if text in FALSE_WORDS:
            return False
        raise ValueError(f"Cannot convert {text} to a boolean.")
    if annotation in (int, float):
        return annotation(text)
    if annotation is str:
        return text
    raise TypeError(f"unsupported parameter type {annotation!r}")
