"""The runtimes by name, and ``runtime: auto`` resolved to the best one this machine can build with.

Adding a runtime: its folder beside the others (its :class:`~specbuild.runtimes.interface.Runtime` subclass
and what is specific to it), its name in :mod:`specbuild.runtimes.names`, and its class in :data:`RUNTIMES`.
"""

from __future__ import annotations

from specbuild.errors import SpecError
from specbuild.runtimes.interface import Runtime
from specbuild.runtimes.names import RUNTIME_NAMES
from specbuild.runtimes.settings import RUNTIME_SETTINGS
from specbuild.runtimes.tensorrt_llm.runtime import TensorRTLLMRuntime
from specbuild.runtimes.tensorrt_llm_llmapi.runtime import TensorRTLLMLLMAPIRuntime
from specbuild.runtimes.torch.runtime import TorchRuntime
from specbuild.spec import BuildSpec

RUNTIMES: dict[str, Runtime] = {runtime.name: runtime
                                for runtime in (TorchRuntime(), TensorRTLLMRuntime(), TensorRTLLMLLMAPIRuntime())}
if tuple(RUNTIMES) != RUNTIME_NAMES:  # the spec accepts exactly the names registered here
    raise RuntimeError(f"the registry holds {tuple(RUNTIMES)}, specbuild.runtimes.names lists {RUNTIME_NAMES}")
if any(runtime.settings is not RUNTIME_SETTINGS.get(name) for name, runtime in RUNTIMES.items()):
    raise RuntimeError("a runtime's settings are not the ones specbuild.runtimes.settings composes the spec from")


def runtime_for(name: str) -> Runtime:
    """The runtime called ``name`` (a resolved name: ``auto`` is resolved by :func:`resolved`)."""
    try:
        return RUNTIMES[name]
    except KeyError:
        raise SpecError(f"unknown runtime {name!r}", f"choose one of {', '.join(RUNTIMES)}") from None


def best_available() -> str:
    """``runtime: auto``: of the runtimes this machine can build with, the one of highest ``auto_priority``
    (TensorRT-LLM engines, then TensorRT-LLM's LLM API where the engine flow is gone, then embedded torch)."""
    available = [runtime for runtime in RUNTIMES.values() if runtime.available()]
    return max(available, key=lambda runtime: runtime.settings.auto_priority).name


def resolved(spec: BuildSpec) -> BuildSpec:
    """``spec`` with ``runtime: auto`` replaced by the runtime that will really be used."""
    return spec if spec.runtime != "auto" else spec.model_copy(update={"runtime": best_available()})


def runtime_of(spec: BuildSpec) -> Runtime:
    """The runtime ``spec`` is built and served with (``auto`` resolved)."""
    return runtime_for(resolved(spec).runtime)
