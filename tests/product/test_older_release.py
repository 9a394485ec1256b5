"""A release built by an older specbuild (the source of commit :data:`OLDER_COMMIT`, today's main before issue 43's
renames) still verifies and serves with this checkout's specbuild, answering as a release built by this checkout.

The older release is the tiny pair compiled as ``tiny_release`` is (torch runtime, same limits and name), by that
commit's own ``specbuild compile`` (``git archive`` of its ``pipeline/`` on PYTHONPATH); so the vendored modules in it
are that commit's. This checkout's code then reads, of the older release, exactly:

- ``manifest.json`` (:mod:`specbuild.package.manifest`): its format, trees, file hashes and checkpoint identities
  (``verify``, and ``refuse_modified_release`` before serving); its ``spec`` through today's ``BuildSpec`` and its
  engines' build records through ``BuildRecord`` (``read_release``: serve, deploy).
- the launch plan made from that spec (:mod:`specbuild.serve.release_launch`): the runtime named by the manifest
  (``runtime_for``), the launch settings it lets a launch change, ``check_compiled_layout`` and ``launch_plan``
  (the bundled server, with the OpenAI-compatible API); ``deploy``'s pod plan from the same spec and records.
- ``config.pbtxt`` of the orchestrator and of preprocessing (``read_config``): the orchestrator's parameters
  (``OrchestratorParameters``: ``verify``'s cost model, the OpenAI API's request checks) and preprocessing's
  (``PreprocessingParameters``: the end id), and the model folder names of today's contract (``ensemble``,
  ``orchestrator``, ``preprocessing``; ``serves_openai``).
- ``preprocessing/1/tokenizer`` (the OpenAI-compatible API's tokenizer).
- for ``bench --in-process`` (:class:`~specbuild.bench.in_process.InProcessRelease`, today's orchestrator code on
  the older files): the ensemble's ``config.pbtxt`` steps (input and output maps), the engine models'
  ``config.pbtxt`` (``TorchEngineParameters``) and the engines they name, loaded by today's ``load_engine``
  (``build_info.json`` and the converted weights); ``tune``: the target engine's build record (``max_draft_len``).
- the ensemble's and orchestrator's tensor names: today's client (``SpecbuildClient``) and the OpenAI API's
  ``orchestrator_arrays`` send today's input names to the older models, which Triton refuses if unknown.
- ``doctor.py``: the release's own doctor (the older one, standard library only) run by ``run_doctor`` with this
  Python, and its JSON report read into today's ``Check``; ``doctor_facts.json`` and ``image_rules.py`` are read
  by that older doctor only.
- the vendored ``<model>/1/specbuild/`` modules and each ``model.py`` are imported by the python backend's stubs,
  never by this checkout: the server that this checkout starts must load the older copies (its own folder first on
  ``sys.path``), whatever this checkout's modules are now called; answers equal to today's release's show it did.

The older commit must be in the clone: a clone without git, or without that commit (a shallow clone), fails naming
why and the fix rather than skipping, since a skip would quietly drop the one test that holds the renames to their
promise (CI runs on a full clone).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner

from conftest import TINY_CACHE_DIR
from locations import REPO_ROOT
from triton_requests import infer_stream
from specbuild.cli import main
from specbuild.package.contract import ORCHESTRATOR_MODEL
from specbuild.serve.client import SpecbuildClient
from specbuild.serve.frontend import OpenAIFrontend
from specbuild.serve.orchestrator_client import OrchestratorClient
from specbuild.serve.server import TritonServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

OLDER_COMMIT = "c8e075dc38c3920c4c1eb6ae1cdd86c8a2877c66"  # main before issue 43's renames
FOLDER = f"tiny-{OLDER_COMMIT[:7]}-release"  # in the cache folder, beside tiny-release/
PROMPTS = ("def main():\n    ", "import os\nimport sys\n\n")
MAX_TOKENS = 24


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, check=False)


@pytest.fixture(scope="module")
def older_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The older commit's ``pipeline/`` folder (``git archive``), to put on PYTHONPATH."""
    if shutil.which("git") is None:
        pytest.fail("git is not installed, so the older commit's source cannot be read: install git")
    found = _git("cat-file", "-e", f"{OLDER_COMMIT}^{{commit}}")
    if found.returncode != 0:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() == b"true"
        why = "this clone is shallow" if shallow else (found.stderr.decode().strip() or "not in this clone")
        pytest.fail(f"commit {OLDER_COMMIT} is not in {REPO_ROOT} ({why}): clone the repository with its whole "
                    "history (`git fetch --unshallow`), since this test builds a release with that commit's source")
    archive = _git("archive", "--format=tar", OLDER_COMMIT, "pipeline")
    assert archive.returncode == 0, archive.stderr.decode()
    root = tmp_path_factory.mktemp("older-source")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(root, filter="data")
    return root / "pipeline"


@pytest.fixture(scope="module")
def older_release(tiny_pair, tiny_release, older_source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny pair compiled by the older commit's ``specbuild compile`` with ``tiny_release``'s name and limits,
    into ``FOLDER/`` of the cache folder (a rerun skips its unchanged steps); its repository folder."""
    root, spec = TINY_CACHE_DIR / FOLDER, tiny_release.spec
    options = {"name": spec.name, "limits.max_input_len": spec.limits.max_input_len,
               "limits.max_seq_len": spec.limits.max_seq_len,
               "speculation.max_draft_len": spec.speculation.max_draft_len, "outputs.build_dir": root / "build",
               "outputs.engines_dir": root / "engines", "outputs.repository_dir": root / "triton_repo"}
    command = [sys.executable, "-m", "specbuild.cli", "compile", "--target", str(tiny_pair.target_dir),
               "--draft", str(tiny_pair.draft_dir), "--runtime", "torch", "--json",
               *(f"--set={key}={value}" for key, value in options.items())]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(older_source), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(command, env=environment, cwd=tmp_path_factory.mktemp("older-compile"),
                          capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, f"the older specbuild's compile failed:\n{done.stderr[-4000:]}"
    repository = Path(json.loads(done.stdout)["repository"])
    vendored = sorted(repository.glob("*/1/specbuild/**/*.py"))
    assert vendored, f"{repository} ships no specbuild modules"
    for copy in vendored:  # the older commit's copies (package markers aside), not this checkout's
        source = older_source.joinpath(*copy.relative_to(repository).parts[2:])  # <model>/1/specbuild/...
        if copy.name != "__init__.py":
            assert copy.read_bytes() == source.read_bytes(), f"{copy} is not {OLDER_COMMIT}'s"
    return repository


def test_verify_reads_the_older_manifest_and_cost_model(older_release: Path):
    result = CliRunner().invoke(main, ["verify", str(older_release), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] and report["checked"] > 0, report
    assert report["cost_model"].get("draft_len_schedule"), report  # the orchestrator's parameters, read


def test_the_older_doctor_passes_here(older_release: Path):
    result = CliRunner().invoke(main, ["doctor", str(older_release), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    found = {check["name"]: check["verdict"] for check in report["checks"]}
    assert report["ok"] and report["runtime"] == "torch", report
    for name in ("files", "config:target", "config:draft", "logits:target", "logits:draft", "tokenizer"):
        assert found[name] == "pass", (name, report)


def test_deploy_and_tune_read_the_older_release(older_release: Path, tiny_release):
    from specbuild.bench.tune import release_max_draft_len

    result = CliRunner().invoke(main, ["deploy", str(older_release), "-o", "-", "--pvc", "releases", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "Deployment" in {item["kind"] for item in json.loads(result.stdout)["items"]}
    assert release_max_draft_len(older_release) == tiny_release.spec.speculation.max_draft_len


@dataclass(frozen=True)
class Served:
    """A release served by the bundled Triton server with the OpenAI-compatible API beside it."""

    repository: Path
    model: str  # the name the OpenAI-compatible API serves it as
    grpc_url: str
    openai: Any  # openai.OpenAI on the API

    def ensemble(self, prompt: str, **options: Any) -> str:
        return SpecbuildClient(self.grpc_url, timeout=300).generate(prompt, MAX_TOKENS, **options).text

    def token_ids(self, prompt: str) -> list[int]:
        """The orchestrator's answer as ids, its inputs made by the OpenAI API's code from the release's files."""
        client = OrchestratorClient.for_release(self.grpc_url, self.repository)
        arrays = client.arrays(client.preprocessor.checked(prompt), MAX_TOKENS, stream=False)
        last = infer_stream(self.grpc_url, arrays, model=ORCHESTRATOR_MODEL)[-1]
        length = int(last.as_numpy("output_length").reshape(-1)[0])
        return last.as_numpy("output_ids").reshape(-1)[:length].tolist()

    def completion(self, prompt: str) -> str:
        return self.openai.completions.create(model=self.model, prompt=prompt, max_tokens=MAX_TOKENS,
                                              temperature=0).choices[0].text


def _openai(frontend: OpenAIFrontend) -> Any:
    return openai.OpenAI(base_url=frontend.url, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def older_served(older_release: Path) -> Iterator[Served]:
    """The older release launched as ``specbuild serve`` launches it (its launch plan, verified first; free ports)."""
    from specbuild.package.manifest import read_release
    from specbuild.runtimes.launch_plans import BundledPlan
    from specbuild.serve.frontend import serves_openai
    from specbuild.serve.release_launch import release_launch_plan

    release = read_release(older_release)
    plan = release_launch_plan(older_release, {f"triton.{kind}_port": 0
                                               for kind in ("http", "grpc", "metrics", "openai")})
    assert isinstance(plan, BundledPlan) and plan.openai_port is not None and serves_openai(plan.repository)
    with TritonServer(plan.repository, host=plan.host, startup_timeout=300,
                      **{f"{kind}_port": port for kind, port in plan.ports.items()}) as server, \
            OpenAIFrontend(plan.repository, server.grpc_url, release.spec.name, host=plan.host,
                           port=plan.openai_port) as frontend:
        yield Served(plan.repository, release.spec.name, server.grpc_url, _openai(frontend))


@pytest.fixture(scope="module")
def today_served(tiny_release, tiny_server) -> Iterator[Served]:
    """This checkout's tiny release on the session's server, with the OpenAI-compatible API beside it."""
    name = tiny_release.spec.name
    with OpenAIFrontend(tiny_release.repository, tiny_server.grpc_url, name, port=0) as frontend:
        yield Served(tiny_release.repository, name, tiny_server.grpc_url, _openai(frontend))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_older_release_answers_as_today_s(older_served: Served, today_served: Served, prompt: str):
    ids = older_served.token_ids(prompt)
    assert ids and ids == today_served.token_ids(prompt)
    for options in ({}, {"num_draft_tokens": 0}, {"stream": True}):
        assert older_served.ensemble(prompt, **options) == today_served.ensemble(prompt, **options), options
    assert older_served.completion(prompt) == today_served.completion(prompt) == today_served.ensemble(prompt)


def test_the_bench_runs_the_older_release_in_process(older_served: Served):
    from specbuild.bench.in_process import InProcessRelease
    from specbuild.serve.client import GenerationRequest

    local = InProcessRelease(older_served.repository)
    for index, prompt in enumerate(PROMPTS):
        trace = local.trace(index, "code", GenerationRequest(prompt, MAX_TOKENS))
        assert trace.error is None and trace.text == older_served.ensemble(prompt), trace
