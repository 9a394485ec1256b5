"""The orchestrator's request handling as pure functions (the Triton model in ``triton_models/orchestrator.py``
only moves tensors in and out): a request's rows as :class:`~specbuild.speculation.loop.GenerationRequest`
objects, and the tensors of a response.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specbuild.errors import RequestError
from specbuild.package.contract import OrchestratorParameters
from specbuild.serve.batch import row_value
from specbuild.serve.text import decode_word_list, pad_rows
from specbuild.speculation.loop import GenerationRequest
from specbuild.speculation.rules import SamplingParams
from specbuild.speculation.stats import SpeculationStats

Arrays = Mapping[str, "np.ndarray | None"]


@dataclass
class RowRequest:
    """One row of a client's request: what to generate and how to answer."""

    generation: GenerationRequest
    stream: bool
    exclude_input: bool


def _end_id(value: Any) -> int | None:
    """A negative end id means "never stop on a token", as in TensorRT-LLM."""
    return None if value is None or int(value) < 0 else int(value)


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
        try:
            sampling = SamplingParams.from_request(get("temperature"), get("top_k"), get("top_p"))
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        seed = get("random_seed")
        stream = bool(get("stream", False))
        rows.append(RowRequest(
            generation=GenerationRequest(
                prompt_ids=prompt, max_tokens=wanted, sampling=sampling,
                seed=None if seed is None else int(seed), end_id=_end_id(get("end_id")),
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
        ))
    return rows


def response_arrays(rows: Sequence[Sequence[int]], skips: Sequence[int], final: bool,
                    stats: Sequence[SpeculationStats], counts: Sequence[int]) -> dict[str, np.ndarray]:
    """The orchestrator's outputs for every row: tokens for postprocessing, how many of them were already sent
    as text, and the acceptance figures so far."""
    def column(values: Sequence[Any], dtype: Any) -> np.ndarray:
        return np.array([[value] for value in values], dtype=dtype)

    return {
        "output_ids": pad_rows(rows, 0),
        "output_length": column([len(r) for r in rows], np.int32),
        "skip_tokens": column(skips, np.int32),
        "is_final": column([final] * len(rows), bool),
        "acceptance_rate": column([s.acceptance_rate for s in stats], np.float32),
        "total_accepted_draft_tokens": column([s.accepted_tokens for s in stats], np.int32),
        "total_draft_tokens": column([s.drafted_tokens for s in stats], np.int32),
        "output_token_count": column(counts, np.int32),
    }
