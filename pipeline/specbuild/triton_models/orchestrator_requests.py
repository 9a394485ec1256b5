"""The orchestrator's request handling as pure functions (the Triton model in ``triton_models/orchestrator_model.py``
only moves tensors in and out): a request's rows as :class:`~specbuild.speculation.request.TokenRequest`
objects, checked as NVIDIA's backend would check them before anything runs, and the tensors of each response.

Every response is about one row (``batch_index``), as the ``tensorrtllm`` backend answers a batched request
(one response per sample): a streamed row sends its new tokens each round, a non-streamed one its whole answer
once; the request's last response carries the final flag.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from specbuild.errors import RequestError
from specbuild.package.contract import NUMPY_DTYPES, ORCHESTRATOR_OUTPUTS, OrchestratorParameters, by_name
from specbuild.speculation.guide_spec import TYPE_INPUT, GuideSpec
from specbuild.speculation.request import TokenRequest
from specbuild.speculation.request_settings import resolve
from specbuild.speculation.stats import SpeculationStats
from specbuild.triton_models import public_rows
from specbuild.triton_models.batch import row_value
from specbuild.triton_models.public_rows import Arrays, read_row, row_getters
from specbuild.triton_models.text import decode_word_list

_OUTPUTS = by_name(ORCHESTRATOR_OUTPUTS)


@dataclass
class RowRequest:
    """One row of a client's request: what to generate and how to answer."""

    generation: TokenRequest
    stream: bool
    exclude_input: bool
    echo_ids: list[int]  # what the whole answer repeats before its tokens unless the input is excluded
    max_seconds: float | None  # stop after the round that passes this many seconds from arrival (None: never)
    guide: GuideSpec | None = None  # checked; the orchestrator compiles it into generation.guide before it runs
    store: bool = True  # the row may be captured (the store setting); a release that captures nothing ignores it

    def sampling_settings(self) -> dict[str, float | int]:
        """How the row samples and how long it may run, by the ensemble inputs' names: what a capture record
        keeps to replay it (``random_seed`` only when one was sent)."""
        generation = self.generation
        seed = {} if generation.seed is None else {"random_seed": generation.seed}
        return {**asdict(generation.sampling), **seed, "max_tokens": generation.max_tokens,
                "min_tokens": generation.min_tokens}


def _end_id(value: int | None, vocab_size: int) -> int | None:
    """A negative end id means "never stop on a token", as in TensorRT-LLM; one beyond the vocabulary is the
    client's error (refused here, before a draft or target call could fail on it)."""
    if value is None or value < 0:
        return None
    if value >= vocab_size:
        raise RequestError(f"end_id {value} is outside the vocabulary [0, {vocab_size})",
                           "send a token id of the model's tokenizer, or leave end_id out for its eos")
    return value


def parse_orchestrator_rows(arrays: Arrays, settings: OrchestratorParameters) -> list[RowRequest]:
    """Each row of an orchestrator request, checked against the release's limits: the public rules
    (:func:`~specbuild.triton_models.public_rows.read_row`), then the prompt and the request settings, each as sent
    or the release's (:func:`~specbuild.speculation.request_settings.resolve`).

    Raises :class:`RequestError` naming the input at fault; nothing of the request runs then.
    """
    for name in ("input_ids", "input_length"):
        if arrays.get(name) is None:
            raise RequestError(f"missing input {name!r}")
    input_ids, lengths = arrays["input_ids"], arrays["input_length"]
    stop_words, bad_words = arrays.get("stop_words_ids"), arrays.get("bad_words_ids")
    rows = []
    for row, get in enumerate(row_getters(arrays, "input_ids")):
        public = read_row(get, max_request_seconds=settings.max_request_seconds)
        prompt = input_ids[row].reshape(-1)[: int(row_value(lengths, row))].tolist()
        echo = arrays.get("echo_ids")
        echo_ids = prompt if echo is None else echo[row].reshape(-1)[: int(get("echo_length", 0))].tolist()
        if len(prompt) + public.max_tokens > settings.max_seq_len:
            raise RequestError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({public.max_tokens}) exceeds max_seq_len "
                f"({settings.max_seq_len}); ask for at most {max(0, settings.max_seq_len - len(prompt))} tokens")
        chosen = resolve(public.settings, settings)
        k = chosen["num_draft_tokens"]
        if not 0 <= k <= settings.max_draft_len:
            raise RequestError(f"num_draft_tokens must be within 0..{settings.max_draft_len} (the target engine's "
                               f"max_draft_len), got {k}")
        if public.guide is not None and not (settings.guided_decoding or settings.engine_guides):
            raise RequestError(f"{TYPE_INPUT}={public.guide.type!r}: this release's engine models take no guide "
                               "masks and have no guided decoding of their own",
                               f"leave {TYPE_INPUT} out, or package the release again")
        rows.append(RowRequest(
            generation=TokenRequest(
                prompt_ids=prompt, max_tokens=public.max_tokens, sampling=public.sampling, seed=public.seed,
                end_id=_end_id(public.end_id, settings.vocab_size), min_tokens=public.min_tokens,
                stop_words=decode_word_list(None if stop_words is None else stop_words[row]),
                bad_words=decode_word_list(None if bad_words is None else bad_words[row]),
                num_draft_tokens=k, use_draft_logits=chosen["use_draft_logits"], verification=settings.verification,
                adaptive_draft=chosen["adaptive_draft"],
                prompt_lookup=settings.lookup if chosen["prompt_lookup"] else None,
                break_even=settings.cost_model if chosen["break_even"] else None,
                target_only_chunk=1 if public.stream else None,
            ),
            stream=public.stream,
            exclude_input=public.exclude_input,
            echo_ids=echo_ids,
            max_seconds=public.max_seconds,
            guide=public.guide,
            store=chosen["store"],
        ))
    return rows


@dataclass
class OrchestratorRowProgress(public_rows.RowProgress):
    """One row while it runs: its tokens so far and how many were sent, with what every response reports."""

    row: RowRequest = field(kw_only=True)
    stats: SpeculationStats = field(default_factory=SpeculationStats)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # the loop's (length, end_id, stop_words, ...), or "time" at the deadline
    rounds: list[tuple[int, int]] | None = None  # each round's [drafted, accepted], kept only for a captured row

    def __post_init__(self) -> None:
        self.prompt_tokens = len(self.row.generation.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, tokens: list[int], now_ns: int, finish_reason: str | None, drafted: int = 0,
            accepted: int = 0) -> None:
        """A round's tokens, accepted at ``now_ns``, and why the row ends there (None: it goes on); its
        ``drafted`` and ``accepted`` draft tokens are kept where :attr:`rounds` is."""
        if self.rounds is not None:
            self.rounds.append((drafted, accepted))
        if tokens:
            self.produced(now_ns)
        self.token_ids.extend(tokens)
        self.tokens = len(self.token_ids)
        self.finish_reason = finish_reason

    @property
    def has_news(self) -> bool:
        """Whether a response is due: a streamed row with unsent tokens, or a finished row."""
        return self.finished or (self.row.stream and self.tokens > self.reported_tokens)

    def response(self, arrival_ns: int) -> dict[str, np.ndarray]:
        """The next response's tensors (and the tokens it covers count as sent): a streamed row's tokens so far
        with how many were already sent, or a finished row's whole answer (its echo first unless excluded)."""
        row = self.row
        if row.stream:
            ids, skip = self.token_ids, self.reported_tokens
        else:
            ids = self.token_ids if row.exclude_input else row.echo_ids + self.token_ids
            skip = 0
        values = {"output_ids": np.array([ids], dtype=np.int32) if ids else np.zeros((1, 1), dtype=np.int32),
                  "output_length": np.array([[len(ids)]], dtype=NUMPY_DTYPES[_OUTPUTS["output_length"].dtype]),
                  "skip_tokens": np.array([[skip]], dtype=NUMPY_DTYPES[_OUTPUTS["skip_tokens"].dtype]),
                  "is_final": np.array([[self.finished]], dtype=NUMPY_DTYPES[_OUTPUTS["is_final"].dtype])}
        return {**values, **self.figures(arrival_ns, acceptance_rate=self.stats.acceptance_rate,
                                         accepted=self.stats.accepted_tokens, drafted=self.stats.drafted_tokens)}
