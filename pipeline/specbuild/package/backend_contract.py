"""The engine models' contract: what TensorRT-LLM's ``tensorrtllm`` Triton backend (1.2.x) reads.

One table for both runtimes. The ``target``/``draft`` configs of a ``tensorrt-llm`` release and of a
``torch`` release are rendered from it (only the backend, the weights path and the ``torch_*`` keys differ),
and the torch runtime's engine model parses its parameters and requests by the same rules
(:class:`EngineParameters`, :mod:`specbuild.triton_models.engine_io`), so every CPU test also rehearses the GPU
configuration: a parameter the backend requires is required on CPU too, and a request input the backend
does not know is refused by Triton on both.

Sources (read, not copied), TensorRT-LLM ``triton_backend/inflight_batcher_llm/``:
``src/model_instance_state.cc`` (parameters: ``getExecutorConfigFromParams`` and the ``get*ConfigFromParams``
helpers), ``src/model_state.cc`` (``LoadParameters``, ``GetParameter<T>``), ``src/utils.h``
(``InputFieldsNames``/``OutputFieldsNames``: the request tensor names, ``seed`` and ``min_tokens`` since
tensorrtllm_backend PR #749, May 2025, which renamed ``random_seed`` and ``min_length``), ``src/utils.cc``
(``getSamplingConfigFromTensors``, ``getExternalDraftTokensConfigFromTensors``), and
``all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt`` (dims, ``reshape``, ragged batching).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from specbuild.package.contract import Tensor
from specbuild.package.parameters import OPTIONAL, ModelParameters

BatchingType = Literal["inflight_fused_batching", "inflight_batching", "V1"]
SchedulerPolicy = Literal["guaranteed_no_evict", "max_utilization"]
LOGITS_TYPE = "TYPE_FP32"  # engines are built with --logits_dtype float32; the backend checks they agree


@dataclass(frozen=True)
class EngineParameters(ModelParameters):
    """The ``parameters`` of an engine model as the ``tensorrtllm`` backend reads them.

    Keys without ``OPTIONAL`` are read outside any try/catch (``model_instance_state.cc``): a config without
    them fails to load with "Cannot find parameter with name". Optional ones fall back to the backend's
    default (given here) when absent. Keys the backend reads but specbuild leaves at their defaults
    (LoRA cache, CUDA graphs, lookahead/Medusa/EAGLE choices, ...) are not rendered.
    """

    MODEL: ClassVar[str] = "engine model"

    # The engine folder as the server sees it; the backend fails the load when it does not exist.
    gpt_model_path: str
    gpt_model_type: BatchingType = "inflight_fused_batching"
    # Guided decoding (getGuidedDecodingConfigFromParams): the three keys are required, empty values turn it off;
    # a tensorrt-llm release's target sets the last two (package/backend_guides.py), tokenizer_dir stays unused.
    tokenizer_dir: str = ""
    xgrammar_tokenizer_info_path: str = ""
    guided_decoding_backend: str = ""
    max_beam_width: int = field(default=1, metadata=OPTIONAL)  # draft-target decoding has no beam search
    batch_scheduler_policy: SchedulerPolicy = field(default="guaranteed_no_evict", metadata=OPTIONAL)
    # KV cache (getKvCacheConfigFromParams); the fraction applies to the GPU memory free when the engine loads
    kv_cache_free_gpu_mem_fraction: float | None = field(default=None, metadata=OPTIONAL)
    max_tokens_in_paged_kv_cache: int | None = field(default=None, metadata=OPTIONAL)
    # Each round re-sends the whole sequence: block reuse makes that cost only the new tokens.
    enable_kv_cache_reuse: bool = field(default=True, metadata=OPTIONAL)
    enable_chunked_context: bool = field(default=False, metadata=OPTIONAL)
    exclude_input_in_output: bool = field(default=False, metadata=OPTIONAL)  # requests may override it
    # Devices and MPI ranks ("," within an instance); fast logits need orchestrator mode and both models' ranks.
    gpu_device_ids: tuple[int, ...] | None = field(default=None, metadata=OPTIONAL)
    participant_ids: tuple[int, ...] | None = field(default=None, metadata=OPTIONAL)
    speculative_decoding_fast_logits: bool = field(default=False, metadata=OPTIONAL)

    def __post_init__(self) -> None:
        fraction = self.kv_cache_free_gpu_mem_fraction
        if fraction is not None and not 0 < fraction < 1:
            raise ValueError(f"kv_cache_free_gpu_mem_fraction is outside (0, 1): {fraction}")
        for name in ("max_tokens_in_paged_kv_cache", "max_beam_width"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        for name in ("gpu_device_ids", "participant_ids"):
            ids = getattr(self, name)
            if ids is not None and (not ids or any(i < 0 for i in ids)):
                raise ValueError(f"{name} must be a non-empty list of non-negative integers, got {ids!r}")
        if self.speculative_decoding_fast_logits and self.participant_ids is None:
            raise ValueError("speculative_decoding_fast_logits needs participant_ids (orchestrator mode with "
                             "spawning disabled); TensorRT-LLM would otherwise drop fast logits silently")


@dataclass(frozen=True)
class EngineModel:
    """How a release serves one engine: the Triton backend of its model, the config's parameters, how many
    instances, the python model it runs (None: the backend's own), and whether it takes :data:`GUIDE_MASKS` and
    :data:`BLOCK_VERIFICATION`."""

    backend: str
    parameters: EngineParameters
    instances: int = 1
    source: Path | None = None
    guide_masks: bool = False
    block_verification: bool = False


# --- request and response tensors (names as the backend reads them) --------------------------------------
# Dims exclude the batch dimension. Per-request scalars are [1] with ``reshape: {shape: []}`` and variable-length
# ones are ragged, as in the backend's own config.pbtxt (see repository.engine_model_config).
ENGINE_INPUTS: tuple[Tensor, ...] = (
    Tensor("input_ids", "TYPE_INT32", (-1,)),
    Tensor("input_lengths", "TYPE_INT32", (1,)),
    Tensor("request_output_len", "TYPE_INT32", (1,)),
    Tensor("draft_input_ids", "TYPE_INT32", (-1,), True),
    Tensor("draft_logits", LOGITS_TYPE, (-1, -1), True),
    Tensor("draft_acceptance_threshold", "TYPE_FP32", (1,), True),
    Tensor("end_id", "TYPE_INT32", (1,), True),
    Tensor("pad_id", "TYPE_INT32", (1,), True),
    Tensor("bad_words_list", "TYPE_INT32", (2, -1), True),
    Tensor("stop_words_list", "TYPE_INT32", (2, -1), True),
    Tensor("runtime_top_k", "TYPE_INT32", (1,), True),
    Tensor("runtime_top_p", "TYPE_FP32", (1,), True),
    Tensor("temperature", "TYPE_FP32", (1,), True),
    Tensor("seed", "TYPE_UINT64", (1,), True),  # was random_seed before tensorrtllm_backend PR #749
    Tensor("min_tokens", "TYPE_INT32", (1,), True),  # was min_length
    # penaltyKernels.cu: temperature, then repetition (x or / once per token present), presence (- once) and
    # frequency (- per occurrence) over the prompt and the tokens generated so far
    Tensor("repetition_penalty", "TYPE_FP32", (1,), True),
    Tensor("presence_penalty", "TYPE_FP32", (1,), True),
    Tensor("frequency_penalty", "TYPE_FP32", (1,), True),
    Tensor("len_penalty", "TYPE_FP32", (1,), True),  # scores finished beams: no effect at beam width 1
    Tensor("return_generation_logits", "TYPE_BOOL", (1,), True),
    Tensor("exclude_input_in_output", "TYPE_BOOL", (1,), True),
    Tensor("streaming", "TYPE_BOOL", (1,), True),
    Tensor("beam_width", "TYPE_INT32", (1,), True),
    # guided decoding (utils.cc getGuidedDecodingParamsFromTensors; rules in package/backend_guides.py): strings,
    # ragged and not reshaped, as the backend's config.pbtxt declares them
    Tensor("guided_decoding_guide_type", "TYPE_STRING", (1,), True),
    Tensor("guided_decoding_guide", "TYPE_STRING", (1,), True),
)
# specbuild's own, not the tensorrtllm backend's: the tokens a request's guide allows at each new position
# (speculation/guide.py), int32 bitmask rows [positions, ceil(vocab / 32)]; declared by engine models that apply it
GUIDE_MASKS = Tensor("guide_token_masks", "TYPE_INT32", (-1, -1), True)
# specbuild's own too: judge draft_logits by block verification (speculation.rules.verify_block) rather than token by
# token; sent only when true, declared by engine models that verify with specbuild's rules
BLOCK_VERIFICATION = Tensor("block_verification", "TYPE_BOOL", (1,), True)
ENGINE_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("output_ids", "TYPE_INT32", (-1, -1)),  # [beam, tokens]
    Tensor("sequence_length", "TYPE_INT32", (-1,)),  # [beam]
    Tensor("generation_logits", LOGITS_TYPE, (-1, -1, -1)),  # [beam, tokens, vocab (padded to the world size)]
)
