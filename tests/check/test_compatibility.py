"""check_pair: every incompatibility is a reason with a fix; what is merely worth knowing is a warning."""

from __future__ import annotations

import pytest
from checkpoint_factory import MAX_POSITIONS, PADDED_VOCAB, VOCAB, Checkpoints

from specbuild.checkpoint.info import CheckpointInfo, read_checkpoint
from specbuild.runtimes.registry import runtime_for
from specbuild.check.compatibility import CompatibilityReport, PairParams, check_pair
from specbuild.spec import BuildSpec, ModelSpec


@pytest.fixture(scope="module")
def target(checkpoints: Checkpoints) -> CheckpointInfo:
    return read_checkpoint(checkpoints.target)


@pytest.fixture(scope="module")
def draft(checkpoints: Checkpoints) -> CheckpointInfo:
    return read_checkpoint(checkpoints.draft)


def codes(findings) -> set[str]:
    return {f.code for f in findings}


def with_tokenizer(info: CheckpointInfo, **changes) -> CheckpointInfo:
    return info.model_copy(update={"tokenizer": info.tokenizer.model_copy(update=changes)})


def test_matching_pair_is_compatible_without_warnings(target: CheckpointInfo, draft: CheckpointInfo) -> None:
    report = check_pair(target, draft)
    assert report.compatible and report.reasons == [] and report.warnings == []
    assert report.size_ratio == pytest.approx(target.num_parameters / draft.num_parameters)
    assert report.to_dict()["compatible"] is True


def test_different_tokenizers_name_both_vocab_sizes(target: CheckpointInfo, checkpoints: Checkpoints) -> None:
    report = check_pair(target, read_checkpoint(checkpoints.other_tokenizer))
    assert not report.compatible
    [reason] = [r for r in report.reasons if r.code == "tokenizer"]
    assert f"target vocab size {VOCAB} does not match draft vocab size 350" in reason.message
    assert "tokenizer" in reason.fix


def test_same_size_different_tokens_is_named_by_hash(target: CheckpointInfo, draft: CheckpointInfo) -> None:
    report = check_pair(target, with_tokenizer(draft, hash="0" * 64))
    [reason] = report.reasons
    assert reason.code == "tokenizer" and "same vocab size" in reason.message and "000000000000" in reason.message


def test_padded_draft_needs_token_match(target: CheckpointInfo, checkpoints: Checkpoints) -> None:
    padded = read_checkpoint(checkpoints.padded_draft)
    logits = check_pair(target, padded, PairParams(acceptance="draft-logits"))
    [reason] = logits.reasons
    assert reason.code == "logits-width"
    assert f"{VOCAB} does not match draft logits width {PADDED_VOCAB}" in reason.message
    assert "token-match" in reason.fix

    match = check_pair(target, padded, PairParams(acceptance="token-match"))
    assert match.compatible and "logits-width" in codes(match.warnings)
    assert "draft-vocab-size" not in codes(match.warnings)  # config and embedding agree at 448


def test_draft_logits_compares_the_widths_the_engines_have_across_tp_sizes(target: CheckpointInfo,
                                                                          draft: CheckpointInfo) -> None:
    # TensorRT-LLM pads lm_head to a multiple of tp: an odd vocabulary split over 2 GPUs returns one more logit
    def widened(info: CheckpointInfo) -> CheckpointInfo:
        rows = {"lm_head_rows": VOCAB + 1, "embedding_rows": VOCAB + 1}
        return info.model_copy(update={"vocab_size": VOCAB + 1, "weights": info.weights.model_copy(update=rows)})

    odd, odd_draft = widened(target), widened(draft)
    assert odd.logits_width == odd_draft.logits_width == VOCAB + 1
    engines = PairParams(acceptance="draft-logits", runtime="tensorrt-llm", target_tp=2, draft_tp=1)
    [reason] = [r for r in check_pair(odd, odd_draft, engines).reasons if r.code == "logits-width"]
    assert f"target logits width {VOCAB + 2} does not match draft logits width {VOCAB + 1}" in reason.message
    assert "padded to a multiple of tp 2 and 1" in reason.message
    assert "token-match" in reason.fix and "the target's tp_size" in reason.fix
    # the same pair at equal tp sizes, or with token matching, or on the torch runtime (no padding) is fine
    for params in (engines.model_copy(update={"draft_tp": 2}), engines.model_copy(update={"acceptance": "token-match"}),
                   PairParams(acceptance="draft-logits", runtime="torch", target_tp=2, draft_tp=1)):
        assert "logits-width" not in codes(check_pair(odd, odd_draft, params).reasons), params
    # an even vocabulary pads to itself
    assert check_pair(target, draft, engines).compatible


def test_tokenizer_ids_beyond_the_embedding_are_a_reason(target: CheckpointInfo, draft: CheckpointInfo) -> None:
    report = check_pair(target, with_tokenizer(draft, max_token_id=VOCAB + 5))
    assert "draft-embedding" in codes(report.reasons)


def test_bos_and_eos_must_match_pad_may_differ(target: CheckpointInfo, draft: CheckpointInfo) -> None:
    eos = check_pair(target, with_tokenizer(draft, eos_token_id=7))
    [reason] = eos.reasons
    assert reason.code == "eos-id" and "target eos token id 1 does not match draft eos token id 7" in reason.message
    bos = check_pair(target, with_tokenizer(draft, bos_token_id=7))
    assert codes(bos.reasons) == {"bos-id"}
    pad = check_pair(target, with_tokenizer(draft, pad_token_id=7))
    assert pad.compatible and codes(pad.warnings) == {"pad-id"}


@pytest.mark.parametrize("runtime", ["tensorrt-llm", "torch"])
def test_an_architecture_the_runtime_cannot_run_is_a_reason(target: CheckpointInfo, draft: CheckpointInfo,
                                                            runtime: str) -> None:
    odd = draft.model_copy(update={"architecture": "NoSuchModelForCausalLM"})
    report = check_pair(target, odd, PairParams(runtime=runtime))
    [finding] = [f for f in report.reasons if f.code == "draft-architecture"]
    assert "NoSuchModelForCausalLM" in finding.message and not report.compatible


def test_an_architecture_only_the_torch_runtime_runs_is_a_tensorrt_llm_reason_and_a_torch_warning(
        target: CheckpointInfo, draft: CheckpointInfo) -> None:
    gemma = draft.model_copy(update={"architecture": "GemmaForCausalLM"})  # transformers runs it; no 1.2 converter
    refused = check_pair(target, gemma, PairParams(runtime="tensorrt-llm"))
    [reason] = [f for f in refused.reasons if f.code == "draft-architecture"]
    assert "TensorRT-LLM 1.2" in reason.message and "--runtime torch" in reason.fix
    allowed = check_pair(target, gemma, PairParams(runtime="torch"))
    assert allowed.compatible and "draft-architecture-tensorrt-llm" in codes(allowed.warnings)


@pytest.mark.parametrize("architecture", ["GemmaForCausalLM", "OPTForCausalLM", "BloomForCausalLM",
                                          "GPTNeoXForCausalLM"])
def test_check_accepts_for_tensorrt_llm_exactly_what_its_converter_takes(architecture: str) -> None:
    """The audit's finding: these passed check (a 42-architecture list) and failed at convert (12)."""
    from specbuild.runtimes.tensorrt_llm import engine_plans as tensorrt_llm

    runtime = runtime_for("tensorrt-llm")
    assert runtime.unsupported(architecture) is not None
    for supported in tensorrt_llm.SUPPORTED_ARCHITECTURES:
        assert runtime.unsupported(supported) is None


def test_float32_engines_are_refused_for_tensorrt_llm(target: CheckpointInfo, draft: CheckpointInfo) -> None:
    report = check_pair(target, draft, PairParams(runtime="tensorrt-llm", draft_dtype="float32"))
    assert codes(report.reasons) == {"draft-dtype"}
    assert check_pair(target, draft, PairParams(runtime="torch", draft_dtype="float32")).compatible


def test_checkpoint_dtypes_that_differ_are_a_warning(target: CheckpointInfo, draft: CheckpointInfo) -> None:
    report = check_pair(target, draft.model_copy(update={"torch_dtype": "bfloat16"}))
    assert report.compatible and codes(report.warnings) == {"checkpoint-dtypes"}


@pytest.mark.parametrize("draft_is_target", [True, False])
def test_draft_cost_outside_the_useful_range_warns(target: CheckpointInfo, draft: CheckpointInfo,
                                                   draft_is_target: bool) -> None:
    deep_target = target.model_copy(update={"num_layers": 4000})  # a draft 1/1000 of its cost
    report = check_pair(target, target) if draft_is_target else check_pair(deep_target, draft)
    [warning] = [w for w in report.warnings if w.code == "size-ratio"]
    if draft_is_target:
        assert report.cost_ratio == pytest.approx(1.0)
        assert "too large" in warning.message and "the draft cannot pay: even with every drafted token accepted, " \
            "K=1 would be slower than the target alone" in warning.message and "100%" not in warning.message
    else:
        assert report.cost_ratio < 0.005 and "so small" in warning.message
    assert report.compatible


def test_draft_cost_counts_layers_and_the_head_not_the_shared_embeddings(target: CheckpointInfo) -> None:
    """A 2-layer draft of a 30-layer, 49k-vocabulary target has a quarter of its parameters (the embeddings
    and head are most of both) but costs far less per token: not "too large"."""
    shape = {"hidden_size": 576, "num_attention_heads": 9, "num_kv_heads": 3, "head_dim": 64,
             "intermediate_size": 1536, "vocab_size": 49152}
    weights = target.weights.model_copy(update={"lm_head_rows": 49152, "embedding_rows": 49152})
    big = target.model_copy(update={**shape, "num_layers": 30, "weights": weights})
    small = target.model_copy(update={**shape, "num_layers": 2, "weights": weights})
    per_layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
    head = 576 * 49152
    assert big.macs_per_token == 30 * per_layer + head
    report = check_pair(big, small)
    assert report.cost_ratio == pytest.approx((2 * per_layer + head) / (30 * per_layer + head))
    assert report.cost_ratio < 0.5 and "size-ratio" not in codes(report.warnings)


def test_max_seq_len_is_checked_against_the_target_alone(target: CheckpointInfo, draft: CheckpointInfo) -> None:
    """The release serves the target's window: a draft with a shorter one warns (past it requests draft by lookup or
    run on the target alone), never refuses; a limit beyond the target, or a draft window beyond the draft, does."""
    short = draft.model_copy(update={"max_position_embeddings": 1024})
    report = check_pair(target, short, PairParams(max_seq_len=2048))
    assert report.compatible and codes(report.warnings) == {"draft-window"}
    [warning] = report.warnings
    assert "holds 1024 positions, the release serves 2048" in warning.message
    assert "specbuild_draft_window_requests_total" in warning.message
    assert codes(check_pair(target, draft, PairParams(max_seq_len=2048)).warnings) == set()  # same windows
    beyond = check_pair(target, short, PairParams(max_seq_len=MAX_POSITIONS + 1))
    [reason] = beyond.reasons
    assert reason.code == "target-max-positions" and f"to {MAX_POSITIONS} or less" in reason.fix
    drafted = check_pair(target, short, PairParams(draft_max_seq_len=2048))
    [reason] = drafted.reasons
    assert reason.code == "draft-max-positions" and "1024" in reason.message and "to 1024 or less" in reason.fix


def test_rope_differences_warn(target: CheckpointInfo, draft: CheckpointInfo) -> None:
    report = check_pair(target, draft.model_copy(update={"rope_theta": 500000.0}))
    assert report.compatible and codes(report.warnings) == {"rope"}


def test_spec_supplies_the_parameters(target: CheckpointInfo, draft: CheckpointInfo) -> None:
    spec = BuildSpec(runtime="torch", target=ModelSpec(checkpoint="t"),
                     draft=ModelSpec(checkpoint="d", dtype="float16"),
                     speculation={"acceptance": "token-match"}, limits={"max_input_len": 100, "max_seq_len": 300})
    params = PairParams.from_spec(spec)
    assert params == PairParams(acceptance="token-match", max_seq_len=300, max_input_len=100, runtime="torch",
                                target_dtype="auto",
                                draft_dtype="float16")
    assert isinstance(check_pair(target, draft, spec), CompatibilityReport)


@pytest.mark.parametrize("runtime", ["torch", "tensorrt-llm", "tensorrt-llm-llmapi"])
def test_block_verification_needs_a_runtime_whose_target_runs_it(target: CheckpointInfo, draft: CheckpointInfo,
                                                                  runtime: str) -> None:
    spec = BuildSpec(runtime=runtime, target=ModelSpec(checkpoint="t"), draft=ModelSpec(checkpoint="d"),
                     speculation={"verification": "block"})
    reasons = [f for f in check_pair(target, draft, spec).reasons if f.code == "verification"]
    if runtime == "torch":
        assert reasons == []
    else:
        [reason] = reasons
        assert f"the {runtime} runtime" in reason.message and "verification: token" in reason.fix
    token = spec.model_copy(update={"speculation": spec.speculation.model_copy(update={"verification": "token"})})
    assert not [f for f in check_pair(target, draft, token).reasons if f.code == "verification"]


# -- a sub-vocabulary head --------------------------------------------------------------------------------
def with_head_vocabulary(info: CheckpointInfo, ids: tuple[int, ...]) -> CheckpointInfo:
    from specbuild.checkpoint.head_vocabulary import HeadVocabulary

    return info.model_copy(update={"head_vocabulary": HeadVocabulary.of(ids)})


@pytest.mark.parametrize("runtime", ["tensorrt-llm", "tensorrt-llm-llmapi"])
def test_the_tensorrt_llm_runtimes_serve_a_sub_vocabulary_draft_with_its_full_head_and_say_so(
        target: CheckpointInfo, draft: CheckpointInfo, runtime: str) -> None:
    reduced = with_head_vocabulary(draft, tuple(range(VOCAB // 2)) + (target.tokenizer.eos_token_id,))
    report = check_pair(target, reduced, PairParams(runtime=runtime))
    assert report.compatible
    [warning] = [f for f in report.warnings if f.code == "draft-head-vocabulary-unused"]
    assert f"the {runtime} runtime" in warning.message and f"{VOCAB // 2 + 1} of {VOCAB} ids" in warning.message
    assert "--runtime torch" in warning.fix
    assert report.cost_ratio == check_pair(target, draft, PairParams(runtime=runtime)).cost_ratio  # the full head


def test_a_sub_vocabulary_draft_is_compatible_on_torch_and_costs_its_rows(target: CheckpointInfo,
                                                                         draft: CheckpointInfo) -> None:
    eos = target.tokenizer.eos_token_id
    reduced = with_head_vocabulary(draft, (eos, 5, 9))
    report = check_pair(target, reduced, PairParams(runtime="torch"))
    assert report.compatible and report.warnings == []
    assert report.cost_ratio < check_pair(target, draft).cost_ratio  # 3 head rows instead of VOCAB
    no_end = check_pair(target, with_head_vocabulary(draft, tuple(i for i in range(8) if i != eos)))
    assert no_end.compatible and codes(no_end.warnings) == {"head-vocabulary-end"}


def test_a_target_with_a_head_vocabulary_is_a_reason(target: CheckpointInfo, draft: CheckpointInfo) -> None:
    report = check_pair(with_head_vocabulary(target, (1, 2, 3)), draft)
    [reason] = report.reasons
    assert reason.code == "target-head-vocabulary" and "head_vocabulary.json" in reason.fix
