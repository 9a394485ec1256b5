"""The orchestrator's settings, read from the parameters the repository renderer writes (outside Triton: only
the python backend's utils module is stood in for, and nothing here calls it). Serving is covered end to
end in test_e2e_serving.py."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from specbuild.errors import SpecError
from specbuild.speculation.lookup import PromptLookup
from specbuild.package.repository import EngineInfo, orchestrator_config
from specbuild.spec import load_spec


@pytest.fixture
def orchestrator(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    utils = types.ModuleType("triton_python_backend_utils")
    utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", utils)
    monkeypatch.delitem(sys.modules, "specbuild.serve.triton_models.orchestrator", raising=False)
    import specbuild.serve.triton_models.orchestrator as module

    return module


def rendered_parameters(tmp_path: Path, runtime: str, **speculation: object) -> dict[str, str]:
    spec = load_spec(None, {"runtime": runtime, "target.checkpoint": "t", "draft.checkpoint": "d",
                            "limits.max_input_len": 64, "limits.max_seq_len": 128,
                            **{f"speculation.{key}": value for key, value in speculation.items()}}, base_dir=tmp_path)
    target = EngineInfo(role="target", runtime=runtime, path=tmp_path, dtype="float16", vocab_size=320,
                        build_config={"max_draft_len": 8})
    config = orchestrator_config(spec, target)
    return {key: value.string_value for key, value in config.parameters.items()}


@pytest.mark.parametrize("runtime", ["torch", "tensorrt-llm"])
def test_settings_read_the_rendered_prompt_lookup_parameters(orchestrator, tmp_path, runtime):
    settings = orchestrator.Settings.from_parameters(rendered_parameters(
        tmp_path, runtime, **{"prompt_lookup.enabled": True, "prompt_lookup.max_ngram": 3,
                              "prompt_lookup.min_ngram": 1, "prompt_lookup.draft_fallback": False}))
    assert settings.prompt_lookup is True
    assert settings.lookup == PromptLookup(max_ngram=3, min_ngram=1)
    assert settings.lookup_draft_fallback is False
    assert settings.vocab_size == 320
    default = orchestrator.Settings.from_parameters(rendered_parameters(tmp_path, runtime))
    assert default.prompt_lookup is False and default.lookup == PromptLookup()
    assert default.lookup_draft_fallback is True


def test_settings_of_an_older_repository_default_to_lookup_off(orchestrator):
    settings = orchestrator.Settings.from_parameters({"max_draft_len": "8", "num_draft_tokens": "4",
                                                      "use_draft_logits": "true", "max_input_len": "64",
                                                      "max_seq_len": "128"})
    assert settings.prompt_lookup is False and settings.vocab_size is None
    assert settings.lookup_draft_fallback is True


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [("2", "3"), ("4", "0")])
def test_bad_lookup_parameters_fail_the_load_with_a_clear_error(orchestrator, max_ngram, min_ngram):
    with pytest.raises(SpecError) as error:
        orchestrator.lookup_settings({"lookup_max_ngram": max_ngram, "lookup_min_ngram": min_ngram})
    assert "lookup_max_ngram/lookup_min_ngram" in error.value.message
    assert "max_ngram >= min_ngram >= 1" in error.value.message
    assert "speculation.prompt_lookup" in (error.value.fix or "")
