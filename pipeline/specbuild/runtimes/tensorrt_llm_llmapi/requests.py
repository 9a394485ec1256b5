"""The adapter's request handling as pure functions: a client's ensemble request as LLM-API requests, and the
answers as the ensemble's outputs (the Triton model ``triton_models/llmapi_adapter.py`` only moves tensors).

specbuild's public interface is the same for every runtime (:data:`specbuild.package.contract.ENSEMBLE_INPUTS`);
what TensorRT-LLM's LLM API cannot honour per request is refused here with a message naming the input and why: a
draft length other than the one fixed at load, draft-logits acceptance, adaptive K, prompt lookup, bad words, an
end token other than the tokenizer's, beam search, ``min_tokens``, ``repetition_penalty``, several return
sequences, and presence/frequency penalties on a release that speculates. Everything else maps onto
``SamplingParams`` (sampling normalised as the other runtimes normalise it for their engines, so every runtime
samples alike), or is done here: stop words (matched in the text, the stream cancelled, the stop word kept as the
ensemble keeps it), the chat template (the adapter ships the tokenizer) and the time limit (``max_time`` within
the release's ``max_request_seconds``: the answer so far, the generation cancelled). On a line whose model does not
stream (1.2) the answer so far is always empty: ``max_time`` is refused there, and a request that reaches
``max_request_seconds`` ends with no text.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from specbuild.errors import RequestError
from specbuild.runtimes.tensorrt_llm_llmapi.contract import LLMAPIAdapterParameters
from specbuild.runtimes.tensorrt_llm_llmapi.lines import LINES
from specbuild.runtimes.tensorrt_llm_llmapi.tensors import LLMAPIAnswer, LLMAPIRequest
from specbuild.speculation.request_settings import REQUEST_SETTINGS
from specbuild.speculation.rules import SamplingParams
from specbuild.triton_models import public_rows
from specbuild.triton_models.public_rows import Arrays, PublicRow, read_row, row_getters
from specbuild.triton_models.text import decode_utf8, text_after
_STATISTICS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")


@dataclass(frozen=True)
class AdapterRow:
    """One row of a client's request: the LLM-API request, and how to answer the client."""

    llm: LLMAPIRequest
    stream: bool
    include_prompt: bool  # non-streamed text starts with the prompt (exclude_input_in_output false)
    echo: str  # what that text repeats: the client's text_input (not its chat template), as preprocessing's echo_ids
    chat: bool = False  # the prompt goes in the tokenizer's chat template (the adapter applies it)
    stop: tuple[str, ...] = ()  # stop words: the text ends with the first one found
    max_seconds: float | None = None  # the time limit (None: none)


def _strings(raw: np.ndarray | None, row: int, name: str) -> tuple[str, ...]:
    if raw is None or raw.size == 0:
        return ()
    items = np.asarray(raw[row if raw.shape[0] > 1 else 0]).reshape(-1)
    return tuple(text for text in (decode_utf8(item, name) for item in items) if text)


def sampling_values(sampling: SamplingParams) -> dict[str, float | int]:
    """``SamplingParams`` (of :mod:`specbuild.speculation.rules`) as the LLM API's ``temperature``/``top_k``/
    ``top_p``: greedy as ``top_k=1``, no nucleus limit as ``top_p=1``, as the orchestrator sends engines."""
    values = sampling.backend_values()
    names = {"temperature": "temperature", "runtime_top_k": "top_k", "runtime_top_p": "top_p",
             "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty"}
    return {names[name]: value for name, value in values.items()}


def _refuse(name: str, value: Any, why: str, fix: str) -> RequestError:
    return RequestError(f"{name}={value!r}: {why}", fix)


# Inputs of the public interface that the LLM-API Triton model has no input for, with the value that means "not
# used" (its config.pbtxt: contract.LLMAPI_INPUTS).
UNAVAILABLE = {"min_tokens": 0, "repetition_penalty": 1.0}


def _refuse_unavailable(public: PublicRow) -> None:
    for name, unused in UNAVAILABLE.items():
        value = public.min_tokens if name == "min_tokens" else getattr(public.sampling, name)
        if value != unused:
            raise _refuse(name, value, "this release serves TensorRT-LLM's LLM-API model, which takes no such input",
                          f"leave {name} out (or send {unused})")


def _refuse_unexact_penalties(public: PublicRow, settings: LLMAPIAdapterParameters) -> None:
    """specbuild never drafts under penalties (each drafted position of a verification would need its own counts);
    whether TensorRT-LLM's two-model Draft/Target path penalises each verified position by the tokens before it is
    not established from its source, so a release that speculates refuses them; a K=0 release passes them on."""
    if not settings.num_draft_tokens:
        return
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(public.sampling, name)
        if value:
            raise _refuse(name, value, "this release speculates inside TensorRT-LLM, whose exactness under sampling "
                          "penalties is not established", f"leave {name} out, or serve a release packaged with "
                          "speculation.num_draft_tokens=0 (the target alone), which applies it")


def _refuse_fixed_speculation(public: PublicRow, settings: LLMAPIAdapterParameters) -> None:
    """What TensorRT-LLM fixes at load, or does not do: a request may restate it, not change it (each request
    setting's ``engine_free`` verdict, and the end token)."""
    for setting in REQUEST_SETTINGS:
        refusal = setting.engine_free.refusal(setting.name, public.settings[setting.name], settings)
        if refusal is not None:
            raise RequestError(*refusal)
    if public.end_id is not None and public.end_id != settings.end_id:
        raise _refuse("end_id", public.end_id, f"the LLM API stops on the tokenizer's end token ({settings.end_id}) "
                      "only", f"send end_id={settings.end_id} or leave it out")


def parse_adapter_rows(arrays: Arrays, settings: LLMAPIAdapterParameters) -> list[AdapterRow]:
    """Each row of an ensemble request as an LLM-API request: the public rules
    (:func:`~specbuild.triton_models.public_rows.read_row`), then what the LLM API cannot honour, refused with a
    :class:`RequestError` naming the input; nothing of the request runs then."""
    texts = arrays.get("text_input")
    rows = []
    for row, get in enumerate(row_getters(arrays, "text_input")):
        public = read_row(get, max_request_seconds=settings.max_request_seconds)
        prompt = decode_utf8(np.asarray(texts[row]).reshape(-1)[0], "text_input")
        if not prompt.strip():
            raise RequestError("text_input is empty", "send a non-empty prompt")
        _refuse_fixed_speculation(public, settings)
        bad_words = _strings(arrays.get("bad_words"), row, "bad_words")
        if bad_words:
            raise _refuse("bad_words", list(bad_words), "the LLM-API Triton model takes no bad words",
                          "leave bad_words out")
        _refuse_unavailable(public)
        _refuse_unexact_penalties(public, settings)
        line = LINES[settings.tensorrt_llm]
        if get("max_time") is not None and not line.streams:
            raise _refuse("max_time", float(get("max_time")), f"TensorRT-LLM {line.tensorrt_llm}'s LLM-API model "
                          "does not stream (lines.py), so nothing of the answer reaches the adapter before it ends: "
                          "a time limit could only end the request with no text",
                          "leave max_time out (the release's triton.max_request_seconds still bounds the request), "
                          "or serve a release packaged for a line that streams (triton.tensorrt_llm: main)")
        if public.guide is not None:  # no line's LLM-API model has a guide input (lines.py)
            raise _refuse("guided_decoding_guide_type", public.guide.type, "this release serves TensorRT-LLM "
                          f"{LINES[settings.tensorrt_llm].tensorrt_llm}'s LLM-API Triton model (line "
                          f"{settings.tensorrt_llm}), whose config.pbtxt has no guided decoding input "
                          "(guided_decoding_guide_type, guided_decoding_guide)",
                          "leave guided_decoding_guide_type out, or serve a torch or tensorrt-llm release for guided "
                          "output")
        rows.append(AdapterRow(
            llm=LLMAPIRequest(prompt=prompt, max_tokens=public.max_tokens, seed=public.seed,
                              streaming=public.stream and settings.streams, **sampling_values(public.sampling)),
            stream=public.stream,
            include_prompt=not public.stream and not public.exclude_input,
            echo=prompt,
            chat=bool(get("apply_chat_template", False)),
            stop=_strings(arrays.get("stop_words"), row, "stop_words"),
            max_seconds=public.max_seconds,
        ))
    return rows


def templated(row: AdapterRow, tokenizer: Any) -> AdapterRow:
    """``row`` with its prompt in the tokenizer's chat template when it asked for it and the tokenizer has one (as
    the preprocessing model does). The LLM API adds the tokenizer's special tokens to a text prompt, so a template
    that starts with the BOS token is sent without it: the model sees the ids the other runtimes' models see."""
    if not row.chat or not getattr(tokenizer, "chat_template", None):
        return row
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": row.llm.prompt}], tokenize=False,
                                             add_generation_prompt=True)
    except Exception as exc:  # noqa: BLE001 - a template may raise anything (jinja, its own checks)
        raise RequestError(f"the chat template refused the prompt: {exc}", "send apply_chat_template=false") from None
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer.encode("x")[:1] == [tokenizer.bos_token_id]:
        text = text[len(bos):]
    return replace(row, llm=replace(row.llm, prompt=text))


@dataclass
class AdapterRowProgress(public_rows.RowProgress):
    """What a row's client has been sent and the latest answer of the LLM-API model for it, with what every
    response reports (``tokens``: the output_token_count of the latest text)."""

    row: AdapterRow = field(kw_only=True)
    answer: LLMAPIAnswer | None = None
    sent: str = ""
    finished: bool = False

    def update(self, answer: LLMAPIAnswer, now_ns: int = 0) -> None:
        """Take the model's latest answer, received at ``now_ns``; statistics it did not send keep their last
        values. Text after the first stop word is cut, and the row is finished there (the caller cancels the rest
        of the generation; on the 1.2 line, which does not stream, the whole answer was generated first)."""
        if self.answer is not None:
            kept = {name: getattr(self.answer, name) for name in _STATISTICS if getattr(answer, name) is None}
            answer = replace(answer, **kept)
        ends = [found + len(word) for word in self.row.stop if (found := answer.text.find(word)) >= 0]
        if ends:
            answer = replace(answer, text=answer.text[:min(ends)], finish_reason="stop")
            self.finished = True
        if answer.text != (self.answer.text if self.answer is not None else ""):
            self.produced(now_ns)
        self.answer = answer

    def generated(self) -> str:
        """The generated text (ending with the stop word that ended it, as the other runtimes keep it)."""
        return "" if self.answer is None else self.answer.text

    def take_new_text(self) -> str:
        """The text not sent yet (a trailing incomplete character held back until the end); marks it sent."""
        new = text_after(self.generated(), self.sent, self.finished)
        self.sent += new
        return new

    def response(self, text: str, arrival_ns: int) -> dict[str, np.ndarray]:
        """A response about this row: ``text`` 1-D as NVIDIA's postprocessing sends it, and the row's figures so far
        (statistics the model did not send count 0)."""
        answer = self.answer
        figures = self.figures(arrival_ns, acceptance_rate=(answer and answer.acceptance_rate) or 0.0,
                               accepted=(answer and answer.total_accepted_draft_tokens) or 0,
                               drafted=(answer and answer.total_draft_tokens) or 0)
        return {"text_output": np.array([text.encode("utf-8")], dtype=np.object_), **figures}


def past_draft_window(progress: AdapterRowProgress, settings: LLMAPIAdapterParameters) -> bool:
    """Whether a speculating row's sequence outgrew the draft's window: TensorRT-LLM's LLM API then stops drafting
    for it and verifies placeholder drafts (NVIDIA/TensorRT-LLM ``tensorrt_llm/_torch/speculative/model_drafter.py``,
    ``_prepare_draft_batch``: skipped once its tokens minus one reach the draft engine's ``max_seq_len``, which
    ``PyTorchModelEngine._init_max_seq_len`` caps at the draft's max_position_embeddings; ``py_executor_creator.py``:
    "The draft model engine will infer its own max_seq_len. We'll stop drafting when we hit the max."). The answer
    goes on with the target's tokens, exact: no error, a cost."""
    return settings.num_draft_tokens > 0 and progress.prompt_tokens + progress.tokens > settings.draft_max_seq_len
