"""Run by test_release_image.py in two Pythons, the image's (transformers 4.57) and specbuild's own (transformers
5): what that Python's transformers reads from each checkpoint folder and computes with it. The same code in both,
so a difference is one of reading, not of this script.

For each folder: the config as the model computes with it (RoPE from where that transformers line takes it: 4.x
the top-level ``rope_theta``/``rope_scaling``, 5.x ``rope_parameters``), whether the loaded head is the embedding
(tied), the tokenizer's ids of each prompt and of each chat (its chat template, generation prompt added) and the
float32 next-token logits after each prompt. Prints one JSON line.

Usage: python next_token_logits.py JOB_JSON   (JOB: {"folders": [...], "prompts": [...], "chats": [[message]]})
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

# The config fields the forward pass of a decoder reads (beside RoPE), compared between the two readings.
FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "attention_bias", "mlp_bias",
          "max_position_embeddings", "tie_word_embeddings")


def rope(config: Any) -> dict[str, Any]:
    """The RoPE this transformers computes with: theta and the scaling (type and parameters; None: default)."""
    if int(transformers.__version__.split(".")[0]) >= 5:
        params = dict(config.rope_parameters or {})
        theta = params.pop("rope_theta", None)
    else:  # 4.x: rope_parameters, where a config holds it, is an unknown attribute nothing reads
        theta, params = config.rope_theta, dict(config.rope_scaling or {})
        params.setdefault("rope_type", params.pop("type", "default"))
    params.pop("partial_rotary_factor", None)
    return {"rope_theta": float(theta) if theta is not None else None,
            "rope_scaling": None if params.get("rope_type", "default") == "default" else params,
            "partial_rotary_factor": getattr(config, "partial_rotary_factor", None)}


def read(folder: str, prompts: list[str], chats: list[list[dict[str, str]]]) -> dict[str, Any]:
    config = AutoConfig.from_pretrained(folder)
    fields = {name: getattr(config, name, None) for name in FIELDS}
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).float().eval()
    ids = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    chat_ids = ([list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True,
                                                    return_dict=True)["input_ids"]) for chat in chats]
                if tokenizer.chat_template else None)
    with torch.inference_mode():
        logits = [model(torch.tensor([row])).logits[0, -1].tolist() for row in ids]
    tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    return {"config": {**fields, **rope(config), "tied": tied}, "ids": ids, "chat_ids": chat_ids,
            "logits": logits}


def main() -> None:
    job = json.loads(open(sys.argv[1], encoding="utf-8").read())
    torch.manual_seed(0)
    report = {"transformers": transformers.__version__,
              "folders": {folder: read(folder, job["prompts"], job["chats"]) for folder in job["folders"]}}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
