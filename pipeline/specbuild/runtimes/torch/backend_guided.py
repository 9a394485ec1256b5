"""The ``tensorrtllm`` backend's own guided decoding on a :class:`~specbuild.runtimes.torch.engine.TorchEngine`: the
CPU stand-in of an engine model whose parameters turn it on (``guided_decoding_backend: xgrammar`` and
``xgrammar_tokenizer_info_path``), as a ``tensorrt-llm`` release's target has them.

As the backend does (``cpp/tensorrt_llm/batch_manager/guidedDecoder.cpp``, see
:mod:`specbuild.package.backend_guides`): the guides compile against the tokenizer info file, each guided request
gets a new matcher at its first new token (never inside its input), one mask per step and one accepted token per
step, the grammar complete once the file's stop token comes. The steps are
:meth:`specbuild.speculation.guide.Guide.constrained`'s one-token calls; verification with draft tokens never gets
here (refused with the guide when the request is read).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from specbuild.package.backend_guides import load_tokenizer_info
from specbuild.runtimes.torch.engine import TorchEngine
from specbuild.speculation.engine_call import EngineOutput, EngineRequest
from specbuild.speculation.guide import GuideCompiler


class BackendGuidedEngine:
    """``engine`` answering requests, guided ones under the backend's rules (its compiler made at the first)."""

    def __init__(self, engine: TorchEngine, tokenizer_info_path: Path) -> None:
        self.engine = engine
        self.info = load_tokenizer_info(tokenizer_info_path, engine.vocab_size)  # a bad file fails the load
        self._compiler: GuideCompiler | None = None

    def run(self, request: EngineRequest) -> EngineOutput:
        if request.guide is None:
            return self.engine.run(request)
        if self._compiler is None:
            # guidedDecoder.cpp compiles a json_schema guide with xgrammar's default, any whitespace
            self._compiler = GuideCompiler(None, self.engine.vocab_size, tokenizer_info=self.info,
                                           json_whitespace=True)
        guide = self._compiler.guide(request.guide, self.info.stop_token_ids[0])

        async def step(one: EngineRequest) -> EngineOutput:
            return self.engine.run(one)

        return asyncio.run(guide.constrained(step)(request))
