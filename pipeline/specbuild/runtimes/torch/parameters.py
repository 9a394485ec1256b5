"""The parameters of the torch runtime's engine models: the ``tensorrtllm`` backend's own, read by the same rules
(:class:`~specbuild.package.backend_contract.EngineParameters`), plus the ``torch_*`` keys of this runtime."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from specbuild.package.backend_contract import EngineParameters
from specbuild.package.parameters import OPTIONAL

TorchDevice = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True)
class TorchEngineParameters(EngineParameters):
    """The torch runtime's engine model: the backend's parameters, read by the same rules, plus its own
    ``torch_*`` keys (the ``tensorrtllm`` backend ignores keys it does not know; these are never rendered
    for it)."""

    MODEL: ClassVar[str] = "torch engine model"

    torch_device: TorchDevice = "auto"  # auto: CUDA when available
    # intra-op threads of this model's process; 0: every core the host gives it (runtimes.torch.engine.threads)
    torch_threads: int = 0
    # a draft with a sub-vocabulary head: the sha256 of its engine folder's head_vocabulary.json (None: full head)
    head_vocabulary_sha256: str | None = field(default=None, metadata=OPTIONAL)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.torch_threads < 0:
            raise ValueError(f"torch_threads must be 0 (every core) or more, got {self.torch_threads}")
