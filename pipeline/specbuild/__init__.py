"""specbuild: compile a target/draft checkpoint pair into a Triton repository that serves speculative decoding.

The public API, importable from the top level (loaded on first use, so ``import specbuild`` stays light)::

    import specbuild
    spec = specbuild.load_spec("specbuild.yaml", {"speculation.num_draft_tokens": 3})
    report = specbuild.check_pair(spec.target.checkpoint, spec.draft.checkpoint, spec)   # CheckReport
    result = specbuild.compile(spec)                                                      # CompileResult
    assert specbuild.verify(result.repository).ok
    assert specbuild.run_doctor(result.repository).ok   # DoctorReport; image="nvcr.io/...": in that image
    with specbuild.TritonServer(result.repository) as server:
        print(specbuild.SpecbuildClient(server.grpc_url).generate("Hello", 16).text)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "BuildSpec": ("specbuild.spec", "BuildSpec"),
    "load_spec": ("specbuild.spec", "load_spec"),
    "check_pair": ("specbuild.check.pair_report", "check"),
    "CheckReport": ("specbuild.check.pair_report", "CheckReport"),
    "compile": ("specbuild.compiler", "run"),
    "CompileResult": ("specbuild.compiler", "CompileResult"),
    "verify": ("specbuild.package.manifest", "verify"),
    "run_doctor": ("specbuild.doctor", "run_doctor"),
    "DoctorReport": ("specbuild.doctor", "DoctorReport"),
    "TritonServer": ("specbuild.serve.server", "TritonServer"),
    "SpecbuildClient": ("specbuild.serve.client", "SpecbuildClient"),
    "SpecbuildError": ("specbuild.errors", "SpecbuildError"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specbuild' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value
