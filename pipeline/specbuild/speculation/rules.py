"""The speculative-decoding algorithm, pure: sampling transforms and the three verification rules.

Notation (Leviathan et al. 2023): the draft proposes tokens ``x_1..x_k`` from its distributions ``q_i``;
the target scores the same positions in one pass, giving ``p_1..p_{k+1}`` (one more than drafted: the
"bonus" position after the last draft token). Every rule returns the accepted prefix of the draft plus
exactly one token chosen by the target, so a round always makes progress, and the output is distributed
exactly as the target alone would produce it:

* greedy: accept while ``argmax p_i == x_i``; then emit ``argmax p`` at the first mismatch (or the bonus).
* token-match: the target samples its own token ``y_i ~ p_i``; accept while ``y_i == x_i``; emit ``y``
  at the first mismatch. Exact for any draft; needs no draft probabilities.
* rejection: accept ``x_i`` with probability ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection emit
  a sample of ``norm(max(0, p_i - q_i))``; after full acceptance emit a sample of ``p_{k+1}``.
* block rejection (Sun et al. 2024): judges the drafted block as a whole, accepting a prefix at least as long in
  expectation as token-by-token rejection does (:func:`verify_block`).

Both rejection rules need the draft's probabilities; a release picks one
(:data:`~specbuild.speculation.modes.VerificationMode`, ``speculation.verification``).

Sampling transforms (temperature, top-k, top-p) are applied by :func:`probabilities` to draft and target
logits identically, so ``q`` is the distribution the draft really sampled from and ``p`` the one the target
alone would sample from.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass
from typing import Literal

import torch

from specbuild.errors import RequestError
from specbuild.speculation.modes import VerificationMode

Rule = Literal["greedy", "token-match", "rejection"]


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples, with TensorRT-LLM's meaning of each value. Greedy when ``top_k == 1`` or
    ``temperature == 0``; ``top_k == 0`` means no top-k limit and ``top_p == 1`` no nucleus limit.

    Requests and engines read their inputs by one rule, the ``tensorrtllm`` backend's (:meth:`from_backend`),
    so a client of NVIDIA's ensemble gets the answer NVIDIA's backend gives. The penalties are TensorRT-LLM's
    (:func:`penalize`); a greedy request keeps its temperature because the backend applies it before them.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0.0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not (0.0 <= self.top_p <= 1.0):
            raise ValueError(f"top_p must be within [0, 1], got {self.top_p}")
        # TensorRT-LLM's SamplingConfig::checkRepetitionPenalty: strictly positive
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0.0):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Whether a repetition, presence or frequency penalty changes the distribution."""
        return (self.repetition_penalty, self.presence_penalty, self.frequency_penalty) != (1.0, 0.0, 0.0)

    @classmethod
    def from_backend(cls, temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                     repetition_penalty: float | None = None, presence_penalty: float | None = None,
                     frequency_penalty: float | None = None) -> SamplingParams:
        """Sampling inputs as TensorRT-LLM's ``tensorrtllm`` backend reads them (``runtime_top_k``,
        ``runtime_top_p``, ...; NVIDIA's ensemble passes ``top_k``/``top_p`` on unchanged): a ``top_p`` of 0
        or less is unset, ``top_k`` 0 or 1 with ``top_p`` unset is greedy whatever the temperature
        (TensorRT-LLM ``samplingTopKKernels.h``, ``regularizeTopKTopP``), a ``top_k`` with ``top_p`` unset
        has no nucleus limit; absent values take the backend's defaults. A value it cannot take is a
        :class:`~specbuild.errors.RequestError` naming the input."""
        try:
            k = 0 if top_k is None else int(top_k)
            p = 0.0 if top_p is None or top_p <= 0.0 else float(top_p)
            greedy = k in (0, 1) and p == 0.0
            return cls(temperature=1.0 if temperature is None else float(temperature), top_k=1 if greedy else k,
                       top_p=1.0 if p == 0.0 else p,
                       repetition_penalty=1.0 if repetition_penalty is None else float(repetition_penalty),
                       presence_penalty=0.0 if presence_penalty is None else float(presence_penalty),
                       frequency_penalty=0.0 if frequency_penalty is None else float(frequency_penalty))
        except (TypeError, ValueError) as exc:  # a value the backend cannot sample with: the request's error
            raise RequestError(str(exc)) from None

    def backend_values(self) -> dict[str, float | int]:
        """The backend inputs (``temperature``, ``runtime_top_k``, ``runtime_top_p``, penalties) that make it
        sample like this, the inverse of :meth:`from_backend`; values at the backend's default are left out."""
        values: dict[str, float | int] = {"runtime_top_k": 1} if self.is_greedy else {
            "runtime_top_k": self.top_k, "runtime_top_p": self.top_p}
        defaults = {"temperature": 1.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
        values.update({name: getattr(self, name) for name, default in defaults.items()
                       if getattr(self, name) != default})
        return values


GREEDY = SamplingParams(top_k=1)


def explicit_sampling(temperature: float | None, top_k: int | None = None,
                      top_p: float | None = None) -> dict[str, float | int | None]:
    """``temperature``/``top_k``/``top_p`` as OpenAI-style callers mean them (a temperature above 0 samples), in
    the inputs NVIDIA's backend reads (:meth:`SamplingParams.from_backend`: greedy while top_k and top_p are 0 or
    absent, whatever the temperature): a temperature above 0 without either samples the whole distribution
    (``top_p = 1``); ``None`` leaves an input out."""
    if temperature and top_k is None and top_p is None:
        top_p = 1.0
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p}


def penalize(logits: torch.Tensor, context: list[int], params: SamplingParams) -> torch.Tensor:
    """Logits ``[V]`` as TensorRT-LLM's penalty kernel leaves them for the sampler (``cpp/tensorrt_llm/kernels/
    penaltyKernels.cu``, ``batchApplyPenalty``): scaled by ``1 / (temperature + 1e-6)`` unless the temperature is
    1, then every token of ``context`` (prompt and generated so far) is penalised: the repetition penalty divides
    a positive logit and multiplies a negative one, once per token present; the presence penalty is subtracted
    once and the frequency penalty once per occurrence. The result is sampled at temperature 1."""
    logits = logits.to(torch.float32)
    if params.temperature != 1.0:
        logits = logits * (1.0 / (params.temperature + 1e-6))
    if not params.penalized or not context:
        return logits
    counts = torch.bincount(torch.tensor(context, dtype=torch.long, device=logits.device),
                            minlength=logits.shape[-1])[: logits.shape[-1]].to(torch.float32)
    seen = counts > 0
    repeated = torch.where(logits < 0, logits * params.repetition_penalty, logits / params.repetition_penalty)
    logits = torch.where(seen, repeated, logits)
    return logits - seen.to(torch.float32) * params.presence_penalty - counts * params.frequency_penalty


def allowed_tokens(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """Bitmask rows ``[n, ceil(vocab / 32)]`` (int32, bit j of word i allowing token 32 i + j: xgrammar's layout)
    as booleans ``[n, vocab]``."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.to(torch.int32)[..., None] >> shifts) & 1
    return bits.reshape(*bitmask.shape[:-1], -1)[..., :vocab].bool()


def restrict(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``logits`` with every token ``allowed`` does not have at ``-inf``: sampled after this, a distribution is
    the model's restricted to the allowed tokens and renormalised (a guide's masked distribution)."""
    return logits.masked_fill(~allowed.to(logits.device), float("-inf"))


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits ``[..., V]`` into the distribution a sampler with ``params`` draws from (float64).

    Greedy gives the one-hot of the argmax (ties broken towards the lowest id, as ``argmax`` does).
    """
    logits = logits.to(torch.float64)
    if params.is_greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(torch.float64)
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if 0.0 < params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        # Keep the smallest prefix whose mass reaches top_p (always at least the most likely token).
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a 1-D distribution."""
    return int(torch.multinomial(probs.to(torch.float64), 1, generator=generator).item())


def acceptance_probability(p: torch.Tensor, q: torch.Tensor, token: int) -> float:
    """``min(1, p(x) / q(x))`` for the drafted token ``x``; a token the draft could not draw is rejected."""
    q_x = float(q[token])
    if q_x <= 0.0:
        return 0.0
    return min(1.0, float(p[token]) / q_x)


def residual_distribution(p: torch.Tensor, q: torch.Tensor, weight: float = 1.0) -> torch.Tensor:
    """``norm(max(0, weight * p - q))``: what to sample from after a rejection (``weight`` < 1 only for
    :func:`verify_block`'s residuals).

    When ``weight * p <= q`` everywhere (with weight 1 only possible if ``p == q``, where rejection has
    probability 0; with less, where :func:`verify_block` never stops) fall back to ``p`` so the function is total.
    """
    residual = torch.clamp(weight * p.to(torch.float64) - q.to(torch.float64), min=0.0)
    total = residual.sum()
    if total <= 0.0:
        return p.to(torch.float64)
    return residual / total


@dataclass(frozen=True)
class Verification:
    """Outcome of verifying one round: ``tokens`` = the accepted draft prefix + one target token."""

    accepted: int
    tokens: list[int]


def _check_shapes(draft_tokens: list[int], target: torch.Tensor) -> None:
    if target.dim() != 2 or target.shape[0] != len(draft_tokens) + 1:
        raise ValueError(
            f"target scores must be [k+1, vocab] for k={len(draft_tokens)} draft tokens, got {tuple(target.shape)}"
        )


def _check_draft_shape(draft_tokens: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor) -> None:
    if draft_probs.shape != (len(draft_tokens), target_probs.shape[1]):
        raise ValueError(
            f"draft probabilities must be [k, vocab] = [{len(draft_tokens)}, {target_probs.shape[1]}], "
            f"got {tuple(draft_probs.shape)}"
        )


def verify_greedy(draft_tokens: list[int], target_logits: torch.Tensor) -> Verification:
    """Accept the longest prefix where the target's argmax equals the draft token."""
    _check_shapes(draft_tokens, target_logits)
    choices = target_logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(draft_tokens) and choices[accepted] == draft_tokens[accepted]:
        accepted += 1
    return Verification(accepted, list(draft_tokens[:accepted]) + [int(choices[accepted])])


def verify_token_match(
    draft_tokens: list[int], target_probs: torch.Tensor, generator: torch.Generator | None
) -> Verification:
    """The target samples each position itself and accepts while its sample equals the draft token."""
    _check_shapes(draft_tokens, target_probs)
    for position, drafted in enumerate(draft_tokens):
        chosen = sample(target_probs[position], generator)
        if chosen != drafted:
            return Verification(position, list(draft_tokens[:position]) + [chosen])
    return Verification(len(draft_tokens), list(draft_tokens) + [sample(target_probs[-1], generator)])


def verify_rejection(
    draft_tokens: list[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verification:
    """Speculative rejection sampling: exact for any draft distribution ``q`` the drafts were drawn from."""
    _check_shapes(draft_tokens, target_probs)
    _check_draft_shape(draft_tokens, draft_probs, target_probs)
    for position, drafted in enumerate(draft_tokens):
        p, q = target_probs[position], draft_probs[position]
        threshold = acceptance_probability(p, q, drafted)
        if threshold < 1.0:
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if u >= threshold:
                corrected = sample(residual_distribution(p, q), generator)
                return Verification(position, list(draft_tokens[:position]) + [corrected])
    return Verification(len(draft_tokens), list(draft_tokens) + [sample(target_probs[-1], generator)])


def block_weights(draft_tokens: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor) -> list[float]:
    """Block verification's weights ``w_0..w_k``: ``w_0 = 1``, ``w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))``
    (0 for a token the draft could not draw, as :func:`acceptance_probability` rejects it)."""
    weights = [1.0]
    for position, drafted in enumerate(draft_tokens):
        q_x = float(draft_probs[position, drafted])
        ratio = float(target_probs[position, drafted]) / q_x if q_x > 0.0 else 0.0
        weights.append(min(1.0, weights[-1] * ratio))
    return weights


def block_stop_probabilities(weights: list[float], draft_probs: torch.Tensor,
                             target_probs: torch.Tensor) -> list[float]:
    """Block verification's ``h_1..h_k`` for ``weights`` (:func:`block_weights`): ``h_k = w_k``; for ``i < k``
    ``h_i = r_i / (r_i + 1 - w_i)`` with ``r_i = sum_x max(0, w_i p_{i+1}(x) - q_{i+1}(x))`` the residual mass at
    the next position (0 where ``w_i = 1`` and ``r_i = 0``: there ``p_{i+1} = q_{i+1}`` and a later ``h`` is 1)."""
    k = len(weights) - 1
    if k == 0:
        return []
    inner = torch.tensor(weights[1:k], dtype=torch.float64)
    residual = torch.clamp(inner[:, None] * target_probs[1:k].to(torch.float64)
                           - draft_probs[1:k].to(torch.float64), min=0.0).sum(dim=-1).tolist()
    stops = [r / (r + (1.0 - w)) if r + (1.0 - w) > 0.0 else 0.0 for r, w in zip(residual, weights[1:k])]
    return stops + [weights[k]]


def verify_block(
    draft_tokens: list[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verification:
    """Block verification (Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro, Suresh 2024, "Block Verification
    Accelerates Speculative Decoding", arXiv 2403.10444, Algorithm 2): exact for any draft ``q`` the drafts were
    drawn from, like :func:`verify_rejection`, and accepts at least as many tokens in expectation.

    With weights ``w_i`` (:func:`block_weights`) and stop probabilities ``h_i`` (:func:`block_stop_probabilities`),
    draw ``eta_1..eta_k ~ U[0, 1)`` and keep ``tau``, the largest ``i`` with ``eta_i < h_i`` (0 if none): the
    prefix ``x_1..x_tau`` is accepted, then one token is emitted from ``p_{k+1}`` if ``tau = k``, else from
    ``norm(max(0, w_tau p_{tau+1} - q_{tau+1}))``. Where token-by-token rejection stops at the first rejection,
    a rejected token here may still be followed by an accepted block: the weights carry the target's surplus
    probability forward along the block.

    Lossless: for a draft block ``x ~ q``, the emitted prefix plus its correction, continued by the target's own
    samples, is distributed as the target's ``p`` over the whole block (the paper's Theorem 1; checked by exact
    enumeration in ``tests/speculation/test_rules.py``). With ``k = 1`` it is token-by-token rejection. Seeded,
    it draws ``k`` uniforms then one token from ``generator``, so a seed gives the same answer every time.
    """
    _check_shapes(draft_tokens, target_probs)
    _check_draft_shape(draft_tokens, draft_probs, target_probs)
    weights = block_weights(draft_tokens, draft_probs, target_probs)
    stops = block_stop_probabilities(weights, draft_probs, target_probs)
    eta = torch.rand(len(draft_tokens), generator=generator, dtype=torch.float64).tolist()
    accepted = max((i for i, (u, h) in enumerate(zip(eta, stops), start=1) if u < h), default=0)
    if accepted == len(draft_tokens):
        return Verification(accepted, list(draft_tokens) + [sample(target_probs[-1], generator)])
    residual = residual_distribution(target_probs[accepted], draft_probs[accepted], weights[accepted])
    return Verification(accepted, list(draft_tokens[:accepted]) + [sample(residual, generator)])


def expected_accepted(draft_tokens: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                      mode: VerificationMode) -> float:
    """How many of ``draft_tokens`` a rejection rule accepts in expectation, exactly, for this drafted block: token
    by token ``sum_i prod_{j <= i} min(1, p_j(x_j) / q_j(x_j))``; as a block ``sum_t t P(tau = t)`` with
    ``P(tau = t) = h_t prod_{j > t} (1 - h_j)``. Averaged over blocks drawn from ``q`` it is each rule's acceptance;
    block verification's is never below token-by-token rejection's there (not block by block)."""
    if mode == "token":
        chances = (acceptance_probability(target_probs[i], draft_probs[i], x) for i, x in enumerate(draft_tokens))
        return sum(itertools.accumulate(chances, operator.mul))
    stops = block_stop_probabilities(block_weights(draft_tokens, draft_probs, target_probs), draft_probs, target_probs)
    return sum(t * stops[t - 1] * math.prod(1.0 - h for h in stops[t:]) for t in range(1, len(stops) + 1))


def verify(
    draft_tokens: list[int],
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    draft_logits: torch.Tensor | None = None,
    mode: VerificationMode = "token",
) -> Verification:
    """Pick the rule from the request: greedy, rejection (draft logits given; token by token or as a block, by
    ``mode``) or token matching."""
    if params.is_greedy:
        return verify_greedy(draft_tokens, target_logits)
    target_probs = probabilities(target_logits, params)
    if draft_logits is not None and len(draft_tokens) > 0:
        rejection = verify_block if mode == "block" else verify_rejection
        return rejection(draft_tokens, probabilities(draft_logits, params), target_probs, generator)
    return verify_token_match(draft_tokens, target_probs, generator)


def make_generator(seed: int | None, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch generator seeded with ``seed`` (a fresh random seed when None)."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return generator


def round_seed(seed: int | None, round_index: int, role: int) -> int | None:
    """Derive an independent seed for one round and role (0 draft, 1 target) from the request's seed.

    Engines reseed on every call, so reusing the request's seed each round would replay the same random
    numbers; a splitmix64-style mix keeps rounds independent and the whole request reproducible.
    """
    if seed is None:
        return None
    z = (int(seed) + 0x9E3779B97F4A7C15 * (2 * round_index + role + 1)) & 0xFFFF_FFFF_FFFF_FFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFF_FFFF_FFFF_FFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFF_FFFF_FFFF_FFFF
    return (z ^ (z >> 31)) & 0x7FFF_FFFF_FFFF_FFFF
