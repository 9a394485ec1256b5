"""Each runtime's part of the build spec, by name in the registry's order: what the spec composes its runtime
sections, the ``triton`` keys one runtime reads, its ``runtime`` prose and its load policy's defaults from.

It imports the runtimes' settings modules alone, never the runtimes (which import the spec); each runtime class
exposes its own (:attr:`~specbuild.runtimes.interface.Runtime.settings`), and :mod:`specbuild.runtimes.registry`
checks that they are these.
"""

from __future__ import annotations

from collections.abc import Mapping

from specbuild.runtimes.names import TENSORRT_LLM, TENSORRT_LLM_LLMAPI, TORCH
from specbuild.runtimes.tensorrt_llm.settings import TENSORRT_LLM_SETTINGS
from specbuild.runtimes.tensorrt_llm_llmapi.settings import TENSORRT_LLM_LLMAPI_SETTINGS
from specbuild.runtimes.torch.settings import TORCH_SETTINGS
from specbuild.spec_section import RuntimeSettings, Section, TritonKey

RUNTIME_SETTINGS: Mapping[str, RuntimeSettings] = {
    TORCH: TORCH_SETTINGS, TENSORRT_LLM: TENSORRT_LLM_SETTINGS, TENSORRT_LLM_LLMAPI: TENSORRT_LLM_LLMAPI_SETTINGS}

PREFERRED: tuple[RuntimeSettings, ...] = tuple(sorted(RUNTIME_SETTINGS.values(),
                                                      key=lambda settings: -settings.auto_priority))
"""The runtimes' settings in the order ``runtime: auto`` prefers them."""

RUNTIME_SECTIONS: Mapping[str, Section] = {key: section for settings in PREFERRED
                                           for key, section in settings.sections.items()}
"""The spec's runtime sections by key, those of the runtimes ``auto`` prefers first (as the spec has them)."""

RUNTIME_TRITON_KEYS: Mapping[str, TritonKey] = {key: triton_key for settings in PREFERRED
                                                for key, triton_key in settings.triton.items()}
"""The ``triton`` keys that one runtime reads, in the same order."""
