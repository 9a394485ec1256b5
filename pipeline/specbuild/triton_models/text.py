"""Text <-> token helpers shared by the pre- and postprocessing models (pure; testable without Triton)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from specbuild.errors import RequestError

REPLACEMENT_CHARACTER = "\ufffd"


def decode_utf8(raw: Any, field: str) -> str:
    """A Triton BYTES element as text; invalid UTF-8 is a client error, not a crash."""
    if isinstance(raw, str):
        return raw
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"{field} is not valid UTF-8 (byte {exc.start})", "send text encoded as UTF-8") from None


def encode_word_list(words: Sequence[Sequence[int]]) -> np.ndarray:
    """Word lists as TensorRT-LLM takes them: ``[2, L]`` int32, row 0 the concatenated ids (0-padded),
    row 1 the end offset of each word (-1-padded). An empty list is ``[[0], [-1]]``."""
    flat = [token for word in words for token in word]
    offsets, end = [], 0
    for word in words:
        end += len(word)
        offsets.append(end)
    width = max(1, len(flat), len(offsets))
    encoded = np.zeros((2, width), dtype=np.int32)
    encoded[1, :] = -1
    encoded[0, : len(flat)] = flat
    encoded[1, : len(offsets)] = offsets
    return encoded


def decode_word_list(encoded: np.ndarray | None) -> list[list[int]]:
    """Inverse of :func:`encode_word_list`; ``None`` means no words."""
    if encoded is None or encoded.size == 0:
        return []
    encoded = np.asarray(encoded).reshape(2, -1)
    ids, words, start = encoded[0].tolist(), [], 0
    for end in encoded[1].tolist():
        if end < 0:
            break
        if end < start or end > len(ids):
            raise RequestError("malformed word list: offsets must increase and stay within the ids row")
        words.append(ids[start:end])
        start = end
    return [word for word in words if word]


def pad_rows(rows: Sequence[Sequence[int]], pad: int) -> np.ndarray:
    """Ragged int rows as one ``[len(rows), max_len]`` int32 array (at least one column)."""
    width = max([1] + [len(row) for row in rows])
    out = np.full((len(rows), width), pad, dtype=np.int32)
    for index, row in enumerate(rows):
        out[index, : len(row)] = row
    return out


def incremental_text(tokenizer: Any, tokens: Sequence[int], skip: int, final: bool) -> str:
    """The text that ``tokens`` add after their first ``skip`` tokens were already sent.

    Stateless, so a streamed request needs no server-side memory: the orchestrator resends the generated
    ids and how many were covered before. A trailing U+FFFD (an incomplete multi-byte character split
    across tokens) is held back until its remaining bytes arrive or the request ends, so no chunk ever
    carries half a character.
    """
    full = tokenizer.decode(list(tokens), skip_special_tokens=True)
    sent = tokenizer.decode(list(tokens[:skip]), skip_special_tokens=True) if skip > 0 else ""
    return text_after(full, sent, final)


def text_after(full: str, sent: str, final: bool) -> str:
    """What ``full`` (the whole text so far) adds to ``sent`` (the text already sent, as it was decoded then),
    holding back a trailing U+FFFD until ``final``."""
    sent = sent.rstrip(REPLACEMENT_CHARACTER)
    if not final:
        full = full.rstrip(REPLACEMENT_CHARACTER)
    if full.startswith(sent):
        return full[len(sent):]
    common = 0  # a tokenizer whose decode is not prefix-stable: emit from the first differing character
    while common < min(len(full), len(sent)) and full[common] == sent[common]:
        common += 1
    return full[common:]


class StopStrings:
    """OpenAI's ``stop``: the text ends before the first occurrence of any stop string, which is not returned.

    :meth:`feed` takes each new piece of text and returns what may be sent now: text that could still turn out
    to begin a stop string is held back until the next piece decides it (or :meth:`flush` at the end).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [stop for stop in stops if stop]
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        text = self._held + piece
        ends = [index for index in (text.find(stop) for stop in self.stops) if index >= 0]
        if ends:
            self.stopped, self._held = True, ""
            return text[: min(ends)]
        keep = max((length for stop in self.stops for length in range(1, len(stop))
                    if text.endswith(stop[:length])), default=0)
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The held-back text once no more comes (it began no stop string after all)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
