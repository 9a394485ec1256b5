"""The rules of specbuild's public request inputs, once: each row of a request to the ensemble's interface read as
NVIDIA's backend reads it, and what a row reports back while it runs.

Both models that answer the public interface build on these: the orchestrator (:mod:`.orchestrator_requests`, behind the
ensemble's preprocessing) and the engine-free runtime's adapter in front of TensorRT-LLM's LLM-API model
(:mod:`specbuild.runtimes.tensorrt_llm_llmapi.requests`). :func:`read_row` checks what every runtime refuses alike
(``max_tokens``, beam search, several sequences, ``length_penalty``, both spellings of ``seed`` and ``min_tokens``,
the sampling inputs, the time limit) with one message each; each model then adds only what its backend cannot do.
:class:`RowProgress` holds what every response reports about its row (``batch_index``, the timings, token counts
and acceptance figures), whatever the row's answers are made of.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from specbuild.errors import RequestError
from specbuild.package.contract import ENSEMBLE_OUTPUTS, NUMPY_DTYPES, by_name
from specbuild.speculation.guide_spec import GUIDE_INPUT, TYPE_INPUT, GuideSpec
from specbuild.speculation.request_settings import SettingValue, read_settings
from specbuild.speculation.rules import SamplingParams
from specbuild.triton_models.batch import finite, renamed_value, row_value
from specbuild.triton_models.text import decode_utf8

Arrays = Mapping[str, "np.ndarray | None"]
Get = Callable[..., Any]  # get(name, default=None): one row's value of an input
_OUTPUTS = by_name(ENSEMBLE_OUTPUTS)


@dataclass(frozen=True)
class PublicRow:
    """One row's public inputs, checked; its request settings (speculation.request_settings) by name, None where the
    row left one to the release."""

    max_tokens: int
    sampling: SamplingParams
    seed: int | None
    min_tokens: int
    stream: bool
    exclude_input: bool  # exclude_input_in_output: the answer leaves the prompt out
    max_seconds: float | None  # the row's time limit: max_time within the release's (None: none)
    end_id: int | None  # as sent (negative: never stop on a token)
    guide: GuideSpec | None  # guided_decoding_guide_type and guided_decoding_guide, checked (not compiled)
    settings: dict[str, SettingValue | None]


def row_getters(arrays: Arrays, batch_input: str) -> list[Get]:
    """A getter per row of the request, as many as ``batch_input`` (its prompts) has rows."""
    batch = arrays.get(batch_input)
    if batch is None:
        raise RequestError(f"missing input {batch_input!r}")

    def getter(row: int) -> Get:
        return lambda name, default=None: row_value(arrays.get(name), row, default)

    return [getter(row) for row in range(batch.shape[0])]


def _optional(get: Get, name: str, kind: Callable[[Any], Any]) -> Any:
    value = get(name)
    return None if value is None else kind(value)


def _text(get: Get, name: str) -> str | None:
    value = get(name)
    return None if value is None else decode_utf8(value, name)


def read_row(get: Get, *, max_request_seconds: float) -> PublicRow:
    """The public inputs of one row (``get``), refused as every runtime refuses them, naming the input."""
    wanted = get("max_tokens")
    if wanted is None:
        raise RequestError("missing input 'max_tokens'")
    if int(wanted) < 1:
        raise RequestError(f"max_tokens must be at least 1, got {int(wanted)}")
    if int(get("beam_width", 1)) != 1:
        raise RequestError(f"beam_width must be 1, got {int(get('beam_width'))}: beam search does not combine with "
                           "draft-target decoding", "send beam_width=1 or leave it out")
    if int(get("num_return_sequences", 1)) != 1:
        raise RequestError(f"num_return_sequences must be 1, got {int(get('num_return_sequences'))}: one sequence "
                           "per request", "send the request again for more sequences")
    finite("length_penalty", get("length_penalty"))  # scores finished beams: no effect at beam width 1
    min_tokens = int(renamed_value(get, "min_tokens") or 0)
    if min_tokens < 0:
        raise RequestError(f"min_tokens must be 0 or more, got {min_tokens}")
    sampling = SamplingParams.from_backend(get("temperature"), get("top_k"), get("top_p"), get("repetition_penalty"),
                                           get("presence_penalty"), get("frequency_penalty"))
    seed = renamed_value(get, "seed")
    limits = [limit for limit in (finite("max_time", get("max_time"), positive=True), max_request_seconds or None)
              if limit is not None]
    return PublicRow(
        max_tokens=int(wanted), sampling=sampling, seed=None if seed is None else int(seed), min_tokens=min_tokens,
        stream=bool(get("stream", False)), exclude_input=bool(get("exclude_input_in_output", False)),
        max_seconds=min(limits) if limits else None, end_id=_optional(get, "end_id", int),
        guide=GuideSpec.parse(_text(get, TYPE_INPUT), _text(get, GUIDE_INPUT)), settings=read_settings(get))


@dataclass
class RowProgress:
    """What every response reports about one row while it runs (epoch ns for the times): the subclasses of the two
    models keep what the row's answers are made of (tokens, or the LLM-API model's texts)."""

    index: int  # batch_index
    scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    prompt_tokens: int = 0
    tokens: int = 0  # output_token_count so far
    reported_tokens: int = 0  # of those, the ones earlier responses covered

    def produced(self, now_ns: int) -> None:
        """New output arrived at ``now_ns``."""
        self.first_token_ns = self.first_token_ns or now_ns
        self.last_token_ns = now_ns

    def figures(self, arrival_ns: int, *, acceptance_rate: float, accepted: int, drafted: int) -> dict[str, np.ndarray]:
        """The response's figures about this row (``num_output_tokens``: the tokens since the previous response),
        as the ensemble's output tensors."""
        values = {
            "batch_index": self.index, "acceptance_rate": acceptance_rate, "total_accepted_draft_tokens": accepted,
            "total_draft_tokens": drafted, "arrival_time_ns": arrival_ns, "first_scheduled_time_ns": self.scheduled_ns,
            "first_token_time_ns": self.first_token_ns, "last_token_time_ns": self.last_token_ns,
            "num_input_tokens": self.prompt_tokens, "num_output_tokens": self.tokens - self.reported_tokens,
            "output_token_count": self.tokens,
        }
        self.reported_tokens = self.tokens
        return {name: np.array([[value]], dtype=NUMPY_DTYPES[_OUTPUTS[name].dtype]) for name, value in values.items()}
