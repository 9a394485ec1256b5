"""The torch runtime's engine: an HF causal LM served with the ``tensorrtllm`` backend's semantics.

One :class:`TorchEngine` runs one model (target or draft). A request either generates up to
``max_new_tokens`` tokens autoregressively, or, given ``draft_tokens``, scores them in one forward pass and
returns the accepted prefix plus one target token (the speculative verification of
:mod:`specbuild.speculation.rules`). KV caches of recent sequences are kept in a :class:`PrefixCache` and the
longest cached prefix is reused, as TensorRT-LLM's KV-cache block reuse does, so a speculative round costs
the new tokens rather than the whole sequence. On a CPU, float32 linears run on weights packed for a few rows
(:class:`PackedLinear`), so verifying K drafted tokens costs about one decoding step rather than K+1. A draft
checkpoint with a ``head_vocabulary.json`` runs its output head over those ids only (:class:`SubVocabularyHead`).
Grouped-query attention on a CPU reads the cached keys once for all the query heads of a group
(:mod:`~specbuild.runtimes.torch.attention`), so verification does not grow dearer than a step with the context.
"""

from __future__ import annotations

import copy
import inspect
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from specbuild.checkpoint.head_vocabulary import HeadVocabulary, read_head_vocabulary
from specbuild.errors import RequestError
from specbuild.runtimes.torch.attention import use_packed_gqa
from specbuild.runtimes.torch.threads import ThreadGovernor
from specbuild.speculation.engine_call import EngineOutput, EngineRequest
from specbuild.speculation.rules import (SamplingParams, allowed_tokens, make_generator, penalize, probabilities,
                                        restrict, sample, verify)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEFAULT_CACHE_TOKENS = 16384  # KV-cache tokens kept for reuse (0: no reuse)
# Rows the packed weights are laid out for: a verification call's K+1 (docs/benchmarks.md, "Cheap verification")
PACKED_ROWS = 8


def resolve_device(requested: str) -> str:
    """``torch.device`` ``auto``: CUDA where this machine has a GPU, else the CPU; ``cpu`` and ``cuda`` as they are."""
    if requested != "auto":
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


class PackedLinear(torch.nn.Module):
    """A float32 ``nn.Linear`` on the CPU whose weight oneDNN has reordered once for products of a few rows.

    torch's default CPU product (MKL) costs about as much per row for 2-6 rows as for one on CPUs where MKL
    has no kernel for small row counts (AMD, measured: the 49k-row output head 12 / 31 / 46 ms for 1 / 2 / 3
    rows), which makes verifying K drafted tokens cost nearly K+1 target steps. With the weight packed for a
    few rows (``torch.ops.mkldnn._reorder_linear_weight``, the layout inductor's CPU freezing pass uses) the
    same product reads the weight once for all rows (12 / 13 / 13.5 ms). Every call of the engine goes
    through it, a one-row step as much as a verification, so the target alone and the target verifying
    compute with the same kernels."""

    def __init__(self, linear: torch.nn.Linear, rows: int = PACKED_ROWS) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def can_pack_linears(model: torch.nn.Module) -> bool:
    """Whether :class:`PackedLinear` applies: float32 weights on a CPU, and a torch built with oneDNN."""
    weight = next(model.parameters())
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and all(hasattr(torch.ops.mkldnn, op) for op in ("_reorder_linear_weight", "_linear_pointwise")))


def pack_linears(model: torch.nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` (the output head too) by a :class:`PackedLinear`, where that
    applies; returns how many were replaced. A tied head gets a packed copy; the embedding keeps its weight."""
    if not can_pack_linears(model):
        return 0
    linears = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, torch.nn.Linear)]
    for parent, name, child in linears:
        setattr(parent, name, PackedLinear(child))
    return len(linears)


def scatter_logits(logits: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[rows, len(ids)]`` logits of a sub-vocabulary -> ``[rows, vocab_size]``, -inf outside ``ids``."""
    full = logits.new_full((logits.shape[0], vocab_size), float("-inf"))
    full[:, ids] = logits
    return full


class SubVocabularyHead:
    """A model's output head cut to the rows of a :class:`HeadVocabulary`, its logits scattered back.

    The head computes ``len(ids)`` logits instead of the whole vocabulary's; :meth:`scatter` puts them back at
    their ids in a vocabulary-wide row, -inf elsewhere. Everything after the head (bad words, the end token
    before ``min_tokens``, penalties, top-k/top-p, argmax, rejection sampling against the target) then works in
    the target's ids unchanged, and exactly: the draft's distribution is its own, zero outside its ids, and a
    token it proposes is always one of them."""

    def __init__(self, model: torch.nn.Module, vocabulary: HeadVocabulary, vocab_size: int) -> None:
        head = model.get_output_embeddings()
        self.ids = torch.tensor(vocabulary.ids, dtype=torch.long, device=head.weight.device)
        self.vocab_size = vocab_size
        reduced = torch.nn.Linear(head.in_features, vocabulary.size, bias=head.bias is not None,
                                  dtype=head.weight.dtype, device=head.weight.device)
        with torch.no_grad():
            reduced.weight.copy_(head.weight[self.ids])  # a copy: a tied embedding keeps every row
            if head.bias is not None:
                reduced.bias.copy_(head.bias[self.ids])
        model.set_output_embeddings(reduced)

    def scatter(self, logits: torch.Tensor) -> torch.Tensor:
        return scatter_logits(logits, self.ids, self.vocab_size)


def cache_keyword(model: Any) -> str:
    """The forward argument that takes a KV cache: transformers 5.x renamed it; 4.57 (TensorRT-LLM 1.2 images)
    only knows ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _common_prefix_length(a: list[int], b: tuple[int, ...]) -> int:
    limit = min(len(a), len(b))
    index = 0
    while index < limit and a[index] == b[index]:
        index += 1
    return index


class PrefixCache:
    """An LRU of KV caches keyed by the tokens they hold; a lookup takes the entry sharing the longest prefix.

    Taking an entry removes it (the caller extends it in place and puts the grown cache back), so one
    cache object is never used by two requests at once. An entry is cut back in place only when the caller's
    tokens leave it at their last token (the same sequence after a rejected draft); any other caller sharing
    part of it (another request with the same chat template) gets a cut copy and the entry stays, or
    requests served in turn would each destroy the next one's cache and every call would read its whole
    sequence again (measured: 4 interleaved requests, 3-9x the cost of a decoding step per call). The cache
    holds at most ``max_tokens`` tokens in all (``max_tokens_in_paged_kv_cache``, as TensorRT-LLM bounds its
    KV cache); the oldest entries go first.
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max(0, max_tokens)
        self._entries: OrderedDict[int, tuple[tuple[int, ...], Any]] = OrderedDict()
        self._next_key = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.reused_tokens = 0

    def take(self, tokens: list[int]) -> tuple[Any | None, int]:
        """Return ``(cache, length)``: a cache cropped to the longest reusable prefix, or ``(None, 0)``.

        At most ``len(tokens) - 1`` tokens are reused, so the caller always feeds one token and gets logits.
        """
        with self._lock:
            best_key, best_length = None, 0
            for key, (cached_tokens, _) in self._entries.items():
                length = _common_prefix_length(tokens, cached_tokens)
                if length > best_length:
                    best_key, best_length = key, length
            if best_key is None:
                return None, 0
            cached_tokens, cache = self._entries[best_key]
            length = min(best_length, len(tokens) - 1)
            if length <= 0:
                return None, 0
            surplus = len(cached_tokens) - length
            if surplus > 0 and length < len(tokens) - 1:
                cache = copy.deepcopy(cache)  # another sequence's: it keeps its own
            else:
                del self._entries[best_key]
        if surplus > 0:
            cache.crop(-surplus)  # negative = tokens to drop: works with transformers 4.57 and 5.x
        self.hits += 1
        self.reused_tokens += length
        return cache, length

    def put(self, tokens: list[int], cache: Any) -> None:
        if not 0 < len(tokens) <= self.max_tokens:
            return
        with self._lock:
            self._entries[self._next_key] = (tuple(tokens), cache)
            self._next_key += 1
            while sum(len(cached) for cached, _ in self._entries.values()) > self.max_tokens:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def reset(self) -> None:
        """Forget every entry and the counts."""
        with self._lock:
            self._entries.clear()
            self.hits = self.reused_tokens = 0


def mask_bad_words(logits: torch.Tensor, context: list[int], bad_words: list[list[int]]) -> torch.Tensor:
    """Forbid the last token of every bad word whose other tokens end ``context`` (TensorRT-LLM semantics)."""
    if not bad_words:
        return logits
    banned = [word[-1] for word in bad_words if word and (len(word) == 1 or context[-(len(word) - 1):] == word[:-1])]
    if not banned:
        return logits
    logits = logits.clone()
    logits[banned] = float("-inf")
    return logits


class TorchEngine:
    """Runs one HF causal LM checkpoint; thread-safe (one request at a time per engine)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        max_seq_len: int | None = None,
        max_draft_len: int = 0,
        cache_tokens: int = DEFAULT_CACHE_TOKENS,
        trust_remote_code: bool = False,
        pack_weights: bool = True,
        governor: ThreadGovernor | None = None,
    ) -> None:
        """``pack_weights``: run the linears as :class:`PackedLinear` where that applies (float32 on a CPU). A
        ``head_vocabulary.json`` in ``model_dir`` (validated against the head's rows) makes the head a
        :class:`SubVocabularyHead`; its logits are returned vocabulary-wide all the same. ``governor`` chooses
        each step's intra-op threads (None: the process's setting)."""
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=DTYPES[dtype], use_safetensors=True, trust_remote_code=trust_remote_code
        ).to(self.device)
        self.model.eval()
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.head_vocabulary = read_head_vocabulary(Path(model_dir), self.vocab_size)
        self._head = (SubVocabularyHead(self.model, self.head_vocabulary, self.vocab_size)
                      if self.head_vocabulary is not None else None)
        self.packed_linears = pack_linears(self.model) if pack_weights else 0
        # where measured to pay: a CPU (runtimes/torch/attention.py)
        self.packed_attention = self.device.type == "cpu" and use_packed_gqa(self.model)
        self._cache_argument = cache_keyword(self.model)
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        config = self.model.config
        self.max_seq_len = int(max_seq_len or getattr(config, "max_position_embeddings", 2048))
        self.max_draft_len = max_draft_len
        self.cache = PrefixCache(cache_tokens)
        self.governor = governor
        self._lock = threading.Lock()

    # -- public -----------------------------------------------------------------------------------
    def run(self, request: EngineRequest) -> EngineOutput:
        self._validate(request)
        with self._lock, torch.inference_mode():
            if request.draft_tokens:
                return self._verify(request)
            return self._generate(request)

    def sequence_logits(self, sequence: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[len, vocab]`` at every position of one token sequence, without the prefix cache:
        what a measurement of agreement reads. Vocabulary-wide, as every other output of the engine (a
        sub-vocabulary head's logits scattered back), so an argmax is a token id."""
        with self._lock, torch.inference_mode():
            return self._forward(sequence.tolist(), self._new_cache(), len(sequence))

    def warm_up(self, prompt_tokens: int = 16) -> None:
        """Take the paths of a first request once, on made-up tokens, and forget them: a prefill, decoding steps
        with their logits (what a draft returns), a sampled step and, for a target, a verification of
        ``max_draft_len`` drafted tokens with their logits. PyTorch and oneDNN allocate and choose their kernels
        when a shape first runs; the engine model calls this before it reports ready, so the first request costs
        what later ones do. The prefix cache is emptied after: no request reuses the made-up sequence."""
        ids = [1 + index % (self.vocab_size - 1) for index in range(prompt_tokens)]
        self.run(EngineRequest(ids, 2, return_logits=True))
        self.run(EngineRequest(ids, 1, sampling=SamplingParams(temperature=1.0), seed=0))
        drafts = ids[: self.max_draft_len]
        if drafts:
            self.run(EngineRequest(ids, 1, draft_tokens=drafts, return_logits=True,
                                   draft_logits=torch.zeros(len(drafts), self.vocab_size, device=self.device)))
        self.cache.reset()

    # -- internals --------------------------------------------------------------------------------
    def _validate(self, request: EngineRequest) -> None:
        if not request.input_ids:
            raise RequestError("input_ids is empty", "send at least one prompt token")
        if request.max_new_tokens < 1:
            raise RequestError(f"request_output_len must be >= 1, got {request.max_new_tokens}")
        draft_count = len(request.draft_tokens or [])
        if draft_count > self.max_draft_len:
            raise RequestError(
                f"Number of draft tokens ({draft_count}) is larger than maximum number of draft tokens "
                f"({self.max_draft_len})",
                "ask for fewer draft tokens, or rebuild the target with a larger max_draft_len",
            )
        total = len(request.input_ids) + max(request.max_new_tokens, draft_count + 1)
        if total > self.max_seq_len:
            raise RequestError(
                f"input ({len(request.input_ids)} tokens) + output ({request.max_new_tokens}) exceeds the engine's "
                f"max_seq_len ({self.max_seq_len})",
                "shorten the prompt or ask for fewer tokens",
            )
        if request.end_id is not None and not 0 <= request.end_id < self.vocab_size:
            raise RequestError(f"end_id {request.end_id} is outside the vocabulary [0, {self.vocab_size})")
        bad_word_tokens = [token for word in request.bad_words for token in word]
        for token in request.input_ids + (request.draft_tokens or []) + bad_word_tokens:
            if not 0 <= token < self.vocab_size:
                raise RequestError(f"token id {token} is outside the vocabulary [0, {self.vocab_size})")
        positions = draft_count + 1 if draft_count else request.max_new_tokens
        words = -(-self.vocab_size // 32)
        masks = request.token_masks
        if masks is not None and (masks.dim() != 2 or masks.shape[0] < positions or masks.shape[1] != words):
            raise RequestError(f"token_masks must be [{positions}, {words}] int32 bitmask rows, got "
                               f"{tuple(masks.shape)}", "send one guide mask row per new position")
        if request.draft_logits is not None and tuple(request.draft_logits.shape) != (draft_count, self.vocab_size):
            raise RequestError(
                f"draft_logits must be [{draft_count}, {self.vocab_size}], got {tuple(request.draft_logits.shape)}",
                "draft and target must have the same vocabulary size for draft-logits acceptance",
            )

    def _forward(self, tokens: list[int], cache: Any, keep: int) -> torch.Tensor:
        """Feed ``tokens`` after what ``cache`` holds; return float32 logits ``[keep, vocab]`` of the last ``keep``.

        The output head runs on those positions only where the model allows it: over a prompt, or over the
        tokens a draft catches up on after a round, a 49k-row head on every position costs more than a small
        draft's decoder layers."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        kept = {"logits_to_keep": keep} if self._keeps_logits else {}
        count = self.governor.choose() if self.governor is not None else None
        if count is not None and count != torch.get_num_threads():
            torch.set_num_threads(count)
        started = time.perf_counter()
        out = self.model(input_ids=ids, use_cache=True, **kept, **{self._cache_argument: cache})
        logits = out.logits[0, -keep:].float()
        if self.governor is not None:
            self.governor.observe(count, len(tokens), time.perf_counter() - started)
        return logits if self._head is None else self._head.scatter(logits)

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache()

    def _take_cache(self, tokens: list[int]) -> tuple[Any, int]:
        cache, length = self.cache.take(tokens)
        return (cache if cache is not None else self._new_cache()), length

    def _pick(self, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
        if params.is_greedy:
            return int(logits.argmax())
        return sample(probabilities(logits, params), generator)

    def _masked(self, logits: torch.Tensor, context: list[int], request: EngineRequest, step: int) -> torch.Tensor:
        """The logits of new token number ``step`` after ``context``, with the tokens it may not be removed: those
        its guide's mask forbids, bad words, and the end token before ``min_new_tokens`` (TensorRT-LLM
        ``penaltyKernels.cu``, min length) unless a guide allows nothing else there (a complete grammar ends the
        answer, min_tokens or not)."""
        if request.token_masks is not None:
            logits = restrict(logits, allowed_tokens(request.token_masks[step], self.vocab_size))
        logits = mask_bad_words(logits, context, request.bad_words)
        if request.end_id is not None and step < request.min_new_tokens:
            others = int(torch.isfinite(logits).sum()) - int(torch.isfinite(logits[request.end_id]))
            if request.token_masks is None or others > 0:
                logits = logits.clone()
                logits[request.end_id] = float("-inf")
        return logits

    @staticmethod
    def _sampled(rows: torch.Tensor, contexts: list[list[int]], params: SamplingParams) -> tuple[torch.Tensor,
                                                                                                   SamplingParams]:
        """``rows`` and ``params`` as the sampler sees them: with penalties, the temperature and the penalties
        applied to each row for its context (:func:`~specbuild.speculation.rules.penalize`), sampled at
        temperature 1 then; without, unchanged."""
        if not params.penalized:
            return rows, params
        penalized = torch.stack([penalize(row, context, params) for row, context in zip(rows, contexts)])
        return penalized, params if params.is_greedy else replace(params, temperature=1.0)

    def _generate(self, request: EngineRequest) -> EngineOutput:
        generator = make_generator(request.seed)
        sequence = list(request.input_ids)
        cache, reused = self._take_cache(sequence)
        feed = sequence[reused:]
        tokens: list[int] = []
        kept_logits: list[torch.Tensor] = []
        for step in range(request.max_new_tokens):
            logits = self._masked(self._forward(feed, cache, 1)[-1], sequence, request, step)
            sampled, params = self._sampled(logits[None], [sequence], request.sampling)
            token = self._pick(sampled[0], params, generator)
            tokens.append(token)
            sequence.append(token)
            if request.return_logits:
                kept_logits.append(logits)
            if token == request.end_id:
                break
            feed = [token]
        self.cache.put(sequence[:-1], cache)  # the last token was never fed
        return EngineOutput(tokens, torch.stack(kept_logits) if request.return_logits else None)

    def _verify(self, request: EngineRequest) -> EngineOutput:
        """Score the draft in one pass; each position's logits are those generating would have there (bad words,
        min tokens, penalties for the context up to it), the draft's logits penalised the same way."""
        drafts = list(request.draft_tokens or [])
        prompt = list(request.input_ids)
        cache, reused = self._take_cache(prompt)
        contexts = [prompt + drafts[:position] for position in range(len(drafts) + 1)]
        raw = self._forward(prompt[reused:] + drafts, cache, len(drafts) + 1)
        logits = torch.stack([self._masked(row, context, request, position)
                              for position, (row, context) in enumerate(zip(raw, contexts))])
        target, params = self._sampled(logits, contexts, request.sampling)
        draft = request.draft_logits
        if draft is not None and len(drafts):
            if request.token_masks is not None:  # the draft sampled under the same masks: q renormalised as p is
                draft = restrict(draft, allowed_tokens(request.token_masks[: len(drafts)], self.vocab_size))
            draft, _ = self._sampled(draft, contexts, request.sampling)
        outcome = verify(drafts, target, params, make_generator(request.seed), draft, request.verification)
        rejected = len(drafts) - outcome.accepted
        if rejected:
            cache.crop(-rejected)
        self.cache.put(prompt + drafts[: outcome.accepted], cache)
        tokens = outcome.tokens
        if request.end_id is not None and request.end_id in tokens:
            tokens = tokens[: tokens.index(request.end_id) + 1]
        return EngineOutput(tokens, logits[: len(tokens)] if request.return_logits else None)
