"""How a ``tensorrt-llm-llmapi`` release starts in the NGC image: the checkpoints mounted where ``model.yaml`` names
them."""

from __future__ import annotations

from specbuild.spec import BuildSpec, Role


def container_checkpoint(spec: BuildSpec, role: Role) -> str:
    """Where the checkpoint of ``role`` is mounted inside the container (what ``model.yaml`` names)."""
    return f"{spec.triton.checkpoint_mount.rstrip('/')}/{role}"
