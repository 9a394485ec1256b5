"""Each request setting, end to end on a real Triton server, through every surface that offers it: Triton's HTTP
generate endpoint, the gRPC client's keyword, the OpenAI API's extra field and ``specbuild generate``'s option.

Each row has a probe below that says what the setting changes in the orchestrator's own counters (its metrics
endpoint, not anything the surfaces report): a request sent with the setting moves them otherwise than one sent
without. The release is the factory pair (random weights), capturing: its draft rarely agrees with its target,
which is what the break-even, adaptive K and token matching react to. The engine-free adapter's verdict is checked per row too.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
from click.testing import CliRunner

from triton_requests import delta, http_post, metrics

from specbuild.speculation.request_settings import REQUEST_SETTINGS

PROMPT = "import json\nimport json\nimport json\nimport json\nimport"  # its own n-grams propose the first draft
MAX_TOKENS = 24
GREEDY: dict[str, Any] = {}
SAMPLED = {"temperature": 1.0, "top_p": 1.0, "seed": 7}


@dataclass(frozen=True)
class Probe:
    """A request with ``base`` settings against one with ``varied``, and the counter that tells them apart:
    ``moves(base_delta, varied_delta)``."""

    base: dict[str, Any]
    varied: dict[str, Any]
    counter: str
    moves: Callable[[float, float], bool]
    sampling: dict[str, Any]


PROBES = {
    "num_draft_tokens": Probe({}, {"num_draft_tokens": 0}, "specbuild_spec_decode_num_draft_tokens_total",
                              lambda base, varied: varied == 0 < base, GREEDY),
    "use_draft_logits": Probe({"break_even": False}, {"break_even": False, "use_draft_logits": False},
                              "specbuild_spec_decode_num_accepted_tokens_total", lambda base, varied: varied < base,
                              SAMPLED),
    "adaptive_draft": Probe({"break_even": False}, {"break_even": False, "adaptive_draft": True},
                            "specbuild_spec_decode_num_draft_tokens_total", lambda base, varied: varied < base, GREEDY),
    "prompt_lookup": Probe({}, {"prompt_lookup": True}, "specbuild_spec_decode_source_draft_tokens_total[lookup]",
                           lambda base, varied: base == 0 < varied, GREEDY),
    "break_even": Probe({}, {"break_even": False}, "specbuild_break_even_rounds_total",
                        lambda base, varied: varied == 0 < base, GREEDY),
    "store": Probe({}, {"store": False}, "specbuild_capture_records_total", lambda base, varied: varied == 0 < base,
                   GREEDY),
}


def test_every_row_has_a_probe():
    assert set(PROBES) == {setting.name for setting in REQUEST_SETTINGS}


@pytest.fixture(scope="module")
def served(capturing_repository, tmp_path_factory):
    """The factory pair with capture on (the store row's probe counts the records written), its store a
    temporary folder."""
    from specbuild.serve.server import TritonServer

    store = tmp_path_factory.mktemp("settings_capture") / "store"
    with TritonServer(capturing_repository, startup_timeout=300, capture_dir=store) as server:
        yield server


@pytest.fixture(scope="module")
def openai_url(served, capturing_repository):
    from specbuild.serve.frontend import OpenAIFrontend

    with OpenAIFrontend(capturing_repository, served.grpc_url, "tiny", port=0) as frontend:
        yield frontend.url


def _post(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        assert response.status == 200


def _http(served, openai_url, settings, sampling) -> None:
    http_post(served, "/v2/models/ensemble/generate", {"text_input": PROMPT, "max_tokens": MAX_TOKENS,
                                                        **sampling, **settings})


def _grpc(served, openai_url, settings, sampling) -> None:
    from specbuild.serve.client import SpecbuildClient

    SpecbuildClient(served.grpc_url).generate(PROMPT, MAX_TOKENS, **sampling, **settings)


def _openai(served, openai_url, settings, sampling) -> None:
    _post(f"{openai_url}/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                                        "temperature": 0, **sampling, **settings})


def _cli(served, openai_url, settings, sampling) -> None:
    from specbuild.cli import main

    options = [f"--{name.replace('_', '-')}={value}" for name, value in sampling.items()]
    for name, value in settings.items():
        flag = "--" + name.replace("_", "-")
        options.append(flag if value is True else f"--no-{flag[2:]}" if value is False else f"{flag}={value}")
    result = CliRunner().invoke(main, ["generate", PROMPT, "--url", served.grpc_url, "--raw", "--no-stream",
                                       "--json", f"--max-tokens={MAX_TOKENS}", *options])
    assert result.exit_code == 0, result.output


SURFACES = {"http": _http, "grpc": _grpc, "openai": _openai, "cli": _cli}
FLAGS = {setting.name for setting in REQUEST_SETTINGS if setting.flag}


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("name", [setting.name for setting in REQUEST_SETTINGS])
def test_a_setting_sent_through_a_surface_changes_what_the_orchestrator_does(served, openai_url, name, surface):
    probe = PROBES[name]
    if surface == "cli" and not set(probe.base) | set(probe.varied) <= FLAGS:
        pytest.skip(f"specbuild generate has no option for {sorted(set(probe.base) | set(probe.varied) - FLAGS)}")
    send = SURFACES[surface]
    moved = []
    for settings in (probe.base, probe.varied):
        before = metrics(served)
        send(served, openai_url, settings, probe.sampling)
        moved.append(delta(before, metrics(served), probe.counter))
    assert probe.moves(*moved), f"{name} through {surface}: {probe.counter} moved {moved[0]} without, {moved[1]} with"


@pytest.mark.parametrize("setting", REQUEST_SETTINGS, ids=lambda setting: setting.name)
def test_the_engine_free_adapter_keeps_or_refuses_each_setting_with_its_reason(setting):
    from specbuild.errors import RequestError
    from specbuild.runtimes.tensorrt_llm_llmapi.contract import LLMAPIAdapterParameters
    from specbuild.runtimes.tensorrt_llm_llmapi.requests import parse_adapter_rows

    settings = LLMAPIAdapterParameters(num_draft_tokens=4, end_id=2, streams=True, max_request_seconds=0.0,
                                       tensorrt_llm="main", draft_max_seq_len=512)
    restated = 4 if setting.kind is int else False
    asked = 2 if setting.kind is int else True

    def request(value: Any) -> list[Any]:
        dtype = np.int32 if setting.kind is int else np.bool_
        return parse_adapter_rows({"text_input": np.array([[b"hi"]], dtype=object), "max_tokens": np.array([[4]], np.int32),
                           setting.name: np.array([[value]], dtype)}, settings)

    assert request(restated)  # what the LLM API does anyway: kept
    with pytest.raises(RequestError) as refused:
        request(asked)
    assert refused.value.message == f"{setting.name}={asked!r}: " + setting.engine_free.why.format(
        fixed=restated)
