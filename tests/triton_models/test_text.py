"""Word lists and incremental detokenization (no broken multi-byte characters between chunks)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from checkpoint_factory import TEXT_MAIN, train_tokenizer
from specbuild.errors import RequestError
from specbuild.triton_models.text import REPLACEMENT_CHARACTER, decode_utf8, decode_word_list, encode_word_list, incremental_text


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXT_MAIN, 400)


@given(st.lists(st.lists(st.integers(0, 50_000), min_size=1, max_size=5), max_size=6))
def test_word_lists_round_trip(words: list[list[int]]) -> None:
    encoded = encode_word_list(words)
    assert encoded.shape[0] == 2 and encoded.dtype == np.int32
    assert decode_word_list(encoded) == words


def test_empty_word_list_and_malformed_offsets() -> None:
    assert encode_word_list([]).tolist() == [[0], [-1]]
    assert decode_word_list(None) == []
    with pytest.raises(RequestError, match="offsets"):
        decode_word_list(np.array([[1, 2], [2, 1]]))


def test_invalid_utf8_is_a_request_error() -> None:
    assert decode_utf8(b"caf\xc3\xa9", "text_input") == "café"
    with pytest.raises(RequestError, match="text_input is not valid UTF-8"):
        decode_utf8(b"\xff\xfe", "text_input")


@pytest.mark.parametrize("text", ["naïve café ☕ — 数据 🚀 end", "plain ascii text", "é"])
def test_streamed_chunks_never_split_a_character(tokenizer, text: str) -> None:
    tokens = tokenizer.encode(text, add_special_tokens=False)
    # Byte-level BPE trained on ASCII source code splits non-ASCII characters over several tokens.
    assert len(tokens) > len(text.encode("ascii", "ignore")) // 8
    for step in (1, 2, 3):
        chunks, sent = [], 0
        for end in range(step, len(tokens) + step, step):
            end = min(end, len(tokens))
            chunks.append(incremental_text(tokenizer, tokens[:end], sent, final=end == len(tokens)))
            sent = end
        assert all(REPLACEMENT_CHARACTER not in chunk for chunk in chunks)
        assert "".join(chunks) == tokenizer.decode(tokens)


def test_a_trailing_incomplete_character_is_released_at_the_end(tokenizer) -> None:
    tokens = tokenizer.encode("☕", add_special_tokens=False)
    assert len(tokens) > 1
    assert incremental_text(tokenizer, tokens[:-1], 0, final=False) == ""
    assert incremental_text(tokenizer, tokens[:-1], 0, final=True).endswith(REPLACEMENT_CHARACTER)


# --- OpenAI stop strings ---------------------------------------------------------------------------------------
def test_stop_strings_end_the_text_before_the_first_one_across_pieces():
    from specbuild.triton_models.text import StopStrings

    stops = StopStrings(["END", "\n\n"])
    sent = [stops.feed(piece) for piece in ("Hello E", "N", "D and more")]
    assert sent == ["Hello ", "", ""] and stops.stopped  # "E", "EN" held back until "END" completed
    assert stops.feed("more") == "" and stops.flush() == ""

    held = StopStrings(["END"])
    assert [held.feed("a E"), held.feed("x"), held.flush()] == ["a ", "Ex", ""]  # "E" began no stop after all
    trailing = StopStrings(["END"])
    assert [trailing.feed("ab EN"), trailing.flush()] == ["ab ", "EN"] and not trailing.stopped
    earliest = StopStrings(["b", "a"])
    assert earliest.feed("xab") == "x"  # the earliest occurrence of any of them
    assert StopStrings([]).feed("anything") == "anything"
