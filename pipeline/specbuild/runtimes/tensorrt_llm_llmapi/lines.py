"""What each TensorRT-LLM line's parsers accept from a release, one rule table per line.

A ``tensorrt-llm-llmapi`` release meets three upstream parsers: the LLM-API Triton model's ``model.yaml`` (its
``model.py`` hands every key but ``triton_config`` to ``update_llm_args_with_extra_dict`` and then ``LLM(**args)``),
the same ``LLM()`` arguments read by ``trtllm-serve --extra_llm_api_options``, and the model's ``config.pbtxt``
inputs (:data:`specbuild.runtimes.tensorrt_llm_llmapi.contract.LLMAPI_INPUTS`). Where they differ between lines,
the difference is here: the renderer (:mod:`specbuild.runtimes.tensorrt_llm_llmapi.repository`) writes from a
line's table and the CPU stand-in's parse (:func:`specbuild.runtimes.tensorrt_llm_llmapi.model_yaml.parse`)
refuses what the line's rules refuse, so a rehearsal fails where the image would.

Sources (read, not copied):

* ``1.2``: TensorRT-LLM 1.2.1, what NGC ``tritonserver:26.04``-``26.07`` install (tensorrtllm_backend r26.04
  ``dockerfile/Dockerfile.triton.trt_llm_backend``: ``TENSORRTLLM_VER=1.2.1``, ``all_models`` cloned from
  ``release/1.2.1``). ``tensorrt_llm/llmapi/llm_args.py`` of the release/1.2 line: ``DecodingBaseConfig.from_dict``
  dispatches a dict on ``decoding_type`` through its table (``"DraftTarget": DraftTargetDecodingConfig``, else
  ``ValueError("Invalid decoding type")``) and pops the key; ``DecodingBaseConfig`` is a ``StrictBaseModel``
  (``extra="forbid"``) declaring ``max_draft_len``, ``max_total_draft_tokens``, ``speculative_model`` (alias
  ``speculative_model_dir``), ``max_concurrency: Optional[int]``, ``draft_len_schedule``, ``load_format``,
  ``acceptance_window``, ``acceptance_length_threshold``; ``BaseLlmArgs.validate_speculative_config`` asserts
  ``max_draft_len > 0`` and a draft path for ``DraftTargetDecodingConfig``. The exact release/1.2.1 file could not
  be fetched here (the repository's snapshot is 2.5 GB): it was read from stored release/1.2-era copies and an
  extraction of the 1.2.1 ``DecodingBaseConfig`` (the field list above).
* ``main``: TensorRT-LLM main at commit 0004396720054fd8e205cbf616f21f0b57c6b412 (1.4.0rc), the same file:
  ``SpeculativeConfig`` is a pydantic union discriminated on ``decoding_type``, whose DraftTarget member is
  ``Literal["Draft_Target"]``; ``DraftTargetDecodingConfig.validate_draft_target_config`` refuses
  ``max_draft_len`` absent or 0 and a missing ``speculative_model``; ``max_concurrency: Optional[PositiveInt]``;
  ``validate_max_concurrency_and_draft_len_schedule_mutually_exclusive``.
* Guided decoding: neither line's LLM-API model takes a guide. ``triton_backend/all_models/llmapi/tensorrt_llm/
  config.pbtxt`` declares no ``guided_decoding_guide_type``/``guided_decoding_guide`` (nor any guide) input on
  release/1.2.1 (:data:`specbuild.runtimes.tensorrt_llm_llmapi.contract.LLMAPI_INPUTS`) or on main at commit
  0a71057313ec0626527e164a8fc0205c5822e2f5, so a guided request is refused naming the line (``requests.py``).
* ``draft_len_schedule`` (K per batch size; specbuild's load policy, :func:`load_keys`), read from the same stored
  copies. 1.2: ``DecodingBaseConfig.validate_draft_len_schedule_and_sort`` (keys >= 1, values >= 0, key 1 required
  and ``schedule[1] == max_draft_len``, every value <= ``max_draft_len``); ``tensorrt_llm/_torch/speculative/
  drafter.py`` ``Drafter.get_draft_len_for_batch_size`` takes the largest key <= the batch size (a key is where a
  K starts). main: the same validator with "the smallest key maps to ``max_draft_len``" instead of key 1;
  ``tensorrt_llm/_torch/speculative/utils.py`` ``get_draft_len_for_batch_size`` takes the first key >= the batch
  size, and 0 above the largest ("new semantics": a key is where a K ends); ``max_concurrency`` N is translated
  to ``{N: max_draft_len}`` and refused beside a schedule.
* ``tokenizer`` (both lines): ``BaseLlmArgs.tokenizer``, ``LLM.__init__``'s committed argument ``tokenizer:
  Union[str, Path, PreTrainedTokenizerBase, TokenizerBase, None]`` (``tests/unittest/api_stability/
  references_committed/llm.yaml``); without it ``LLM()`` loads the model folder's tokenizer with the image's
  transformers 4.57, which fails on a ``tokenizer_config.json`` naming ``TokenizersBackend`` (transformers 5's
  name), so the renderer names the adapter's portable copy there (``model_yaml.LLMArgs.tokenizer``).
* Both: ``triton_backend/all_models/llmapi/tensorrt_llm/1/model.py`` reads ``triton_config["decoupled"]`` and
  ``["max_batch_size"]`` (both required); ``trtllm-serve``'s ``--extra_llm_api_options`` (``tensorrt_llm/commands/
  serve.py``) reads the same arguments through ``update_llm_args_with_extra_options``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from specbuild.speculation.schedule import DraftLenSchedule

Line = Literal["1.2", "main"]
Check = Callable[[Mapping[str, Any]], "str | None"]

DRAFT_KEY = "speculative_model"  # the draft's key on both lines (speculative_model_dir is its alias)
_DRAFT_KEYS = (DRAFT_KEY, "speculative_model_dir")
# DecodingBaseConfig's fields on each line (StrictBaseModel: nothing else is accepted).
_BASE_FIELDS = frozenset({"decoding_type", "max_draft_len", "max_total_draft_tokens", *_DRAFT_KEYS,
                          "max_concurrency", "draft_len_schedule", "load_format"})
_FIELDS_1_2 = _BASE_FIELDS | {"acceptance_window", "acceptance_length_threshold"}
_FIELDS_MAIN = _BASE_FIELDS | {"acceptance_rate_window_size", "acceptance_rate_threshold", "use_rejection_sampling",
                               "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty"}
_LLM_ARGS = "tensorrt_llm/llmapi/llm_args.py"


@dataclass(frozen=True)
class Rule:
    """One thing an upstream parser refuses: ``check`` answers why a ``speculative_config`` breaks it (None: it
    does not), ``source`` where upstream says so."""

    name: str
    source: str
    check: Check


@dataclass(frozen=True)
class LineRules:
    """A TensorRT-LLM line as a release meets it.

    ``decoding_type``: the spelling its parser dispatches Draft/Target on. ``min_max_concurrency``: the least
    ``max_concurrency`` it accepts (the load policy's cutoff). ``schedule_keys``: what a ``draft_len_schedule`` key
    is, ``from`` (1.2: the batch size its K starts at) or ``up_to`` (main: the batch size its K ends at, 0 after
    the last). ``streams``: whether its LLM-API model streams:
    1.2.1's ``model.py`` passes ``streaming`` positionally into ``generate_async``'s ``lora_request`` slot (fixed by
    TensorRT-LLM PR #14079, May 2026), so on 1.2 the adapter asks for whole answers. ``serve_flag``: how
    ``trtllm-serve`` takes the YAML of ``LLM()`` arguments.
    """

    line: Line
    tensorrt_llm: str
    decoding_type: str
    min_max_concurrency: int
    schedule_keys: Literal["from", "up_to"]
    streams: bool
    rules: tuple[Rule, ...]
    serve_flag: str = "--extra_llm_api_options"

    def refusals(self, speculative: Mapping[str, Any]) -> list[str]:
        """What this line refuses in ``speculative`` (a ``speculative_config`` as YAML holds it), each naming its
        rule and source; empty when it loads."""
        return [f"{why} [{rule.name}: {rule.source}]" for rule in self.rules if (why := rule.check(speculative))]


def load_keys(schedule: DraftLenSchedule, k: int, max_batch_size: int, line: LineRules) -> dict[str, Any]:
    """specbuild's load policy for a release drafting ``k`` as ``line``'s ``speculative_config`` keys (TensorRT-LLM
    counts its batch, not the adapter's requests in flight): none where K never changes; a single cutoff (K, then
    0 from N requests: ``busy_in_flight`` N) as ``max_concurrency`` N-1, speculating while the batch holds at most
    that many; any other schedule as ``draft_len_schedule`` in the line's key form, over batch sizes up to
    ``max_batch_size`` (the most its batch holds)."""
    runs = schedule.runs(k, max([max_batch_size, *(count for count, _ in schedule.steps)]))
    values = [value for _, _, value in runs]
    if values == [k]:
        return {}
    if values in ([k, 0], [0]):
        return {"max_concurrency": runs[-1][0] - 1}
    if line.schedule_keys == "from":
        return {"draft_len_schedule": {first: value for first, _, value in runs}}
    return {"draft_len_schedule": {last: value for _, last, value in runs if value}}


def _decoding_type(expected: str, how: str) -> Check:
    def check(config: Mapping[str, Any]) -> str | None:
        found = config.get("decoding_type")
        return None if found == expected else f"decoding_type {found!r} is not {expected!r} ({how})"
    return check


def _known_fields(fields: frozenset[str]) -> Check:
    def check(config: Mapping[str, Any]) -> str | None:
        extra = sorted(set(config) - fields)
        return f"unknown field(s) {', '.join(extra)} (extra fields are forbidden)" if extra else None
    return check


def _positive_draft_len(config: Mapping[str, Any]) -> str | None:
    value = config.get("max_draft_len")
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return None if ok else f"max_draft_len {value!r} must be an integer > 0 for Draft/Target"


def _draft_model(config: Mapping[str, Any]) -> str | None:
    return None if any(config.get(key) for key in _DRAFT_KEYS) else "speculative_model (the draft) is required"


def _max_concurrency(least: int, kind: str) -> Check:
    def check(config: Mapping[str, Any]) -> str | None:
        value = config.get("max_concurrency")
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= least):
            return None
        return f"max_concurrency {value!r} is not {kind}"
    return check


def _draft_len_schedule(key_1_required: bool) -> Check:
    """The line's validator: the smallest key (key 1, where ``key_1_required``) has max_draft_len."""
    def check(config: Mapping[str, Any]) -> str | None:
        schedule = config.get("draft_len_schedule")
        if schedule is None:
            return None
        if not isinstance(schedule, Mapping) or not schedule:
            return f"draft_len_schedule {schedule!r} is not a mapping of batch sizes to draft lengths"
        steps = {int(size): length for size, length in schedule.items()}  # YAML keys may come as strings
        longest = config.get("max_draft_len")
        if min(steps) < 1 or min(steps.values()) < 0:
            return "draft_len_schedule: batch sizes must be >= 1 and draft lengths >= 0"
        if key_1_required and 1 not in steps:
            return "draft_len_schedule must include batch_size=1"
        first = min(steps)
        if steps[first] != longest:
            return f"draft_len_schedule[{first}] ({steps[first]}) must equal max_draft_len ({longest})"
        if isinstance(longest, int) and max(steps.values()) > longest:
            return f"draft_len_schedule: every draft length must be <= max_draft_len ({longest})"
        return None
    return check


def _exclusive(config: Mapping[str, Any]) -> str | None:
    both = config.get("max_concurrency") is not None and config.get("draft_len_schedule") is not None
    return "max_concurrency and draft_len_schedule are mutually exclusive" if both else None


_AT_1_2 = f"{_LLM_ARGS}, release/1.2 (TensorRT-LLM 1.2.1)"
_AT_MAIN = f"{_LLM_ARGS} @ 0004396720054fd8e205cbf616f21f0b57c6b412"

LINES: dict[str, LineRules] = {
    "1.2": LineRules("1.2", "1.2.1", decoding_type="DraftTarget", min_max_concurrency=0, schedule_keys="from",
                     streams=False, rules=(
        Rule("decoding-type", f"{_AT_1_2}: DecodingBaseConfig.from_dict",
             _decoding_type("DraftTarget", "from_dict's dispatch table; anything else is 'Invalid decoding type'")),
        Rule("known-fields", f"{_AT_1_2}: DecodingBaseConfig(StrictBaseModel)", _known_fields(_FIELDS_1_2)),
        Rule("max-draft-len", f"{_AT_1_2}: BaseLlmArgs.validate_speculative_config", _positive_draft_len),
        Rule("speculative-model", f"{_AT_1_2}: BaseLlmArgs.validate_speculative_config", _draft_model),
        Rule("max-concurrency", f"{_AT_1_2}: DecodingBaseConfig.max_concurrency: Optional[int]",
             _max_concurrency(0, "an integer")),
        Rule("draft-len-schedule", f"{_AT_1_2}: DecodingBaseConfig.validate_draft_len_schedule_and_sort",
             _draft_len_schedule(key_1_required=True)),
    )),
    "main": LineRules("main", "main (1.4.0rc)", decoding_type="Draft_Target", min_max_concurrency=1,
                      schedule_keys="up_to", streams=True, rules=(
        Rule("decoding-type", f"{_AT_MAIN}: SpeculativeConfig (discriminator decoding_type)",
             _decoding_type("Draft_Target", "DraftTargetDecodingConfig's Literal in the discriminated union")),
        Rule("known-fields", f"{_AT_MAIN}: DraftTargetDecodingConfig(StrictBaseModel)", _known_fields(_FIELDS_MAIN)),
        Rule("max-draft-len", f"{_AT_MAIN}: DraftTargetDecodingConfig.validate_draft_target_config",
             _positive_draft_len),
        Rule("speculative-model", f"{_AT_MAIN}: DraftTargetDecodingConfig.validate_draft_target_config",
             _draft_model),
        Rule("max-concurrency", f"{_AT_MAIN}: DecodingBaseConfig.max_concurrency: Optional[PositiveInt]",
             _max_concurrency(1, "a positive integer")),
        Rule("draft-len-schedule", f"{_AT_MAIN}: DecodingBaseConfig.validate_draft_len_schedule_and_sort",
             _draft_len_schedule(key_1_required=False)),
        Rule("max-concurrency-or-schedule",
             f"{_AT_MAIN}: DecodingBaseConfig.validate_max_concurrency_and_draft_len_schedule_mutually_exclusive",
             _exclusive),
    )),
}
