"""GPU memory plan for a target and a draft sharing GPUs, and the KV-cache split between them.

TensorRT-LLM gives each engine ``kv_cache_free_gpu_mem_fraction`` of the GPU memory free when it allocates
its KV cache. With two engines on one GPU the fractions must be split explicitly, or the first engine takes
90% and the second runs out of memory (a common report). The split here is proportional to each model's KV
need at the spec's limits, as fractions of the memory left after both models' weights, activations and
runtime, summing to the KV budget (0.9 unless the spec sets ``triton.kv_cache_free_gpu_mem_fraction``).
Because the engine loaded first measures free memory before the second's weights exist, it may take a
little more than planned: a renderer should also cap each engine at its ``kv_tokens``
(``max_tokens_in_paged_kv_cache``; TensorRT-LLM uses the smaller of the two limits). The whole layout is
refused when it cannot fit the GPU.

The estimate's assumptions are listed in :data:`ASSUMPTIONS` and in every plan's JSON.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel

from specbuild.checkpoint.info import CheckpointInfo
from specbuild.errors import IncompatibleError, SpecbuildError
from specbuild.runtimes.registry import runtime_of
from specbuild.runtimes.trtllm_image import MAX_NUM_TOKENS
from specbuild.spec import BuildSpec, ModelSpec, Role

GIB = 2**30
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
DEFAULT_KV_BUDGET = 0.9  # TensorRT-LLM's own default kv_cache_free_gpu_mem_fraction
ACTIVATION_HIDDEN_BUFFERS = 4
ACTIVATION_MLP_BUFFERS = 2
LOGITS_BYTES = 4
RUNTIME_OVERHEAD_BYTES = 512 * 2**20
FRACTION_DIGITS = 4

ASSUMPTIONS = (
    "weights: parameters x engine dtype bytes; with tied embeddings the engine holds its own lm_head copy",
    "KV cache: 2 * layers * kv_heads * head_dim * dtype bytes per token, for max_batch_size * (max_seq_len + "
    "max_draft_len) tokens (the draft tokens in flight need room too)",
    "tensor/pipeline parallel: weights / (tp * pp) per GPU; KV heads split over tp (at least one per GPU: "
    "TensorRT-LLM replicates heads when tp > kv_heads), layers over pp",
    "draft and target shards share GPUs: GPU 0 holds a shard of each, so per-GPU needs add up",
    f"activations: min(max_batch_size * max_input_len, {MAX_NUM_TOKENS}) tokens in flight (TensorRT-LLM's "
    f"default max_num_tokens) x ({ACTIVATION_HIDDEN_BUFFERS} * hidden + {ACTIVATION_MLP_BUFFERS} * intermediate / tp) "
    "values of the engine dtype (buffers are reused across layers), plus fp32 logits for max_batch_size * "
    "(max_draft_len + 1) positions",
    f"runtime: a fixed {RUNTIME_OVERHEAD_BYTES // 2**20} MiB per model per GPU (CUDA context share, cuBLAS and "
    "TensorRT workspaces)",
)


class ModelMemory(BaseModel):
    """One model's memory at the engine dtype; ``*_per_gpu`` figures are one shard's."""

    role: str
    dtype: str
    dtype_bytes: int
    tp_size: int
    pp_size: int
    parameters: int
    weights_bytes: int
    weights_bytes_per_gpu: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    kv_tokens: int
    kv_bytes: int
    kv_bytes_per_gpu: int
    activation_bytes_per_gpu: int
    overhead_bytes_per_gpu: int

    @property
    def fixed_bytes_per_gpu(self) -> int:
        """Everything but the KV cache: what is taken before TensorRT-LLM measures free memory."""
        return self.weights_bytes_per_gpu + self.activation_bytes_per_gpu + self.overhead_bytes_per_gpu


class MemoryPlan(BaseModel):
    target: ModelMemory
    draft: ModelMemory
    gpus: int
    gpu_memory_gib: float | None
    kv_budget_fraction: float  # target + draft share of the memory free after weights
    needed_bytes_per_gpu: int  # weights + activations + overhead + KV of both models on the busiest GPU
    min_gpu_bytes: int  # the smallest GPU on which the KV fits within the budget fraction
    total_bytes: int  # over all GPUs
    target_kv_fraction: float  # kv_cache_free_gpu_mem_fraction for the target engine
    draft_kv_fraction: float
    fits: bool | None  # None when no GPU size was given (or the models run on the CPU)
    device: Literal["GPU", "CPU"] = "GPU"  # where the runtime keeps the models (Runtime.memory_device)
    problem: str | None = None
    fix: str | None = None
    assumptions: list[str] = list(ASSUMPTIONS)

    @property
    def needed_gib(self) -> float:
        return self.needed_bytes_per_gpu / GIB

    def to_dict(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data["needed_gib_per_gpu"] = round(self.needed_gib, 3)
        data["min_gpu_gib"] = round(self.min_gpu_bytes / GIB, 3)
        return data


def engine_dtype(spec: BuildSpec, role: str, checkpoint: CheckpointInfo) -> str:
    """The dtype the spec's runtime builds the engine in (one resolved dtype per runtime, the same as compile
    uses); the requested one where the runtime refuses it (the pair check reports that)."""
    requested = getattr(spec, role).dtype
    try:
        return runtime_of(spec).engine_dtype(requested, role, checkpoint.torch_dtype)
    except SpecbuildError:
        return "float32" if requested == "auto" else requested


def model_memory(role: Role, model: ModelSpec, info: CheckpointInfo, spec: BuildSpec) -> ModelMemory:
    """Weights, KV cache and activations of one model at the spec's dtype, limits and parallelism."""
    dtype = engine_dtype(spec, role, info)
    size = DTYPE_BYTES[dtype]
    tp, pp = model.tp_size, model.pp_size
    limits, max_draft_len = spec.limits.of(role), spec.speculation.max_draft_len
    parameters = info.num_parameters
    if info.tie_word_embeddings and info.weights.lm_head_rows is None and info.embedding_rows:
        parameters += info.embedding_rows * info.hidden_size  # the engine's own lm_head copy
    weights = parameters * size
    kv_per_token = 2 * info.num_layers * info.num_kv_heads * info.head_dim * size
    kv_per_token_gpu = 2 * math.ceil(info.num_layers / pp) * math.ceil(info.num_kv_heads / tp) * info.head_dim * size
    kv_tokens = limits.max_batch_size * (limits.max_seq_len + max_draft_len)
    in_flight = min(limits.max_batch_size * limits.max_input_len, MAX_NUM_TOKENS)
    per_token_values = ACTIVATION_HIDDEN_BUFFERS * info.hidden_size + ACTIVATION_MLP_BUFFERS * math.ceil(
        info.intermediate_size / tp)
    logits = limits.max_batch_size * (max_draft_len + 1) * info.logits_width * LOGITS_BYTES
    return ModelMemory(
        role=role, dtype=dtype, dtype_bytes=size, tp_size=tp, pp_size=pp, parameters=parameters,
        weights_bytes=weights, weights_bytes_per_gpu=math.ceil(weights / (tp * pp)),
        kv_bytes_per_token=kv_per_token, kv_bytes_per_token_per_gpu=kv_per_token_gpu, kv_tokens=kv_tokens,
        kv_bytes=kv_per_token * kv_tokens, kv_bytes_per_gpu=kv_per_token_gpu * kv_tokens,
        activation_bytes_per_gpu=in_flight * per_token_values * size + logits,
        overhead_bytes_per_gpu=RUNTIME_OVERHEAD_BYTES,
    )


def _floor(value: float) -> float:
    scale = 10**FRACTION_DIGITS
    return math.floor(value * scale) / scale


def plan_memory(spec: BuildSpec, target: CheckpointInfo, draft: CheckpointInfo, gpu_memory_gib: float | None = None,
                *, refuse: bool = True) -> MemoryPlan:
    """The memory plan; with a GPU size (argument, else ``spec.triton.gpu_memory_gib``) it is checked against it.

    A layout that cannot fit raises :class:`IncompatibleError` naming the figures, unless ``refuse`` is false
    (then ``fits``, ``problem`` and ``fix`` say so and the caller reports it).
    """
    t = model_memory("target", spec.target, target, spec)
    d = model_memory("draft", spec.draft, draft, spec)
    device = runtime_of(spec).memory_device(spec)
    gpu_gib = gpu_memory_gib if gpu_memory_gib is not None else spec.triton.gpu_memory_gib
    if device == "CPU":
        gpu_gib = None  # no GPU to check against
    budget = spec.triton.kv_cache_free_gpu_mem_fraction or DEFAULT_KV_BUDGET
    fixed = t.fixed_bytes_per_gpu + d.fixed_bytes_per_gpu
    kv_need = t.kv_bytes_per_gpu + d.kv_bytes_per_gpu
    min_gpu = fixed + math.ceil(kv_need / budget)
    plan = MemoryPlan(
        target=t, draft=d, gpus=max(spec.target.world_size, spec.draft.world_size), gpu_memory_gib=gpu_gib,
        kv_budget_fraction=budget, needed_bytes_per_gpu=fixed + kv_need, min_gpu_bytes=min_gpu,
        total_bytes=sum(m.tp_size * m.pp_size * (m.fixed_bytes_per_gpu + m.kv_bytes_per_gpu) for m in (t, d)),
        target_kv_fraction=_floor(budget * t.kv_bytes_per_gpu / kv_need),
        draft_kv_fraction=_floor(budget * d.kv_bytes_per_gpu / kv_need),
        fits=None if gpu_gib is None else min_gpu <= gpu_gib * GIB, device=device,
    )
    if plan.fits is False:
        plan.problem, plan.fix = _shortfall(spec, plan, fixed, kv_need)
        if refuse:
            raise IncompatibleError(plan.problem, plan.fix)
    return plan


def _shortfall(spec: BuildSpec, plan: MemoryPlan, fixed: int, kv_need: int) -> tuple[str, str]:
    gpu = f"{plan.gpu_memory_gib:g} GiB"
    if fixed > plan.gpu_memory_gib * GIB:
        problem = (f"target and draft weights, activations and runtime need {fixed / GIB:.2f} GiB per GPU, more than "
                   f"the {gpu} GPU holds")
    else:
        problem = (f"the KV cache needs {kv_need / GIB:.2f} GiB per GPU (max_batch_size {spec.limits.max_batch_size} x "
                   f"(max_seq_len {spec.limits.max_seq_len} + max_draft_len {spec.speculation.max_draft_len}) tokens) "
                   f"but only {plan.kv_budget_fraction:g} of the {(plan.gpu_memory_gib * GIB - fixed) / GIB:.2f} GiB "
                   f"left after weights on a {gpu} GPU may hold it")
    fix = (f"use GPUs with at least {math.ceil(plan.min_gpu_bytes / GIB)} GiB, lower limits.max_batch_size or "
           "limits.max_seq_len, or shard the target over more GPUs (target.tp_size)")
    return problem, fix
