"""A tensorrt-llm release turns the ``tensorrtllm`` backend's guided decoding on for its target: the parameters, the
tokenizer info file NVIDIA's tool would write (loaded into xgrammar 0.1.25 the way the backend loads it), the
orchestrator told the target applies guides itself, and the backend's load-time rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkpoint_factory import Checkpoints, package_gpu_release
from specbuild.package.backend_guides import (TOKENIZER_INFO_FILE, guided_decoding_configured, load_tokenizer_info,
                                              tokenizer_info)
from specbuild.package.manifest import verify
from specbuild.package.repository import read_config


@pytest.fixture(scope="module")
def release(checkpoints: Checkpoints, tmp_path_factory: pytest.TempPathFactory):
    return package_gpu_release(checkpoints, tmp_path_factory.mktemp("guided"))


def parameters(repository: Path, model: str) -> dict[str, str]:
    return {key: value.string_value for key, value in read_config(repository / model).parameters.items()}


def test_the_target_has_the_backends_guided_decoding_and_the_draft_none(release):
    target, draft = parameters(release.repository, "target"), parameters(release.repository, "draft")
    assert target["guided_decoding_backend"] == "xgrammar"
    assert target["xgrammar_tokenizer_info_path"] == f"/triton_repo/target/{TOKENIZER_INFO_FILE}"  # the mount
    assert target["tokenizer_dir"] == ""  # the C++ workflow ignores it
    assert (draft["guided_decoding_backend"], draft["xgrammar_tokenizer_info_path"]) == ("", "")
    orchestrator = parameters(release.repository, "orchestrator")
    assert (orchestrator["engine_guides"], orchestrator["guided_decoding"]) == ("true", "false")
    inputs = {t.name: t for t in read_config(release.repository / "target").input}
    for name in ("guided_decoding_guide_type", "guided_decoding_guide"):  # as the backend's config.pbtxt has them
        assert inputs[name].optional and inputs[name].allow_ragged_batch and not inputs[name].HasField("reshape")


def test_the_tokenizer_info_file_is_nvidias_format_and_in_the_manifest(release, checkpoints: Checkpoints):
    from transformers import AutoTokenizer

    path = release.repository / "target" / TOKENIZER_INFO_FILE
    written = json.loads(path.read_text(encoding="utf-8"))
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoints.target))
    assert list(written) == ["encoded_vocab", "tokenizer_str", "stop_token_ids"]
    assert written == tokenizer_info(tokenizer)
    assert written["stop_token_ids"] == [tokenizer.eos_token_id]
    vocab = tokenizer.get_vocab()
    assert [vocab[token] for token in written["encoded_vocab"]] == list(range(len(vocab)))  # ordered by id
    assert verify(release.manifest).ok
    path.write_text("{}", encoding="utf-8")  # changed after packaging: the manifest says so
    assert str(path.relative_to(release.manifest.parent)) in verify(release.manifest).changed
    path.write_text(json.dumps(written, ensure_ascii=False), encoding="utf-8")
    assert verify(release.manifest).ok


def test_the_file_loads_in_xgrammar_as_the_backend_loads_it_and_masks_as_the_tokenizer_does(release, checkpoints):
    """guidedDecoder.cpp: TokenizerInfo::FromHuggingFace(encoded_vocab, tokenizer_str, vocab_size_padded,
    stop_token_ids); its masks equal those of xgrammar's own from_huggingface on the tokenizer."""
    import xgrammar
    from transformers import AutoTokenizer

    padded = 64 * ((len(AutoTokenizer.from_pretrained(str(checkpoints.target))) + 63) // 64)  # a padded head
    loaded = load_tokenizer_info(release.repository / "target" / TOKENIZER_INFO_FILE, padded)
    direct = xgrammar.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(str(checkpoints.target)),
                                                     vocab_size=padded)
    assert (loaded.vocab_size, loaded.vocab_type, loaded.stop_token_ids, loaded.add_prefix_space) == (
        direct.vocab_size, direct.vocab_type, direct.stop_token_ids, direct.add_prefix_space)
    masks = []
    for info in (loaded, direct):
        compiled = xgrammar.GrammarCompiler(info, max_threads=1).compile_json_schema(
            '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}')
        bitmask = xgrammar.allocate_token_bitmask(1, padded)
        xgrammar.GrammarMatcher(compiled).fill_next_token_bitmask(bitmask)
        masks.append(bitmask)
    assert bool((masks[0] == masks[1]).all()) and not bool((masks[0] == -1).all())  # equal, and a real mask


@pytest.mark.parametrize(("contents", "problem"), [
    (None, "does not exist"), ({"encoded_vocab": ["a"]}, "lacks tokenizer_str, stop_token_ids")])
def test_a_missing_or_partial_file_fails_as_the_backend_fails(tmp_path, contents, problem):
    path = tmp_path / TOKENIZER_INFO_FILE
    if contents is not None:
        path.write_text(json.dumps(contents), encoding="utf-8")
    with pytest.raises(ValueError, match=problem):
        load_tokenizer_info(path, 16)


def test_guided_decoding_is_on_only_with_both_parameters_and_only_with_xgrammar():
    """model_instance_state.cc getGuidedDecodingConfigFromParams: either unset (or a template placeholder) turns it
    off; another backend fails the load."""
    assert guided_decoding_configured("xgrammar", "/triton_repo/target/x.json")
    for backend, path in [("", "/x.json"), ("xgrammar", ""), ("${guided_decoding_backend}", "/x.json"),
                          ("xgrammar", "${xgrammar_tokenizer_info_path}")]:
        assert not guided_decoding_configured(backend, path)
    with pytest.raises(ValueError, match="supported with 'xgrammar' backend"):
        guided_decoding_configured("llguidance", "/x.json")
