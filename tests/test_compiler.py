"""The compile pipeline on small real checkpoints (torch runtime): outputs, skip, atomicity, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from checkpoint_factory import Checkpoints, copy_checkpoint, pair_spec
from specbuild.package import manifest
from specbuild.package.build_record import BUILD_INFO, BuildRecord
from specbuild import compiler
from specbuild.cli import main
from specbuild.errors import StageError, VerificationError
from specbuild.runtimes.torch import runtime as torch_runtime
from specbuild.spec import BuildSpec


@pytest.fixture()
def spec(tmp_path: Path, checkpoints: Checkpoints) -> BuildSpec:
    return pair_spec(tmp_path, checkpoints.target, checkpoints.draft)


def statuses(result: compiler.CompileResult) -> dict[str, str]:
    return {step.name: step.status for step in result.steps}


def test_compile_writes_a_verified_release(spec: BuildSpec, tmp_path: Path) -> None:
    result = compiler.run(spec, json_mode=True)
    assert set(statuses(result).values()) == {"ok"}
    assert result.manifest == tmp_path / "triton_repo" / "manifest.json"
    assert manifest.verify(result.repository).ok
    target = BuildRecord.read(tmp_path / "engines" / "target")
    assert target.runtime == "torch" and target.toolchain is not None  # built here, not planned
    # the target verifies up to max_draft_len drafted tokens beyond a request's sequence; the draft none
    assert target.limits.max_draft_len == spec.speculation.max_draft_len
    assert target.limits.engine_seq_len == target.limits.max_seq_len + spec.speculation.max_draft_len
    draft = BuildRecord.read(tmp_path / "engines" / "draft")
    assert draft.limits.max_draft_len == 0 and draft.limits.engine_seq_len == draft.limits.max_seq_len
    assert draft.generation_logits is (spec.speculation.acceptance == "draft-logits")
    config = (result.repository / "target" / "config.pbtxt").read_text()
    assert 'string_value: "engines/target"' in config  # relative: the release moves as a whole


def test_unchanged_inputs_skip_and_a_changed_k_only_repackages(spec: BuildSpec, tmp_path: Path) -> None:
    compiler.run(spec, json_mode=True)
    again = compiler.run(spec, json_mode=True)
    assert set(statuses(again).values()) == {"skipped"}
    assert again.check["kv_fractions"]  # a skipped check still hands its findings to later steps
    changed = pair_spec(tmp_path, Path(spec.target.checkpoint), Path(spec.draft.checkpoint),
                        **{"speculation.num_draft_tokens": 2})
    result = compiler.run(changed, json_mode=True)
    assert statuses(result) == {"check": "skipped", "convert": "skipped", "build": "skipped", "package": "ok"}
    assert 'key: "num_draft_tokens"\n  value {\n    string_value: "2"' in \
        (tmp_path / "triton_repo" / "orchestrator" / "config.pbtxt").read_text()
    assert manifest.verify(result.repository).ok


def test_weights_already_as_convert_writes_them_are_linked_not_copied(tmp_path: Path,
                                                                    checkpoints: Checkpoints) -> None:
    """float32 checkpoints saved by this transformers are what the torch runtime's convert writes: the converted
    checkpoint and the engines hard-link them (one copy on disk); a dtype conversion writes its own. Rewritten in
    place, a linked checkpoint makes the next compile run again, and the release still verifies."""
    source = copy_checkpoint(checkpoints.target, tmp_path / "target")
    spec = pair_spec(tmp_path, source, checkpoints.draft)
    compiler.run(spec, json_mode=True)
    weights = source / "model.safetensors"
    for folder in (tmp_path / "build" / "torch" / "target", tmp_path / "engines" / "target"):
        assert (folder / "model.safetensors").stat().st_ino == weights.stat().st_ino
    # Only the weights: a release's config.json edited in place (as a user might) leaves the checkpoint as it was.
    converted_config = tmp_path / "build" / "torch" / "target" / "config.json"
    assert converted_config.stat().st_ino != (source / "config.json").stat().st_ino
    halved = pair_spec(tmp_path / "half", source, checkpoints.draft, **{"target.dtype": "bfloat16"})
    compiler.run(halved, json_mode=True)
    assert (tmp_path / "half" / "engines" / "target" / "model.safetensors").stat().st_ino != weights.stat().st_ino
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    name = sorted(tensors)[0]
    save_file({**tensors, name: tensors[name] + 1}, str(weights), metadata={"format": "pt"})  # in place
    again = compiler.run(spec, json_mode=True)
    assert statuses(again)["check"] == "ok" and statuses(again)["convert"] == "ok"
    assert manifest.verify(again.repository).ok
    assert torch.equal(load_file(tmp_path / "engines" / "target" / "model.safetensors")[name], tensors[name] + 1)


def test_an_incompatible_pair_stops_at_check(tmp_path: Path, checkpoints: Checkpoints) -> None:
    spec = pair_spec(tmp_path, checkpoints.target, checkpoints.other_tokenizer)
    with pytest.raises(StageError) as error:
        compiler.run(spec, json_mode=True)
    assert error.value.stage == "check" and error.value.exit_code == 10
    assert "tokenizer" in str(error.value)
    assert not (tmp_path / "engines").exists() and not (tmp_path / "triton_repo").exists()



def _as_before_the_typed_record(record: BuildRecord) -> dict:
    """A build record as specbuild wrote it before it was typed (no ``format``, limits in ``build_config``)."""
    limits = record.limits
    return {"runtime": record.runtime, "role": record.role, "dtype": record.dtype, "vocab_size": record.vocab_size,
            "architecture": record.architecture, "toolchain": record.toolchain,
            "build_config": {"max_batch_size": limits.max_batch_size, "max_input_len": limits.max_input_len,
                             "max_seq_len": limits.engine_seq_len, "max_draft_len": limits.max_draft_len}}


def test_a_release_compiled_before_the_typed_build_record_is_refused_with_the_fix_to_recompile(
        spec: BuildSpec, tmp_path: Path) -> None:
    result = compiler.run(spec, json_mode=True)
    manifest_file = result.repository / manifest.MANIFEST_NAME
    data = json.loads(manifest_file.read_text())
    for role in ("target", "draft"):
        old = _as_before_the_typed_record(BuildRecord.read(result.engines / role))
        data["extra"]["build_info"][role] = old
        (result.engines / role / BUILD_INFO).write_text(json.dumps(old))
    manifest_file.write_text(json.dumps(data))
    for command in (["verify", str(result.repository)], ["serve", str(result.repository), "--dry-run"]):
        refused = CliRunner().invoke(main, command)
        assert refused.exit_code == 1 and "older specbuild" in refused.output, (command, refused.output)
        assert "recompile the release" in refused.output and "Traceback" not in refused.output
    with pytest.raises(VerificationError, match="older specbuild") as error:  # as the torch engine model reads it
        BuildRecord.read(result.engines / "target")
    assert "recompile" in error.value.fix
    assert compiler.run(spec, json_mode=True, force=True).manifest is not None  # recompiled, it serves again
    assert manifest.verify(result.repository).ok


def test_a_new_build_record_format_rebuilds_the_engines(spec: BuildSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upgraded specbuild that records engines differently rebuilds them, rather than skipping the build as
    unchanged and then refusing the record the older version wrote."""
    assert statuses(compiler.run(spec, json_mode=True))["build"] == "ok"
    assert statuses(compiler.run(spec, json_mode=True))["build"] == "skipped"
    monkeypatch.setattr(compiler, "RECORD_FORMAT", "specbuild.build/v2")
    assert statuses(compiler.run(spec, json_mode=True))["build"] == "ok"

def test_an_interrupted_build_leaves_no_partial_output(spec: BuildSpec, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    real_build = torch_runtime.build

    def interrupted(spec, role, checkpoint_dir, output_dir):
        real_build(spec, role, checkpoint_dir, output_dir)
        if role == "draft":
            raise KeyboardInterrupt

    monkeypatch.setattr(torch_runtime, "build", interrupted)
    with pytest.raises(KeyboardInterrupt):
        compiler.run(spec, json_mode=True)
    assert not (tmp_path / "engines").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".engines")]
    monkeypatch.setattr(torch_runtime, "build", real_build)
    result = compiler.run(spec, json_mode=True)
    assert statuses(result)["convert"] == "skipped" and statuses(result)["build"] == "ok"
    assert manifest.verify(result.repository).ok


def test_pickle_only_checkpoints_are_refused(tmp_path: Path, checkpoints: Checkpoints) -> None:
    spec = pair_spec(tmp_path, checkpoints.target, checkpoints.pickle_only)
    with pytest.raises(StageError, match="allow_pickle|allow-pickle"):
        compiler.run(spec, json_mode=True)


def test_tensorrt_llm_dry_run_prints_the_plan_per_rank(tmp_path: Path, checkpoints: Checkpoints) -> None:
    result = CliRunner().invoke(main, [
        "compile", "--runtime", "tensorrt-llm", "--dry-run", "--target", str(checkpoints.target),
        "--draft", str(checkpoints.draft), "--set", "target.tp_size=2", "--max-draft-len", "6"])
    assert result.exit_code == 0, result.output
    assert result.output.count("$ trtllm-build") == 2  # one per model; it builds every rank of its checkpoint
    assert "--speculative_decoding_mode=draft_tokens_external --max_draft_len=6" in result.output
    assert "rank 1" in result.output


def test_compile_json_and_exit_codes(tmp_path: Path, checkpoints: Checkpoints) -> None:
    runner = CliRunner()
    args = ["compile", "--runtime", "torch", "--target", str(checkpoints.target), "--draft", str(checkpoints.draft),
            "--set", f"outputs.build_dir={tmp_path / 'b'}", "--set", f"outputs.engines_dir={tmp_path / 'e'}",
            "--set", f"outputs.repository_dir={tmp_path / 'r'}", "--set", "limits.max_seq_len=128",
            "--set", "limits.max_input_len=64", "--json"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [step["name"] for step in report["steps"]] == ["check", "convert", "build", "package"]
    bad = runner.invoke(main, args[:-1] + ["--set", "speculation.acceptance=greedy"])
    assert bad.exit_code == 2 and "speculation.acceptance" in bad.output


def test_a_failed_tensorrt_llm_compile_leaves_the_torch_steps_done(spec: BuildSpec) -> None:
    compiler.run(spec, json_mode=True)
    with pytest.raises(StageError) as failed:  # TensorRT-LLM cannot be installed here: its convert fails
        compiler.run(spec.model_copy(update={"runtime": "tensorrt-llm"}), json_mode=True)
    assert failed.value.stage == "convert"
    again = compiler.run(spec, json_mode=True)
    assert statuses(again) == {"check": "ok", "convert": "skipped", "build": "skipped", "package": "skipped"}


def test_a_changed_specbuild_re_packages_a_release(spec, monkeypatch):
    """A release ships copies of specbuild's serving modules: after an update, packaging runs again rather than
    keep the old copies (other steps stay skipped)."""
    from specbuild.package import vendor

    compiler.run(spec, json_mode=True)
    monkeypatch.setattr(compiler, "source_digest", lambda: vendor.source_digest() + "-updated")
    assert statuses(compiler.run(spec, json_mode=True)) == {"check": "skipped", "convert": "skipped",
                                                            "build": "skipped", "package": "ok"}


def test_verify_and_serve_dry_run_show_the_release_cost_model_measured_or_not(spec: BuildSpec) -> None:
    """Nothing measured: c from the parameter ratio and V(K) = 1, said so; measured figures (as init and tune write
    them) are compiled in and shown as measured."""
    for speculation, shown in (({}, "not measured (c from the parameter ratio, V(K) = 1)"),
                               ({"draft_cost": 0.18, "verify_cost": {1: 1.15}, "measured_acceptance": 0.49},
                                "measured on the build host: c=0.180, V(1)=1.15")):
        measured = spec.model_copy(update={"speculation": spec.speculation.model_copy(update=speculation)})
        result = compiler.run(measured, json_mode=True)
        for command in (["verify", str(result.repository)], ["serve", str(result.repository), "--dry-run"]):
            output = CliRunner().invoke(main, command)
            assert output.exit_code == 0 and f"cost model {shown}" in output.output, (command, output.output)
        document = json.loads(CliRunner().invoke(main, ["verify", str(result.repository), "--json"]).stdout)
        assert document["cost_model"]["measured"] is bool(speculation) and document["cost_model"]["break_even"]


def test_verify_and_serve_dry_run_show_the_release_load_schedule(spec: BuildSpec) -> None:
    scheduled = spec.model_copy(update={"speculation": spec.speculation.model_copy(
        update={"num_draft_tokens": 3, "draft_len_schedule": {1: 3, 4: 1, 8: 0}})})
    result = compiler.run(scheduled, json_mode=True)
    for command in (["verify", str(result.repository)], ["serve", str(result.repository), "--dry-run"]):
        output = CliRunner().invoke(main, command)
        assert "K by load: K=3 from 1 in flight, K=1 from 4 in flight, K=0 from 8 in flight" in output.output, command
    document = json.loads(CliRunner().invoke(main, ["verify", str(result.repository), "--json"]).stdout)
    assert document["cost_model"]["draft_len_schedule"] == {"1": 3, "4": 1, "8": 0}


def test_a_sub_vocabulary_draft_carries_its_head_vocabulary_through_the_release(
        tmp_path: Path, checkpoints: Checkpoints) -> None:
    """The draft's head_vocabulary.json goes into its engine folder, its size and checksum into the build record,
    the manifest and the draft engine model's parameters; a list changed at the source compiles again; a list
    swapped in the engine folder afterwards fails the release's verification and the engine model's check."""
    from specbuild.checkpoint.head_vocabulary import HEAD_VOCABULARY, HeadVocabulary
    from specbuild.package.build_record import HeadVocabularyRecord

    draft = copy_checkpoint(checkpoints.draft, tmp_path / "draft")
    vocabulary = HeadVocabulary.of([2, 0, 7, 5, 11, 3, 1], {"prompts": 2})
    vocabulary.write(draft)
    spec = pair_spec(tmp_path, checkpoints.target, draft)
    result = compiler.run(spec, json_mode=True)
    expected = HeadVocabularyRecord(size=7, sha256=vocabulary.sha256)
    engine = tmp_path / "engines" / "draft"
    assert BuildRecord.read(engine).head_vocabulary == expected
    assert BuildRecord.read(tmp_path / "engines" / "target").head_vocabulary is None
    assert (engine / HEAD_VOCABULARY).read_bytes() == (draft / HEAD_VOCABULARY).read_bytes()
    recorded = json.loads(result.manifest.read_text())["extra"]["build_info"]
    assert recorded["draft"]["head_vocabulary"] == expected.model_dump()
    assert recorded["target"]["head_vocabulary"] is None
    config = (result.repository / "draft" / "config.pbtxt").read_text()
    assert f'key: "head_vocabulary_sha256"\n  value {{\n    string_value: "{vocabulary.sha256}"' in config
    assert "head_vocabulary_sha256" not in (result.repository / "target" / "config.pbtxt").read_text()
    assert manifest.verify(result.repository).ok

    HeadVocabulary.of([2, 0, 7, 5]).write(draft)  # ranked again: the release follows
    again = compiler.run(spec, json_mode=True)
    assert statuses(again)["convert"] == "ok" and BuildRecord.read(engine).head_vocabulary.size == 4
    (engine / HEAD_VOCABULARY).unlink()  # hard-linked to the converted copy: replace, never edit in place
    HeadVocabulary.of([2, 0, 7]).write(engine)
    assert not manifest.verify(again.repository).ok


def test_the_engine_free_runtime_packages_a_sub_vocabulary_draft_with_its_full_head(
        tmp_path: Path, checkpoints: Checkpoints) -> None:
    """The demo pair ships a head vocabulary: every runtime must package it. One that cannot cut a head serves the
    full one, says so in the check, and records no head vocabulary."""
    from specbuild.checkpoint.head_vocabulary import HeadVocabulary

    draft = copy_checkpoint(checkpoints.draft, tmp_path / "draft")
    HeadVocabulary.of([2, 0, 7, 5, 11, 3, 1]).write(draft)
    spec = pair_spec(tmp_path, checkpoints.target, draft, runtime="tensorrt-llm-llmapi")
    result = compiler.run(spec, json_mode=True)
    assert set(statuses(result).values()) == {"ok"} and manifest.verify(result.repository).ok
    assert "draft-head-vocabulary-unused" in {warning["code"] for warning in result.check["compatibility"]["warnings"]}
    recorded = json.loads(result.manifest.read_text())["extra"]["build_info"]
    assert recorded["draft"]["head_vocabulary"] is None
