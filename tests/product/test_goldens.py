"""What a user sees, pinned: every rendered ``config.pbtxt`` (each runtime), the OpenAI-compatible API's OpenAPI
schema, the spec's YAML keys and JSON schema, ``specbuild init``'s starter spec and every command's ``--help``.

A change to any of them shows here as a diff against ``tests/data/goldens/``; a deliberate one is written with
``SPECBUILD_UPDATE_GOLDENS=1`` and committed with the change that makes it. JSON documents are compared with their
keys sorted: the order of a schema's properties carries no meaning.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from locations import DATA

GOLDENS = DATA / "goldens"
UPDATE = os.environ.get("SPECBUILD_UPDATE_GOLDENS") == "1"


def _check(name: str, text: str) -> None:
    path = GOLDENS / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"no golden {name}: write it with SPECBUILD_UPDATE_GOLDENS=1"
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from its golden"


def _json(document: object) -> str:
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


@pytest.fixture(scope="module")
def releases(checkpoints, tmp_path_factory) -> dict[str, Path]:
    """The factory pair's repository for every runtime: {runtime: repository folder}."""
    from checkpoint_factory import package_gpu_release, package_llmapi_release, release_spec
    from specbuild import compiler
    from specbuild.runtimes.names import RUNTIME_NAMES

    makers = {"torch": lambda root: compiler.run(release_spec(checkpoints, root, "torch"), json_mode=True),
              "tensorrt-llm": lambda root: package_gpu_release(checkpoints, root),
              "tensorrt-llm-llmapi": lambda root: package_llmapi_release(checkpoints, root)}
    assert set(makers) == set(RUNTIME_NAMES), "a runtime without its goldens"
    return {runtime: Path(make(tmp_path_factory.mktemp(runtime)).repository) for runtime, make in makers.items()}


def test_rendered_configs(releases: dict[str, Path]) -> None:
    for runtime, repository in releases.items():
        root = str(repository.parent.parent)
        for config in sorted(repository.glob("*/config.pbtxt")):
            text = config.read_text(encoding="utf-8").replace(root, "<root>")
            _check(f"config/{runtime}/{config.parent.name}.pbtxt", text)


def test_openapi_schema() -> None:
    from specbuild.serve.openai_api import create_app

    _check("openapi.json", _json(create_app(client=None, model="golden").openapi()))  # type: ignore[arg-type]


def _keys(model: type, prefix: str = "") -> list[str]:
    from pydantic import BaseModel

    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys.extend(_keys(field.annotation, f"{prefix}{name}."))
    return keys


def test_spec_keys_and_schema() -> None:
    from specbuild.spec import BuildSpec

    _check("spec-keys.txt", "\n".join(_keys(BuildSpec)) + "\n")
    _check("spec-schema.json", _json(BuildSpec.model_json_schema()))


@pytest.mark.parametrize("runtime", ["auto", "torch", "tensorrt-llm", "tensorrt-llm-llmapi"])
def test_starter_spec(runtime: str, tmp_path: Path) -> None:
    from specbuild.starter import make_starter

    starter = make_starter(None, None, tmp_path / "specbuild.yaml", placeholders=("/models/target", "/models/draft"),
                           runtime=runtime)  # type: ignore[arg-type]
    _check(f"starter/{runtime}.yaml", starter.text)


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, command in sorted(group.commands.items()):
        found.extend(_commands(command, (*path, name)) if isinstance(command, click.Group) else [(*path, name)])
    return found


def test_every_help() -> None:
    from specbuild.cli import main

    for path in _commands(main):
        result = CliRunner().invoke(main, [*path, "--help"], prog_name="specbuild", terminal_width=110)
        assert result.exit_code == 0, result.output
        _check(f"help/{'-'.join(path) or 'specbuild'}.txt", result.output)
