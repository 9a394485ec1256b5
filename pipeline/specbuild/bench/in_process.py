"""A torch-runtime release run in the bench's own process: what ``specbuild bench --in-process`` measures the
served path against.

Nothing is re-implemented: the request goes through the release's ensemble steps as its ``config.pbtxt`` maps
them (the preprocessing's :class:`~specbuild.triton_models.preprocessor.Preprocessor`, then the orchestrator's
:class:`~specbuild.triton_models.request_runner.RequestRunner` with the orchestrator's own parameters) and the
engines load as the engine models load them (:func:`~specbuild.runtimes.torch.engine_loading.load_engine`: the
same thread governor, cache and warm-up). What is left out is what serving adds: Triton, the BLS calls and their
shared memory, the postprocessing model, the stream, and the other processes on the same cores. So served tokens/s
over these is the served path's efficiency (docs/benchmarks.md, "The served path").
"""

from __future__ import annotations

from specbuild.runtimes.torch.threads import spin_briefly

spin_briefly()  # before torch loads (when this module is the first to load it), as the engine models do

import asyncio  # noqa: E402
import logging  # noqa: E402
import time  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from specbuild.bench.figures import Counters, RequestTrace, chunk_tokens  # noqa: E402
from specbuild.errors import RequestError, UsageError  # noqa: E402
from specbuild.package.contract import ENSEMBLE_MODEL, ORCHESTRATOR_MODEL, PREPROCESSING_MODEL  # noqa: E402
from specbuild.serve.client import first_value  # noqa: E402
from specbuild.speculation.engine_call import EngineOutput, EngineRequest  # noqa: E402
from specbuild.speculation.stats import REQUEST_METRICS, SpeculationStats, request_samples  # noqa: E402
from specbuild.triton_models.text import incremental_text  # noqa: E402

LOG = logging.getLogger("specbuild.bench")
_TOTALS = {metric.key: metric.name for metric in REQUEST_METRICS}


class ProcessCounters:
    """The request runner's metrics kept in this process as Prometheus samples, so :class:`Counters` reads them
    as it reads a server's; latencies are the bench's own timing of each response."""

    def __init__(self) -> None:
        self.samples: list[tuple[str, dict[str, str], float]] = []
        self._in_flight = 0

    @property
    def requests_in_flight(self) -> int:
        return self._in_flight

    def in_flight(self, change: int) -> None:
        self._in_flight += change

    def count(self, key: str, value: float = 1.0) -> None:
        self.samples.append((_TOTALS[key], {}, value))

    def record(self, stats: SpeculationStats, output_tokens: int) -> None:
        self.samples += [(metric.name, labels, value) for metric, labels, value in request_samples(stats, output_tokens)]

    def observe_latencies(self, **_: int) -> None:
        """Not kept: the bench times every response itself."""

    def counters(self) -> Counters:
        return Counters.from_samples(self.samples)


class _Exchange:
    """One request's orchestrator inputs in, its responses collected with the time each arrived."""

    def __init__(self, arrays: Mapping[str, np.ndarray | None], started: float) -> None:
        self._arrays = arrays
        self.started = started
        self.responses: list[tuple[float, Mapping[str, np.ndarray]]] = []
        self.error: str | None = None

    def arrays(self) -> Mapping[str, np.ndarray | None]:
        return self._arrays

    def cancelled(self) -> bool:
        return False

    def send(self, arrays: Mapping[str, np.ndarray], *, final: bool) -> None:
        self.responses.append((time.perf_counter() - self.started, arrays))

    def send_error(self, message: str) -> None:
        self.error = message

    def send_cancelled(self) -> None:
        self.error = "cancelled"


class InProcessRelease:
    """The release in ``repository`` (torch runtime) answering the ensemble's requests in this process."""

    def __init__(self, repository: str | Path) -> None:
        from specbuild.package.repository import read_config
        from specbuild.runtimes.torch.engine_loading import load_engine
        from specbuild.runtimes.torch.parameters import TorchEngineParameters
        from specbuild.serve.orchestrator_client import release_requests
        from specbuild.speculation.guide import ReleaseGuides
        from specbuild.triton_models.request_runner import RequestRunner

        self.repository = Path(repository).resolve()
        self.preprocessor, settings = release_requests(self.repository)
        steps = {step.model_name: step for step in read_config(self.repository / ENSEMBLE_MODEL)
                 .ensemble_scheduling.step}
        self.preprocessing, self.orchestration = steps[PREPROCESSING_MODEL], steps[ORCHESTRATOR_MODEL]
        engines = {}
        for name in (settings.target_model, settings.draft_model):
            config = read_config(self.repository / name)
            if config.backend != "python":
                raise UsageError(f"{name} runs on Triton's {config.backend} backend: only a torch-runtime release "
                                 "runs in process", "leave out --in-process for this release")
            parameters = TorchEngineParameters.from_parameters(
                {key: value.string_value for key, value in config.parameters.items()})
            engines[name] = load_engine(parameters, self.repository.parent)
        self.engines = engines  # LoadedEngine by model name
        self.counts = ProcessCounters()
        guided = settings.guided_decoding or settings.engine_guides  # the orchestrator's tokenizer only then
        guides = ReleaseGuides(self.repository / ORCHESTRATOR_MODEL / "1" / "tokenizer", settings.vocab_size) \
            if guided else None

        def call(runner: Any) -> Any:
            async def run(request: EngineRequest) -> EngineOutput:
                return runner.run(request)
            return run

        self.runner = RequestRunner(settings, call(engines[settings.target_model].runner),
                                    call(engines[settings.draft_model].runner), self.counts, LOG,
                                    guides=guides)

    def orchestrator_arrays(self, ensemble_arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray | None]:
        """The orchestrator's inputs for a request of the ensemble, through the ensemble's own steps."""
        tensors: dict[str, Any] = dict(ensemble_arrays)
        inputs = {model_input: tensors.get(name) for model_input, name in self.preprocessing.input_map.items()}
        outputs = self.preprocessor.tensors(inputs)
        tensors.update({name: outputs[model_output] for model_output, name in self.preprocessing.output_map.items()})
        return {model_input: tensors.get(name) for model_input, name in self.orchestration.input_map.items()}

    def trace(self, index: int, category: str, request: Any) -> RequestTrace:
        """Answer one ensemble request (:class:`specbuild.serve.client.GenerationRequest`) as the bench records a
        served one; a refused request is recorded with its error."""
        started = time.perf_counter()
        try:
            exchange = _Exchange(self.orchestrator_arrays(request.arrays()), started)
        except (RequestError, ValueError) as exc:
            return RequestTrace(index, category, (), (), time.perf_counter() - started, error=str(exc))
        asyncio.run(self.runner.serve(exchange))
        total = time.perf_counter() - started
        if exchange.error is not None or not exchange.responses:
            return RequestTrace(index, category, (), (), total, error=exchange.error or "no response")
        last = exchange.responses[-1][1]
        ids = np.asarray(last["output_ids"]).reshape(-1)[: int(first_value(last["output_length"]))].tolist()
        return RequestTrace(
            prompt_index=index, category=category, chunk_times=tuple(at for at, _ in exchange.responses),
            chunk_tokens=tuple(chunk_tokens([int(first_value(arrays["output_token_count"]))
                                             for _, arrays in exchange.responses])),
            total_time=total, drafted=int(first_value(last["total_draft_tokens"])),
            accepted=int(first_value(last["total_accepted_draft_tokens"])),
            text=incremental_text(self.preprocessor.tokenizer, ids, 0, True),
        )
