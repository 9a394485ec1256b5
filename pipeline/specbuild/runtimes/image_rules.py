"""What specbuild depends on in the Python of the NGC ``tritonserver:<yy.mm>-trtllm-python-py3`` image that builds or
serves a release: the rules whose breach makes a release fail to load or compute other numbers. Every other version
in the image is information (docker/ngc-26.04-python.txt lists what was read, with sources), never a failure.

Standard library and ``packaging`` (which the image has) only, and no specbuild import: docker/check_image_python.py
and the doctor a release ships read this file by path in an image where specbuild is not installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class PackageRule:
    """A package a release needs at versions ``specifier`` allows ('' = present, any version), or ``absent``: a
    package specbuild must never need (its presence is information, not a failure). ``guided_only``: the rule
    holds only for releases that serve guided decoding."""

    name: str
    specifier: str
    why: str
    source: str
    guided_only: bool = False


# The image's Python (/opt/venv-tritonserver): python models and the doctor run on it.
PYTHON = "3.12"
PYTHON_SOURCE = "tensorrtllm_backend r26.04 dockerfile/Dockerfile.triton.trt_llm_backend (the image's venv)"

RULES: tuple[PackageRule, ...] = (
    PackageRule("numpy", "<2",
                "the python backend's stubs and TensorRT-LLM 1.2.x are built against numpy 1.x; the release's python "
                "models exchange numpy arrays with them",
                "TensorRT-LLM requirements.txt at 000867d9 (release/1.2-era): numpy<2; python_backend r24.08-r26.07"),
    PackageRule("transformers", ">=4.57,<5",
                "the release's checkpoints, tokenizer files and chat templates are rehearsed with transformers 4.57 "
                "(tests/product/test_release_image.py, at 4.57.1 and 4.57.3); 5.x reads configs another way (RoPE in "
                "rope_parameters)",
                "TensorRT-LLM requirements.txt at 000867d9 (release/1.2-era): transformers==4.57.1; its 1.2.1 "
                "documentation's release notes: 4.57.3 (docker/ngc-26.04-python.txt)"),
    PackageRule("xgrammar", "",
                "a guided release's tokenizer-info file is read by xgrammar in the backend (guidedDecoder.cpp)",
                "TensorRT-LLM requirements.txt at 000867d9: xgrammar==0.1.25, upgraded in 1.2.1 (release notes, "
                "#12811); tensorrtllm_backend inflight_batcher_llm guided decoding",
                guided_only=True),
)
# What specbuild never needs in the image (NVIDIA's guides pip-install it there by hand).
ABSENT_OK = ("tritonclient",)


def breaches(installed: Mapping[str, str | None], *, guided: bool, python: str | None = None) -> list[str]:
    """Each rule ``installed`` (package -> version, None where missing) breaks, as a sentence naming the package,
    what was found, the rule and why; ``python`` (``"3.12.3"``) is checked against :data:`PYTHON` where given."""
    problems = []
    if python is not None and ".".join(python.split(".")[:2]) != PYTHON:
        problems.append(f"Python is {python}, the image's is {PYTHON} ({PYTHON_SOURCE})")
    for rule in RULES:
        if rule.guided_only and not guided:
            continue
        version = installed.get(rule.name)
        if version is None:
            problems.append(f"{rule.name} is not installed; a release needs {rule.name}{rule.specifier} "
                            f"({rule.why})")
            continue
        try:
            allowed = SpecifierSet(rule.specifier).contains(Version(version), prereleases=True)
        except InvalidVersion:
            allowed = False
        if not allowed:
            problems.append(f"{rule.name} is {version}; a release needs {rule.name}{rule.specifier} ({rule.why})")
    return problems
