"""Where a build spec's values come from: the spec file (YAML), dotted ``KEY=VALUE`` overrides, paths taken relative
to the file's folder or the working directory; and a validation error told as one line per value, naming where it
came from. :func:`specbuild.spec.load_spec` puts them together."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from specbuild.errors import SpecError


def describe_errors(error: ValidationError, origin: Callable[[tuple[Any, ...]], str | None]) -> str:
    """One line per bad value: its dotted path, the problem, and where the value came from."""
    lines = ["invalid build spec:"]
    for item in error.errors():
        path = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; `specbuild init` writes every key with a comment)"
        elif item["type"] == "missing":
            message = "required field is missing"
        where = origin(tuple(item["loc"]))
        lines.append(f"  {path}: {message}" + (f" (from {where})" if where else ""))
    return "\n".join(lines)


def value_origin(loc: tuple[Any, ...], file_name: str | None, file_data: dict[str, Any],
                  override_sources: Mapping[str, str]) -> str | None:
    """Where the value(s) at ``loc`` came from: the spec file, the overrides that touch it, both, or None
    (a default)."""
    dotted = ".".join(str(part) for part in loc)
    touching = [source for key, source in override_sources.items()
                if key == dotted or key.startswith(dotted + ".") or dotted.startswith(key + ".")]
    replaced = any(key == dotted or dotted.startswith(key + ".") for key in override_sources)
    node: Any = file_data
    for part in loc:
        node = node.get(part) if isinstance(node, dict) else None
    from_file = [file_name] if file_name and node is not None and not replaced else []
    return " and ".join(from_file + touching) or None


def parse_override(assignment: str) -> tuple[str, Any]:
    """``"speculation.max_draft_len=8"`` -> ``("speculation.max_draft_len", 8)`` (value parsed as YAML)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise SpecError(f"override {assignment!r} is not KEY=VALUE", "write it as e.g. --set limits.max_seq_len=4096")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except (yaml.YAMLError, RecursionError):  # deeply nested brackets exhaust the YAML composer's recursion
        value = raw
    return key.strip(), value


def apply_override(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(f"cannot set {dotted!r}: {part!r} is not a section", "check the key's path")
        node = child
    node[parts[-1]] = value


def read_spec_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"spec file {str(path)!r} does not exist", "run `specbuild init` to write a starter spec")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SpecError(f"spec file {str(path)!r} is not valid YAML: {exc}", "fix the file's syntax") from None
    except RecursionError:
        raise SpecError(f"spec file {str(path)!r} nests too deeply to be a build spec",
                        "write the spec as `specbuild init` does (a few levels of keys)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"spec file {str(path)!r} must hold a mapping at the top level", "see `specbuild init`")
    return data


def resolve_relative_paths(data: dict[str, Any], root: Path) -> None:
    for role in ("target", "draft"):
        model = data.get(role)
        if isinstance(model, dict) and isinstance(model.get("checkpoint"), str):
            model["checkpoint"] = _resolved(f"{role}.checkpoint", model["checkpoint"], root)
    outputs = data.get("outputs")
    if isinstance(outputs, dict):
        for key, value in outputs.items():
            if isinstance(value, str):
                outputs[key] = _resolved(f"outputs.{key}", value, root)


def _resolved(key: str, path: str, root: Path) -> str:
    """``path`` from ``root``, absolute ("" stays empty: the field's own rule refuses it)."""
    if "\0" in path:  # the operating system refuses it: no file is named so
        raise SpecError(f"{key}: a path cannot contain a NUL character ({path!r})", f"set {key} to a folder's path")
    return str((root / path).resolve()) if path else ""
