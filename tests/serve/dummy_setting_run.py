"""Run by test_dummy_setting.py with a copy of the package that has one more request setting, ``most_tokens``
(a cap on a request's tokens): the factory pair compiled and served from that copy, the setting sent through every
surface, and what the orchestrator did printed as JSON (``{surface: [output tokens without, with most_tokens=3]}``).

Usage: python dummy_setting_run.py TARGET DRAFT ROOT
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

PROMPT = "import json\nfrom json import"
MAX_TOKENS = 16
CAP = 3


def main(target: str, draft: str, root: Path) -> dict[str, Any]:
    import numpy as np
    from click.testing import CliRunner

    import specbuild
    from specbuild import compiler
    from specbuild.cli import main as cli
    from specbuild.errors import RequestError
    from specbuild.runtimes.tensorrt_llm_llmapi.contract import LLMAPIAdapterParameters
    from specbuild.runtimes.tensorrt_llm_llmapi.requests import parse_adapter_rows
    from specbuild.serve.client import SpecbuildClient
    from specbuild.serve.frontend import OpenAIFrontend
    from specbuild.serve.server import TritonServer
    from specbuild.spec import load_spec

    spec = load_spec(None, {"name": "dummy", "runtime": "torch", "target.checkpoint": target, "draft.checkpoint": draft,
                            "limits.max_input_len": 64, "limits.max_seq_len": 128,
                            "outputs.build_dir": str(root / "build"), "outputs.engines_dir": str(root / "engines"),
                            "outputs.repository_dir": str(root / "triton_repo")}, base_dir=root)
    repository = compiler.run(spec, json_mode=True).repository

    def post(url: str, body: dict[str, Any]) -> None:
        request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            response.read()

    def output_tokens(server: TritonServer) -> float:
        with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
            lines = response.read().decode().splitlines()
        return sum(float(line.split()[-1]) for line in lines if line.startswith("specbuild_output_tokens_total{"))

    observed: dict[str, Any] = {"package": specbuild.__file__}
    with TritonServer(repository, startup_timeout=300) as server, \
            OpenAIFrontend(repository, server.grpc_url, "dummy", port=0) as frontend:
        surfaces = {
            "http": lambda extra: post(f"{server.http_url}/v2/models/ensemble/generate",
                                       {"text_input": PROMPT, "max_tokens": MAX_TOKENS, "end_id": -1, **extra}),
            "grpc": lambda extra: SpecbuildClient(server.grpc_url).generate(PROMPT, MAX_TOKENS, end_id=-1, **extra),
            "openai": lambda extra: post(f"{frontend.url}/completions", {"model": "dummy", "prompt": PROMPT,
                                                                        "max_tokens": MAX_TOKENS, "temperature": 0,
                                                                        **extra}),
            "cli": lambda extra: CliRunner().invoke(cli, ["generate", PROMPT, "--url", server.grpc_url, "--raw",
                                                          "--no-stream", "--json", f"--max-tokens={MAX_TOKENS}",
                                                          *(f"--most-tokens={value}" for value in extra.values())],
                                                    catch_exceptions=False),
        }
        for surface, send in surfaces.items():
            counts = []
            for extra in ({}, {"most_tokens": CAP}):
                before = output_tokens(server)
                send(extra)
                counts.append(output_tokens(server) - before)
            observed[surface] = counts
    adapter = LLMAPIAdapterParameters(num_draft_tokens=4, end_id=2, streams=True, max_request_seconds=0.0,
                                      tensorrt_llm="main", draft_max_seq_len=128)
    try:
        parse_adapter_rows({"text_input": np.array([[b"hi"]], dtype=object), "max_tokens": np.array([[4]], np.int32),
                    "most_tokens": np.array([[CAP]], np.int32)}, adapter)
        observed["adapter"] = None
    except RequestError as exc:
        observed["adapter"] = exc.message
    return observed


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))))
