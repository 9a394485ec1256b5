"""Guided decoding in TensorRT-LLM's ``tensorrtllm`` backend (1.2.x, C++ executor): its tokenizer info file and how
it reads a request's ``guided_decoding_guide_type`` / ``guided_decoding_guide``.

Sources (read, not copied), TensorRT-LLM:

* ``examples/generate_xgrammar_tokenizer_info.py`` writes ``xgrammar_tokenizer_info.json`` with
  ``tensorrt_llm/llmapi/tokenizer.py`` ``_xgrammar_tokenizer_info``: ``encoded_vocab`` (the tokens ordered by id),
  ``tokenizer_str`` (a fast tokenizer's ``backend_tokenizer.to_str()``) and ``stop_token_ids`` (``[eos_token_id]``);
  any other tokenizer but tiktoken's is refused there (tiktoken's have no ``tokenizer_str``).
* ``triton_backend/inflight_batcher_llm/src/model_instance_state.cc`` ``getGuidedDecodingConfigFromParams``: guided
  decoding is off unless both ``guided_decoding_backend`` and ``xgrammar_tokenizer_info_path`` are set; then the file
  must exist, is parsed for those three keys, and a backend other than ``xgrammar`` fails the model's load
  (``tokenizer_dir`` is ignored by the C++ workflow).
* ``cpp/tensorrt_llm/batch_manager/guidedDecoder.cpp``: ``TokenizerInfo::FromHuggingFace(encoded_vocab,
  tokenizer_str, vocab_size_padded, stop_token_ids)`` (without ``tokenizer_str``: a RAW vocabulary); a matcher made
  at the request's first context step (the grammar starts at the request's first new token, never inside its
  input), one bitmask per sequence slot per step, ``AcceptToken(getLastTokens(0))``: one token per step.
* ``triton_backend/inflight_batcher_llm/src/utils.cc`` ``getGuidedDecodingParamsFromTensors``: the type strings
  ``json``, ``json_schema``, ``regex``, ``ebnf_grammar``; an unknown type, or a guide without a type, is dropped
  without a word (the request runs unconstrained); ``cpp/tensorrt_llm/executor/guidedDecodingParams.cpp``: every
  type but ``json`` needs a guide ("The guide string must be provided unless using GuideType::kJSON.").
  ``trtGptModelInflightBatching.cpp`` builds the guided decoder only with a guided decoding config, so a guide sent
  to an engine without one is ignored too.

specbuild refuses where the backend refuses, and also where it would drop a guide silently (an answer that is not
what the client asked for is worse than an error): :func:`backend_guide` is the rule, used by the CPU stand-in of the
backend (the torch runtime's engine models) so a rehearsal fails where a GPU release would misbehave.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specbuild.errors import RequestError, StageError
from specbuild.speculation.guide_spec import GUIDE_INPUT, GUIDE_TYPES, TYPE_INPUT, GuideSpec

XGRAMMAR = "xgrammar"  # the only guided_decoding_backend the C++ executor takes
TOKENIZER_INFO_FILE = "xgrammar_tokenizer_info.json"  # generate_xgrammar_tokenizer_info.py's file name
TOKENIZER_INFO_KEYS = ("encoded_vocab", "tokenizer_str", "stop_token_ids")


def tokenizer_info(tokenizer: Any) -> dict[str, Any]:
    """The tokenizer info of ``tokenizer`` (a transformers fast tokenizer) in the backend's format."""
    from transformers import PreTrainedTokenizerFast

    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise StageError("package", f"the target's tokenizer ({type(tokenizer).__name__}) is not a fast tokenizer, "
                         "whose tokenizer.json the tensorrtllm backend's guided decoding reads",
                         "ship tokenizer.json with the target checkpoint")
    if tokenizer.eos_token_id is None:
        raise StageError("package", "the target's tokenizer defines no eos token, the stop token of the tensorrtllm "
                         "backend's guided decoding", "set eos_token in tokenizer_config.json")
    vocab = tokenizer.get_vocab()
    return {"encoded_vocab": [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])],
            "tokenizer_str": tokenizer.backend_tokenizer.to_str(),
            "stop_token_ids": [tokenizer.eos_token_id]}


def write_tokenizer_info(tokenizer_dir: Path, destination: Path) -> Path:
    """Write the tokenizer info of the tokenizer in ``tokenizer_dir`` into ``destination`` (a folder)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=False)
    path = destination / TOKENIZER_INFO_FILE
    path.write_text(json.dumps(tokenizer_info(tokenizer), ensure_ascii=False), encoding="utf-8")
    return path


def load_tokenizer_info(path: Path, vocab_size: int) -> Any:
    """``path`` as an ``xgrammar.TokenizerInfo`` built the way the backend builds it (``guidedDecoder.cpp``):
    ``FromHuggingFace`` over the file's vocabulary, tokenizer string and stop tokens, ``vocab_size`` the engine's
    (padded) vocabulary. A file without the keys fails as the backend's JSON parse does."""
    import xgrammar

    if not path.is_file():
        raise ValueError(f"Xgrammar's tokenizer info path at {path} does not exist.")
    info = json.loads(path.read_text(encoding="utf-8"))
    missing = [key for key in TOKENIZER_INFO_KEYS if key not in info]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: not a tokenizer info file "
                         "(write it with generate_xgrammar_tokenizer_info.py's format)")
    # the Python face of the C++ TokenizerInfo::FromHuggingFace(encoded_vocab, tokenizer_str, ...): the vocabulary
    # type and prefix space detected from the tokenizer string by the same core function
    metadata = xgrammar.TokenizerInfo._detect_metadata_from_hf(info["tokenizer_str"])
    return xgrammar.TokenizerInfo(info["encoded_vocab"], metadata["vocab_type"], vocab_size=vocab_size,
                                  stop_token_ids=info["stop_token_ids"], add_prefix_space=metadata["add_prefix_space"])


def guided_decoding_configured(backend: str, tokenizer_info_path: str) -> bool:
    """Whether an engine model's parameters turn the backend's guided decoding on (``model_instance_state.cc``):
    both set (NVIDIA's template placeholders count as unset); a backend other than xgrammar fails the load."""
    unset = {"", "${guided_decoding_backend}", "${xgrammar_tokenizer_info_path}"}
    if backend in unset or tokenizer_info_path in unset:
        return False
    if backend != XGRAMMAR:
        raise ValueError("Guided decoding is currently supported with 'xgrammar' backend. Invalid "
                         f"guided_decoding_backend parameter provided: {backend!r}.")
    return True


def backend_guide(guide_type: str | None, guide: str | None, *, configured: bool,
                  draft_tokens: bool) -> GuideSpec | None:
    """A request's guide as the backend takes it, or None without one; raises a :class:`RequestError` where the
    backend refuses, and where it would silently run the request unconstrained (see the module notes)."""
    if guide_type is None:
        if guide is not None:
            raise RequestError(f"{GUIDE_INPUT} without {TYPE_INPUT}: the tensorrtllm backend drops it silently "
                               "(utils.cc getGuidedDecodingParamsFromTensors)", f"send {TYPE_INPUT} too")
        return None
    if guide_type not in GUIDE_TYPES:
        raise RequestError(f"{TYPE_INPUT} {guide_type!r}: the tensorrtllm backend knows {', '.join(GUIDE_TYPES)} and "
                           "drops any other silently", f"use one of {', '.join(GUIDE_TYPES)}")
    if guide is None and guide_type != "json":
        raise RequestError("The guide string must be provided unless using GuideType::kJSON.",
                           f"send {GUIDE_INPUT} with {TYPE_INPUT} {guide_type}")
    if not configured:
        raise RequestError(f"{TYPE_INPUT} {guide_type}: this engine has no guided decoding configured "
                           "(guided_decoding_backend, xgrammar_tokenizer_info_path), so the tensorrtllm backend would "
                           "ignore the guide", "package the release with guided decoding, or send no guide")
    if draft_tokens:
        raise RequestError(f"{TYPE_INPUT} with draft_input_ids: the C++ executor's guided decoder masks one position "
                           "and accepts one token per step (guidedDecoder.cpp), so drafted tokens would not be checked "
                           "against the guide", "send guided requests to the target alone")
    return GuideSpec(guide_type, guide or "")
