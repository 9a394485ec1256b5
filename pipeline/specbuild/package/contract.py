"""The tensor contract between the models of the repository: one source of truth for names, types, shapes.

The repository renderer builds every ``config.pbtxt`` from these tables, the Triton python models read
and write tensors by these names, and the contract tests check that the ensemble's mappings agree with
them. Shapes exclude the batch dimension (every model has ``max_batch_size > 0``), as in Triton configs.

* ``ENSEMBLE_*``: the public interface, kept name-for-name with NVIDIA's tensorrtllm_backend ensemble, both
  before and after its May 2025 renames (so its clients, GenAI-Perf's tensorrtllm mode, Triton's generate
  endpoint and Triton's OpenAI frontend work), plus the request settings
  (:data:`specbuild.speculation.request_settings.REQUEST_SETTINGS`: ``num_draft_tokens`` and ``use_draft_logits``
  from its BLS model, then specbuild's), ``apply_chat_template`` and ``max_time``.
* the engine models' tensors and parameters: :mod:`specbuild.package.backend_contract`.

Each python model's ``parameters`` are a typed class here (:class:`~specbuild.package.parameters.ModelParameters`):
the repository renders them and the model parses them with the same code, so a key cannot go missing quietly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

from specbuild.package.parameters import OPTIONAL, ModelParameters
from specbuild.speculation.cost import CostModel
from specbuild.speculation.lookup import PromptLookup
from specbuild.speculation.modes import VerificationMode
from specbuild.speculation.request_settings import REQUEST_SETTINGS
from specbuild.speculation.schedule import DraftLenSchedule


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # Triton config dtype, e.g. "TYPE_INT32"
    dims: tuple[int, ...]
    optional: bool = False
    description: str = ""


# --- public ensemble interface -------------------------------------------------------------------------
# The inputs the ensemble hands to the orchestrator unchanged. NVIDIA's names and meanings (sampling as the
# tensorrtllm backend reads it, see SamplingParams.from_backend), both spellings where tensorrtllm_backend renamed an
# input (PR #749, May 2025: random_seed -> seed, min_length -> min_tokens), then specbuild's own: the request
# settings' table (speculation.request_settings), the time limit and NVIDIA's guided decoding inputs.
REQUEST_INPUTS: tuple[Tensor, ...] = (
    Tensor("max_tokens", "TYPE_INT32", (1,), description="tokens to generate"),
    Tensor("stream", "TYPE_BOOL", (1,), True, "one response per round as tokens are accepted"),
    Tensor("temperature", "TYPE_FP32", (1,), True, "default 1; greedy whatever it is when top_k and top_p are 0"),
    Tensor("top_k", "TYPE_INT32", (1,), True, "0 = no limit; 0 or 1 with top_p 0 (or both absent) = greedy"),
    Tensor("top_p", "TYPE_FP32", (1,), True, "0 = unset, 1 = no limit"),
    Tensor("seed", "TYPE_UINT64", (1,), True, "reproducible sampling"),
    Tensor("random_seed", "TYPE_UINT64", (1,), True, "seed's name before tensorrtllm_backend 0.20"),
    Tensor("min_tokens", "TYPE_INT32", (1,), True, "no end token before this many tokens"),
    Tensor("min_length", "TYPE_INT32", (1,), True, "min_tokens' name before tensorrtllm_backend 0.20"),
    Tensor("repetition_penalty", "TYPE_FP32", (1,), True, "TensorRT-LLM's; the request runs without drafts"),
    Tensor("presence_penalty", "TYPE_FP32", (1,), True, "TensorRT-LLM's; the request runs without drafts"),
    Tensor("frequency_penalty", "TYPE_FP32", (1,), True, "TensorRT-LLM's; the request runs without drafts"),
    Tensor("length_penalty", "TYPE_FP32", (1,), True, "scores beams: no effect at beam width 1, as in NVIDIA's"),
    Tensor("pad_id", "TYPE_INT32", (1,), True),
    Tensor("exclude_input_in_output", "TYPE_BOOL", (1,), True, "non-streamed text without the prompt"),
    Tensor("return_perf_metrics", "TYPE_BOOL", (1,), True, "accepted; the figures are always returned"),
    Tensor("return_num_input_tokens", "TYPE_BOOL", (1,), True, "accepted; num_input_tokens is always returned"),
    Tensor("return_num_output_tokens", "TYPE_BOOL", (1,), True, "accepted; num_output_tokens is always returned"),
    Tensor("beam_width", "TYPE_INT32", (1,), True, "only 1: beam search does not combine with draft-target"),
    Tensor("num_return_sequences", "TYPE_INT32", (1,), True, "only 1"),
    *(Tensor(setting.name, setting.dtype, (1,), True, setting.help) for setting in REQUEST_SETTINGS),
    Tensor("max_time", "TYPE_FP32", (1,), True, "seconds: stop after the round that passes them (within the "
           "server's max_request_seconds)"),
    # NVIDIA's guided decoding inputs (tensorrtllm_backend's ensemble and GuidedDecodingParams' guide types)
    Tensor("guided_decoding_guide_type", "TYPE_STRING", (1,), True, "json, json_schema, regex or ebnf_grammar"),
    Tensor("guided_decoding_guide", "TYPE_STRING", (1,), True, "the JSON schema, regular expression or grammar "
           "(none for json)"),
)
# What every response says about its row besides the text: NVIDIA's names (batch_index, the perf metrics it can
# fill honestly, num_input/output_tokens), and specbuild's count of tokens so far.
RESPONSE_FIGURES: tuple[Tensor, ...] = (
    Tensor("batch_index", "TYPE_INT32", (1,), description="the row of the request this response is about"),
    Tensor("acceptance_rate", "TYPE_FP32", (1,), description="accepted / drafted tokens so far"),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("arrival_time_ns", "TYPE_INT64", (1,), description="the orchestrator received the request (epoch ns)"),
    Tensor("first_scheduled_time_ns", "TYPE_INT64", (1,), description="its first engine call started"),
    Tensor("first_token_time_ns", "TYPE_INT64", (1,), description="its first token was accepted (0: none yet)"),
    Tensor("last_token_time_ns", "TYPE_INT64", (1,), description="its latest token was accepted (0: none yet)"),
    Tensor("num_input_tokens", "TYPE_INT32", (1,), description="prompt tokens"),
    Tensor("num_output_tokens", "TYPE_INT32", (1,), description="tokens this response adds"),
    Tensor("output_token_count", "TYPE_INT32", (1,), description="tokens generated so far"),
)
ENSEMBLE_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (1,), description="the prompt"),
    Tensor("end_id", "TYPE_INT32", (1,), True, "stop token (default: the tokenizer's eos; < 0: none)"),
    Tensor("stop_words", "TYPE_STRING", (-1,), True, "stop after any of these strings"),
    Tensor("bad_words", "TYPE_STRING", (-1,), True, "never generate these strings"),
    Tensor("apply_chat_template", "TYPE_BOOL", (1,), True, "text_input is a user message: wrap it in the "
           "tokenizer's chat template (a tokenizer without one takes the text as it is)"),
) + REQUEST_INPUTS
ENSEMBLE_OUTPUTS: tuple[Tensor, ...] = (Tensor("text_output", "TYPE_STRING", (-1,)),) + RESPONSE_FIGURES

# --- preprocessing: text -> ids -------------------------------------------------------------------------
PREPROCESSING_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (1,)),
    Tensor("stop_words", "TYPE_STRING", (-1,), True),
    Tensor("bad_words", "TYPE_STRING", (-1,), True),
    Tensor("end_id", "TYPE_INT32", (1,), True),
    Tensor("apply_chat_template", "TYPE_BOOL", (1,), True),
)
PREPROCESSING_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("input_ids", "TYPE_INT32", (-1,)),
    Tensor("input_length", "TYPE_INT32", (1,)),
    # Word lists as TensorRT-LLM encodes them: row 0 the concatenated ids, row 1 the end offsets (-1 padded).
    Tensor("stop_words_ids", "TYPE_INT32", (2, -1)),
    Tensor("bad_words_ids", "TYPE_INT32", (2, -1)),
    Tensor("end_id", "TYPE_INT32", (1,)),
    # What a non-streamed answer repeats before its tokens unless the input is excluded: the prompt's ids, or the
    # user's text alone where the chat template wrapped it (never the template around it).
    Tensor("echo_ids", "TYPE_INT32", (-1,)),
    Tensor("echo_length", "TYPE_INT32", (1,)),
)

# --- orchestrator: the speculative loop (decoupled) ----------------------------------------------------
# The ensemble's request settings and the tokenizer's ids; one response per row (batch_index says which).
ORCHESTRATOR_INPUTS: tuple[Tensor, ...] = (
    Tensor("input_ids", "TYPE_INT32", (-1,)),
    Tensor("input_length", "TYPE_INT32", (1,)),
    Tensor("stop_words_ids", "TYPE_INT32", (2, -1), True),
    Tensor("bad_words_ids", "TYPE_INT32", (2, -1), True),
    Tensor("end_id", "TYPE_INT32", (1,), True),
    Tensor("echo_ids", "TYPE_INT32", (-1,), True, "default: input_ids"),
    Tensor("echo_length", "TYPE_INT32", (1,), True),
) + REQUEST_INPUTS
ORCHESTRATOR_OUTPUTS: tuple[Tensor, ...] = (
    # Tokens for postprocessing to decode, and how many leading ones were already sent as text.
    Tensor("output_ids", "TYPE_INT32", (-1,)),
    Tensor("output_length", "TYPE_INT32", (1,)),
    Tensor("skip_tokens", "TYPE_INT32", (1,)),
    Tensor("is_final", "TYPE_BOOL", (1,)),
) + RESPONSE_FIGURES

# --- postprocessing: ids -> text, incremental ----------------------------------------------------------
POSTPROCESSING_INPUTS: tuple[Tensor, ...] = (
    Tensor("output_ids", "TYPE_INT32", (-1,)),
    Tensor("output_length", "TYPE_INT32", (1,)),
    Tensor("skip_tokens", "TYPE_INT32", (1,)),
    Tensor("is_final", "TYPE_BOOL", (1,)),
)
# One text per row, 1-D as NVIDIA's postprocessing returns it ([batch x beams]): its clients read text_output[0].
POSTPROCESSING_OUTPUTS: tuple[Tensor, ...] = (Tensor("text_output", "TYPE_STRING", (-1,)),)


# The models of a repository, by role. Names are fixed so clients and the ensemble can rely on them.
ENSEMBLE_MODEL = "ensemble"
PREPROCESSING_MODEL = "preprocessing"
ORCHESTRATOR_MODEL = "orchestrator"
POSTPROCESSING_MODEL = "postprocessing"
TARGET_MODEL = "target"
DRAFT_MODEL = "draft"
MANIFEST_NAME = "manifest.json"  # the release's manifest, beside the models (package/manifest.py writes it)
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
    draft_len_schedule: str  # the load policy: K per requests in flight (speculation.schedule's "in_flight:K,...")
    prompt_lookup: bool
    lookup_max_ngram: int
    lookup_min_ngram: int
    lookup_draft_fallback: bool  # with lookup on: call the draft model when lookup finds nothing
    fast_logits: bool  # TensorRT-LLM passes draft logits GPU to GPU: the draft's logits are a handle, passed on as is
    max_input_len: int
    max_seq_len: int  # the target's window: what a request may hold
    draft_max_seq_len: int  # the draft engine's window: past it the draft model is not called (drafting.ModelDrafts)
    vocab_size: int  # the engines' vocabulary: a request's end_id must be inside it
    max_request_seconds: float  # a request stops after the round that passes this (0: never); abandons end too
    break_even: bool  # requests' default: drafting switches off for a request while it does not pay
    draft_cost: float  # the release's cost model (speculation.cost.CostModel): c, in target steps
    verify_costs: tuple[float, ...]  # V(1)..V(max_draft_len), in target steps
    cost_measured: bool  # c measured on the build host (else the parameter ratio)
    measured_acceptance: float | None = field(default=None, metadata=OPTIONAL)  # the break-even's prior
    verification: VerificationMode = "token"  # how the target judges draft logits (speculation.verification)
    draft_context: int = field(default=0, metadata=OPTIONAL)  # the most recent tokens the draft reads (0: all)
    guided_decoding: bool = False  # the engines take guide masks (guide_token_masks): guided requests run
    # the target engine applies NVIDIA's guided decoding inputs itself (the tensorrtllm backend's xgrammar): guided
    # requests run on the target alone, each answer in one call (triton_models/request_runner.py)
    engine_guides: bool = False
    target_model: str = TARGET_MODEL
    draft_model: str = DRAFT_MODEL
    # the spec's capture section (optional: a release packaged before it captures nothing); records carry the
    # release tokenizer's hash (checkpoint.tokenizer_files.tokenizer_hash)
    tokenizer_hash: str = field(default="", metadata=OPTIONAL)
    capture: bool = field(default=False, metadata=OPTIONAL)  # finished rows are appended to the capture store
    capture_max_file_mib: float = field(default=64.0, metadata=OPTIONAL)
    capture_max_file_hours: float = field(default=24.0, metadata=OPTIONAL)
    capture_retention_days: float = field(default=30.0, metadata=OPTIONAL)

    def __post_init__(self) -> None:
        if self.capture and not self.tokenizer_hash:
            raise ValueError("capture is on but tokenizer_hash is empty: records would not name their tokenizer")
        if not 0 <= self.num_draft_tokens <= self.max_draft_len:
            raise ValueError(f"num_draft_tokens ({self.num_draft_tokens}) must be within 0..max_draft_len "
                             f"({self.max_draft_len})")
        if not self.max_request_seconds >= 0:
            raise ValueError(f"max_request_seconds must be 0 (no limit) or more, got {self.max_request_seconds}")
        self.lookup  # noqa: B018 - validates the n-gram range
        self.load_schedule  # noqa: B018 - validates the schedule

    @cached_property  # the parameters are frozen: read once per model, not per request
    def load_schedule(self) -> DraftLenSchedule:
        return DraftLenSchedule.parse(self.draft_len_schedule)

    @cached_property
    def cost_model(self) -> CostModel:
        return CostModel(self.draft_cost, dict(enumerate(self.verify_costs, start=1)), self.measured_acceptance,
                         self.cost_measured)

    @cached_property
    def lookup(self) -> PromptLookup:
        return PromptLookup(max_ngram=self.lookup_max_ngram, min_ngram=self.lookup_min_ngram)
