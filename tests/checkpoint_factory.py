"""Tiny HF checkpoints built with the real libraries, for the ``specbuild check`` tests.

A byte-level BPE tokenizer trained with ``tokenizers`` on stdlib sources, wrapped in
``PreTrainedTokenizerFast``; small random ``LlamaForCausalLM`` models saved with ``save_pretrained``. Built
once per session (``checkpoints`` fixture) and copied by tests that damage them.
"""

from __future__ import annotations

import json
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>"]
STDLIB = Path(sysconfig.get_paths()["stdlib"])
TEXT_MAIN = sorted((STDLIB / "json").glob("*.py"))
TEXT_OTHER = [STDLIB / "textwrap.py", STDLIB / "string.py", STDLIB / "shlex.py"]
VOCAB = 400
OTHER_VOCAB = 350
PADDED_VOCAB = 448  # VOCAB rounded up to a multiple of 64, as some families pad their embeddings
MAX_POSITIONS = 4096


@dataclass(frozen=True)
class Checkpoints:
    target: Path  # hidden 64, 4 layers, untied
    draft: Path  # same tokenizer, hidden 16, 1 layer, tied embeddings: ~30x fewer parameters
    other_tokenizer: Path  # draft shape, tokenizer trained on other text with a smaller vocab
    padded_draft: Path  # draft with its embedding padded to PADDED_VOCAB rows
    sharded_target: Path  # the target saved in several safetensors shards with an index
    pickle_only: Path  # the draft saved as pytorch_model.bin only
    target_parameters: int
    draft_parameters: int


def train_tokenizer(files: list[Path], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train([str(f) for f in files], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=SPECIALS[0], eos_token=SPECIALS[1],
                                   pad_token=SPECIALS[2])


def llama(tokenizer, *, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
          vocab_size: int | None = None, tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size or len(tokenizer), hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=tie, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def save(model, tokenizer, folder: Path, **kwargs) -> Path:
    """``save_pretrained``, with RoPE also at the top level of config.json as checkpoints saved by transformers 4.x
    (most of the Hub's) hold it: what every runtime can serve (one holding only transformers 5's
    ``rope_parameters``: :func:`strip_legacy_rope`)."""
    from specbuild.checkpoint.rope import write_legacy_rope

    model.save_pretrained(folder, **kwargs)
    write_legacy_rope(folder)
    tokenizer.save_pretrained(folder)
    return folder


def strip_legacy_rope(folder: Path) -> Path:
    """``folder``'s config.json as transformers 5 saves it: RoPE only in ``rope_parameters``."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key in ("rope_theta", "rope_scaling", "partial_rotary_factor"):
        config.pop(key, None)
    path.write_text(json.dumps(config))
    return folder


def copy_checkpoint(source: Path, destination: Path) -> Path:
    shutil.copytree(source, destination)
    return destination


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def with_max_positions(checkpoints: Checkpoints, root: Path, positions: int) -> tuple[Path, Path]:
    """Copies of the compatible target and draft whose configs hold only ``positions`` positions."""
    pair = []
    for name, source in (("target", checkpoints.target), ("draft", checkpoints.draft)):
        folder = copy_checkpoint(source, root / f"{name}-{positions}")
        edit_json(folder / "config.json", max_position_embeddings=positions)
        pair.append(folder)
    return pair[0], pair[1]


def build(root: Path) -> Checkpoints:
    tokenizer = train_tokenizer(TEXT_MAIN, VOCAB)
    other = train_tokenizer(TEXT_OTHER, OTHER_VOCAB)
    target = llama(tokenizer, hidden=64, layers=4, heads=4, kv_heads=2, intermediate=256)
    draft_shape = dict(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, tie=True)
    draft = llama(tokenizer, **draft_shape)
    pickle_only = save(draft, tokenizer, root / "pickle_only")
    (pickle_only / "model.safetensors").unlink()
    torch.save(draft.state_dict(), pickle_only / "pytorch_model.bin")
    return Checkpoints(
        target=save(target, tokenizer, root / "target"),
        draft=save(draft, tokenizer, root / "draft"),
        other_tokenizer=save(llama(other, **draft_shape), other, root / "other_tokenizer"),
        padded_draft=save(llama(tokenizer, vocab_size=PADDED_VOCAB, **draft_shape), tokenizer, root / "padded_draft"),
        sharded_target=save(target, tokenizer, root / "sharded_target", max_shard_size="100KB"),
        pickle_only=pickle_only,
        target_parameters=sum(p.numel() for p in target.parameters()),
        draft_parameters=sum(p.numel() for p in draft.parameters()),
    )


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Checkpoints:
    return _cached_build(tmp_path_factory.getbasetemp())


_BUILT: dict[Path, Checkpoints] = {}


def _cached_build(basetemp: Path) -> Checkpoints:
    """One build per session even when several test modules import the fixture."""
    if basetemp not in _BUILT:
        root = basetemp / "checkpoints"
        root.mkdir()
        _BUILT[basetemp] = build(root)
    return _BUILT[basetemp]


def pair_spec(root: Path, target: Path, draft: Path, **overrides: Any):
    """A spec of ``target`` and ``draft`` (the torch runtime unless ``overrides`` say otherwise: dotted spec keys)
    with its outputs in ``root/{build,engines,triton_repo}``."""
    from specbuild.spec import load_spec

    return load_spec(None, {
        "runtime": "torch", "target.checkpoint": str(target), "draft.checkpoint": str(draft),
        "limits.max_input_len": 64, "limits.max_seq_len": 128,
        "outputs.build_dir": str(root / "build"), "outputs.engines_dir": str(root / "engines"),
        "outputs.repository_dir": str(root / "triton_repo"), **overrides,
    }, base_dir=root)


def release_spec(checkpoints: Checkpoints, root: Path, runtime: str, overrides: dict | None = None):
    """A spec of the factory pair for ``runtime``, its release under ``root/release``."""
    from specbuild.spec import load_spec

    return load_spec(None, {
        "name": "gpu", "runtime": runtime, "target.checkpoint": str(checkpoints.target),
        "draft.checkpoint": str(checkpoints.draft), "limits.max_input_len": 64, "limits.max_seq_len": 192,
        "outputs.build_dir": str(root / "build"), "outputs.engines_dir": str(root / "release" / "engines"),
        "outputs.repository_dir": str(root / "release" / "triton_repo"), **(overrides or {}),
    })


def package_gpu_release(checkpoints: Checkpoints, root: Path, overrides: dict | None = None, gpu: str | None = None):
    """A tensorrt-llm release of the factory pair whose engines were "built on a GPU host": each engine folder
    holds the build record TensorRT-LLM's runtime plans for it (with ``gpu`` as the GPU it was built on, as a real
    build records it) and a stand-in engine file, then ``specbuild package`` renders and hashes the repository here.
    Returns the ``CompileResult``."""
    from specbuild import compiler
    from specbuild.runtimes.registry import runtime_for
    from specbuild.checkpoint.info import read_checkpoint
    from specbuild.package.build_record import GpuInfo

    spec = release_spec(checkpoints, root, "tensorrt-llm", overrides)
    runtime = runtime_for("tensorrt-llm")
    for role in ("target", "draft"):
        folder = Path(spec.outputs.engines_dir) / role
        folder.mkdir(parents=True)
        record = runtime.planned_record(spec, role, read_checkpoint(getattr(spec, role).checkpoint))
        if gpu is not None:
            record = record.model_copy(update={"gpu": GpuInfo(name=gpu, sm="9.0")})
        record.write(folder)
        (folder / "rank0.engine").write_bytes(b"stand-in engine")
    return compiler.run(spec, json_mode=True, package_only=True)


def package_llmapi_release(checkpoints: Checkpoints, root: Path, overrides: dict | None = None):
    """A tensorrt-llm-llmapi release of the factory pair, compiled here (it builds nothing): the ``CompileResult``."""
    from specbuild import compiler

    return compiler.run(release_spec(checkpoints, root, "tensorrt-llm-llmapi", overrides), json_mode=True)
