"""The tensorrt-llm-llmapi runtime's part of the build spec: its key of the ``triton`` section (where the
checkpoints are mounted); no section of its own (it reads TensorRT-LLM's ``launch``, refusing the layouts its
LLM-API model cannot run)."""

from __future__ import annotations

from pydantic import Field

from specbuild.runtimes.tensorrt_llm.settings import TENSORRT_LLM_LOAD_DEFAULT
from specbuild.spec_section import ContainerPath, RuntimeSettings, TritonKey

TENSORRT_LLM_LLMAPI_SETTINGS = RuntimeSettings(
    summary="no engines, TensorRT-LLM's LLM-API model loads the checkpoints (CUDA GPU, NGC image)",
    auto_label="the LLM API",
    auto_priority=10,  # after the engine flow (what the 1.2 images run), before embedded torch
    load_default=TENSORRT_LLM_LOAD_DEFAULT,
    triton={"checkpoint_mount": TritonKey(ContainerPath, Field(
        "/checkpoints", description="tensorrt-llm-llmapi: where the target and draft checkpoints are mounted inside "
        "the container (as <mount>/target, <mount>/draft)"), before="repository_mount")},
)
