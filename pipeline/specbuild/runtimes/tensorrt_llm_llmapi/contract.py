"""The contract of TensorRT-LLM's LLM-API Triton model, and of the adapter that puts specbuild's ensemble in front.

The ``tensorrt-llm-llmapi`` runtime serves no engines: TensorRT-LLM's own Python model for Triton (``LLM()`` of the
PyTorch backend, draft-target speculation inside its scheduler) loads the checkpoints, configured by a
``model.yaml`` (:mod:`specbuild.runtimes.tensorrt_llm_llmapi.model_yaml`). Its tensors are one table here, read from
upstream (not copied): TensorRT-LLM ``triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt`` (inputs, outputs,
dims) and ``1/model.py`` + ``1/helpers.py`` (how each is read and what is really sent back), as shipped in
TensorRT-LLM 1.2.1 (NGC ``tritonserver:26.04``-``26.07``; docs/deployment.md, section 6). The repository renders the
model's ``config.pbtxt`` from it, the adapter encodes requests and decodes answers by it, and the CPU stand-in
(:mod:`specbuild.runtimes.tensorrt_llm_llmapi.stand_in`) refuses what it does not declare, so the CPU tests rehearse
the GPU contract.

Upstream declares its statistics outputs (``acceptance_rate`` FP32, the token counts INT32, ...) with numeric types,
but ``model.py`` sends every output with ``text_output``'s dtype (BYTES strings, as the published sample response
``"acceptance_rate": "0.0"`` shows). This table declares what is sent (``TYPE_STRING``), so the config specbuild
renders agrees with the tensors Triton receives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from specbuild.package.contract import ENSEMBLE_MODEL, Tensor
from specbuild.package.parameters import ModelParameters

LLMAPI_MODEL = "tensorrt_llm"  # the upstream name (launch_triton_server.py --tensorrt_llm_model_name default)
ADAPTER_MODEL = "llmapi_adapter"
LLMAPI_MODEL_NAMES = (ENSEMBLE_MODEL, ADAPTER_MODEL, LLMAPI_MODEL)
MODEL_YAML = "model.yaml"  # beside model.py in the LLM-API model's version folder, where upstream reads it
SERVE_CONFIG = "trtllm-serve.yaml"  # the same LLM arguments for `trtllm-serve --config`, at the repository's root
STAND_IN_SETTINGS = "stand_in.json"  # CPU rehearsal: the line, and container path -> host folder, beside model.yaml
# Where the NGC trtllm-python-py3 images hold the upstream model (tensorrtllm_backend r26.04-r26.07
# dockerfile/Dockerfile.triton.trt_llm_backend: ``WORKDIR /app``, ``COPY ... triton_backend/all_models all_models``).
# The packaged model links its ``model.py`` and ``helpers.py`` there; upstream code is never copied into a release.
IMAGE_MODEL_DIR = "/app/all_models/llmapi/tensorrt_llm/1"
IMAGE_MODEL_FILES = ("model.py", "helpers.py")

# --- the LLM-API model (TensorRT-LLM 1.2.1; max_batch_size 0, so dims are whole shapes) --------------------
# Inputs added on main only (image_url, lora_*) are left out: specbuild never sends them.
LLMAPI_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (-1,), description="the prompt, as is (no chat template is applied)"),
    Tensor("streaming", "TYPE_BOOL", (1,), True),
    Tensor("sampling_param_best_of", "TYPE_INT32", (1,), True),
    Tensor("sampling_param_temperature", "TYPE_FP32", (1,), True),
    Tensor("sampling_param_top_k", "TYPE_INT32", (1,), True),
    Tensor("sampling_param_top_p", "TYPE_FP32", (1,), True),
    Tensor("sampling_param_frequency_penalty", "TYPE_FP32", (1,), True),
    Tensor("sampling_param_presence_penalty", "TYPE_FP32", (1,), True),
    Tensor("sampling_param_max_tokens", "TYPE_INT32", (1,), True),
    # helpers.py hands this BYTES array to SamplingParams.stop, which tokenizes str items only: the adapter ends
    # stop words itself and never sends it (the stand-in refuses it, as upstream's request would fail)
    Tensor("sampling_param_stop", "TYPE_STRING", (-1,), True, "stop strings: never sent (see above)"),
    Tensor("sampling_param_seed", "TYPE_UINT64", (1,), True),
    Tensor("sampling_param_exclude_input_from_output", "TYPE_BOOL", (1,), True, "default false: prompt + answer"),
    Tensor("sampling_param_return_perf_metrics", "TYPE_BOOL", (1,), True, "the acceptance outputs are sent only then"),
    Tensor("return_finish_reason", "TYPE_BOOL", (1,), True),
    Tensor("return_stop_reason", "TYPE_BOOL", (1,), True),
    Tensor("return_cumulative_logprob", "TYPE_BOOL", (1,), True),
    Tensor("stop", "TYPE_BOOL", (1,), True, "cancel the in-flight requests of this request id"),
)
_PERF_METRICS = ("kv_cache_reused_block", "kv_cache_hit_rate", "kv_cache_alloc_new_blocks",
                 "kv_cache_alloc_total_blocks", "kv_cache_missed_block", "arrival_time_ns", "first_scheduled_time_ns",
                 "first_token_time_ns", "last_token_time_ns")
LLMAPI_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "TYPE_STRING", (-1,), description="streamed: the whole text so far, not a delta"),
    Tensor("finish_reason", "TYPE_STRING", (-1,), description="with return_finish_reason: stop, length, ..."),
    Tensor("stop_reason", "TYPE_STRING", (-1,), description="with return_stop_reason: the stop string matched"),
    Tensor("cumulative_logprob", "TYPE_STRING", (-1,)),
    *(Tensor(name, "TYPE_STRING", (-1,) if name.startswith("kv_cache") else (1,)) for name in _PERF_METRICS),
    Tensor("acceptance_rate", "TYPE_STRING", (1,), description="with return_perf_metrics: accepted / drafted"),
    Tensor("total_accepted_draft_tokens", "TYPE_STRING", (1,)),
    Tensor("total_draft_tokens", "TYPE_STRING", (1,)),
)
# What the adapter asks for (BLS ``requested_output_names``).
ADAPTER_WANTS = ("text_output", "finish_reason", "stop_reason", "acceptance_rate", "total_accepted_draft_tokens",
                 "total_draft_tokens")


# --- the adapter's parameters ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LLMAPIAdapterParameters(ModelParameters):
    """What the adapter knows of the release: the draft length fixed at load (requests may not change it; 0: no
    ``speculative_config``, the target alone), the tokenizer's end token (the only ``end_id`` the LLM API stops
    on), the time limit of a request, and whether the LLM-API model streams
    (:data:`specbuild.runtimes.tensorrt_llm_llmapi.lines.LINES`)."""

    MODEL: ClassVar[str] = ADAPTER_MODEL

    num_draft_tokens: int  # speculative_config.max_draft_len in model.yaml; 0: none rendered
    end_id: int
    streams: bool
    max_request_seconds: float  # a request's time limit (0: none), as the orchestrator's
    tensorrt_llm: str  # the release's TensorRT-LLM line (a lines.LINES key): what its refusals name
    # the draft's window (its max_position_embeddings, at most max_seq_len): TensorRT-LLM stops drafting for a request
    # past it (model_drafter.py), which the adapter counts in specbuild_draft_window_requests_total
    draft_max_seq_len: int
    llmapi_model: str = LLMAPI_MODEL

    def __post_init__(self) -> None:
        if self.num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens must be 0 (the target alone) or more, got {self.num_draft_tokens}")
        if not self.max_request_seconds >= 0:
            raise ValueError(f"max_request_seconds must be 0 (no limit) or more, got {self.max_request_seconds}")
