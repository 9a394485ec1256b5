"""The tensorrt-llm runtime's part of the build spec: its ``launch`` section (processes and GPUs) and its key of
the ``triton`` section (where the engines are mounted)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from specbuild.spec_section import ContainerPath, LoadDefault, RuntimeSettings, Section, SpecSection, TritonKey


class LaunchSpec(SpecSection):
    """How the TensorRT-LLM engines are laid out over processes and GPUs (tensorrt-llm runtime). Compiled into
    the engine configs (``gpu_device_ids``, ``participant_ids``, ``speculative_decoding_fast_logits``); ``serve``
    and ``deploy`` launch what the release was compiled for."""

    mode: Literal["auto", "single", "leader", "orchestrator"] = Field(
        "auto", description="auto: single when both models have one rank, else TensorRT-LLM's orchestrator mode "
        "(required with tensor parallelism for two models)")
    placement: Literal["shared", "separate"] = Field(
        "shared", description="shared: the draft on the target's first GPU(s); separate: GPUs of its own")
    fast_logits: bool = Field(False, description="pass draft logits GPU to GPU (orchestrator mode, no spawning; "
                              "draft-logits acceptance)")

    def check_spec(self, spec: BaseModel) -> None:
        acceptance = spec.speculation.acceptance  # type: ignore[attr-defined]
        if self.fast_logits and acceptance != "draft-logits":
            raise ValueError("launch.fast_logits passes the draft's logits to the target, but speculation.acceptance "
                             f"is {acceptance!r}, which never sends them; set acceptance: draft-logits or turn fast "
                             "logits off")


# On a GPU, verification is nearly free until the batch fills the GPU: NVIDIA measures draft-target at about 2x at
# batch 1 and about 1x at batch 16 (docs/benchmarks.md).
TENSORRT_LLM_LOAD_DEFAULT = LoadDefault("TensorRT-LLM", 16, "where NVIDIA measures draft-target at about 1x")

TENSORRT_LLM_SETTINGS = RuntimeSettings(
    summary="TensorRT-LLM 1.2.x engines on Triton's tensorrtllm backend (CUDA GPU, NGC image)",
    auto_label="GPU engines",
    auto_priority=20,
    load_default=TENSORRT_LLM_LOAD_DEFAULT,
    sections={"launch": Section(LaunchSpec, "tensorrt-llm: processes and GPUs, compiled into the release")},
    triton={"engine_mount": TritonKey(ContainerPath, Field("/engines", description="where engines are mounted inside "
                                                           "the container"), before="repository_mount")},
)
