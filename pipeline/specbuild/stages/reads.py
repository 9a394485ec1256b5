"""The spec fields a compile step reads, and the fingerprint inputs they make.

A step declares the dotted spec paths it reads (a section stands for all of its fields); its fingerprint hashes
the values at those paths, and the files of each checkpoint whose path it reads, so a changed field runs
exactly the steps that read it again (``tests/stages/test_stage_reads.py`` watches every step of every runtime read
the spec and holds the declarations to what it sees).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from specbuild.spec import ROLES, BuildSpec

# Fields that name an input folder: a step reading one reads the files in it too.
CONTENT_FIELDS: tuple[str, ...] = tuple(f"{role}.checkpoint" for role in ROLES)


def _section(path: str) -> type[BaseModel] | None:
    """The model class of the section at ``path`` ("" is the spec), None for a leaf; KeyError if no such field."""
    model: type[BaseModel] | None = BuildSpec
    for part in filter(None, path.split(".")):
        if model is None:  # a name below a leaf
            raise KeyError(path)
        annotation = model.model_fields[part].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return model


def field_paths(prefix: str = "") -> tuple[str, ...]:
    """Every leaf field at or under ``prefix`` (dotted; "" for the whole spec), in declaration order."""
    model = _section(prefix)
    if model is None:
        return (prefix,)
    base = f"{prefix}." if prefix else ""
    return tuple(path for name in model.model_fields for path in field_paths(base + name))


def expand(paths: Iterable[str]) -> frozenset[str]:
    """The leaf fields ``paths`` name (a section: all of its fields); a path the spec lacks is a ValueError."""
    leaves: set[str] = set()
    for path in paths:
        try:
            leaves.update(field_paths(path))
        except KeyError:
            raise ValueError(f"stage reads {path!r}, which is not a field of the build spec") from None
    return frozenset(leaves)


def field_value(spec: BuildSpec, path: str) -> Any:
    """The value at the leaf field ``path`` of ``spec``, as JSON (a mapping's keys as strings)."""
    return reduce(dict.__getitem__, path.split("."), spec.model_dump(mode="json"))


def spec_inputs(spec: BuildSpec, paths: Iterable[str]) -> dict[str, Any]:
    """A stage's fingerprint inputs for reading ``paths`` of ``spec``: each field's value, and the content of
    every checkpoint folder among them (a Path counts by its files)."""
    leaves = sorted(expand(paths))
    return {"fields": {path: field_value(spec, path) for path in leaves},
            "content": {path: Path(field_value(spec, path)) for path in CONTENT_FIELDS if path in leaves}}
