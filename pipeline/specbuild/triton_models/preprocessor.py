"""Text to token ids, as the ``preprocessing`` model does it for the ensemble and the OpenAI-compatible front end
does it for its calls of the orchestrator: one :class:`Preprocessor` for both, so a prompt means the same ids
whichever way it arrives (pure; the tokenizer is a ``transformers`` tokenizer).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from specbuild.errors import RequestError
from specbuild.package.contract import PreprocessingParameters
from specbuild.triton_models.batch import row_value
from specbuild.triton_models.text import decode_utf8, encode_word_list, pad_rows

Message = Mapping[str, Any]  # {"role": ..., "content": ...} (and, for templates that take them, "tool_calls")


class Preprocessor:
    """A release's tokenizer and its preprocessing parameters (``max_input_len``, the default ``end_id``)."""

    def __init__(self, tokenizer: Any, parameters: PreprocessingParameters) -> None:
        self.tokenizer = tokenizer
        self.parameters = parameters

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def template_takes_tools(self) -> bool:
        """Whether the chat template reads a ``tools`` variable (Hugging Face's convention for tool definitions)."""
        return self.has_chat_template and "tools" in str(self.tokenizer.chat_template)

    def chat_text(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """``messages`` (and ``tools``, for a template that takes them) in the tokenizer's chat template, ready for
        the assistant's answer."""
        if not self.has_chat_template:
            raise RequestError("this model's tokenizer has no chat template",
                               "send the prompt as plain text (/v1/completions), or package a tokenizer with one")
        try:
            return self.tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None,
                                                      tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - a template may raise anything (jinja, its own checks)
            raise RequestError(f"the chat template refused the messages: {exc}",
                               "send messages in the roles and order the model's template accepts") from None

    def prompt_ids(self, text: str, *, chat: bool = False) -> list[int]:
        """The prompt's ids: ``text`` as it is, or (``chat``) as a user message in the chat template when the
        tokenizer has one. A templated text already holds its special tokens, so none are added to it."""
        templated = chat and self.has_chat_template
        if templated:
            text = self.chat_text([{"role": "user", "content": text}])
        return self.checked(text, add_special_tokens=not templated)

    def checked(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """``text`` encoded; refused when empty or longer than the release's ``max_input_len``."""
        if not text.strip():
            raise RequestError("text_input is empty", "send a non-empty prompt")
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        limit = self.parameters.max_input_len
        if len(ids) > limit:
            raise RequestError(f"prompt has {len(ids)} tokens, more than max_input_len ({limit})",
                               "shorten the prompt or rebuild with a larger limits.max_input_len")
        return ids

    def warm_up(self) -> None:
        """Encode a short text once (through the chat template where there is one): a tokenizer's first call
        builds its caches, which would otherwise cost the first request."""
        self.tensors({"text_input": np.array([[b"Hello, world"]], dtype=np.object_),
                      "apply_chat_template": np.array([[True]]), "stop_words": np.array([[b"stop"]], dtype=np.object_)})

    def word_ids(self, words: Iterable[str]) -> list[list[int]]:
        """Stop or bad words as token sequences (empty strings ignored)."""
        return [self.tokenizer.encode(word, add_special_tokens=False) for word in words if word]

    def tensors(self, arrays: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """The ``preprocessing`` model's outputs for a request's rows (``text_input``, ``stop_words``,
        ``bad_words``, ``end_id``, ``apply_chat_template``): the prompt's ids, and those a non-streamed answer
        repeats when its input is not excluded (the prompt's, or the user's text where the template wrapped it)."""
        texts = arrays.get("text_input")
        if texts is None:
            raise RequestError("missing input 'text_input'")
        rows = texts.shape[0]
        ids, echoes = [], []
        for row in range(rows):
            text = decode_utf8(np.asarray(texts[row]).reshape(-1)[0], "text_input")
            templated = bool(row_value(arrays.get("apply_chat_template"), row, False)) and self.has_chat_template
            ids.append(self.prompt_ids(text, chat=templated))
            echoes.append(self.tokenizer.encode(text) if templated else ids[-1])  # the user's text, not the template
        end_id = self.parameters.end_id
        outputs = {
            "input_ids": pad_rows(ids, end_id),
            "input_length": np.array([[len(row)] for row in ids], dtype=np.int32),
            "end_id": np.array([[row_value(arrays.get("end_id"), r, end_id)] for r in range(rows)], dtype=np.int32),
            "echo_ids": pad_rows(echoes, end_id),
            "echo_length": np.array([[len(row)] for row in echoes], dtype=np.int32),
        }
        for name, output in (("stop_words", "stop_words_ids"), ("bad_words", "bad_words_ids")):
            outputs[output] = stack_word_lists([encode_word_list(self.word_ids(_texts(arrays.get(name), row, name)))
                                                for row in range(rows)])
        return outputs


def _texts(raw: np.ndarray | None, row: int, name: str) -> list[str]:
    """Row ``row`` of a BYTES input holding words (one row is broadcast to all)."""
    if raw is None or not raw.size:
        return []
    return [decode_utf8(item, name) for item in np.asarray(raw[row if raw.shape[0] > 1 else 0]).reshape(-1)]


def stack_word_lists(lists: Sequence[np.ndarray]) -> np.ndarray:
    """Rows' ``[2, L]`` word lists as one ``[rows, 2, max L]`` int32 array (ids padded with 0, offsets -1)."""
    width = max(item.shape[1] for item in lists)
    stacked = np.stack([np.pad(item, ((0, 0), (0, width - item.shape[1])), constant_values=-1)
                        for item in lists]).astype(np.int32)
    stacked[:, 0, :][stacked[:, 0, :] < 0] = 0
    return stacked
