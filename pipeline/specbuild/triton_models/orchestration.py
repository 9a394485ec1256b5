"""The orchestrator's request handling as pure functions (the Triton model in ``triton_models/orchestrator.py``
only moves tensors in and out): a request's rows as :class:`~specbuild.speculation.request.GenerationRequest`
objects, checked as NVIDIA's backend would check them before anything runs, and the tensors of each response.

Every response is about one row (``batch_index``), as the ``tensorrtllm`` backend answers a batched request
(one response per sample): a streamed row sends its new tokens each round, a non-streamed one its whole answer
once; the request's last response carries the final flag.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from specbuild.errors import RequestError
from specbuild.package.contract import NUMPY_DTYPES, ORCHESTRATOR_OUTPUTS, OrchestratorParameters, by_name
from specbuild.speculation.request import GenerationRequest
from specbuild.speculation.rules import SamplingParams
from specbuild.speculation.stats import SpeculationStats
from specbuild.triton_models.batch import finite, renamed_value, row_value
from specbuild.triton_models.text import decode_word_list

Arrays = Mapping[str, "np.ndarray | None"]
_OUTPUTS = by_name(ORCHESTRATOR_OUTPUTS)


@dataclass
class RowRequest:
    """One row of a client's request: what to generate and how to answer."""

    generation: GenerationRequest
    stream: bool
    exclude_input: bool
    max_seconds: float | None  # stop after the round that passes this many seconds from arrival (None: never)


def _end_id(value: Any, vocab_size: int) -> int | None:
    """A negative end id means "never stop on a token", as in TensorRT-LLM; one beyond the vocabulary is the
    client's error (refused here, before a draft or target call could fail on it)."""
    if value is None or int(value) < 0:
        return None
    if int(value) >= vocab_size:
        raise RequestError(f"end_id {int(value)} is outside the vocabulary [0, {vocab_size})",
                           "send a token id of the model's tokenizer, or leave end_id out for its eos")
    return int(value)


def _deadline(get: Callable[[str], Any], settings: OrchestratorParameters) -> float | None:
    """The row's time limit: the client's ``max_time`` within the server's ``max_request_seconds`` (0: none)."""
    limits = [limit for limit in (finite("max_time", get("max_time"), positive=True),
                                  settings.max_request_seconds or None) if limit is not None]
    return min(limits) if limits else None


def parse_rows(arrays: Arrays, settings: OrchestratorParameters) -> list[RowRequest]:
    """Each row of an orchestrator request, checked against the release's limits.

    Raises :class:`RequestError` naming the input at fault; nothing of the request runs then.
    """
    input_ids, lengths, max_tokens = (arrays.get(name) for name in ("input_ids", "input_length", "max_tokens"))
    for name, array in (("input_ids", input_ids), ("input_length", lengths), ("max_tokens", max_tokens)):
        if array is None:
            raise RequestError(f"missing input {name!r}")
    stop_words, bad_words = arrays.get("stop_words_ids"), arrays.get("bad_words_ids")
    rows = []
    for row in range(input_ids.shape[0]):
        def get(name: str, default: Any = None, row: int = row) -> Any:
            return row_value(arrays.get(name), row, default)

        prompt = input_ids[row].reshape(-1)[: int(row_value(lengths, row))].tolist()
        wanted = int(row_value(max_tokens, row))
        if wanted < 1:
            raise RequestError(f"max_tokens must be at least 1, got {wanted}")
        if len(prompt) + wanted > settings.max_seq_len:
            raise RequestError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({wanted}) exceeds max_seq_len ({settings.max_seq_len}); "
                f"ask for at most {max(0, settings.max_seq_len - len(prompt))} tokens")
        k = int(get("num_draft_tokens", settings.num_draft_tokens))
        if not 0 <= k <= settings.max_draft_len:
            raise RequestError(f"num_draft_tokens must be within 0..{settings.max_draft_len} (the target engine's "
                               f"max_draft_len), got {k}")
        if int(get("beam_width", 1)) != 1:
            raise RequestError("beam_width must be 1: beam search does not combine with draft-target decoding")
        if int(get("num_return_sequences", 1)) != 1:
            raise RequestError("num_return_sequences must be 1: one sequence per request (send the request again "
                               "for more)")
        finite("length_penalty", get("length_penalty"))  # scores finished beams: no effect at beam width 1
        min_tokens = int(renamed_value(get, "min_tokens") or 0)
        if min_tokens < 0:
            raise RequestError(f"min_tokens must be 0 or more, got {min_tokens}")
        try:
            sampling = SamplingParams.from_backend(get("temperature"), get("top_k"), get("top_p"),
                                                   get("repetition_penalty"), get("presence_penalty"),
                                                   get("frequency_penalty"))
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        seed = renamed_value(get, "seed")
        stream = bool(get("stream", False))
        rows.append(RowRequest(
            generation=GenerationRequest(
                prompt_ids=prompt, max_tokens=wanted, sampling=sampling,
                seed=None if seed is None else int(seed), end_id=_end_id(get("end_id"), settings.vocab_size),
                min_tokens=min_tokens,
                stop_words=decode_word_list(None if stop_words is None else stop_words[row]),
                bad_words=decode_word_list(None if bad_words is None else bad_words[row]),
                num_draft_tokens=k,
                use_draft_logits=bool(get("use_draft_logits", settings.use_draft_logits)),
                adaptive=bool(get("adaptive_draft", settings.adaptive_draft)),
                prompt_lookup=settings.lookup if bool(get("prompt_lookup", settings.prompt_lookup)) else None,
                target_only_chunk=1 if stream else None,
            ),
            stream=stream,
            exclude_input=bool(get("exclude_input_in_output", False)),
            max_seconds=_deadline(get, settings),
        ))
    return rows


@dataclass
class RowProgress:
    """One row while it runs: its tokens so far, how many were sent, and when things happened (epoch ns)."""

    index: int  # batch_index
    row: RowRequest
    stats: SpeculationStats = field(default_factory=SpeculationStats)
    tokens: list[int] = field(default_factory=list)
    sent: int = 0
    finish_reason: str | None = None  # the loop's (length, end_id, stop_words, ...), or "time" at the deadline
    scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, tokens: list[int], now_ns: int, finish_reason: str | None) -> None:
        """A round's tokens, accepted at ``now_ns``, and why the row ends there (None: it goes on)."""
        if tokens:
            self.first_token_ns = self.first_token_ns or now_ns
            self.last_token_ns = now_ns
        self.tokens.extend(tokens)
        self.finish_reason = finish_reason

    @property
    def has_news(self) -> bool:
        """Whether a response is due: a streamed row with unsent tokens, or a finished row."""
        return self.finished or (self.row.stream and len(self.tokens) > self.sent)

    def response(self, arrival_ns: int) -> dict[str, np.ndarray]:
        """The next response's tensors (and the tokens it covers count as sent): a streamed row's tokens so far
        with how many were already sent, or a finished row's whole answer (the prompt first unless excluded)."""
        row = self.row
        if row.stream:
            ids, skip, new = self.tokens, self.sent, len(self.tokens) - self.sent
        else:
            ids = self.tokens if row.exclude_input else row.generation.prompt_ids + self.tokens
            skip, new = 0, len(self.tokens)
        self.sent = len(self.tokens)
        values = {
            "output_ids": (np.array([ids], dtype=np.int32) if ids else np.zeros((1, 1), dtype=np.int32)),
            "output_length": len(ids), "skip_tokens": skip, "is_final": self.finished, "batch_index": self.index,
            "acceptance_rate": self.stats.acceptance_rate, "total_accepted_draft_tokens": self.stats.accepted_tokens,
            "total_draft_tokens": self.stats.drafted_tokens, "arrival_time_ns": arrival_ns,
            "first_scheduled_time_ns": self.scheduled_ns, "first_token_time_ns": self.first_token_ns,
            "last_token_time_ns": self.last_token_ns, "num_input_tokens": len(row.generation.prompt_ids),
            "num_output_tokens": new, "output_token_count": len(self.tokens),
        }
        return {name: value if isinstance(value, np.ndarray)
                else np.array([[value]], dtype=NUMPY_DTYPES[_OUTPUTS[name].dtype]) for name, value in values.items()}
