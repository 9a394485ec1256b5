"""Guided decoding through the served tiny release (a real Triton server): a JSON-schema answer over HTTP generate
parses, matches its schema and is the target's alone under the same schema at K=0 and K=4 (greedy); NVIDIA's
``guided_decoding_guide_type json`` over gRPC gives JSON; a malformed schema is refused naming the guide."""

from __future__ import annotations

import json

import jsonschema
import pytest

from specbuild.serve.client import GenerationRequest, http_generate
from specbuild.errors import RequestError

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "count": {"type": "integer", "minimum": 0, "maximum": 999},
                                           "kind": {"enum": ["def", "class", "import"]}},
          "required": ["name", "count", "kind"], "additionalProperties": False}
PROMPT = "def parse(self, text):\n    "


@pytest.fixture(scope="module")
def guides(tokenizer, tiny_release):
    from specbuild.speculation.guide import GuideCompiler
    from specbuild.package.build_record import BuildRecord

    return GuideCompiler(tokenizer, BuildRecord.read(tiny_release.engines / "target").vocab_size)


def test_a_json_schema_answer_parses_matches_and_is_the_targets_alone_at_every_k(tiny_server, target_alone,
                                                                                  tokenizer, guides):
    from specbuild.speculation.guide_spec import GuideSpec

    guide = guides.guide(GuideSpec("json_schema", json.dumps(SCHEMA)), tokenizer.eos_token_id)
    expected = target_alone(PROMPT, 96, guide=guide)
    answers = [http_generate(tiny_server.http_url, GenerationRequest(
        PROMPT, 96, num_draft_tokens=k, guided_decoding_guide_type="json_schema",
        guided_decoding_guide=json.dumps(SCHEMA))) for k in (0, 4)]
    assert [answer.text for answer in answers] == [expected.text, expected.text]
    jsonschema.validate(json.loads(expected.text), SCHEMA)
    assert answers[1].acceptance_rate is not None


def json_so_far(guides, text: str) -> bool:
    """Whether ``text`` is JSON, or the start of some (an answer cut by max_tokens), by xgrammar's JSON grammar."""
    import xgrammar

    from specbuild.speculation.guide_spec import GuideSpec

    return xgrammar.GrammarMatcher(guides.compile(GuideSpec("json"))).accept_string(text)


def test_nvidia_s_json_guide_type_over_grpc_gives_json_at_every_k(tiny_client, guides):
    answers = [tiny_client.generate(PROMPT, 48, num_draft_tokens=k, guided_decoding_guide_type="json")
               for k in (0, 3)]
    assert answers[0].text == answers[1].text and answers[0].text
    assert json_so_far(guides, answers[0].text), answers[0].text
    assert not json_so_far(guides, answers[0].text + "}}]]")  # the check can fail


def test_nvidia_s_client_with_guided_decoding_guide_type_json_gets_json(tiny_server, guides):
    import nvidia_conformance as nvidia

    answer = nvidia.run(tiny_server.grpc_url, [PROMPT], output_len=48, exclude_input_in_output=True,
                        **nvidia.guided_inputs("json"))
    assert not answer.errors and answer.texts[0] and json_so_far(guides, answer.texts[0])


def test_a_malformed_schema_is_refused_naming_the_guide(tiny_server):
    with pytest.raises(RequestError) as refused:
        http_generate(tiny_server.http_url, GenerationRequest(
            PROMPT, 8, guided_decoding_guide_type="json_schema", guided_decoding_guide='{"type": "nope"}'))
    assert 'guided_decoding_guide is not a valid json schema: Unsupported type "nope"' in refused.value.message
