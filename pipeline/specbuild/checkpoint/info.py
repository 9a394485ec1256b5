"""Reading Hugging Face checkpoints without loading their weights.

:func:`read_checkpoint` reads ``config.json``, the safetensors headers (never the tensor data) and the
tokenizer files of one checkpoint folder into a :class:`CheckpointInfo`. Everything a user can get wrong
(a missing or corrupt file, a pickle-only checkpoint, remote code) is a :class:`CheckpointError` that names
the file and the fix; every size read from a file is checked against the file before anything is allocated.

The config is read here; the weights in :mod:`specbuild.checkpoint.weights`, the tokenizer in
:mod:`specbuild.checkpoint.tokenizer_files`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from specbuild.checkpoint.head_vocabulary import HeadVocabulary, read_head_vocabulary
from specbuild.checkpoint.json_files import MAX_CONFIG_JSON, read_json
from specbuild.checkpoint.rope import legacy_rope_keys, legacy_scaling
from specbuild.checkpoint.tokenizer_files import TokenizerInfo, read_tokenizer
from specbuild.checkpoint.weights import WeightsInfo, read_weights
from specbuild.errors import CheckpointError

# config.json spells the same quantity differently across families; the first key present wins.
CONFIG_ALIASES: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"),
}


class CheckpointInfo(BaseModel):
    """One HF checkpoint folder, summarized from its config, weight headers and tokenizer files."""

    path: str
    architecture: str
    model_type: str | None
    vocab_size: int  # config.json: the logits width the model was built with
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int | None
    rope_theta: float | None
    rope_scaling: dict[str, Any] | None
    torch_dtype: str | None
    tie_word_embeddings: bool
    remote_code: bool  # config or tokenizer_config has an ``auto_map`` (read, never executed, here)
    weights: WeightsInfo
    tokenizer: TokenizerInfo
    head_vocabulary: HeadVocabulary | None = None  # a draft's sub-vocabulary head (head_vocabulary.json)
    # what config.json lacks for transformers 4.57 to read its RoPE as 5.x does (:func:`specbuild.checkpoint.rope.legacy_rope_keys`)
    legacy_rope_missing: dict[str, Any] = {}

    @property
    def num_parameters(self) -> int:
        return self.weights.num_parameters

    @property
    def embedding_rows(self) -> int | None:
        return self.weights.embedding_rows

    @property
    def logits_width(self) -> int:
        """Width of the logits the engine returns: the output projection's rows."""
        return self.weights.lm_head_rows or self.weights.embedding_rows or self.vocab_size

    @property
    def head_rows(self) -> int:
        """Rows the output head computes: the sub-vocabulary's where it has one (its logits are still returned
        :attr:`logits_width` wide, -inf outside it)."""
        return self.head_vocabulary.size if self.head_vocabulary is not None else self.logits_width

    @property
    def macs_per_token(self) -> int:
        """Multiply-accumulates of one decoding step for one token (see :func:`decoder_macs_per_token`)."""
        return decoder_macs_per_token(layers=self.num_layers, hidden=self.hidden_size,
                                      query_width=self.num_attention_heads * self.head_dim,
                                      kv_width=self.num_kv_heads * self.head_dim,
                                      intermediate=self.intermediate_size, logits_width=self.head_rows)

    def summary(self) -> dict[str, Any]:
        """The figures a report shows (no per-file lists)."""
        data = self.model_dump(mode="json", exclude={"weights", "tokenizer", "head_vocabulary"})
        data.update(
            head_vocabulary=self.head_vocabulary.summary() if self.head_vocabulary is not None else None,
            num_parameters=self.num_parameters,
            embedding_rows=self.embedding_rows,
            logits_width=self.logits_width,
            weights_format=self.weights.format,
            parameters_by_dtype=self.weights.parameters_by_dtype,
            tokenizer=self.tokenizer.model_dump(mode="json", exclude={"files"}),
        )
        return data


def decoder_macs_per_token(*, layers: int, hidden: int, query_width: int, kv_width: int, intermediate: int,
                           logits_width: int) -> int:
    """Multiply-accumulates of a decoder's weight matmuls for one token: per layer the query and output
    projections (``hidden x query_width`` each), the key and value projections (``hidden x kv_width`` each)
    and a gated MLP (``3 x hidden x intermediate``, as Llama-family models have), plus the output head
    (``hidden x logits_width``). The embedding lookup costs no matmul and attention over the context is
    left out (it is small next to these at the short contexts where decoding cost matters)."""
    per_layer = 2 * hidden * query_width + 2 * hidden * kv_width + 3 * hidden * intermediate
    return layers * per_layer + hidden * logits_width

def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# --- config.json ---------------------------------------------------------------------------------------
def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal and some newer configs nest the language model under ``text_config``."""
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else config


def _config_value(config: dict[str, Any], field: str) -> Any:
    for key in CONFIG_ALIASES.get(field, (field,)):
        if config.get(key) is not None:
            return config[key]
    return None


def _require_int(config: dict[str, Any], field: str, path: Path) -> int:
    value = _config_value(config, field)
    if not _positive_int(value):
        keys = " / ".join(CONFIG_ALIASES.get(field, (field,)))
        raise CheckpointError(f"{path}: {keys} is missing or not a positive integer (got {value!r})",
                              "use the config.json the model was trained with")
    return value


def _rope(config: dict[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    """rope_theta and rope scaling; transformers 5 moves both into ``rope_parameters``."""
    params = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
    theta = config.get("rope_theta", params.get("rope_theta"))
    scaling = config.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = legacy_scaling(params)
    return (float(theta) if isinstance(theta, (int, float)) else None), (scaling if isinstance(scaling, dict) else None)


# --- the whole checkpoint ------------------------------------------------------------------------------
def read_checkpoint(path: str | Path, *, allow_pickle: bool = False, trust_remote_code: bool = False) -> CheckpointInfo:
    """Summarize the HF checkpoint folder ``path`` from its config, weight headers and tokenizer files."""
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {str(folder)!r} does not exist",
                              "pass the folder that holds config.json")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{folder} has no config.json", "point at a Hugging Face checkpoint folder "
                              "(config.json, tokenizer files, *.safetensors)")
    raw_config = read_json(config_path, MAX_CONFIG_JSON)
    if not isinstance(raw_config, dict):
        raise CheckpointError(f"{config_path} is not a JSON object", "use the checkpoint's original config.json")
    remote_code = _refuse_remote_code(folder, raw_config, trust_remote_code)
    config = _text_config(raw_config)
    architectures = raw_config.get("architectures") or config.get("architectures")
    if not (isinstance(architectures, list) and architectures and isinstance(architectures[0], str)):
        raise CheckpointError(f"{config_path} names no architectures", "use the config.json written by save_pretrained")
    hidden = _require_int(config, "hidden_size", config_path)
    heads = _require_int(config, "num_attention_heads", config_path)
    kv_heads = _config_value(config, "num_kv_heads")
    if not _positive_int(kv_heads):
        kv_heads = 1 if config.get("multi_query") else heads
    head_dim = config.get("head_dim") if _positive_int(config.get("head_dim")) else hidden // heads
    intermediate = _config_value(config, "intermediate_size")
    max_positions = _config_value(config, "max_position_embeddings")
    rope_theta, rope_scaling = _rope(config)
    dtype = raw_config.get("torch_dtype", raw_config.get("dtype", config.get("torch_dtype", config.get("dtype"))))
    weights = read_weights(folder, allow_pickle)
    info = CheckpointInfo(
        path=str(folder.resolve()),
        architecture=architectures[0],
        model_type=config.get("model_type") if isinstance(config.get("model_type"), str) else None,
        vocab_size=_require_int(config, "vocab_size", config_path),
        hidden_size=hidden,
        num_layers=_require_int(config, "num_layers", config_path),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate if _positive_int(intermediate) else 4 * hidden,
        max_position_embeddings=max_positions if _positive_int(max_positions) else None,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        torch_dtype=dtype if isinstance(dtype, str) else None,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        remote_code=remote_code,
        weights=weights,
        tokenizer=read_tokenizer(folder, config),
        legacy_rope_missing=legacy_rope_keys(config),
    )
    return info.model_copy(update={"head_vocabulary": read_head_vocabulary(folder, info.logits_width)})


def _refuse_remote_code(folder: Path, config: dict[str, Any], trust_remote_code: bool) -> bool:
    """Checkpoints with an ``auto_map`` need their own Python code to load: refused unless trusted."""
    sources = [("config.json", config)]
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file():
        data = read_json(tokenizer_config, MAX_CONFIG_JSON)
        sources.append(("tokenizer_config.json", data if isinstance(data, dict) else {}))
    needing = [name for name, data in sources if data.get("auto_map")]
    if needing and not trust_remote_code:
        raise CheckpointError(
            f"{folder / needing[0]} has an auto_map: the checkpoint needs its own Python code to load",
            "use a checkpoint of a built-in transformers architecture, or pass --trust-remote-code "
            "(security.trust_remote_code) if you trust its source")
    return bool(needing)
