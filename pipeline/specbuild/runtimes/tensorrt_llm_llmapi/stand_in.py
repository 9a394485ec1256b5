"""A CPU stand-in for TensorRT-LLM's LLM-API model: the same ``model.yaml``, the same tensors, torch underneath.

It lets a ``tensorrt-llm-llmapi`` release run end to end on the Triton server bundled with specbuild: the ensemble,
the adapter and this stand-in in the ``tensorrt_llm`` model's place (see :mod:`specbuild.serve. rehearsal`). It
reads the release's ``model.yaml`` with the typed model packaging wrote it from, loads the ``model`` and
``speculative_config.speculative_model`` checkpoints (container paths mapped to host folders as ``docker run``
mounts would), and answers :class:`~specbuild.runtimes.tensorrt_llm_llmapi.tensors.LLMAPIRequest` objects as the LLM
API does, running draft-target speculation with specbuild's own loop
(:class:`~specbuild.runtimes.torch.inprocess.InProcessSpeculator`): the draft length fixed at load, verification by
token matching, the tokenizer's end token, the whole text so far in every streamed answer, acceptance figures from
the loop's statistics, the draft at its own window (past it the loop drafts no more, where TensorRT-LLM verifies
placeholder drafts: the same tokens, at another cost); a ``model.yaml`` without ``speculative_config`` serves the target alone (and applies presence
and frequency penalties, exact there). It reads ``model.yaml`` by the rule table of the release's TensorRT-LLM line,
so what that line's parser refuses fails here too. It computes in float32 on the CPU whatever ``dtype`` says (that
is TensorRT-LLM's business on the GPU).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path, PurePosixPath

from specbuild.errors import RequestError
from specbuild.package.build_record import BuildLimits
from specbuild.runtimes.tensorrt_llm_llmapi.model_yaml import ModelYaml
from specbuild.runtimes.tensorrt_llm_llmapi.tensors import LLMAPIAnswer, LLMAPIRequest
from specbuild.runtimes.torch.engine import TorchEngine
from specbuild.runtimes.torch.inprocess import InProcessSpeculator
from specbuild.speculation.request import TokenRequest
from specbuild.speculation.rules import SamplingParams
from specbuild.speculation.stats import SpeculationStats

# The loop's finish reasons as the LLM API names them.
FINISH_REASONS = {"end_id": "stop", "no_progress": "stop", "length": "length"}


def host_path(path: str, mounts: Mapping[str, str]) -> Path:
    """``path`` inside the container as a host folder: through the mount whose target holds it, else as is."""
    container = PurePosixPath(path)
    for target, source in sorted(mounts.items(), key=lambda item: -len(item[0])):
        if container == PurePosixPath(target) or PurePosixPath(target) in container.parents:
            return Path(source) / container.relative_to(target)
    return Path(path)


class LLMAPIStandIn:
    """The models of a ``model.yaml``, answering LLM-API requests (concurrent ones overlap on one event loop)."""

    def __init__(self, config: ModelYaml, mounts: Mapping[str, str]) -> None:
        from transformers import AutoTokenizer

        self.config = config
        target_dir = host_path(config.model, mounts)
        speculative = config.speculative_config
        self.max_draft_len = speculative.max_draft_len if speculative else 0
        # LLM() loads model.yaml's tokenizer where it names one, else the model folder's
        self.tokenizer = AutoTokenizer.from_pretrained(str(host_path(config.tokenizer or config.model, mounts)),
                                                       trust_remote_code=config.trust_remote_code)
        self.end_id = self.tokenizer.eos_token_id
        engine = {"dtype": "float32", "device": "cpu", "trust_remote_code": config.trust_remote_code,
                  "cache_tokens": config.kv_cache_config.max_tokens}
        limits = BuildLimits(max_batch_size=config.max_batch_size, max_input_len=config.max_input_len,
                             max_seq_len=config.max_seq_len, max_draft_len=self.max_draft_len)
        draft = TorchEngine(host_path(speculative.speculative_model, mounts), **engine) if speculative else None
        if draft is not None:  # at its own window, as TensorRT-LLM's draft engine (PyTorchModelEngine._init_max_seq_len)
            draft.max_seq_len = min(draft.max_seq_len, config.max_seq_len)
        self.speculator = InProcessSpeculator(
            TorchEngine(target_dir, max_seq_len=limits.engine_seq_len,
                        max_draft_len=self.max_draft_len, **engine), draft)

    def _generation(self, request: LLMAPIRequest, prompt_ids: list[int]) -> TokenRequest:
        if len(prompt_ids) > self.config.max_input_len:
            raise RequestError(f"the prompt has {len(prompt_ids)} tokens, more than max_input_len "
                               f"({self.config.max_input_len})")
        if len(prompt_ids) + request.max_tokens > self.config.max_seq_len:
            raise RequestError(f"the prompt ({len(prompt_ids)} tokens) and max_tokens ({request.max_tokens}) exceed "
                               f"max_seq_len ({self.config.max_seq_len})")
        penalised = request.presence_penalty or request.frequency_penalty
        if penalised and self.max_draft_len:
            raise RequestError("presence/frequency penalties: the stand-in applies them only without "
                               "speculative_config (specbuild's adapter sends them to such releases only)")
        sampling = SamplingParams.from_backend(request.temperature, request.top_k, request.top_p,
                                               presence_penalty=request.presence_penalty,
                                               frequency_penalty=request.frequency_penalty)
        return TokenRequest(prompt_ids=prompt_ids, max_tokens=request.max_tokens, sampling=sampling,
                                 seed=request.seed, end_id=self.end_id, num_draft_tokens=self.max_draft_len,
                                 use_draft_logits=False)

    def _answer(self, request: LLMAPIRequest, prompt_ids: list[int], tokens: list[int], stats: SpeculationStats,
                finish_reason: str | None) -> LLMAPIAnswer:
        shown = tokens if request.exclude_input_from_output else prompt_ids + tokens
        return LLMAPIAnswer(
            text=self.tokenizer.decode(shown, skip_special_tokens=True),
            finish_reason=None if finish_reason is None else FINISH_REASONS[finish_reason],
            acceptance_rate=stats.acceptance_rate, total_accepted_draft_tokens=stats.accepted_tokens,
            total_draft_tokens=stats.drafted_tokens)

    async def answers(self, request: LLMAPIRequest) -> AsyncIterator[LLMAPIAnswer]:
        """The answers to ``request``: one per round when streaming, else one at the end."""
        prompt_ids = self.tokenizer.encode(request.prompt)
        stats = SpeculationStats()
        tokens: list[int] = []
        async for step in self.speculator.rounds(self._generation(request, prompt_ids), stats, offload=True):
            tokens.extend(step.tokens)
            if request.streaming or step.finished:
                yield self._answer(request, prompt_ids, tokens, stats, step.finish_reason)

