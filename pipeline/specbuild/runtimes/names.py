"""The runtimes by name, in the registry's order: a spec's ``runtime`` is one of them, or ``auto``.

It imports nothing of specbuild, so the spec names the runtimes without importing them (which would import the
spec back); each runtime class takes its name from here, and :mod:`specbuild.runtimes.registry` holds one class
per name.
"""

TORCH = "torch"
TENSORRT_LLM = "tensorrt-llm"
TENSORRT_LLM_LLMAPI = "tensorrt-llm-llmapi"
RUNTIME_NAMES = (TORCH, TENSORRT_LLM, TENSORRT_LLM_LLMAPI)
