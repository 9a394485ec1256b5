"""The engine-free (tensorrt-llm-llmapi) release the golden files pin: its spec, target engine record, memory plan
and load policy, shared by the model.yaml contract tests and the per-line rule tests."""

from __future__ import annotations

from pathlib import Path

from specbuild.package.build_record import BuildLimits, BuildRecord, Engine
from specbuild.runtimes.interface import PackageContext
from specbuild.spec import BuildSpec
from specbuild.speculation.schedule import DraftLenSchedule


def golden_spec(**triton: str) -> BuildSpec:
    return BuildSpec.model_validate({
        "name": "golden", "runtime": "tensorrt-llm-llmapi",
        "target": {"checkpoint": "/models/llama-70b", "dtype": "bfloat16", "tp_size": 4},
        "draft": {"checkpoint": "/models/llama-1b", "dtype": "bfloat16", "tp_size": 4},
        "speculation": {"num_draft_tokens": 5, "acceptance": "token-match"},
        "limits": {"max_batch_size": 16, "max_input_len": 3072, "max_seq_len": 4096},
        "triton": triton,
    })


TARGET = Engine(Path("/unused"), BuildRecord(
    runtime="tensorrt-llm-llmapi", role="target", dtype="bfloat16", vocab_size=128256, architecture="LlamaForCausalLM",
    limits=BuildLimits(max_batch_size=16, max_input_len=3072, max_seq_len=4096, max_draft_len=5)))
CONTEXT = PackageContext(kv_fractions={"target": 0.8164, "draft": 0.0835}, kv_tokens={"target": 65664, "draft": 65664})
BUSY = DraftLenSchedule.from_threshold(16)  # the load policy: no drafts from 16 in flight (the runtime's)
