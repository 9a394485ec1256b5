"""Which fields of a :class:`~specbuild.spec.BuildSpec` code reads, found by watching it run (for tests).

:func:`tracing` watches one spec (and the copies made of it with ``model_copy``): every field read by attribute
and every field a ``model_dump`` of it (or of one of its sections) includes is recorded under its dotted path,
in whichever record is active (:meth:`Tracer.recording`). Objects built from the spec's values (the resolved
limits of a check, a new ``LimitsSpec``) are not the spec and are not watched: what they hold reached the code
through an upstream step's output, which the stage runner hashes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from specbuild.spec import BuildSpec
from specbuild.spec_section import SpecSection


class Tracer:
    """The dotted paths read while :meth:`recording` is active, per record name."""

    def __init__(self, spec: BuildSpec) -> None:
        self.reads: dict[str, set[str]] = {}
        self._paths: dict[int, str] = {}
        self._kept: list[BaseModel] = []  # keeps watched objects alive, so that their ids are not reused
        self._active: set[str] | None = None
        self._watch(spec, "")

    def _watch(self, model: BaseModel, path: str) -> None:
        self._paths[id(model)] = path
        self._kept.append(model)
        for name in type(model).model_fields:
            value = model.__dict__.get(name)
            if isinstance(value, BaseModel):
                self._watch(value, f"{path}{name}.")

    @contextlib.contextmanager
    def recording(self, name: str) -> Iterator[set[str]]:
        record = self.reads.setdefault(name, set())
        previous, self._active = self._active, record
        try:
            yield record
        finally:
            self._active = previous

    def _read(self, model: BaseModel, name: str) -> None:
        prefix = self._paths.get(id(model))
        if prefix is None or self._active is None:
            return
        value = model.__dict__.get(name)
        if not isinstance(value, BaseModel):  # a section counts by the fields read from it
            self._active.add(prefix + name)

    def _dumped(self, model: BaseModel, dump: Any) -> None:
        prefix = self._paths.get(id(model))
        if prefix is None or self._active is None or not isinstance(dump, dict):
            return
        for name, value in dump.items():
            section = model.__dict__.get(name)
            if isinstance(section, BaseModel):
                self._dumped(section, value)
            elif name in type(model).model_fields:
                self._active.add(prefix + name)

    def _copied(self, original: BaseModel, copy: BaseModel) -> None:
        prefix = self._paths.get(id(original))
        if prefix is not None:
            self._paths[id(copy)] = prefix
            self._kept.append(copy)


@contextlib.contextmanager
def tracing(spec: BuildSpec) -> Iterator[Tracer]:
    """Watch ``spec``'s fields while the context is open (the spec's model classes are patched meanwhile)."""
    tracer = Tracer(spec)
    base = SpecSection
    originals = {name: base.__dict__.get(name) for name in ("__getattribute__", "model_dump", "model_copy")}

    def getattribute(self: BaseModel, name: str) -> Any:
        if name in type(self).model_fields:
            tracer._read(self, name)
        return object.__getattribute__(self, name)

    def model_dump(self: BaseModel, **kwargs: Any) -> Any:
        dump = BaseModel.model_dump(self, **kwargs)
        tracer._dumped(self, dump)
        return dump

    def model_copy(self: BaseModel, **kwargs: Any) -> Any:
        copy = BaseModel.model_copy(self, **kwargs)
        tracer._copied(self, copy)
        return copy

    base.__getattribute__ = getattribute  # type: ignore[method-assign]
    base.model_dump = model_dump  # type: ignore[method-assign]
    base.model_copy = model_copy  # type: ignore[method-assign]
    try:
        yield tracer
    finally:
        for name, original in originals.items():
            if original is None:
                delattr(base, name)
            else:
                setattr(base, name, original)
