"""The tensor contract between the models of the repository: one source of truth for names, types, shapes.

The repository renderer builds every ``config.pbtxt`` from these tables, the Triton python models read
and write tensors by these names, and the contract tests check that the ensemble's mappings agree with
them. Shapes exclude the batch dimension (every model has ``max_batch_size > 0``), as in Triton configs.

* ``ENSEMBLE_*``: the public interface, kept name-for-name with NVIDIA's tensorrtllm_backend ensemble
  (so its clients, GenAI-Perf's tensorrtllm mode and Triton's generate endpoint work), plus
  ``num_draft_tokens`` and ``use_draft_logits`` from its BLS model, ``adaptive_draft`` and ``prompt_lookup``.
* the engine models' tensors and parameters: :mod:`specbuild.package.backend_contract`.

Each python model's ``parameters`` are a typed class here (:class:`~specbuild.package.parameters.ModelParameters`):
the repository renders them and the model parses them with the same code, so a key cannot go missing quietly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from specbuild.package.parameters import ModelParameters
from specbuild.speculation.lookup import PromptLookup


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # Triton config dtype, e.g. "TYPE_INT32"
    dims: tuple[int, ...]
    optional: bool = False
    description: str = ""


# --- public ensemble interface -------------------------------------------------------------------------
ENSEMBLE_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (1,), description="the prompt"),
    Tensor("max_tokens", "TYPE_INT32", (1,), description="tokens to generate"),
    Tensor("stream", "TYPE_BOOL", (1,), True, "one response per round as tokens are accepted"),
    Tensor("temperature", "TYPE_FP32", (1,), True, "0 = greedy"),
    Tensor("top_k", "TYPE_INT32", (1,), True, "0 = no limit, 1 = greedy"),
    Tensor("top_p", "TYPE_FP32", (1,), True, "0 or 1 = no limit"),
    Tensor("random_seed", "TYPE_UINT64", (1,), True, "reproducible sampling"),
    Tensor("end_id", "TYPE_INT32", (1,), True, "stop token (default: the tokenizer's eos)"),
    Tensor("pad_id", "TYPE_INT32", (1,), True),
    Tensor("stop_words", "TYPE_STRING", (-1,), True, "stop after any of these strings"),
    Tensor("bad_words", "TYPE_STRING", (-1,), True, "never generate these strings"),
    Tensor("exclude_input_in_output", "TYPE_BOOL", (1,), True, "non-streamed text without the prompt"),
    Tensor("return_perf_metrics", "TYPE_BOOL", (1,), True, "accepted for compatibility; metrics are always returned"),
    Tensor("beam_width", "TYPE_INT32", (1,), True, "only 1: beam search does not combine with draft-target"),
    Tensor("num_draft_tokens", "TYPE_INT32", (1,), True, "K for this request: 0 = target alone"),
    Tensor("use_draft_logits", "TYPE_BOOL", (1,), True, "rejection sampling on draft logits (else token match)"),
    Tensor("adaptive_draft", "TYPE_BOOL", (1,), True, "adapt K from this request's acceptance"),
    Tensor("prompt_lookup", "TYPE_BOOL", (1,), True, "draft from the request's own tokens first (n-gram lookup)"),
)
ENSEMBLE_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "TYPE_STRING", (-1,)),
    Tensor("acceptance_rate", "TYPE_FP32", (1,), description="accepted / drafted tokens so far"),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("output_token_count", "TYPE_INT32", (1,), description="tokens generated so far"),
)

# --- preprocessing: text -> ids -------------------------------------------------------------------------
PREPROCESSING_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (1,)),
    Tensor("stop_words", "TYPE_STRING", (-1,), True),
    Tensor("bad_words", "TYPE_STRING", (-1,), True),
    Tensor("end_id", "TYPE_INT32", (1,), True),
)
PREPROCESSING_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("input_ids", "TYPE_INT32", (-1,)),
    Tensor("input_length", "TYPE_INT32", (1,)),
    # Word lists as TensorRT-LLM encodes them: row 0 the concatenated ids, row 1 the end offsets (-1 padded).
    Tensor("stop_words_ids", "TYPE_INT32", (2, -1)),
    Tensor("bad_words_ids", "TYPE_INT32", (2, -1)),
    Tensor("end_id", "TYPE_INT32", (1,)),
)

# --- orchestrator: the speculative loop (decoupled) ----------------------------------------------------
ORCHESTRATOR_INPUTS: tuple[Tensor, ...] = (
    Tensor("input_ids", "TYPE_INT32", (-1,)),
    Tensor("input_length", "TYPE_INT32", (1,)),
    Tensor("max_tokens", "TYPE_INT32", (1,)),
    Tensor("stop_words_ids", "TYPE_INT32", (2, -1), True),
    Tensor("bad_words_ids", "TYPE_INT32", (2, -1), True),
    Tensor("end_id", "TYPE_INT32", (1,), True),
    Tensor("pad_id", "TYPE_INT32", (1,), True),
    Tensor("stream", "TYPE_BOOL", (1,), True),
    Tensor("temperature", "TYPE_FP32", (1,), True),
    Tensor("top_k", "TYPE_INT32", (1,), True),
    Tensor("top_p", "TYPE_FP32", (1,), True),
    Tensor("random_seed", "TYPE_UINT64", (1,), True),
    Tensor("exclude_input_in_output", "TYPE_BOOL", (1,), True),
    Tensor("return_perf_metrics", "TYPE_BOOL", (1,), True),
    Tensor("beam_width", "TYPE_INT32", (1,), True),
    Tensor("num_draft_tokens", "TYPE_INT32", (1,), True),
    Tensor("use_draft_logits", "TYPE_BOOL", (1,), True),
    Tensor("adaptive_draft", "TYPE_BOOL", (1,), True),
    Tensor("prompt_lookup", "TYPE_BOOL", (1,), True),
)
ORCHESTRATOR_OUTPUTS: tuple[Tensor, ...] = (
    # Tokens for postprocessing to decode, and how many leading ones were already sent as text.
    Tensor("output_ids", "TYPE_INT32", (-1,)),
    Tensor("output_length", "TYPE_INT32", (1,)),
    Tensor("skip_tokens", "TYPE_INT32", (1,)),
    Tensor("is_final", "TYPE_BOOL", (1,)),
    Tensor("acceptance_rate", "TYPE_FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("output_token_count", "TYPE_INT32", (1,)),
)

# --- postprocessing: ids -> text, incremental ----------------------------------------------------------
POSTPROCESSING_INPUTS: tuple[Tensor, ...] = (
    Tensor("output_ids", "TYPE_INT32", (-1,)),
    Tensor("output_length", "TYPE_INT32", (1,)),
    Tensor("skip_tokens", "TYPE_INT32", (1,)),
    Tensor("is_final", "TYPE_BOOL", (1,)),
)
POSTPROCESSING_OUTPUTS: tuple[Tensor, ...] = (Tensor("text_output", "TYPE_STRING", (-1,)),)

# Every engine folder's build record (dtype, vocabulary, build config, toolchain), whichever runtime built it.
BUILD_INFO = "build_info.json"

# The models of a repository, by role. Names are fixed so clients and the ensemble can rely on them.
ENSEMBLE_MODEL = "ensemble"
PREPROCESSING_MODEL = "preprocessing"
ORCHESTRATOR_MODEL = "orchestrator"
POSTPROCESSING_MODEL = "postprocessing"
TARGET_MODEL = "target"
DRAFT_MODEL = "draft"
MODEL_NAMES = (ENSEMBLE_MODEL, PREPROCESSING_MODEL, ORCHESTRATOR_MODEL, POSTPROCESSING_MODEL, TARGET_MODEL, DRAFT_MODEL)

NUMPY_DTYPES = {
    "TYPE_BOOL": "bool",
    "TYPE_INT32": "int32",
    "TYPE_INT64": "int64",
    "TYPE_UINT64": "uint64",
    "TYPE_FP32": "float32",
    "TYPE_FP16": "float16",
    "TYPE_STRING": "object",
}


def by_name(tensors: tuple[Tensor, ...]) -> dict[str, Tensor]:
    return {tensor.name: tensor for tensor in tensors}


# --- python models' parameters --------------------------------------------------------------------------
@dataclass(frozen=True)
class PreprocessingParameters(ModelParameters):
    MODEL: ClassVar[str] = PREPROCESSING_MODEL

    max_input_len: int
    end_id: int  # the tokenizer's eos: requests' default end_id


@dataclass(frozen=True)
class OrchestratorParameters(ModelParameters):
    """Defaults for requests (each may override them) and the release's limits."""

    MODEL: ClassVar[str] = ORCHESTRATOR_MODEL

    max_draft_len: int  # what the target engine was built for
    num_draft_tokens: int
    use_draft_logits: bool
    adaptive_draft: bool
    prompt_lookup: bool
    lookup_max_ngram: int
    lookup_min_ngram: int
    lookup_draft_fallback: bool  # with lookup on: call the draft model when lookup finds nothing
    fast_logits: bool  # TensorRT-LLM passes draft logits GPU to GPU: the draft's logits are a handle, passed on as is
    max_input_len: int
    max_seq_len: int
    target_model: str = TARGET_MODEL
    draft_model: str = DRAFT_MODEL

    def __post_init__(self) -> None:
        if not 0 <= self.num_draft_tokens <= self.max_draft_len:
            raise ValueError(f"num_draft_tokens ({self.num_draft_tokens}) must be within 0..max_draft_len "
                             f"({self.max_draft_len})")
        self.lookup  # noqa: B018 - validates the n-gram range

    @property
    def lookup(self) -> PromptLookup:
        return PromptLookup(max_ngram=self.lookup_max_ngram, min_ngram=self.lookup_min_ngram)
