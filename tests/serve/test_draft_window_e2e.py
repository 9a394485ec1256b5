"""A draft whose window is smaller than the target's, end to end on a real Triton server: the release serves the
target's window, the draft engine is built for its own and sent only what fits, and a request past it goes on
(prompt lookup still drafting), token-identical to K=0, counted in ``specbuild_draft_window_requests_total``; a
``tensorrt-llm-llmapi`` release of the pair (rehearsed: its adapter, a torch stand-in in TensorRT-LLM's place) serves
the target's window too and its adapter counts the requests that outgrew the draft's. With ``speculation.draft_context``
the draft reads only the most recent tokens and drafts from the model all the way, never past its window.

The pair is the tiny pair with its draft cut to :data:`~conftest.SHORT_DRAFT_POSITIONS` positions; its requests run to
``max_tokens`` whatever the model says (``end_id=-1``: no token ends them), so the window is crossed by construction.
"""

from __future__ import annotations

import pytest
from conftest import SHORT_DRAFT_POSITIONS, compile_tiny

from specbuild.errors import RequestError
from specbuild.package.build_record import BuildRecord
from specbuild.package.manifest import read_release
from specbuild.runtimes.tensorrt_llm_llmapi.contract import ADAPTER_MODEL
from specbuild.runtimes.tensorrt_llm_llmapi.rehearsal import rehearsal_repository
from specbuild.serve.client import SpecbuildClient
from specbuild.serve.server import TritonServer
from triton_requests import delta, metrics

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WINDOW_COUNTER = "specbuild_draft_window_requests_total"
MAX_TOKENS = 128
# Python source, as the tiny pair was trained on, repeated so that prompt lookup finds n-grams to draft from.
LINES = ("def main():\n    return run(sys.argv[1:])\n\n", "import os\nimport sys\n\n",
         "class Config:\n    def __init__(self, name):\n        self.name = name\n\n")


@pytest.fixture(scope="module")
def short_draft_server(tiny_short_draft_release):
    with TritonServer(tiny_short_draft_release.repository, startup_timeout=300) as server:
        yield server


@pytest.fixture(scope="module")
def client(short_draft_server) -> SpecbuildClient:
    return SpecbuildClient(short_draft_server.grpc_url, timeout=600)


@pytest.fixture(scope="module")
def tokenizer(tiny_short_draft_release):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_short_draft_release.engines / "target"))


def prompt_of(tokenizer, tokens: int) -> str:
    """Python source of at least ``tokens`` tokens, its lines repeated (so its last n-gram occurred before: prompt
    lookup proposes from round one, whatever the model says)."""
    text, index = "", 0
    while len(tokenizer.encode(text)) < tokens:
        text += LINES[index % len(LINES)]
        index += 1
    return text


def test_the_release_holds_the_target_s_window_and_the_draft_engine_its_own(tiny_short_draft_release) -> None:
    release = tiny_short_draft_release
    assert (release.spec.limits.max_seq_len, release.spec.limits.draft_max_seq_len) == (512, SHORT_DRAFT_POSITIONS)
    assert BuildRecord.read(release.engines / "target").limits.max_seq_len == 512
    assert BuildRecord.read(release.engines / "draft").limits.engine_seq_len == SHORT_DRAFT_POSITIONS


@pytest.mark.parametrize(("prompt_tokens", "lookup"), [(64, False), (200, False), (200, True)],
                         ids=["crossing-in-the-answer", "past-from-the-prompt", "past-with-lookup"])
def test_requests_past_the_draft_window_equal_k0_and_are_counted(short_draft_server, client, tokenizer,
                                                                 prompt_tokens, lookup) -> None:
    """Greedy, with drafting kept on (no break-even), each request runs well past the draft's 128 positions: its text
    equals K=0's, nothing fails (no draft fallback, no error), and the window counter moves once per request."""
    prompt = prompt_of(tokenizer, prompt_tokens)
    assert len(tokenizer.encode(prompt)) + MAX_TOKENS >= SHORT_DRAFT_POSITIONS + 64  # well past the draft's window
    options = {"end_id": -1, "break_even": False, "prompt_lookup": lookup}
    expected = client.generate(prompt, MAX_TOKENS, num_draft_tokens=0, **options)
    before = metrics(short_draft_server)
    got = client.generate(prompt, MAX_TOKENS, num_draft_tokens=4, **options)
    after = metrics(short_draft_server)
    assert got.text == expected.text and got.output_token_count == expected.output_token_count == MAX_TOKENS
    assert delta(before, after, WINDOW_COUNTER) == 1
    assert delta(before, after, "specbuild_draft_fallbacks_total") == 0
    assert delta(before, after, "specbuild_request_errors_total") == 0
    model_drafts = delta(before, after, "specbuild_spec_decode_source_drafts_total[model]")
    # the draft model drafts only while the context fits its window: a prompt already past it never calls it
    assert (model_drafts > 0) == (prompt_tokens < SHORT_DRAFT_POSITIONS)
    if lookup:
        assert delta(before, after, "specbuild_spec_decode_source_drafts_total[lookup]") > 0


DRAFT_CONTEXT = 64  # the most recent tokens the draft reads in the draft-context release: half its window


def test_with_a_draft_context_the_draft_model_drafts_all_the_way(tiny_short_draft_pair, client, tokenizer) -> None:
    """The same pair with ``speculation.draft_context`` 64: a request far past the draft's 128 positions drafts from
    the model in every round after the first (no window count, no fallback), its text K=0's."""
    release = compile_tiny(tiny_short_draft_pair, "torch", "tiny-short-draft-context-release",
                           **{"speculation.draft_context": DRAFT_CONTEXT})
    prompt = prompt_of(tokenizer, 200)
    options = {"end_id": -1, "break_even": False, "prompt_lookup": False}
    expected = client.generate(prompt, MAX_TOKENS, num_draft_tokens=0, **options)
    with TritonServer(release.repository, startup_timeout=300) as server:  # a fresh server: its counters start at 0
        got = SpecbuildClient(server.grpc_url, timeout=600).generate(prompt, MAX_TOKENS, num_draft_tokens=4,
                                                                     **options)
        counted = metrics(server)
    assert got.text == expected.text and got.output_token_count == MAX_TOKENS
    assert counted.get(WINDOW_COUNTER, 0) == counted.get("specbuild_draft_fallbacks_total", 0) == 0
    assert counted["specbuild_spec_decode_source_drafts_total[model]"] > 0
    assert counted.get("specbuild_request_errors_total", 0) == 0


def test_a_prompt_past_the_target_s_window_is_refused_by_name(client, tokenizer) -> None:
    """Past the release's max_input_len (the target's limits), the prompt is refused before any engine runs."""
    prompt = prompt_of(tokenizer, 300)
    with pytest.raises(RequestError, match=r"prompt has \d+ tokens, more than max_input_len \(256\)"):
        client.generate(prompt, 8)


def test_a_rehearsed_llmapi_release_serves_past_the_draft_window_and_counts_it(
        tiny_short_draft_llmapi_release, client, tokenizer, tmp_path_factory) -> None:
    """The LLM API goes on past the draft's window (TensorRT-LLM's model_drafter.py stops drafting there): the text
    equals the torch release's K=0, and the adapter counts the request, whatever the model answers (its prompt alone
    is past the window)."""
    repository = rehearsal_repository(read_release(tiny_short_draft_llmapi_release.repository),
                                      tmp_path_factory.mktemp("rehearsal"))
    prompt = prompt_of(tokenizer, 200)
    with TritonServer(repository, startup_timeout=300) as server:  # a fresh server: its counters start at 0
        got = SpecbuildClient(server.grpc_url, timeout=600).generate(prompt, 48)
        counted = metrics(server, ADAPTER_MODEL)
    assert got.text == client.generate(prompt, 48, num_draft_tokens=0).text
    assert counted[WINDOW_COUNTER] == counted["specbuild_requests_total"] == 1
    assert counted.get("specbuild_request_errors_total", 0) == 0
