"""What the build spec is made of: strict sections, and the part of it each runtime owns.

The spec (:mod:`specbuild.spec`) composes its runtime sections, the ``triton`` keys one runtime reads, its
``runtime`` prose and its load policy's defaults from each runtime's :class:`RuntimeSettings` (:mod:`specbuild.runtimes.settings`), so a runtime's
settings live in its own folder, as TensorRT-LLM keeps one config class per decoding method. This module imports
nothing of specbuild: the runtimes' settings import it without importing the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic.fields import FieldInfo


class SpecSection(BaseModel):
    """A section of the build spec: unknown keys are refused, and values are checked when assigned too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def check_spec(self, spec: BaseModel) -> None:
        """Raise ValueError where this section contradicts the rest of ``spec`` (the build spec holding it)."""


def _absolute_in_container(value: str) -> str:
    if not value.startswith("/") or ".." in Path(value).parts:
        raise ValueError(f"must be an absolute path inside the container without '..', got {value!r}")
    return value


ContainerPath = Annotated[str, AfterValidator(_absolute_in_container)]
"""A path inside the serving container: absolute, without '..'."""


@dataclass(frozen=True)
class TritonKey:
    """A key of the spec's ``triton`` section that one runtime reads: its type, its field, and the key every
    runtime reads that it is written before (None: after all of them)."""

    annotation: Any
    field: FieldInfo
    before: str | None = None


@dataclass(frozen=True)
class Section:
    """A top-level section of the build spec that one runtime reads: its model and its one-line description."""

    model: type[SpecSection]
    description: str


@dataclass(frozen=True)
class LoadDefault:
    """A runtime's default for ``speculation.busy_in_flight``, as the spec's prose names it: ``who`` (a runtime or
    a family of them) and ``why`` (where the number comes from)."""

    who: str
    in_flight: int
    why: str

    def prose(self) -> str:
        return f"{self.who} {self.in_flight}, {self.why}"


@dataclass(frozen=True)
class RuntimeSettings:
    """What one runtime adds to the build spec: how the ``runtime`` key describes it, its rank for ``runtime:
    auto`` (the highest available wins), its load policy's default and the sections only it reads."""

    summary: str  # what the runtime is, after its name in the ``runtime`` key's description
    auto_label: str  # what ``auto`` prefers when it prefers this runtime
    auto_priority: int
    load_default: LoadDefault
    sections: Mapping[str, Section] = field(default_factory=dict)  # by key, in the spec's order
    triton: Mapping[str, TritonKey] = field(default_factory=dict)  # its own keys of the triton section
