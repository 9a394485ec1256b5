"""RoPE as both transformers lines read it from a checkpoint's config.json: transformers 5 saves it only in
``rope_parameters``, 4.57 (the NGC image's) reads only the top-level keys. Standard library only: the GPU scripts
save checkpoints with it on a device machine that has no pydantic."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


# RoPE keys transformers 5 keeps inside ``rope_parameters`` that 4.57 reads at the top level of the config.
_TOP_LEVEL_ROPE_KEYS = ("rope_theta", "partial_rotary_factor")


def legacy_scaling(params: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in params.items() if key not in _TOP_LEVEL_ROPE_KEYS}


def legacy_rope_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level RoPE keys transformers 4.57 reads that ``config`` (a config.json) lacks, from transformers 5's
    ``rope_parameters``: ``rope_theta`` (and ``partial_rotary_factor``), and ``rope_scaling`` where the RoPE type is
    not ``default``; empty where nothing is missing (a 4.x config, or one with per-layer-type RoPE dicts).

    4.57 knows only the top-level keys (``LlamaConfig.__init__(rope_theta=10000.0, rope_scaling=None)``,
    transformers v4.57.3 ``src/transformers/models/llama/configuration_llama.py``; the other decoders alike), so
    a config holding RoPE only in ``rope_parameters`` runs at theta 10000, unscaled, there. 5.x saves only
    ``rope_parameters`` and still reads the legacy keys (``PreTrainedConfig.__init__`` ->
    ``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict``, v5.25.0 ``src/transformers/modeling_rope_utils.py``:
    ``rope_scaling`` replaces ``rope_parameters`` and ``rope_theta`` fills its theta), so a config holding both
    reads the same RoPE in both."""
    params = config.get("rope_parameters")
    if not isinstance(params, Mapping) or "rope_theta" not in params:
        return {}
    missing = {key: params[key] for key in _TOP_LEVEL_ROPE_KEYS if key in params and key not in config}
    if params.get("rope_type", "default") != "default" and config.get("rope_scaling") is None:
        missing["rope_scaling"] = legacy_scaling(params)
    return missing


def write_legacy_rope(folder: Path) -> dict[str, Any]:
    """Add :func:`legacy_rope_keys` to ``folder/config.json`` (and to its ``text_config``), written as
    ``save_pretrained`` writes it; returns what was added to the top level."""
    path = folder / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    added = legacy_rope_keys(config)
    nested = config.get("text_config")
    nested_added = legacy_rope_keys(nested) if isinstance(nested, dict) else {}
    if added or nested_added:
        config.update(added)
        if nested_added:
            nested.update(nested_added)
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return added
