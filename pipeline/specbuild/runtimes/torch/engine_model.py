"""Triton model ``target`` / ``draft`` for the torch runtime: the ``tensorrtllm`` backend's contract served by
:class:`specbuild.runtimes.torch.engine.TorchEngine`.

Parameters are :class:`specbuild.runtimes.torch.parameters.TorchEngineParameters`: the backend's own keys, read
by the backend's rules (a config without a key the backend requires does not load here either), plus
``torch_device`` and ``torch_threads``. ``gpt_model_path`` is the engine folder: absolute, or relative to the
release folder (the repository's parent) and then confined to it. The engine's limits (``max_seq_len``,
``max_draft_len``, dtype) come from its build record (:class:`~specbuild.package.build_record.BuildRecord`), as a
TensorRT-LLM engine's come from its ``config.json``. A draft with a sub-vocabulary head loads only when the head
vocabulary in its folder is the one its build record and ``head_vocabulary_sha256`` name.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __name__.startswith("specbuild."):  # inside a repository: this release's own copy of specbuild first
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from specbuild.runtimes.torch.threads import ThreadGovernor, spin_briefly, threads, wait_policy  # noqa: E402

spin_briefly()  # before torch starts its thread pool (runtimes/torch/threads.py says why)

from typing import Any  # noqa: E402

import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from specbuild.errors import RequestError  # noqa: E402
from specbuild.package.backend_contract import BLOCK_VERIFICATION, ENGINE_INPUTS, GUIDE_MASKS  # noqa: E402
from specbuild.package.backend_guides import guided_decoding_configured  # noqa: E402
from specbuild.runtimes.torch.parameters import TorchEngineParameters  # noqa: E402
from specbuild.package.build_record import BUILD_INFO, BuildRecord  # noqa: E402
from specbuild.triton_models.engine_io import decode_requests, encode_outputs  # noqa: E402
from specbuild.triton_models.common import (  # noqa: E402
    error_response,
    model_parameters,
    request_arrays,
    response,
)
from specbuild.runtimes.torch.backend_guided import BackendGuidedEngine  # noqa: E402
from specbuild.runtimes.torch.engine import TorchEngine, resolve_device  # noqa: E402

def resolve_engine_dir(value: str, release_root: Path) -> Path:
    """``gpt_model_path`` as a folder; a relative one may not climb out of the release folder."""
    path = Path(value)
    if path.is_absolute():
        resolved = path.resolve()
    else:
        resolved = (release_root / path).resolve()
        if release_root != resolved and release_root not in resolved.parents:
            raise ValueError(f"gpt_model_path {value!r} escapes the release folder {release_root}")
    if not (resolved / BUILD_INFO).is_file():
        raise ValueError(f"gpt_model_path {value!r}: no engine at {resolved} (its {BUILD_INFO} is missing)")
    return resolved


def check_head_vocabulary(loaded: str | None, recorded: str | None, parameter: str | None) -> None:
    """The sha256 of the head vocabulary the engine loaded (None: a full head) must be the one its build record and
    its ``head_vocabulary_sha256`` parameter name: a list swapped after the build would serve another draft."""
    if loaded == recorded == parameter:
        return
    raise ValueError(f"head vocabulary mismatch: the engine folder holds {loaded or 'none'}, its build record names "
                     f"{recorded or 'none'} and head_vocabulary_sha256 {parameter or 'none'}; recompile the release "
                     "(specbuild compile)")


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        warnings: list[str] = []
        self.parameters = TorchEngineParameters.from_parameters(model_parameters(args), warnings)
        for warning in warnings:
            pb_utils.Logger.log_warn(warning)
        release_root = Path(args["model_repository"]).resolve().parent.parent
        engine_dir = resolve_engine_dir(self.parameters.gpt_model_path, release_root)
        record = BuildRecord.read(engine_dir)
        device = resolve_device(self.parameters.torch_device)
        count = threads(self.parameters.torch_threads)
        torch.set_num_threads(count)
        # 0 (every core): each step runs with every core while they are free, one while they are not
        governor = ThreadGovernor(count) if not self.parameters.torch_threads and device == "cpu" else None
        chosen = f"1 or {count} (by measured steps)" if governor and count > 1 else str(count)
        pb_utils.Logger.log_info(f"{args['model_name']}: torch on {device} with {chosen} intra-op threads, "
                                 f"{wait_policy()}")
        self.engine = TorchEngine(
            engine_dir,
            dtype=record.dtype,
            device=device,
            max_seq_len=record.limits.engine_seq_len,
            max_draft_len=record.limits.max_draft_len,
            cache_tokens=(self.parameters.max_tokens_in_paged_kv_cache or 0)
            if self.parameters.enable_kv_cache_reuse else 0,
            governor=governor,
        )
        check_head_vocabulary(self.engine.head_vocabulary.sha256 if self.engine.head_vocabulary else None,
                              record.head_vocabulary.sha256 if record.head_vocabulary else None,
                              self.parameters.head_vocabulary_sha256)
        self.engine.warm_up()  # before Triton reports the model ready: the first request costs what later ones do
        # the tensorrtllm backend's own guided decoding, when the parameters turn it on (a bad file fails the load)
        self.guided = guided_decoding_configured(self.parameters.guided_decoding_backend,
                                                 self.parameters.xgrammar_tokenizer_info_path)
        self.runner = BackendGuidedEngine(self.engine, release_root / self.parameters.xgrammar_tokenizer_info_path) \
            if self.guided else self.engine

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                rows = decode_requests(request_arrays(request, ENGINE_INPUTS + (GUIDE_MASKS, BLOCK_VERIFICATION)),
                                       exclude_input_default=self.parameters.exclude_input_in_output,
                                       guided_decoding=self.guided)
                outputs = [self.runner.run(row.request) for row in rows]
                responses.append(response(encode_outputs(rows, outputs, self.engine.vocab_size)))
            except (RequestError, ValueError) as exc:
                responses.append(error_response(str(exc)))
        return responses
