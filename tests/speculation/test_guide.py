"""Guides (speculation/guide.py): refused before anything runs, compiled once per (tokenizer, guide) within bounds,
and the masks a request's matcher gives along a proposal, rolled back."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch

from specbuild.errors import RequestError
from specbuild.speculation.engine_call import EngineOutput, EngineRequest
from specbuild.speculation.guide import GuideCompiler
from specbuild.speculation.guide_spec import MAX_GUIDE_BYTES, GuideSpec
from specbuild.speculation.rules import allowed_tokens

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                     "additionalProperties": False})
TEXTS = ['{"a": 12, "name": "abc", "tags": ["x", "y"]}', "hello world, foo bar baz 0123456789 ab ba"] * 40


@pytest.fixture(scope="module")
def tokenizer():
    from specbuild.drafts.tiny_models import train_tokenizer, wrap_tokenizer

    return wrap_tokenizer(train_tokenizer(TEXTS))


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GuideCompiler(tokenizer, len(tokenizer) + 5)  # a head padded beyond the tokenizer's vocabulary


def allowed(compiler: GuideCompiler, tokenizer, bitmask: torch.Tensor) -> list[set[str]]:
    return [{tokenizer.convert_ids_to_tokens(i) for i in row.nonzero().flatten().tolist() if i < len(tokenizer)}
            for row in allowed_tokens(bitmask, compiler.vocab_size)]


def test_no_guide_is_none_and_each_type_parses():
    assert GuideSpec.parse(None, None) is None and GuideSpec.parse("", "") is None
    assert GuideSpec.parse("json", None) == GuideSpec("json")
    assert GuideSpec.parse("json_schema", SCHEMA) == GuideSpec("json_schema", SCHEMA)
    assert GuideSpec.parse("regex", "[ab]+") == GuideSpec("regex", "[ab]+")
    assert GuideSpec.parse("ebnf_grammar", 'root ::= "a"') == GuideSpec("ebnf_grammar", 'root ::= "a"')


@pytest.mark.parametrize(("guide_type", "guide", "names"), [
    (None, "[ab]+", "guided_decoding_guide was sent without guided_decoding_guide_type"),
    ("xml", "<a/>", "guided_decoding_guide_type 'xml' is not a guide type"),
    ("json", SCHEMA, "guided_decoding_guide_type json takes no guided_decoding_guide"),
    ("regex", "", "guided_decoding_guide_type regex needs a guided_decoding_guide"),
    ("json_schema", "{not json", "guided_decoding_guide is not a JSON schema"),
    ("json_schema", "[1, 2]", "guided_decoding_guide is not a JSON schema: a list"),
    ("regex", "a" * (MAX_GUIDE_BYTES + 1), f"more than the {MAX_GUIDE_BYTES} a guide may have"),
])
def test_a_bad_guide_is_refused_naming_the_input(guide_type, guide, names):
    with pytest.raises(RequestError) as error:
        GuideSpec.parse(guide_type, guide)
    assert names in error.value.message and error.value.fix


@pytest.mark.parametrize(("spec", "names"), [
    (GuideSpec("regex", "a(b"), "guided_decoding_guide is not a valid regex: Regex parsing error"),
    (GuideSpec("ebnf_grammar", "root ::= foo"), 'is not a valid ebnf grammar: EBNF parser error at line 1, column 10'),
    (GuideSpec("json_schema", '{"type": "nope"}'), 'is not a valid json schema: Unsupported type "nope"'),
])
def test_a_guide_that_does_not_compile_is_refused_naming_the_problem(compiler, spec, names):
    with pytest.raises(RequestError) as error:
        compiler.compile(spec)
    assert names in error.value.message and "[" not in error.value.message.split(": ", 1)[1][:1]


def test_a_guide_compiles_once_per_tokenizer_and_the_cache_is_bounded(tokenizer):
    compiler = GuideCompiler(tokenizer, len(tokenizer), cached=2)
    first = compiler.compile(GuideSpec("regex", "a+"))
    assert compiler.compile(GuideSpec("regex", "a+")) is first
    compiler.compile(GuideSpec("regex", "b+"))
    compiler.compile(GuideSpec("regex", "a+"))  # most recent again: b+ is now the oldest
    compiler.compile(GuideSpec("regex", "c+"))
    assert compiler.compile(GuideSpec("regex", "a+")) is first
    assert list(compiler._grammars) == [GuideSpec("regex", "c+"), GuideSpec("regex", "a+")]


def test_a_compile_past_its_time_limit_is_refused(tokenizer):
    """The compile workers held busy (as by two hostile guides still compiling): the next compile cannot finish
    within its limit and is refused; once they are free it compiles."""
    compiler = GuideCompiler(tokenizer, len(tokenizer), timeout=0.2)
    release = threading.Event()
    busy = [compiler._pool.submit(release.wait) for _ in range(2)]
    try:
        with pytest.raises(RequestError) as error:
            compiler.compile(GuideSpec("json_schema", SCHEMA))
        assert "guided_decoding_guide (json_schema) did not compile within 0.2 s" in error.value.message
    finally:
        release.set()
    assert all(future.result() for future in busy)
    assert compiler.compile(GuideSpec("json_schema", SCHEMA)) is not None


def test_masks_follow_a_proposal_and_leave_the_matcher_where_it_was(compiler, tokenizer):
    guide = compiler.guide(GuideSpec("regex", "ab"), tokenizer.eos_token_id)
    a, b = tokenizer.convert_tokens_to_ids(["a", "b"])
    rows = allowed(compiler, tokenizer, guide.masks([a, b]))
    assert "a" in rows[0] and "b" not in rows[0]
    assert rows[1] == {"b"}
    assert rows[2] == {tokenizer.eos_token}  # complete: the end token only
    assert allowed(compiler, tokenizer, guide.masks()) == rows[:1]  # rolled back
    assert guide.admissible([a, a, b]) == 1 and guide.admissible([a, b, b]) == 2
    guide.accept([a, b])
    assert not guide.finished and allowed(compiler, tokenizer, guide.masks())[0] == {tokenizer.eos_token}
    with pytest.raises(RuntimeError, match="forbids"):
        guide.accept([a])


def test_a_generation_call_runs_one_masked_token_at_a_time_and_rolls_back(compiler, tokenizer):
    """``constrained`` splits a call for n tokens into n one-token calls, each with the mask after the tokens
    before it; the engine here picks the lowest allowed token, as an engine applying the mask must."""
    guide = compiler.guide(GuideSpec("regex", "ab"), tokenizer.eos_token_id)
    calls: list[EngineRequest] = []

    async def engine(request: EngineRequest) -> EngineOutput:
        calls.append(request)
        row = allowed_tokens(request.token_masks, compiler.vocab_size)[0]
        return EngineOutput([int(row.nonzero()[0])])

    output = asyncio.run(guide.constrained(engine)(EngineRequest([1], max_new_tokens=5, end_id=tokenizer.eos_token_id)))
    assert tokenizer.convert_ids_to_tokens(output.tokens) == ["a", "b", tokenizer.eos_token]
    assert [len(call.input_ids) for call in calls] == [1, 2, 3]
    assert all(call.max_new_tokens == 1 and call.token_masks.shape[0] == 1 for call in calls)
    assert allowed(compiler, tokenizer, guide.masks())[0] >= {"a"}  # rolled back to the start


def test_the_engine_s_grammar_of_a_schema_is_the_compact_json_specbuild_compiles() -> None:
    """What the tensorrtllm backend gets for a json_schema guide: the ebnf_grammar of its compact JSON, which
    refuses the blanks the backend's own compile of the schema (any whitespace) would allow."""
    import xgrammar
    from xgrammar.testing import _is_grammar_accept_string as accepts

    from specbuild.speculation.guide import engine_guide

    sent = engine_guide(GuideSpec("json_schema", SCHEMA))
    assert sent.type == "ebnf_grammar"
    assert accepts(sent.text, '{"a": 1}') and not accepts(sent.text, '{ "a": 1 }')
    assert accepts(xgrammar.Grammar.from_json_schema(SCHEMA), '{ "a": 1 }')  # the backend's json_schema compile
    assert engine_guide(GuideSpec("regex", "a+")) == GuideSpec("regex", "a+")
