"""What both TensorRT-LLM runtimes share: TensorRT-LLM as the NGC image holds it (the installed package, the
dtypes it runs, its token budget per step).

Imported by :mod:`specbuild.runtimes.tensorrt_llm` (engines) and :mod:`specbuild.runtimes.tensorrt_llm_llmapi`
(the LLM API), and by the memory plan, which sizes activations by TensorRT-LLM's step budget.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from specbuild.errors import CheckpointError, SpecError
from specbuild.runtimes.names import TENSORRT_LLM
from specbuild.spec import Role

EngineDtype = Literal["float16", "bfloat16"]
MAX_NUM_TOKENS = 8192  # TensorRT-LLM's default max_num_tokens: the most tokens one step of an engine takes


def resolve_dtype(requested: str, role: Role, checkpoint_dtype: str | None, *,
                  runtime: str = TENSORRT_LLM) -> EngineDtype:
    """The engine dtype: the spec's, or for ``auto`` the checkpoint's ``torch_dtype``.

    ``auto`` follows ``convert_checkpoint.py --dtype auto``: a float32 (or unrecorded) checkpoint becomes
    float16. float32 is refused: TensorRT-LLM runs fp16/bf16 models only here.
    """
    if requested == "float32":
        raise SpecError(
            f"{role}.dtype is float32, which the {runtime} runtime does not run (fp16/bf16 only)",
            f"set {role}.dtype to bfloat16, float16 or auto, or use --runtime torch for float32",
        )
    if requested != "auto":
        return requested
    found = (checkpoint_dtype or "float32").removeprefix("torch.")
    if found in ("float16", "bfloat16"):
        return found
    if found == "float32":
        return "float16"
    raise CheckpointError(
        f"the {role} checkpoint's config.json records torch_dtype {checkpoint_dtype!r}, which is not a float type",
        f"set {role}.dtype to bfloat16 or float16 explicitly",
    )


def installed_package_dir() -> Path | None:
    """The folder of the installed ``tensorrt_llm`` package, found without importing it (an import loads CUDA)."""
    import importlib.util

    spec = importlib.util.find_spec("tensorrt_llm")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None
