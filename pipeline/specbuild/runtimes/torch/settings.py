"""The torch runtime's part of the build spec: its ``torch`` section (device and threads of the engine models) and
its key of the ``triton`` section (instances per engine model)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from specbuild.spec_section import LoadDefault, RuntimeSettings, Section, SpecSection, TritonKey


class TorchSpec(SpecSection):
    """The torch runtime's engine models."""

    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when the server has a GPU")
    target_threads: int = Field(0, ge=0, le=1024, description="intra-op threads of the target's process; 0: "
                                "every core of the host while they are free, one while other work competes for them "
                                "(judged step by step)")
    draft_threads: int = Field(0, ge=0, le=1024, description="the same for the draft's process")


TORCH_SETTINGS = RuntimeSettings(
    summary="HF checkpoints run with PyTorch inside Triton python models (CPU or CUDA)",
    auto_label="torch",
    auto_priority=0,
    # On CPU cores a round's draft and verification compete with the other requests' steps: from 2 in flight, the
    # default release measured no gain (docs/benchmarks.md, "Cheap verification, the load policy and the goal").
    load_default=LoadDefault("torch", 2, "measured on CPU"),
    sections={"torch": Section(TorchSpec, "torch runtime: device and threads of the engine models")},
    triton={"engine_instances": TritonKey(int, Field(1, ge=1, le=64, description="torch runtime: instances per "
                                                     "engine model"))},
)
