"""The example release pipeline (examples/pipeline): its CI files follow their schemas, and the GitHub workflow's
own ``run:`` steps, run in order as a runner would, release the tiny pair: a good release passes the gate; one
with a deliberately bad draft is refused by it (exit 3, the reason in JSON), and the server is stopped either way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import crd_schemas
from specbuild.package.manifest import verify
from locations import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "pipeline"
WORKFLOW = EXAMPLE / "github-workflow.yml"
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"
# Steps of the workflow the test does not run, and why.
NOT_RUN = {"install": "installs specbuild from the network; the test runs in the environment that has it"}
# The tiny pair, sized to finish in a minute; speedup is noise on a shared 2-core machine, so its threshold here
# only catches a broken release (the acceptance and greedy-identity thresholds are the workflow's own).
TINY = {"BENCH_PROMPTS": "4", "BENCH_REQUESTS": "4", "BENCH_MAX_TOKENS": "32", "GATE_MIN_SPEEDUP": "0.2"}
SPEC = """\
name: tiny
runtime: torch
target: {{checkpoint: {target}}}
draft: {{checkpoint: {draft}}}
limits: {{max_input_len: 400, max_seq_len: 512}}  # the bundled prompts, in the tiny tokenizer
speculation: {{max_draft_len: 4, num_draft_tokens: 2}}
"""


@pytest.mark.parametrize(("schema", "name"), [("vendor.github-workflows", "github-workflow.yml"),
                                              ("vendor.github-workflows", "github-nightly.yml"),
                                              ("vendor.gitlab-ci", "gitlab-ci.yml")])
def test_ci_files_follow_their_schemas(schema: str, name: str, tmp_path: Path) -> None:
    def check(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(CHECK_JSONSCHEMA), "--builtin-schema", schema, str(path)], capture_output=True,
                              text=True, timeout=120)

    result = check(EXAMPLE / name)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = yaml.safe_load((EXAMPLE / name).read_text())
    job = next(iter(broken["jobs"].values())) if "jobs" in broken else broken["check"]
    job["stage" if "stage" in job else "runs-on"] = {"not": "a string"}  # control: the check can fail
    (tmp_path / name).write_text(yaml.safe_dump(broken))
    assert check(tmp_path / name).returncode != 0


def _environment(target: Path, draft: Path, overrides: dict[str, str], workflow: Path = WORKFLOW) -> dict[str, str]:
    """The workflow's ``env`` with its expressions given values (the inputs), in this test's environment."""
    declared = yaml.safe_load(workflow.read_text())["env"]
    inputs = {"${{ inputs.target }}": str(target), "${{ inputs.draft }}": str(draft)}
    values = {key: inputs.get(str(value), str(value)) for key, value in declared.items()}
    assert not [value for value in values.values() if "${{" in value], "an expression the test does not know"
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, **values, **overrides, "PATH": path}


def run_workflow(workdir: Path, env: dict[str, str], workflow_file: Path = WORKFLOW,
                 not_run: dict[str, str] = NOT_RUN) -> dict[str, int | None]:
    """Each ``run:`` step of the workflow in order, in ``bash -eo pipefail`` as GitHub runs them; after a failure
    only the steps marked ``if: always()``. Returns {step name: exit code, None when skipped}."""
    workflow = yaml.safe_load(workflow_file.read_text())
    [job] = workflow["jobs"].values()
    results: dict[str, int | None] = {}
    failed = False
    for step in job["steps"]:
        if "run" not in step or step.get("id") in not_run:
            continue
        if failed and step.get("if") != "always()":
            results[step["name"]] = None
            continue
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=workdir,
                              env={**env, **step.get("env", {})}, timeout=1800)
        results[step["name"]] = done.returncode
        failed = failed or done.returncode != 0
    return results


def _workspace(root: Path, target: Path, draft: Path) -> Path:
    """A checkout of the release repository: its spec and the example's steps scripts in ci/."""
    (root / "ci").mkdir(parents=True)
    for script in ("release.sh", "nightly.sh"):
        shutil.copy2(EXAMPLE / script, root / "ci" / script)
    (root / "specbuild.yaml").write_text(SPEC.format(target=target, draft=draft), encoding="utf-8")
    return root


def _bad_draft(draft: Path, out: Path) -> Path:
    """The draft with its weights drawn at random: the same tokenizer and shapes (so `check` passes), and
    nothing the target would say."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(draft, out)
    generator = torch.Generator().manual_seed(0)
    for weights in out.glob("*.safetensors"):
        tensors = load_file(weights)
        save_file({name: torch.randn(t.shape, generator=generator).to(t.dtype) for name, t in tensors.items()},
                  weights, metadata={"format": "pt"})
    return out


def _reports(workdir: Path) -> Path:
    return workdir / "dist" / "reports"


def _server_stopped(workdir: Path) -> bool:
    pid = int((_reports(workdir) / "serve.pid").read_text())
    return not Path(f"/proc/{pid}").exists()


def _released(tiny_pair: Any, root: Path, draft: Path) -> tuple[Path, dict[str, int | None]]:
    workdir = _workspace(root / "workspace", tiny_pair.target_dir, draft)
    env = _environment(tiny_pair.target_dir, draft, TINY)
    try:
        return workdir, run_workflow(workdir, env)
    finally:  # whatever failed, no server outlives the test
        subprocess.run(["bash", "ci/release.sh", "stop"], cwd=workdir, env=env, timeout=120)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_good_release_passes_the_gate_and_yields_manifests(tiny_pair, tmp_path: Path) -> None:
    workdir, steps = _released(tiny_pair, tmp_path, tiny_pair.draft_dir)
    assert steps == {"Check the pair": 0, "Compile": 0, "Verify": 0, "Serve": 0, "Bench gate": 0,
                     "Stop the server": 0, "Deploy manifests": 0}
    reports = _reports(workdir)
    assert json.loads((reports / "check.json").read_text())["compatible"] is True
    assert json.loads((reports / "verify.json").read_text())["ok"] is True
    gate = json.loads((reports / "gate.json").read_text())
    assert gate["gate"]["passed"] is True and "error" not in gate
    assert {check["threshold"] for check in gate["gate"]["checks"]} == {
        "min_speedup", "min_acceptance", "greedy_identical", "max_p95_ms", "max_error_rate"}
    print("gate figures (good release):", json.dumps(_figures(gate)))
    events = [json.loads(line) for line in (reports / "serve.jsonl").read_text().splitlines()]
    assert [event["event"] for event in events] == ["ready", "stopped"] and _server_stopped(workdir)
    # the uploaded unit (the repository, its engines beside it) verifies wherever it lands
    shutil.copytree(workdir / "dist" / "release", tmp_path / "model-store" / "tiny-1")
    assert verify(tmp_path / "model-store" / "tiny-1" / "triton_repo").ok
    deployed = json.loads((reports / "deploy.json").read_text())
    assert deployed["kinds"] == ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                                 "PodMonitor", "PrometheusRule", "ConfigMap"]
    for path in map(Path, deployed["files"]):
        obj = yaml.safe_load(path.read_text())
        if obj.get("kind") in ("PodMonitor", "PrometheusRule"):
            crd_schemas.validate(obj)
        elif "kind" in obj:
            kubernetes_validate.validate(obj, "1.33", strict=True)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_release_with_a_bad_draft_is_refused_by_the_gate(tiny_pair, tmp_path: Path) -> None:
    bad = _bad_draft(tiny_pair.draft_dir, tmp_path / "bad-draft")
    workdir, steps = _released(tiny_pair, tmp_path, bad)
    assert steps == {"Check the pair": 0, "Compile": 0, "Verify": 0, "Serve": 0, "Bench gate": 3,
                     "Stop the server": 0, "Deploy manifests": None}
    refusal = json.loads((_reports(workdir) / "gate.json").read_text())
    assert refusal["exit_code"] == 3 and refusal["error"].startswith("gate failed:")
    failed = {check["threshold"] for check in refusal["gate"]["failures"]}
    assert failed == {"min_acceptance"}, refusal["gate"]["failures"]  # exact as ever: identity holds
    assert all(check["measured"] < 0.5 for check in refusal["gate"]["failures"])
    print("gate figures (bad draft):", json.dumps(_figures(refusal)))
    assert _server_stopped(workdir) and not (workdir / "dist" / "manifests").exists()


def _figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [{key: cell[key] for key in ("label", "speedup", "acceptance_rate", "matches_baseline", "tokens_per_second")}
            | {"e2e_p95_ms": (cell["e2e"]["p95"] or 0) * 1000} for cell in report["cells"]]


NIGHTLY = EXAMPLE / "github-nightly.yml"
# The nightly steps the test does not run, and why.
NIGHTLY_NOT_RUN = {**NOT_RUN, "distil": "`specbuild draft --from-capture` distils for an hour; the test puts what it "
                   "leaves in place (a draft with its specbuild-capture.json, the held-out records in the store)"}


@pytest.mark.slow
@pytest.mark.e2e
def test_the_nightly_job_releases_a_draft_only_when_it_beats_the_release_in_service(tiny_pair, tiny_release,
                                                                                     tiny_server, tmp_path: Path):
    """The nightly workflow's own steps against the tiny release in service, its capture made of its real answers:
    the new release passes the gate at a margin it can meet (the same draft: speed is noise here) and is released
    with the capture recorded in its manifest; at a margin it cannot meet, the gate refuses it (exit 3)."""
    from captures import served_records, write_store
    from traffic_drafts import provenance

    from specbuild.package.traffic_draft import PROVENANCE_FILE

    store = tmp_path / "capture"
    texts = ["The quick brown fox", "def add(a, b):", "Once upon a time", "Dear team,"]
    served = [record for record, _ in served_records(tiny_release.repository, tiny_server.grpc_url, texts, 10)]
    write_store(store, served)
    workdir = _workspace(tmp_path / "workspace", tiny_pair.target_dir, tiny_pair.draft_dir)
    draft = shutil.copytree(tiny_pair.draft_dir, workdir / "dist" / "nightly" / "draft")  # what distil leaves
    (draft / PROVENANCE_FILE).write_text(json.dumps(provenance()), encoding="utf-8")
    (store / "held-out").mkdir()  # distil holds the newest records out, for the gate
    (store / "held-out" / "draft.jsonl").write_bytes(b"".join(record.to_line() for record in served[2:]))
    env = _environment(tiny_pair.target_dir, draft, {
        "CAPTURE_STORE": str(store), "CURRENT_RELEASE": str(tiny_release.repository),
        "TARGET": str(tiny_pair.target_dir), "MIN_CAPTURED": "4", "BENCH_REQUESTS": "2", "GATE_FASTER_THAN": "0.2"},
        NIGHTLY)
    steps = run_workflow(workdir, env, NIGHTLY, NIGHTLY_NOT_RUN)
    assert steps == {"Check the capture": 0, "Check the pair": 0, "Compile": 0, "Verify": 0,
                     "Bench against the release in service": 0, "Release": 0}
    reports = workdir / "dist" / "nightly" / "reports"
    assert json.loads((reports / "capture.json").read_text())["records"] == 4
    gate = json.loads((reports / "gate.json").read_text())
    assert gate["gate"]["passed"] and {cell["matches_incumbent"] for cell in gate["cells"]} == {1.0}
    manifest = json.loads((workdir / "dist" / "nightly" / "release" / "triton_repo" / "manifest.json").read_text())
    assert manifest["extra"]["traffic_trained_draft"]["base_draft"]["sha256"] == "ab" * 32
    assert json.loads((reports / "deploy.json").read_text())["files"]
    # the reports hold figures, never a captured prompt or answer
    assert not [path for path in reports.rglob("*") if path.is_file() and str(served[0].prompt_ids[:4])[1:-1]
                in path.read_text(errors="replace")]

    refused = subprocess.run(["bash", "ci/nightly.sh", "gate"], cwd=workdir, env={**env, "GATE_FASTER_THAN": "50"},
                             timeout=900)
    assert refused.returncode == 3
    failures = json.loads((reports / "gate.json").read_text())["gate"]["failures"]
    assert {check["threshold"] for check in failures} == {"faster_than_incumbent"}
    assert all(check["measured"] < 50 for check in failures)


def test_the_nightly_job_refuses_a_store_without_enough_records(tmp_path: Path) -> None:
    from captures import captured_record, write_store

    store = write_store(tmp_path / "capture", [captured_record((1, 2), (3,)), captured_record((4,), (5,))])
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "CAPTURE_STORE": str(store), "CURRENT_RELEASE": str(tmp_path), "TARGET": str(tmp_path),
           "NIGHTLY_DIR": str(tmp_path / "nightly"), "MIN_CAPTURED": "3"}
    done = subprocess.run(["bash", str(EXAMPLE / "nightly.sh"), "capture"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "holds 2 captured records, fewer than MIN_CAPTURED=3" in done.stderr
    assert json.loads((tmp_path / "nightly" / "reports" / "capture.json").read_text())["records"] == 2
    enough = subprocess.run(["bash", str(EXAMPLE / "nightly.sh"), "capture"], env={**env, "MIN_CAPTURED": "2"},
                            timeout=120)
    assert enough.returncode == 0
    unknown = subprocess.run(["bash", str(EXAMPLE / "nightly.sh"), "deploy"], env=env, capture_output=True, text=True,
                             timeout=120)
    assert unknown.returncode == 2 and "usage: nightly.sh" in unknown.stderr
