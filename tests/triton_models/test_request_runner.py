"""The orchestrator's serving policy without Triton (``triton_models.request_runner``): real tiny torch engines
behind the engine calls, an in-memory exchange in place of Triton's request and response sender. Sibling rows
are cancelled when one fails, rows stop after the round that passes their deadline, the client's cancellation
stops the work within a round, exactly the last response is final, and the metrics count a request before its
last response goes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from specbuild.capture.records import read_records
from specbuild.capture.store import CaptureWriter, Rotation, open_store
from specbuild.package.contract import OrchestratorParameters
from specbuild.runtimes.torch.engine import TorchEngine
from specbuild.speculation.engine_call import EngineOutput, EngineRequest
from specbuild.speculation.stats import SpeculationStats
from specbuild.triton_models.request_capture import RequestCapture
from specbuild.triton_models.request_runner import RequestRunner

SETTINGS = OrchestratorParameters(max_draft_len=4, num_draft_tokens=2, use_draft_logits=True, adaptive_draft=False,
                                  draft_len_schedule="", prompt_lookup=False, lookup_max_ngram=4, lookup_min_ngram=2,
                                  lookup_draft_fallback=True, fast_logits=False, max_input_len=32, max_seq_len=64,
                                  draft_max_seq_len=64,
                                  vocab_size=16, max_request_seconds=600.0, break_even=False, draft_cost=0.1,
                                  verify_costs=(1.0,) * 4, cost_measured=False)


@dataclass
class Sent:
    arrays: dict[str, np.ndarray] | None
    final: bool
    error: str | None = None
    cancelled: bool = False
    requests_counted: int = 0  # what the metrics showed when it went
    records_written: int = 0  # the capture store's complete records when it went


@dataclass
class Recorder:
    """The metrics' values, as Triton's metrics endpoint would show them."""

    counts: dict[str, float] = field(default_factory=dict)
    latencies: list[dict[str, int]] = field(default_factory=list)  # one per finished row
    observed: dict[str, list[float]] = field(default_factory=dict)  # other histograms' observations
    in_flight_now: int = 0
    peak_in_flight: int = 0

    @property
    def requests_in_flight(self) -> int:
        return self.in_flight_now

    def in_flight(self, change: int) -> None:
        self.in_flight_now += change
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight_now)

    def count(self, key: str, value: float = 1.0) -> None:
        self.counts[key] = self.counts.get(key, 0) + value

    def record(self, stats: SpeculationStats, output_tokens: int) -> None:
        self.count("requests")
        self.count("output_tokens", output_tokens)

    def observe_latencies(self, **times: int) -> None:
        self.latencies.append(times)

    def observe(self, key: str, value: float) -> None:
        self.observed.setdefault(key, []).append(value)


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log_info(self, message: str) -> None:
        self.lines.append(message)

    log_warn = log_error = log_info


class Exchange:
    """One request in memory: its tensors, its responses in order, and a client that cancels after ``cancel_after``
    responses (None: never)."""

    def __init__(self, arrays: dict[str, np.ndarray], metrics: Recorder, cancel_after: int | None = None) -> None:
        self._arrays, self.metrics, self.cancel_after = arrays, metrics, cancel_after
        self.sent: list[Sent] = []
        self.capture_store: Path | None = None  # a store the runner captures to: its records counted at each send

    def arrays(self) -> dict[str, np.ndarray]:
        return self._arrays

    def cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after

    def _note(self, sent: Sent) -> None:
        assert not (self.sent and self.sent[-1].final), "a response after the final one"
        sent.requests_counted = int(self.metrics.counts.get("requests", 0))
        if self.capture_store is not None:
            sent.records_written = sum(1 for _ in read_records([self.capture_store]))
        self.sent.append(sent)

    def send(self, arrays: dict[str, np.ndarray], *, final: bool) -> None:
        self._note(Sent(dict(arrays), final))

    def send_error(self, message: str) -> None:
        self._note(Sent(None, True, error=message))

    def send_cancelled(self) -> None:
        self._note(Sent(None, True, cancelled=True))


class Engines:
    """The tiny target and draft as the orchestrator's engine calls; counts calls, and can fail or be slow."""

    def __init__(self, tiny, *, fail_target_on: list[int] | None = None, delay: float = 0.0) -> None:
        self.target_engine = TorchEngine(tiny.target, max_draft_len=SETTINGS.max_draft_len)
        self.draft_engine = TorchEngine(tiny.perturbed)
        self.fail_target_on = fail_target_on or []  # prompts (their first token) whose target calls fail
        self.delay = delay
        self.calls: list[tuple[str, int]] = []  # (role, the prompt's first token)
        self.draft_lengths: list[int] = []  # what each draft call asked for

    async def target(self, request: EngineRequest) -> EngineOutput:
        self.calls.append(("target", request.input_ids[0]))
        await asyncio.sleep(self.delay)
        if request.input_ids[0] in self.fail_target_on:
            raise RuntimeError("target engine failed")
        return self.target_engine.run(request)

    async def draft(self, request: EngineRequest) -> EngineOutput:
        self.calls.append(("draft", request.input_ids[0]))
        self.draft_lengths.append(request.max_new_tokens)
        await asyncio.sleep(self.delay)
        return self.draft_engine.run(request)


def request(prompts: list[list[int]], max_tokens: int = 12, **arrays: Any) -> dict[str, np.ndarray]:
    width = max(len(prompt) for prompt in prompts)
    ids = np.zeros((len(prompts), width), dtype=np.int32)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
    return {"input_ids": ids, "input_length": np.array([[len(p)] for p in prompts], dtype=np.int32),
            "max_tokens": np.array([[max_tokens]], dtype=np.int32),
            **{name: np.asarray(value) for name, value in arrays.items()}}


def serve(engines: Engines, arrays: dict[str, np.ndarray], settings: OrchestratorParameters = SETTINGS,
          cancel_after: int | None = None, linger: float = 0.5, others_in_flight: int = 0,
          capture_to: Path | None = None) -> tuple[Exchange, Recorder, Log]:
    """Serve one request (beside ``others_in_flight`` requests the gauge counts), then keep the event loop running
    ``linger`` seconds, as Triton's does for the next requests: work a request left running would show up in the
    engine calls; ``capture_to``: a capture store the runner writes finished rows to."""
    metrics, log = Recorder(in_flight_now=others_in_flight), Log()
    exchange = Exchange(arrays, metrics, cancel_after)
    capture = None if capture_to is None else RequestCapture(
        CaptureWriter(open_store(capture_to), "orchestrator_0_0", Rotation(1 << 20, 3600.0, 86400.0),
                      warn=log.log_warn), release="r" * 64, tokenizer="t" * 64, metrics=metrics)
    if capture is not None:
        exchange.capture_store = capture_to

    async def run() -> None:
        await RequestRunner(settings, engines.target, engines.draft, metrics, log, capture=capture).serve(exchange)
        await asyncio.sleep(linger)

    asyncio.run(run())
    return exchange, metrics, log


def test_each_row_answers_once_and_only_the_last_response_is_final(tiny):
    exchange, metrics, _ = serve(Engines(tiny), request([[3, 4, 5], [6, 7]]))
    assert [sent.final for sent in exchange.sent] == [False, True]
    assert sorted(int(sent.arrays["batch_index"][0, 0]) for sent in exchange.sent) == [0, 1]
    assert all(int(sent.arrays["output_token_count"][0, 0]) == 12 for sent in exchange.sent)
    assert metrics.counts["requests"] == 2 and metrics.counts["output_tokens"] == 24
    assert metrics.in_flight_now == 0 and metrics.peak_in_flight == 1


@pytest.mark.parametrize(("others", "asked"), [(0, 2), (2, 1), (3, 1), (4, 0)])
def test_each_round_drafts_what_the_schedule_allows_at_the_in_flight_count(tiny, others, asked):
    """The load policy reads the gauge (this request and ``others``): K=2 asked, at most 1 from 3 in flight,
    none from 5; the output is the target's either way."""
    settings = replace(SETTINGS, draft_len_schedule="3:1,5:0")
    engines = Engines(tiny)
    exchange, _, _ = serve(engines, request([[3, 4, 5]], max_tokens=10), settings, others_in_flight=others)
    expected, _, _ = serve(Engines(tiny), request([[3, 4, 5]], max_tokens=10), replace(SETTINGS, num_draft_tokens=0))
    assert max(engines.draft_lengths, default=0) == asked  # (the last rounds may be cut by max_tokens)
    assert exchange.sent[-1].arrays["output_ids"].tolist() == expected.sent[-1].arrays["output_ids"].tolist()


def test_each_finished_row_observes_its_latencies_in_order(tiny):
    _, metrics, _ = serve(Engines(tiny), request([[3, 4, 5], [6, 7]], stream=[[True]]))
    assert len(metrics.latencies) == 2
    for times in metrics.latencies:
        assert times["arrival_ns"] <= times["scheduled_ns"] <= times["first_token_ns"] < times["last_token_ns"]
        assert times["output_tokens"] == 12


def test_streamed_rows_send_every_round_and_the_metrics_count_them_before_the_last_response(tiny):
    exchange, metrics, _ = serve(Engines(tiny), request([[3, 4, 5], [6, 7]], stream=[[True]]))
    assert len(exchange.sent) > 2 and [sent.final for sent in exchange.sent][-1] is True
    assert not any(sent.final for sent in exchange.sent[:-1])
    # both rows were counted when the final response went out, not after it
    assert exchange.sent[-1].requests_counted == 2 == metrics.counts["requests"]
    streamed = sum(int(sent.arrays["num_output_tokens"][0, 0]) for sent in exchange.sent)
    assert streamed == 24  # every token once


def test_a_failing_row_cancels_its_siblings_and_the_request_ends_with_its_error(tiny):
    engines = Engines(tiny, fail_target_on=[6], delay=0.005)
    exchange, metrics, log = serve(engines, request([[3, 4, 5], [6, 7]], max_tokens=40))
    assert [sent.error for sent in exchange.sent] == ["orchestrator: target engine failed"]
    assert metrics.counts["errors"] == 1 and "request failed" in log.lines[-1]
    sibling_rounds = sum(1 for role, first in engines.calls if role == "target" and first == 3)
    assert sibling_rounds <= 2  # stopped within a round of the failure, far before its 40 tokens
    assert metrics.counts["requests"] == 2  # the work done so far still counts, for both rows
    assert metrics.in_flight_now == 0


def test_a_row_stops_after_the_round_that_passes_its_deadline(tiny):
    engines = Engines(tiny, delay=0.02)
    exchange, metrics, log = serve(engines, request([[3, 4, 5]], max_tokens=60, max_time=[[0.05]]))
    [last] = exchange.sent
    assert last.final and int(last.arrays["output_token_count"][0, 0]) < 60
    assert metrics.counts["timed_out"] == 1 and any("time limit" in line for line in log.lines)


def test_the_server_limit_ends_a_request_nobody_waits_for(tiny):
    settings = replace(SETTINGS, max_request_seconds=0.05)
    exchange, metrics, _ = serve(Engines(tiny, delay=0.02), request([[3, 4, 5]], max_tokens=60), settings)
    assert exchange.sent[-1].final and metrics.counts["timed_out"] == 1


def test_a_cancelled_request_stops_its_work_within_a_round(tiny):
    engines = Engines(tiny)
    exchange, metrics, log = serve(engines, request([[3, 4, 5]], max_tokens=60, stream=[[True]]), cancel_after=1)
    assert exchange.sent[-1].cancelled and exchange.sent[-1].final and len(exchange.sent) == 2
    assert sum(1 for role, _ in engines.calls if role == "target") == 2  # the round it saw, then stopped
    assert metrics.counts["cancelled"] == 1 and metrics.counts["requests"] == 1
    assert any("cancelled" in line for line in log.lines)


def test_a_bad_request_is_refused_before_any_engine_call(tiny):
    engines = Engines(tiny)
    exchange, metrics, _ = serve(engines, request([[3, 4, 5]], num_draft_tokens=[[9]]))
    [refused] = exchange.sent
    assert refused.final and "num_draft_tokens must be within 0..4" in refused.error
    assert engines.calls == [] and metrics.counts["errors"] == 1 and "requests" not in metrics.counts



@pytest.mark.parametrize("stream", [False, True])
def test_a_captured_row_is_written_before_its_last_response_and_an_opted_out_one_never(tiny, tmp_path, stream):
    store = tmp_path / "capture"
    exchange, metrics, log = serve(Engines(tiny), request([[3, 4, 5], [6, 7]], max_tokens=10,
                                                          store=[[True], [False]], stream=[[stream]],
                                                          exclude_input_in_output=[[True]], temperature=[[0.0]]),
                                   capture_to=store)
    [record] = read_records([store])
    assert record.prompt_ids == (3, 4, 5) and record.finish_reason == "length"
    row_zero = [sent for sent in exchange.sent if int(sent.arrays["batch_index"][0, 0]) == 0]
    served = [token for sent in row_zero
              for token in sent.arrays["output_ids"][0, int(sent.arrays["skip_tokens"][0, 0]):].tolist()]
    assert list(record.output_ids) == (served if stream else row_zero[-1].arrays["output_ids"][0].tolist())
    assert len(record.output_ids) == 10 and record.sampling["temperature"] == 0.0 and record.greedy
    assert sum(drafted for drafted, _ in record.rounds) == int(row_zero[-1].arrays["total_draft_tokens"][0, 0])
    assert sum(accepted for _, accepted in record.rounds) == int(row_zero[-1].arrays["total_accepted_draft_tokens"][0, 0])
    assert (record.release, record.tokenizer, record.instance) == ("r" * 64, "t" * 64, "orchestrator_0_0")
    assert row_zero[-1].records_written == 1  # on disk when the row's last response went
    assert metrics.counts["captured"] == 1 and "capture_drops" not in metrics.counts
    assert metrics.counts["capture_bytes"] == len(record.to_line())
    assert len(metrics.observed["capture_seconds"]) == 1 and not log.lines
