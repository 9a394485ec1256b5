"""Each compile step's fingerprint hashes exactly the spec fields it reads.

The steps declare what they read (``compiler.SHARED_READS`` and each runtime's ``Runtime.reads``); here every step
of every runtime runs on the factory pair with the spec watched (``spec_tracer``), and what it really reads must be
what it declares. Then each spec field is changed in turn: exactly the steps that read it get a new fingerprint
(so they run again, and the others are skipped).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest

from checkpoint_factory import VOCAB, Checkpoints, copy_checkpoint, release_spec
from spec_tracer import Tracer, tracing
from specbuild import compiler
from specbuild.errors import StageError
from specbuild.package.build_record import BuildLimits, BuildRecord
from specbuild.runtimes.tensorrt_llm_llmapi.contract import LLMAPI_MODEL, MODEL_YAML
from specbuild.runtimes.tensorrt_llm_llmapi.lines import LINES
from specbuild.runtimes.tensorrt_llm_llmapi.model_yaml import ModelYaml, parse
from specbuild.runtimes.registry import RUNTIMES, runtime_for
from specbuild.runtimes.tensorrt_llm import runtime as tensorrt_llm_runtime
from specbuild.spec import BuildSpec
from specbuild.stages.hashing import fingerprint
from specbuild.stages.reads import expand, field_paths, field_value
from specbuild.stages.runner import Stage, StageRunner

PACKAGED_ALONE = "package (packaged alone)"  # the package step of `specbuild package`, no engines built


def _watched(stage: Stage, tracer: Tracer) -> Stage:
    action = stage.action

    @functools.wraps(action)  # keeps the signature: the runner passes progress only to actions that take it
    def run(*args: Any, **kwargs: Any) -> Any:
        with tracer.recording(stage.name):
            return action(*args, **kwargs)

    return dataclasses.replace(stage, action=run)


def _run_watched(spec: BuildSpec, *, package_only: bool = False, refusal: bool = False) -> dict[str, set[str]]:
    """What each step read, run watched; ``refusal``: a step refusing the spec ends the run, not the test."""
    spec = compiler.resolved(spec)
    runner = StageRunner(Path(spec.outputs.build_dir) / compiler.STATE_FILE, scope=spec.runtime, json_mode=True)
    with tracing(spec) as tracer:
        try:
            runner.run([_watched(stage, tracer)
                        for stage in compiler.stages(spec, runner, package_only=package_only)])
        except StageError:
            if not refusal:
                raise
    return tracer.reads


def _stand_in_engine_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorRT-LLM's convert and build executors (they take the plans the runtime made from the spec, and never
    see the spec), replaced where TensorRT-LLM is not installed: the build writes the build record of its plan."""
    def build(plan: Any, into: Path) -> Path:
        config = plan.build_config
        limits = BuildLimits(max_batch_size=config["max_batch_size"], max_input_len=config["max_input_len"],
                             max_seq_len=config["max_seq_len"], max_draft_len=config.get("max_draft_len", 0))
        Path(into).mkdir(parents=True, exist_ok=True)
        BuildRecord(runtime="tensorrt-llm", role=plan.role, dtype="float16", vocab_size=VOCAB,
                    architecture="LlamaForCausalLM", limits=limits,
                    generation_logits=bool(config.get("gather_generation_logits"))).write(Path(into))
        return Path(into)

    if not runtime_for("tensorrt-llm").available():
        monkeypatch.setattr(tensorrt_llm_runtime, "convert", lambda plan, into: Path(into))
        monkeypatch.setattr(tensorrt_llm_runtime, "build", build)


@pytest.fixture(scope="module")
def reads(checkpoints: Checkpoints,
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, set[str]]]:
    """What each step of each runtime read, watched: ``{runtime: {step: dotted leaf fields}}``; the package step
    of ``specbuild package`` (nothing built) under :data:`PACKAGED_ALONE`."""
    root = tmp_path_factory.mktemp("reads")
    found = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        _stand_in_engine_flow(monkeypatch)
        for name in RUNTIMES:
            found[name] = _run_watched(release_spec(checkpoints, root / name, name))
            alone = _run_watched(release_spec(checkpoints, root / f"{name}-alone", name), package_only=True)
            found[name][PACKAGED_ALONE] = alone["package"]
    return found


def declared(spec: BuildSpec, record: str) -> frozenset[str]:
    if record == PACKAGED_ALONE:
        return compiler.stage_reads(spec, "package", package_only=True)
    return compiler.stage_reads(spec, record)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(RUNTIMES))
def test_every_step_reads_exactly_what_it_declares(name: str, reads, checkpoints: Checkpoints,
                                                   tmp_path: Path) -> None:
    spec = release_spec(checkpoints, tmp_path, name)
    assert set(reads[name]) == {*runtime_for(name).steps, PACKAGED_ALONE}
    for record, fields in reads[name].items():
        expected = declared(spec, record)
        assert fields == expected, (
            f"{name} {record}: reads undeclared {sorted(fields - expected)}, declares unread "
            f"{sorted(expected - fields)} (declare what a step reads in Runtime.reads or compiler.SHARED_READS)")


def test_a_declaration_names_real_fields() -> None:
    assert expand(["speculation.prompt_lookup"]) == {f"speculation.prompt_lookup.{name}" for name in
                                                     ("enabled", "max_ngram", "min_ngram", "draft_fallback")}
    for wrong in ("speculation.no_such_field", "speculation.acceptance.more"):
        with pytest.raises(ValueError, match="not a field of the build spec"):
            expand([wrong])


# --- one field changed at a time --------------------------------------------------------------------------------
def _field(path: str) -> Any:
    model: Any = BuildSpec
    *sections, leaf = path.split(".")
    for name in sections:
        model = model.model_fields[name].annotation
    return model.model_fields[leaf]


def other_value(spec: BuildSpec, path: str, elsewhere: dict[str, str]) -> Any:
    """A valid value of the field at ``path`` other than ``spec``'s (``elsewhere``: the checkpoints copied)."""
    value = field_value(spec, path)
    annotation = _field(path).annotation
    if path in elsewhere:
        return elsewhere[path]
    if path.startswith("outputs."):
        return f"{value}-moved"
    if get_origin(annotation) is Literal:
        return next(choice for choice in get_args(annotation) if choice != value)
    if isinstance(value, bool):
        return not value
    if path == "speculation.traffic":  # a mix of sampling profiles, never empty
        return {"t0.7": 1.0}
    if path == "capture.claim_size":  # a Kubernetes quantity
        return "20Gi"
    if isinstance(value, dict):  # measured figures by K
        return {1: 1.5} if not value else {}
    if isinstance(value, (int, float)):
        return value + 1
    if value is None and any(get_origin(option) is dict for option in get_args(annotation)):  # the K by load
        return {8: 0}
    if value is None:  # optional numbers: a count, or a share of GPU memory
        return 0.5 if float in get_args(annotation) else 3
    if path.endswith("_mount"):
        return f"/elsewhere{value}"
    return f"{value}-other" if path != "triton.host" else "0.0.0.0"


def stage_fingerprints(spec: BuildSpec, *, package_only: bool) -> dict[str, str]:
    runner = StageRunner(Path(spec.outputs.build_dir) / compiler.STATE_FILE, scope=spec.runtime, json_mode=True)
    return {stage.name: fingerprint(stage.inputs)
            for stage in compiler.stages(spec, runner, package_only=package_only)}


@pytest.mark.parametrize("name", list(RUNTIMES))
def test_changing_any_field_reruns_exactly_the_steps_that_read_it(name: str, reads,
                                                                  checkpoints: Checkpoints,
                                                                  tmp_path: Path) -> None:
    spec = release_spec(checkpoints, tmp_path / "release", name)
    elsewhere = {f"{role}.checkpoint": str(copy_checkpoint(Path(getattr(spec, role).checkpoint), tmp_path / role))
                 for role in ("target", "draft")}
    for package_only in (False, True):
        before = stage_fingerprints(spec, package_only=package_only)
        for path in field_paths():
            if path == "runtime":  # it chooses the steps themselves; every one of them reads it
                assert all("runtime" in reads[name][step] for step in runtime_for(name).steps)
                continue
            data = spec.model_dump(mode="json")
            section = functools.reduce(dict.__getitem__, path.split(".")[:-1], data)
            section[path.split(".")[-1]] = other_value(spec, path, elsewhere)
            changed = BuildSpec.model_validate(data)
            after = stage_fingerprints(changed, package_only=package_only)
            rerun = {step for step in before if before[step] != after[step]}
            readers = {step for step in before
                       if path in reads[name][PACKAGED_ALONE if package_only and step == "package" else step]}
            assert rerun == readers, f"{name}: changing {path} reruns {sorted(rerun)}, read by {sorted(readers)}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNTIMES))
def test_no_value_of_any_field_makes_a_step_read_what_it_does_not_declare(name: str,
                                                                         checkpoints: Checkpoints,
                                                                         tmp_path: Path) -> None:
    """A read behind a branch (a field read only for some value of another) shows only when that value is set: each
    field changed in turn, the check and the package step run watched (packaged alone: they hold every runtime's
    spec findings and renderers), and read nothing they do not declare. A changed value that makes the check refuse
    the spec (K=0 for the LLM API) stops there, as compile does."""
    spec = release_spec(checkpoints, tmp_path / "release", name)
    elsewhere = {f"{role}.checkpoint": str(copy_checkpoint(Path(getattr(spec, role).checkpoint), tmp_path / role))
                 for role in ("target", "draft")}
    for index, path in enumerate(field_paths()):
        if path == "runtime" or path.startswith("outputs."):
            continue
        data = release_spec(checkpoints, tmp_path / f"run-{index}", name).model_dump(mode="json")
        section = functools.reduce(dict.__getitem__, path.split(".")[:-1], data)
        section[path.split(".")[-1]] = other_value(spec, path, elsewhere)
        changed = BuildSpec.model_validate(data)
        for step, fields in _run_watched(changed, package_only=True, refusal=True).items():
            expected = compiler.stage_reads(changed, step, package_only=step == "package")
            assert fields <= expected, f"{name}, {path} changed: {step} reads undeclared {sorted(fields - expected)}"


def test_a_changed_k_checks_an_engine_free_release_again(checkpoints: Checkpoints,
                                                          tmp_path: Path) -> None:
    """The first report of this bug: K=1 packaged, then K=0 in the same folder skipped the check (whose findings for
    the LLM API read K) and packaging crashed on the stale findings; now the check runs again and the release is
    packaged for K=0 (the target alone: no speculative_config, as TensorRT-LLM's own K=0 model.yaml)."""
    compiler.run(release_spec(checkpoints, tmp_path, "tensorrt-llm-llmapi", {"speculation.num_draft_tokens": 1}),
                 json_mode=True, package_only=True)
    again = compiler.run(release_spec(checkpoints, tmp_path, "tensorrt-llm-llmapi",
                                      {"speculation.num_draft_tokens": 0}), json_mode=True, package_only=True)
    assert {step.name: step.status for step in again.steps} == {"check": "ok", "package": "ok"}
    typed = parse(ModelYaml, (again.repository / LLMAPI_MODEL / "1" / MODEL_YAML).read_text(), MODEL_YAML,
                  LINES["1.2"])
    assert typed.speculative_config is None
