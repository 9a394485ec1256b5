"""A tensorrt-llm release's orchestrator with guided requests, rehearsed on CPU: every engine call goes through the
``tensorrtllm`` backend's tensors (encode_request -> the stand-in's reading -> a tiny torch engine with the backend's
guided decoding -> the backend's outputs). A guided request runs on the target alone in one call with NVIDIA's
guide inputs, counted, its answer the target's alone under the grammar; the draft is never called for it; an
invalid guide is refused before any engine call; unguided requests still speculate."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from random_llama import END, TOKENS, VOCAB
from specbuild.package.backend_guides import write_tokenizer_info
from specbuild.package.contract import OrchestratorParameters
from specbuild.runtimes.torch.backend_guided import BackendGuidedEngine
from specbuild.runtimes.torch.engine import TorchEngine
from specbuild.speculation.engine_call import EngineOutput, EngineRequest
from specbuild.speculation.guide import GuideCompiler
from specbuild.speculation.guide_spec import GuideSpec
from specbuild.speculation.stats import SpeculationStats
from specbuild.triton_models.engine_io import decode_output, decode_requests, encode_outputs, encode_request
from specbuild.triton_models.request_runner import RequestRunner

REGEX = r"[ab]+c|[0-3]{2}x?"
INTEGER_SCHEMA = '{"type": "integer"}'  # what this 16-token vocabulary can write: digits
SETTINGS = OrchestratorParameters(max_draft_len=4, num_draft_tokens=4, use_draft_logits=False, adaptive_draft=False,
                                  draft_len_schedule="", prompt_lookup=False, lookup_max_ngram=4, lookup_min_ngram=2,
                                  lookup_draft_fallback=True, fast_logits=False, max_input_len=32, max_seq_len=64,
                                  draft_max_seq_len=64,
                                  vocab_size=VOCAB, max_request_seconds=600.0, break_even=False, draft_cost=0.1,
                                  verify_costs=(1.0,) * 4, cost_measured=False, engine_guides=True)


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer, tmp_path_factory):
    made, folder = tiny_tokenizer
    return made, write_tokenizer_info(folder, tmp_path_factory.mktemp("tokenizer_info"))


class BackendEngines:
    """The target (with the backend's guided decoding, as a tensorrt-llm target is configured) and the draft (none)
    behind the backend's tensors; every call kept."""

    def __init__(self, tiny, info_path) -> None:
        self.target = BackendGuidedEngine(TorchEngine(tiny.target, max_draft_len=4), info_path)
        self.draft = TorchEngine(tiny.perturbed)
        self.target_calls: list[dict[str, np.ndarray]] = []
        self.draft_calls: list[dict[str, np.ndarray]] = []

    @staticmethod
    def _through_tensors(engine, guided: bool, calls: list, request: EngineRequest) -> EngineOutput:
        arrays = encode_request(request)
        calls.append(arrays)
        rows = decode_requests(arrays, exclude_input_default=True, guided_decoding=guided)
        answer = encode_outputs(rows, [engine.run(row.request) for row in rows], VOCAB)
        return decode_output(answer, request)

    # off the event loop, as an engine model runs in its own process
    async def call_target(self, request: EngineRequest) -> EngineOutput:
        return await asyncio.to_thread(self._through_tensors, self.target, True, self.target_calls, request)

    async def call_draft(self, request: EngineRequest) -> EngineOutput:
        return await asyncio.to_thread(self._through_tensors, self.draft, False, self.draft_calls, request)


@dataclass
class Recorder:
    counts: dict[str, float] = field(default_factory=dict)
    stats: SpeculationStats = field(default_factory=SpeculationStats)
    requests_in_flight: int = 0

    def in_flight(self, change: int) -> None:
        self.requests_in_flight += change

    def count(self, key: str, value: float = 1.0) -> None:
        self.counts[key] = self.counts.get(key, 0) + value

    def record(self, stats: SpeculationStats, output_tokens: int) -> None:
        self.stats += stats

    def observe_latencies(self, **times: int) -> None:
        pass


class Log:
    def log_info(self, message: str) -> None:
        pass

    log_warn = log_error = log_info


@dataclass
class Exchange:
    inputs: dict[str, np.ndarray]
    sent: list[tuple[dict | None, bool, str | None]] = field(default_factory=list)

    def arrays(self) -> dict[str, np.ndarray]:
        return self.inputs

    def cancelled(self) -> bool:
        return False

    def send(self, arrays, *, final: bool) -> None:
        self.sent.append((dict(arrays), final, None))

    def send_error(self, message: str) -> None:
        self.sent.append((None, True, message))

    def send_cancelled(self) -> None:
        raise AssertionError("nobody cancels here")


def request(prompt: list[int], stream: bool = False, **strings: str) -> dict[str, np.ndarray]:
    return {"input_ids": np.array([prompt], dtype=np.int32), "input_length": np.array([[len(prompt)]], dtype=np.int32),
            "max_tokens": np.array([[10]], dtype=np.int32), "end_id": np.array([[END]], dtype=np.int32),
            "stream": np.array([[stream]]),
            **{name: np.array([[value.encode()]], dtype=object) for name, value in strings.items()}}


def serve(tiny, tokenizer, inputs, settings=SETTINGS) -> tuple[Exchange, Recorder, BackendEngines]:
    made, info_path = tokenizer
    engines, metrics = BackendEngines(tiny, info_path), Recorder()
    compiler = GuideCompiler(made, VOCAB)
    runner = RequestRunner(settings, engines.call_target, engines.call_draft, metrics, Log(), guides=compiler.guide)
    exchange = Exchange(inputs)
    asyncio.run(runner.serve(exchange))
    return exchange, metrics, engines


def answer(exchange: Exchange) -> list[int]:
    tokens: list[int] = []
    for arrays, _, error in exchange.sent:
        assert error is None, error
        tokens += arrays["output_ids"].reshape(-1)[int(arrays["skip_tokens"].reshape(-1)[0]):].tolist()
    return tokens


def text(tokens: list[int]) -> str:
    return "".join(TOKENS[token] for token in tokens)


@pytest.mark.parametrize("stream", [False, True])
def test_a_guided_request_runs_on_the_target_alone_in_one_call_with_nvidias_inputs(tiny, tokenizer, stream):
    exchange, metrics, engines = serve(tiny, tokenizer, request(
        [1, 5, 9], stream, guided_decoding_guide_type="regex", guided_decoding_guide=REGEX))
    assert exchange.sent[-1][2] is None, exchange.sent[-1][2]
    tokens = answer(exchange) if stream else exchange.sent[-1][0]["output_ids"].reshape(-1).tolist()[3:]
    assert re.fullmatch(REGEX, text(tokens)), text(tokens)
    [call] = engines.target_calls  # one call, the whole answer: the backend's grammar starts at each call's output
    assert (call["guided_decoding_guide_type"].item(), call["guided_decoding_guide"].item()) == (b"regex", REGEX.encode())
    assert "draft_input_ids" not in call and "guide_token_masks" not in call
    assert engines.draft_calls == []
    assert metrics.stats.guided_target_only == 1 and metrics.stats.drafted_tokens == 0
    # the answer is the target's alone under the grammar: what the guided engine makes for the prompt by itself
    alone = engines.target.run(EngineRequest([1, 5, 9], 10, end_id=END, guide=GuideSpec("regex", REGEX))).tokens
    assert tokens + [END] == alone


def test_a_json_schema_reaches_the_engine_as_its_compact_grammar_and_answers_as_the_torch_release(tiny, tokenizer):
    """The backend would compile a json_schema with any whitespace allowed: the orchestrator sends the compact
    grammar it compiles itself as ebnf_grammar, so the engine's answer is the torch release's (its own masks)."""
    from specbuild.speculation.guide import engine_guide

    guide = {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": INTEGER_SCHEMA}
    exchange, _, engines = serve(tiny, tokenizer, request([1, 5, 9], **guide))
    [call] = engines.target_calls
    sent = engine_guide(GuideSpec("json_schema", INTEGER_SCHEMA))
    assert (call["guided_decoding_guide_type"].item(), call["guided_decoding_guide"].item()) == (
        b"ebnf_grammar", sent.text.encode())
    torch_release = replace(SETTINGS, engine_guides=False, guided_decoding=True)
    alone, _, masked = serve(tiny, tokenizer, request([1, 5, 9], **guide), torch_release)
    assert masked.target_calls and all("guided_decoding_guide_type" not in c for c in masked.target_calls)
    tokens = exchange.sent[-1][0]["output_ids"].reshape(-1).tolist()[3:]
    assert tokens and tokens == alone.sent[-1][0]["output_ids"].reshape(-1).tolist()[3:]
    assert re.fullmatch(r"-?\d+", text(tokens).removesuffix(TOKENS[END])), text(tokens)


def test_an_unguided_request_still_speculates_and_is_not_counted(tiny, tokenizer):
    exchange, metrics, engines = serve(tiny, tokenizer, request([1, 5, 9]))
    assert exchange.sent[-1][2] is None and engines.draft_calls
    assert all("guided_decoding_guide_type" not in call for call in engines.target_calls + engines.draft_calls)
    assert metrics.stats.guided_target_only == 0 and metrics.stats.drafted_tokens > 0


@pytest.mark.parametrize(("strings", "problem"), [
    ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "[ab"}, "is not a valid regex"),
    ({"guided_decoding_guide_type": "yaml"}, "'yaml' is not a guide type"),
])
def test_a_bad_guide_is_refused_before_any_engine_call(tiny, tokenizer, strings, problem):
    exchange, metrics, engines = serve(tiny, tokenizer, request([1, 5, 9], **strings))
    [(_, final, error)] = exchange.sent
    assert final and problem in error
    assert engines.target_calls == engines.draft_calls == []


def test_a_release_without_guided_engines_refuses_a_guide(tiny, tokenizer):
    exchange, _, engines = serve(tiny, tokenizer, request([1, 5, 9], guided_decoding_guide_type="json"),
                                 replace(SETTINGS, engine_guides=False))
    assert "take no guide masks and have no guided decoding of their own" in exchange.sent[-1][2]
    assert engines.target_calls == []
