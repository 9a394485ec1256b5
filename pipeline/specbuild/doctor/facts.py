"""What the doctor a release ships compares against, written into the release when it is packaged.

Most facts already are in the release: ``manifest.json`` holds its files' hashes, the checkpoints as specbuild read
them (RoPE theta and scaling, vocabulary, head_dim, tied embeddings, the tokenizer's eos/bos: ``compatibility``), the
build records and the memory plan. :func:`ship_doctor` adds the doctor (``doctor.py``, its parts beside it:
:data:`~specbuild.doctor.release_doctor.PARTS`), the image rules it checks packages by (``image_rules.py``, a copy of
:mod:`specbuild.runtimes.image_rules`) and ``doctor_facts.json``: what only the build knows, a few next-token logits of
each checkpoint and the python backend's known bugs the release's models would hit.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.doctor.checked_release import FACTS, LOGITS_PARAMETER_CAP, RULES
from specbuild.doctor.release_doctor import PARTS
from specbuild.package.backend_guides import TOKENIZER_INFO_FILE, TOKENIZER_INFO_KEYS
from specbuild.package.contract import TARGET_MODEL
from specbuild.runtimes import image_rules
from specbuild.runtimes.names import TENSORRT_LLM, TENSORRT_LLM_LLMAPI
from specbuild.spec import ROLES, BuildSpec

DOCTOR = "doctor.py"
FACTS_FORMAT = "specbuild.doctor/v1"
# Texts whose token ids the logits are recorded on (the target's tokenizer; the pair shares it).
LOGIT_PROMPTS = ("The capital of France is", "def add(a, b):\n    return")
TOP_LOGITS = 5
# fp32 on a CPU, another machine and transformers version: the same math up to summation order (~1e-5 here)
LOGIT_TOLERANCE = {"absolute": 2e-3, "relative": 1e-3}


@dataclass(frozen=True)
class BackendBug:
    """A python backend bug a release's python models hit where their code calls ``method`` with ``keywords`` (a
    call in a comment or string does not count), fixed in the NGC image of ``fixed_in`` (``yy.mm``)."""

    name: str
    summary: str
    fixed_in: str
    source: str
    method: str
    keywords: tuple[tuple[str, object], ...]

    def hit_by(self, source: str) -> bool:
        """Whether the Python ``source`` calls the method with those keyword values."""
        wanted = dict(self.keywords)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == self.method:
                given = {k.arg: k.value.value for k in node.keywords if isinstance(k.value, ast.Constant)}
                if all(given.get(key) == value for key, value in wanted.items()):
                    return True
        return False


PYTHON_BACKEND_BUGS = (
    BackendBug("decoupled async_exec",
               "use-after-free in the decoupled async_exec callback (it captures the stub by reference and "
               "dereferences it on the executor thread): intermittent stub crashes",
               "26.07", "triton-inference-server/python_backend src/pb_stub.cc; PR #439, first in r26.07",
               "async_exec", (("decoupled", True),)),
)


def backend_bugs(repository: Path) -> list[dict[str, Any]]:
    """Each known bug and the release's python files (relative to ``repository``) that would hit it."""
    sources = {path.relative_to(repository).as_posix(): path.read_text(encoding="utf-8")
               for path in sorted(repository.glob("*/1/**/*.py")) if not path.is_symlink()}
    return [{"name": bug.name, "summary": bug.summary, "fixed_in": bug.fixed_in, "source": bug.source,
             "files": [name for name, text in sources.items() if bug.hit_by(text)]}
            for bug in PYTHON_BACKEND_BUGS]


def recorded_logits(checkpoint: Path, prompt_ids: list[list[int]]) -> dict[str, Any]:
    """The top next-token logits of ``checkpoint`` (fp32, CPU) after each prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32, trust_remote_code=False,
                                                 use_safetensors=True)
    model.eval()
    top = []
    with torch.no_grad():
        for ids in prompt_ids:
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            values, tokens = torch.topk(logits, min(TOP_LOGITS, logits.numel()))
            top.append([[int(token), float(value)] for token, value in zip(tokens, values)])
    return {"prompt_ids": prompt_ids, "top": top, "tolerance": LOGIT_TOLERANCE}


def _records_logits(checkpoint: Path) -> bool:
    """Whether the build records logits of ``checkpoint``: safetensors weights (a pickle is never loaded to record
    figures, even where the user allowed pickles for the conversion) of at most LOGITS_PARAMETER_CAP parameters."""
    from specbuild.checkpoint.info import read_checkpoint

    return any(checkpoint.glob("*.safetensors")) and \
        read_checkpoint(checkpoint).num_parameters <= LOGITS_PARAMETER_CAP


def _tensorrt_llm_line(spec: BuildSpec) -> str | None:
    """The TensorRT-LLM line the release was made for: the engine runtime's series, the LLM-API release's
    ``triton.tensorrt_llm``; None for the torch runtime."""
    if spec.runtime == TENSORRT_LLM:
        from specbuild.runtimes.tensorrt_llm.engine_plans import TENSORRT_LLM_SERIES

        return TENSORRT_LLM_SERIES
    return spec.triton.tensorrt_llm if spec.runtime == TENSORRT_LLM_LLMAPI else None


def _tokenizer_info(repository: Path) -> dict[str, Any] | None:
    """A guided release's xgrammar tokenizer-info file (the target's, as the tensorrtllm backend reads it) and the
    keys the backend parses; None for a release without one."""
    path = repository / TARGET_MODEL / TOKENIZER_INFO_FILE
    return {"path": path.relative_to(repository).as_posix(), "keys": list(TOKENIZER_INFO_KEYS)} \
        if path.is_file() else None


def doctor_facts(spec: BuildSpec, repository: Path) -> dict[str, Any]:
    """``doctor_facts.json`` of the release rendered into ``repository``."""
    from transformers import AutoTokenizer

    logits: dict[str, Any] = {}
    if importlib.util.find_spec("torch") is not None:  # packaging needs no torch (the GPU runtimes' never runs it)
        tokenizer = AutoTokenizer.from_pretrained(str(spec.target.checkpoint), trust_remote_code=False)
        prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in LOGIT_PROMPTS]
        logits = {role: recorded_logits(Path(getattr(spec, role).checkpoint), prompt_ids) for role in ROLES
                  if _records_logits(Path(getattr(spec, role).checkpoint))}
    line = _tensorrt_llm_line(spec)
    return {"format": FACTS_FORMAT, "runtime": spec.runtime, "line": line,
            "tensorrt_llm": line if line == "1.2" else None,  # the installed version's prefix; main has none
            "tokenizer_info": _tokenizer_info(repository),
            "logits": logits,
            "python_backend_bugs": backend_bugs(repository)}


def ship_doctor(spec: BuildSpec, repository: Path) -> None:
    """The doctor and its parts, its image rules and its facts into the release's repository folder (files, which
    Triton does not take for models; the manifest covers them)."""
    shutil.copy2(Path(__file__).with_name("release_doctor.py"), repository / DOCTOR)
    for part in PARTS:
        shutil.copy2(Path(__file__).with_name(part), repository / part)
    shutil.copy2(Path(image_rules.__file__), repository / RULES)
    (repository / FACTS).write_text(json.dumps(doctor_facts(spec, repository), indent=2) + "\n", encoding="utf-8")
