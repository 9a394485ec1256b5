"""plan_memory: weights, KV cache per token, sharding, the KV split and the refusal when it cannot fit."""

from __future__ import annotations

import math

import pytest
from checkpoint_factory import Checkpoints

from specbuild.checkpoint.info import CheckpointInfo, read_checkpoint
from specbuild.checkpoint.tokenizer_files import TokenizerInfo
from specbuild.checkpoint.weights import WeightsInfo
from specbuild.errors import IncompatibleError
from specbuild.check.memory_plan import GIB, engine_dtype, plan_memory
from specbuild.check.pair_report import spec_for_checkpoints
from specbuild.spec import BuildSpec

LLAMA_VOCAB = 128256


def llama_info(*, layers: int, hidden: int, kv_heads: int, head_dim: int, intermediate: int, parameters: int,
               tie: bool, dtype: str = "bfloat16") -> CheckpointInfo:
    """The published shapes of a Llama 3 checkpoint, as read_checkpoint would report them."""
    tokenizer = TokenizerInfo(hash="0" * 64, model="BPE", vocab_size=LLAMA_VOCAB, max_token_id=LLAMA_VOCAB - 1,
                              bos_token=None, eos_token=None, pad_token=None, bos_token_id=128000,
                              eos_token_id=128009, pad_token_id=None, files=["tokenizer.json"])
    weights = WeightsInfo(format="safetensors", files=["model.safetensors"], num_tensors=1, num_parameters=parameters,
                          stored_bytes=2 * parameters, parameters_by_dtype={dtype: parameters},
                          embedding_tensor="model.embed_tokens.weight", embedding_rows=LLAMA_VOCAB,
                          lm_head_rows=None if tie else LLAMA_VOCAB)
    return CheckpointInfo(
        path="/models/llama", architecture="LlamaForCausalLM", model_type="llama", vocab_size=LLAMA_VOCAB,
        hidden_size=hidden, num_layers=layers, num_attention_heads=hidden // head_dim, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=intermediate, max_position_embeddings=131072, rope_theta=500000.0,
        rope_scaling=None, torch_dtype=dtype, tie_word_embeddings=tie, remote_code=False, weights=weights,
        tokenizer=tokenizer)


LLAMA_8B = llama_info(layers=32, hidden=4096, kv_heads=8, head_dim=128, intermediate=14336, parameters=8_030_261_248,
                      tie=False)
LLAMA_1B = llama_info(layers=16, hidden=2048, kv_heads=8, head_dim=64, intermediate=8192, parameters=1_235_814_400,
                      tie=True)


def spec(**sections) -> BuildSpec:
    """A GPU release (tensorrt-llm) of the Llama 3 pair: the memory plan matters there, at the dtype that runtime
    builds; its open limits resolved as the check does (Llama 3 holds 131072 positions)."""
    target = {"checkpoint": "/models/8b", **sections.pop("target", {})}
    draft = {"checkpoint": "/models/1b", **sections.pop("draft", {})}
    spec = BuildSpec(target=target, draft=draft, **{"runtime": "tensorrt-llm", **sections})
    return spec_for_checkpoints(spec, LLAMA_8B, LLAMA_1B)


def test_kv_cache_per_token_and_tokens() -> None:
    plan = plan_memory(spec(), LLAMA_8B, LLAMA_1B)
    assert plan.target.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 2**10
    assert plan.draft.kv_bytes_per_token == 2 * 16 * 8 * 64 * 2
    assert plan.target.kv_tokens == 8 * (2048 + 8)  # max_batch_size * (max_seq_len + max_draft_len)
    assert plan.target.kv_bytes == plan.target.kv_bytes_per_token * plan.target.kv_tokens
    assert plan.gpus == 1 and plan.fits is None


def test_weights_at_engine_dtype_with_an_lm_head_copy_for_tied_embeddings() -> None:
    plan = plan_memory(spec(), LLAMA_8B, LLAMA_1B)
    assert plan.target.weights_bytes == 2 * 8_030_261_248
    assert plan.draft.parameters == 1_235_814_400 + LLAMA_VOCAB * 2048
    assert plan.draft.weights_bytes == 2 * plan.draft.parameters


def test_the_plan_uses_the_dtype_the_runtime_builds() -> None:
    """One resolved dtype per runtime, as compile builds it: auto is the checkpoint's 16-bit dtype (a float32
    checkpoint becomes float16, as convert_checkpoint.py does) for tensorrt-llm, float32 for the torch runtime."""
    s = spec()
    assert engine_dtype(s, "target", LLAMA_8B) == "bfloat16"
    assert engine_dtype(s, "target", LLAMA_8B.model_copy(update={"torch_dtype": "float16"})) == "float16"
    assert engine_dtype(s, "target", LLAMA_8B.model_copy(update={"torch_dtype": "float32"})) == "float16"
    assert engine_dtype(spec(runtime="torch"), "target", LLAMA_8B) == "float32"
    plan = plan_memory(spec(runtime="torch", draft={"dtype": "bfloat16"}), LLAMA_8B, LLAMA_1B)
    assert plan.target.dtype == "float32" and plan.draft.dtype == "bfloat16"
    assert plan.draft.kv_bytes_per_token == 2 * 16 * 8 * 64 * 2


def test_tensor_and_pipeline_parallel_shards() -> None:
    single = plan_memory(spec(), LLAMA_8B, LLAMA_1B).target
    tp2 = plan_memory(spec(target={"tp_size": 2}), LLAMA_8B, LLAMA_1B)
    assert tp2.gpus == 2
    assert tp2.target.weights_bytes_per_gpu == math.ceil(single.weights_bytes / 2)
    assert tp2.target.kv_bytes_per_token_per_gpu == single.kv_bytes_per_token // 2
    pp2 = plan_memory(spec(target={"pp_size": 2}), LLAMA_8B, LLAMA_1B).target
    assert pp2.kv_bytes_per_token_per_gpu == single.kv_bytes_per_token // 2
    tp16 = plan_memory(spec(target={"tp_size": 16}), LLAMA_8B, LLAMA_1B).target
    assert tp16.kv_bytes_per_token_per_gpu == 2 * 32 * 1 * 128 * 2  # 8 kv heads over 16 GPUs: one each
    assert tp2.total_bytes > tp2.needed_bytes_per_gpu  # two GPUs hold target shards


def test_kv_split_is_proportional_and_within_the_budget() -> None:
    plan = plan_memory(spec(), LLAMA_8B, LLAMA_1B)
    assert plan.target_kv_fraction + plan.draft_kv_fraction <= 0.9
    assert plan.target_kv_fraction / plan.draft_kv_fraction == pytest.approx(4.0, rel=1e-3)  # 128 KiB vs 32 KiB
    assert (plan.target_kv_fraction, plan.draft_kv_fraction) == (0.72, 0.18)
    capped = plan_memory(spec(triton={"kv_cache_free_gpu_mem_fraction": 0.5}), LLAMA_8B, LLAMA_1B)
    assert capped.target_kv_fraction + capped.draft_kv_fraction <= 0.5 and capped.kv_budget_fraction == 0.5


def test_fits_a_large_gpu() -> None:
    plan = plan_memory(spec(limits={"max_batch_size": 64}), LLAMA_8B, LLAMA_1B, gpu_memory_gib=80)
    assert plan.fits and plan.problem is None
    assert plan.needed_bytes_per_gpu < plan.min_gpu_bytes < 80 * GIB


def test_kv_that_cannot_fit_is_refused_with_figures() -> None:
    s = spec(limits={"max_batch_size": 64})
    with pytest.raises(IncompatibleError) as refused:
        plan_memory(s, LLAMA_8B, LLAMA_1B, gpu_memory_gib=24)
    assert "KV cache needs" in refused.value.message and "max_batch_size 64" in refused.value.message
    assert "at least" in refused.value.fix and "tp_size" in refused.value.fix
    plan = plan_memory(s, LLAMA_8B, LLAMA_1B, gpu_memory_gib=24, refuse=False)
    assert plan.fits is False and plan.problem == refused.value.message


def test_weights_that_cannot_fit_are_refused() -> None:
    with pytest.raises(IncompatibleError, match="weights"):
        plan_memory(spec(), LLAMA_8B, LLAMA_1B, gpu_memory_gib=16)


def test_spec_gpu_memory_is_the_default() -> None:
    with pytest.raises(IncompatibleError):
        plan_memory(spec(triton={"gpu_memory_gib": 16}), LLAMA_8B, LLAMA_1B)
    assert plan_memory(spec(triton={"gpu_memory_gib": 16}), LLAMA_8B, LLAMA_1B, gpu_memory_gib=80).fits


def test_plan_of_real_checkpoints_and_its_json(checkpoints: Checkpoints) -> None:
    target, draft = read_checkpoint(checkpoints.target), read_checkpoint(checkpoints.draft)
    plan = plan_memory(spec(), target, draft)
    assert plan.target.dtype == "float16"  # stored float32, auto -> float16 as TensorRT-LLM converts it
    assert plan.target.kv_bytes_per_token == 2 * target.num_layers * target.num_kv_heads * target.head_dim * 2
    data = plan.to_dict()
    assert {"target_kv_fraction", "draft_kv_fraction", "assumptions", "needed_gib_per_gpu"} <= data.keys()
    assert any("max_num_tokens" in line for line in data["assumptions"])
