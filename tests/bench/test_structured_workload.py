"""The structured workload of specbuild bench (a JSON schema per prompt, each prompt sent with it and without) and
the per-kind figures every report carries: the math on synthetic traces (fast), one run against the tiny server
(slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbuild.bench.figures import RequestTrace, compare, summarize
from specbuild.bench.prompts import SCHEMA_SUFFIX, Prompt, load_prompts, with_and_without_schema
from specbuild.bench.report import kind_rows, markdown, tables
from specbuild.bench.sweep import BenchPlan, BenchReport
from specbuild.errors import UsageError


def test_the_structured_workload_sends_each_prompt_with_its_schema_and_without():
    prompts = load_prompts(workload="structured")
    assert len(prompts) == 24
    guided, plain = prompts[0::2], prompts[1::2]
    assert all(p.category.endswith(SCHEMA_SUFFIX) and p.json_schema for p in guided)
    assert all(p.json_schema is None and p.guide == {} for p in plain)
    assert [p.prompt for p in guided] == [p.prompt for p in plain]
    assert [p.category for p in guided] == [p.category + SCHEMA_SUFFIX for p in plain]
    assert {p.category for p in plain} == {"extraction", "classification", "generation", "summarization"}
    assert len(load_prompts(workload="structured", limit=3)) == 6  # the limit counts prompts, not requests
    assert {p.category for p in load_prompts(workload="structured", categories=["generation"])} == {
        "generation", "generation" + SCHEMA_SUFFIX}


def test_every_bundled_schema_passes_the_public_guide_rules_and_compiles():
    xgrammar = pytest.importorskip("xgrammar")
    from specbuild.speculation.guide_spec import GuideSpec

    for prompt in load_prompts(workload="structured")[0::2]:
        guide = prompt.guide
        spec = GuideSpec.parse(guide["guided_decoding_guide_type"], guide["guided_decoding_guide"])
        assert spec is not None and spec.type == "json_schema"
        xgrammar.Grammar.from_json_schema(spec.text, any_whitespace=False)


def test_a_prompt_file_carries_schemas_as_written_and_does_not_mix_with_a_bundled_workload(tmp_path: Path):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    file = tmp_path / "mine.jsonl"
    file.write_text(json.dumps({"category": "check", "prompt": "Is it ok?", "json_schema": schema}) + "\n"
                    + json.dumps({"prompt": "Free text"}) + "\n", encoding="utf-8")
    first, second = load_prompts(file)
    assert first.guide == {"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": json.dumps(schema)}
    assert second.guide == {}
    with pytest.raises(UsageError, match="not both"):
        load_prompts(file, workload="structured")


def trace(index: int, category: str, tokens: int, seconds: float, drafted: int = 0, accepted: int = 0,
          rounds: int = 1) -> RequestTrace:
    per_round = [tokens // rounds] * rounds
    per_round[-1] += tokens - sum(per_round)
    return RequestTrace(index, category, tuple(seconds * (i + 1) / rounds for i in range(rounds)), tuple(per_round),
                        seconds, drafted=drafted, accepted=accepted)


def test_each_kind_is_measured_on_its_own_requests_against_the_same_kind_at_k0():
    plain, guided = with_and_without_schema(Prompt(category="extraction", prompt="x",
                                                   json_schema={"type": "object"}))[::-1]
    base = summarize(0, 1, False, [trace(0, plain.category, 40, 4.0, rounds=40),
                                   trace(1, guided.category, 40, 8.0, rounds=40)], 12.0)
    fast = summarize(2, 1, False, [trace(0, plain.category, 40, 2.0, drafted=40, accepted=20, rounds=20),
                                   trace(1, guided.category, 40, 8.0, drafted=40, accepted=4, rounds=36),
                                   trace(2, guided.category, 0, 0.0)], 10.0)
    _, cell = compare([base, fast])
    assert cell.by_kind["extraction"].tokens_per_second == 20.0 and cell.by_kind["extraction"].speedup == 2.0
    assert cell.by_kind["extraction"].acceptance_rate == 0.5
    schema = cell.by_kind["extraction" + SCHEMA_SUFFIX]
    assert schema.requests == 2 and schema.speedup == pytest.approx((40 / 8.0) / 5.0)
    assert schema.acceptance_rate == 0.1 and schema.tokens_per_round == pytest.approx(40 / 36)
    rows = kind_rows([base, cell])
    assert ("extraction", "2", "1", "1", "20.0", "2.00x", "0.50", "2.00") in rows
    assert len(rows) == 4


def test_reports_show_kinds_only_when_there_are_several():
    one = summarize(0, 1, False, [trace(0, "chat", 10, 1.0)], 1.0)
    assert kind_rows([one]) == [] and len(tables([one])) == 2
    two = summarize(0, 1, False, [trace(0, "chat", 10, 1.0), trace(1, "code", 10, 2.0)], 3.0)
    assert len(tables([two])) == 3
    report = BenchReport(plan=BenchPlan(), url="localhost:8001", prompts=2, cells=[two], metrics=False)
    assert "## By kind of prompt" in markdown(report)
    assert json.loads(json.dumps(report.to_dict()))["cells"][0]["by_kind"]["code"]["tokens_per_second"] == 5.0


@pytest.mark.slow
@pytest.mark.e2e
def test_a_structured_run_against_the_tiny_server_measures_both_kinds_and_keeps_the_text(tiny_release, tiny_server):
    from specbuild.bench.sweep import repository_tokenizer, run_bench

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "ok": {"type": "boolean"}}, "required": ["n", "ok"]}
    prompts = [sent for text in ("def add(a, b):", "Count to three")
               for sent in with_and_without_schema(Prompt(category="short", prompt=text, json_schema=schema))]
    plan = BenchPlan(ks=(3,), requests=4, max_tokens=16)
    report = run_bench(tiny_server.grpc_url, prompts, plan, metrics_url=tiny_server.metrics_url,
                       tokenizer_dir=repository_tokenizer(tiny_release.repository))
    for cell in report.cells:
        assert cell.errors == 0 and cell.matches_baseline == 1.0  # greedy: the same text at K=3, guided or not
        assert set(cell.by_kind) == {"short", "short" + SCHEMA_SUFFIX}
        assert all(figures.requests == 2 for figures in cell.by_kind.values())
    speculative = report.cells[1]
    assert all(figures.speedup is not None and figures.acceptance_rate is not None
               for figures in speculative.by_kind.values())
