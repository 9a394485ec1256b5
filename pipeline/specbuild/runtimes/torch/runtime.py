"""The embedded ``torch`` runtime: engine models that run HF checkpoints with PyTorch inside Triton python
models (CPU, or any CUDA GPU), under the ``tensorrtllm`` backend's contract.

* convert: HF checkpoint -> a normalized checkpoint (safetensors in the engine dtype, config, tokenizer),
  loaded with safetensors only unless the spec allows pickles, never with remote code unless allowed.
* build: the normalized checkpoint -> an engine folder: the weights plus ``build_info.json`` holding the
  same build fields a TensorRT-LLM engine records (limits, ``max_draft_len``, speculative mode), so
  packaging does not care which runtime built it. A draft's ``head_vocabulary.json`` (a sub-vocabulary head)
  travels with its weights and its size and checksum with the record.
* engine models: :class:`~specbuild.runtimes.torch.parameters.TorchEngineParameters`, the backend's keys
  rendered as for TensorRT-LLM plus ``torch_device``/``torch_threads``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from specbuild.checkpoint.head_vocabulary import HeadVocabulary, read_head_vocabulary
from specbuild.checkpoint.rope import write_legacy_rope
from specbuild.checkpoint.tokenizer_files import copy_tokenizer
from specbuild.errors import CheckpointError
from specbuild.package.backend_contract import EngineModel
from specbuild.package.build_record import BuildRecord, Engine, HeadVocabularyRecord
from specbuild.runtimes.interface import RENDER_READS, ModelPlan, PackageContext, Runtime
from specbuild.runtimes.launch_plans import DEFAULT_SHM_GIB, BundledPlan
from specbuild.runtimes.names import TORCH
from specbuild.runtimes.torch.launch import cpu_pod_plan
from specbuild.runtimes.torch.parameters import TorchEngineParameters
from specbuild.runtimes.torch.settings import TORCH_SETTINGS
from specbuild.spec import BuildSpec, Role
from specbuild.speculation.modes import VERIFICATION_MODES

if TYPE_CHECKING:
    from specbuild.checkpoint.info import CheckpointInfo
    from specbuild.runtimes.pod_plans import DeployOptions, PodPlan, ReleaseFootprint

ENGINE_MODEL = Path(__file__).parent / "engine_model.py"  # the python model of the target and the draft
BUILD_READS = ("target.dtype", "draft.dtype", "speculation.acceptance", "speculation.max_draft_len")  # its record


def resolve_dtype(spec: BuildSpec, role: Role) -> str:
    """``auto`` is float32 here: the torch runtime mostly runs on CPUs, where half precision is not faster."""
    return TorchRuntime().engine_dtype(getattr(spec, role).dtype, role, None)


def engine_dir_parameter(engine_dir: Path, repository_dir: Path) -> str:
    """The engine folder relative to the release root (the repository's parent) when it lies inside it,
    so a release moves as a whole; otherwise absolute."""
    root = repository_dir.resolve().parent
    engine_dir = engine_dir.resolve()
    try:
        return str(engine_dir.relative_to(root))
    except ValueError:
        return str(engine_dir)


class TorchRuntime(Runtime):
    name = TORCH
    settings = TORCH_SETTINGS
    ttft_p95_seconds = 5.0  # a CPU's prefill is seconds for long prompts
    sub_vocabulary_heads = True  # engine.SubVocabularyHead
    verifications = VERIFICATION_MODES  # the engine model verifies with speculation.rules
    reads = {"check": ("torch.device",), "convert": ("target.dtype", "draft.dtype"), "build": BUILD_READS,
             "plan": BUILD_READS,
             "package": (*RENDER_READS, "torch", "triton.engine_instances")}

    def available(self) -> bool:
        import importlib.util

        return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))

    def memory_device(self, spec: BuildSpec) -> Literal["GPU", "CPU"]:
        """``torch.device`` as the engine models resolve it: ``auto`` is a GPU where the spec names one
        (``triton.gpu_memory_gib``) or this machine has CUDA, else the CPU."""
        from specbuild.runtimes.torch.engine import resolve_device

        named = spec.torch.device == "auto" and spec.triton.gpu_memory_gib is not None
        return "GPU" if named or resolve_device(spec.torch.device) == "cuda" else "CPU"

    def unsupported(self, architecture: str) -> str | None:
        try:
            from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        except ImportError:
            return "transformers is not installed (pip install 'specbuild[torch]')"

        if architecture in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
            return None
        return f"the installed transformers has no causal LM class {architecture!r}"

    def engine_dtype(self, requested: str, role: Role, checkpoint_dtype: str | None) -> str:
        return "float32" if requested == "auto" else requested

    def plan(self, spec: BuildSpec, role: Role, checkpoint: CheckpointInfo, converted: Path,
             engine: Path) -> ModelPlan:
        planned = self.planned_record(spec, role, checkpoint)
        data = {"checkpoint": getattr(spec, role).checkpoint, "converted": str(converted), "engine": str(engine),
                "dtype": planned.dtype, "limits": planned.limits.model_dump(),
                "generation_logits": planned.generation_logits}
        text = (f"{role}: {data['checkpoint']} -> {converted} -> {engine} (dtype {data['dtype']}, "
                f"{json.dumps(data['limits'])})")
        return ModelPlan(role, data, text)

    def convert(self, spec: BuildSpec, role: Role, checkpoint: CheckpointInfo, output: Path) -> None:
        convert(spec, role, output, checkpoint.head_vocabulary)

    def build(self, spec: BuildSpec, role: Role, converted: Path, output: Path) -> None:
        build(spec, role, converted, output)

    def planned_record(self, spec: BuildSpec, role: Role, checkpoint: CheckpointInfo) -> BuildRecord:
        return record(spec, role, checkpoint.vocab_size, checkpoint.architecture, checkpoint.head_vocabulary,
                      toolchain=None)

    def engine_model(self, spec: BuildSpec, engine: Engine, repository: Path,
                     context: PackageContext) -> EngineModel:
        """A python model (:data:`ENGINE_MODEL`), as many instances as the spec asks for."""
        parameters = TorchEngineParameters(
            gpt_model_path=engine_dir_parameter(engine.path, repository),
            max_tokens_in_paged_kv_cache=context.kv_tokens[engine.role],
            enable_chunked_context=True,
            exclude_input_in_output=True,
            torch_device=spec.torch.device,
            torch_threads=getattr(spec.torch, f"{engine.role}_threads"),
            head_vocabulary_sha256=engine.record.head_vocabulary.sha256 if engine.record.head_vocabulary else None,
        )
        return EngineModel("python", parameters, spec.triton.engine_instances, ENGINE_MODEL, guide_masks=True,
                           block_verification="block" in self.verifications)


    def launch_plan(self, spec: BuildSpec, repository: Path, engines: Path, checkpoints: Mapping[str, Path], *,
                    gpus: int | None = None, shm_gib: int = DEFAULT_SHM_GIB) -> BundledPlan:
        """The bundled Triton server, on this machine's CPU or any CUDA GPU (``gpus`` and ``shm_gib`` are a
        container's)."""
        return BundledPlan.of(spec.triton, repository, openai=True)

    def pod_plan(self, spec: BuildSpec, options: DeployOptions, footprint: ReleaseFootprint) -> PodPlan:
        return cpu_pod_plan(spec, options, footprint)

def convert(spec: BuildSpec, role: Role, output_dir: Path, head_vocabulary: HeadVocabulary | None = None) -> None:
    """Load the HF checkpoint of ``role`` and save it normalized (safetensors, engine dtype) to ``output_dir``,
    with its head vocabulary where it has one (as read and checked with the checkpoint)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from specbuild.runtimes.torch.engine import DTYPES

    hf_logging.disable_progress_bar()
    source = Path(getattr(spec, role).checkpoint)
    has_safetensors = any(source.glob("*.safetensors"))
    if not has_safetensors and not spec.security.allow_pickle:
        raise CheckpointError(f"{source} has no .safetensors weights (pickle files are not loaded by default)",
                              "convert it to safetensors, or pass --set security.allow_pickle=true if you trust it")
    try:
        model, loading = AutoModelForCausalLM.from_pretrained(
            str(source), dtype=DTYPES[resolve_dtype(spec, role)], use_safetensors=has_safetensors,
            trust_remote_code=spec.security.trust_remote_code, low_cpu_mem_usage=True, output_loading_info=True)
    except (OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"cannot load {role} checkpoint {source}: {exc}",
                              "check that the folder is a complete HF causal-LM checkpoint") from None
    missing = sorted(loading.get("missing_keys") or [])
    if missing:  # transformers would fill them with random values: an engine that compiles and talks nonsense
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise CheckpointError(f"{source / 'config.json'} declares weights that the {role} checkpoint does not hold: "
                              f"{shown}", "use the config.json saved with these weights (layer count and sizes "
                              "must match the safetensors files)")
    with torch.no_grad():
        model.save_pretrained(str(output_dir), safe_serialization=True)
    write_legacy_rope(output_dir)  # the image's transformers 4.57 loads this copy: RoPE as 5.x reads it
    copy_tokenizer(source, output_dir)
    if head_vocabulary is not None:
        head_vocabulary.write(output_dir)
    link_identical_files(source, output_dir)


def link_identical_files(source: Path, output_dir: Path) -> list[str]:
    """Replace each weights file of ``output_dir`` whose namesake in ``source`` holds the same bytes by a hard link
    to it (returns their names): a checkpoint already in the engine dtype, saved by the same transformers (the demo
    pair), then costs no second copy on disk, in the converted checkpoint or the engines linked to it. Only the
    weights are linked: the small files (config.json, the tokenizer's) stay copies, so a release's config edited in
    place never edits the checkpoint or another release made from it. Files on another filesystem stay copies. A
    checkpoint rewritten in place afterwards changes the linked weights too: compile sees their hashes change and
    runs again, ``specbuild verify`` names them."""
    import filecmp

    linked = []
    for written in sorted(output_dir.glob("*.safetensors")):
        original = source / written.name
        if not (original.is_file() and written.is_file() and filecmp.cmp(original, written, shallow=False)):
            continue
        temporary = written.with_name(f".{written.name}.link")
        try:
            os.link(original, temporary)
        except OSError:  # another filesystem, or links not allowed: the copy stays
            continue
        os.replace(temporary, written)
        linked.append(written.name)
    return linked


def build(spec: BuildSpec, role: Role, checkpoint_dir: Path, output_dir: Path) -> None:
    """Make the engine folder: the converted weights (hard-linked when possible) and its build record."""
    import torch
    import transformers

    output_dir.mkdir(parents=True, exist_ok=True)
    for item in sorted(checkpoint_dir.iterdir()):
        if item.is_file():
            try:
                os.link(item, output_dir / item.name)
            except OSError:
                shutil.copy2(item, output_dir / item.name)
    config = json.loads((checkpoint_dir / "config.json").read_text(encoding="utf-8"))
    record(spec, role, config.get("vocab_size"), (config.get("architectures") or ["?"])[0],
           read_head_vocabulary(checkpoint_dir, config.get("vocab_size")), toolchain={"torch": torch.__version__, "transformers": transformers.__version__}).write(output_dir)


def record(spec: BuildSpec, role: Role, vocab_size: int | None, architecture: str,
           head_vocabulary: HeadVocabulary | None, toolchain: dict[str, str] | None) -> BuildRecord:
    """An engine folder's record; ``toolchain`` None: planned, not built. The draft returns its logits for
    draft-logits acceptance (every torch engine can; the record says what this release asks of it)."""
    return BuildRecord(runtime=TORCH, role=role, dtype=resolve_dtype(spec, role), vocab_size=vocab_size,
                       architecture=architecture,
                       limits=TorchRuntime().record_limits(spec, role),
                       generation_logits=role == "draft" and spec.speculation.acceptance == "draft-logits",
                       head_vocabulary=HeadVocabularyRecord.of(head_vocabulary), toolchain=toolchain)
