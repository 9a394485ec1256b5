"""Guided decoding: a request's answer held to a JSON schema, a regular expression or a grammar (xgrammar).

A guide is NVIDIA's pair of inputs, ``guided_decoding_guide_type`` and ``guided_decoding_guide``
(:class:`~specbuild.speculation.guide_spec.GuideSpec`, checked before any engine call). A :class:`GuideCompiler` compiles one per (tokenizer, guide),
in a bounded cache and within a time limit (the libraries have none: refused by size first, then given up after
:data:`COMPILE_SECONDS`); each request gets its own :class:`Guide`, a matcher at the end of the accepted tokens.

Where the mask is applied: the loop holds the matcher and the engines keep no grammar state. Each engine call of a
guided request carries the allowed tokens of every position it makes (``EngineRequest.token_masks``, xgrammar's
int32 bitmask rows): a verification the masks along the drafted tokens (so a drafted token the grammar forbids
is a rejection and the target's distributions are masked and renormalised), a generation one position per call
(:meth:`Guide.constrained` turns a call for n tokens into n calls, each with the mask after the tokens before
it, and rolls the matcher back after), which is how the draft proposes under the mask too. A proposal is cut to
the prefix the grammar accepts (:meth:`Guide.admissible`: prompt lookup's). xgrammar is imported here only, at
the first compile.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from specbuild.errors import RequestError
from specbuild.speculation.engine_call import EngineCall, EngineOutput, EngineRequest
from specbuild.speculation.guide_spec import GUIDE_INPUT, GuideSpec

COMPILE_SECONDS = 10.0  # a compile still running then is given up (its thread finishes unseen)
CACHED_GRAMMARS = 64  # compiled guides kept per tokenizer, least recently used first out


def _compile(compiler: Any, spec: GuideSpec, json_whitespace: bool) -> Any:
    if spec.type == "json":
        return compiler.compile_builtin_json_grammar()
    if spec.type == "json_schema":
        return compiler.compile_json_schema(spec.text, any_whitespace=json_whitespace)
    if spec.type == "regex":
        return compiler.compile_regex(spec.text)
    return compiler.compile_grammar(spec.text)


def engine_guide(spec: GuideSpec) -> GuideSpec:
    """``spec`` as specbuild sends it to a ``tensorrtllm`` target engine: a ``json_schema`` guide as the
    ``ebnf_grammar`` of its compact JSON (what specbuild compiles it to), since the backend compiles a
    ``json_schema`` guide with xgrammar's default any whitespace (``guidedDecoder.cpp``) and would answer other text
    than the torch release; the backend takes ``ebnf_grammar`` guides as they are (tensorrtllm_backend r26.04
    ``docs/guided_decoding.md``, guide type 4). Other guides are unchanged."""
    if spec.type != "json_schema":
        return spec
    import xgrammar

    try:
        grammar = xgrammar.Grammar.from_json_schema(spec.text, any_whitespace=False)
    except (RuntimeError, ValueError) as exc:  # compiled by the orchestrator first: a valid schema converts
        raise RequestError(f"{GUIDE_INPUT} (json_schema) has no grammar: {exc}",
                           f"fix the {GUIDE_INPUT} input") from None
    return GuideSpec("ebnf_grammar", str(grammar))


class GuideCompiler:
    """Compiles guides for one tokenizer, each once (an LRU of :data:`CACHED_GRAMMARS`), off the caller's thread
    and within ``timeout`` seconds; thread-safe. ``vocab_size`` is the model's (its output head may be padded
    beyond the tokenizer's vocabulary). ``tokenizer``: a transformers tokenizer, or None with ``tokenizer_info``, an
    ``xgrammar.TokenizerInfo`` made otherwise (the tensorrtllm backend's file: package/backend_guides.py).

    ``json_whitespace``: whether a ``json_schema`` guide allows any whitespace. specbuild's guides are compact JSON
    (no whitespace beyond one space after ':' and ','): with any whitespace allowed a model can spend its tokens on
    blanks between values and never finish (vLLM's guided-JSON reports). The ``tensorrtllm`` backend's stand-in
    compiles as the backend does, with xgrammar's default (True); specbuild sends it compact grammars
    (:func:`engine_guide`)."""

    def __init__(self, tokenizer: Any, vocab_size: int, *, timeout: float = COMPILE_SECONDS,
                 cached: int = CACHED_GRAMMARS, tokenizer_info: Any = None, json_whitespace: bool = False) -> None:
        import xgrammar

        self.json_whitespace = json_whitespace
        self.vocab_size = vocab_size
        self.timeout = timeout
        self.cached = cached
        self._xgrammar = xgrammar
        info = tokenizer_info or xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._grammars: OrderedDict[GuideSpec, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="guide-compile")

    def compile(self, spec: GuideSpec) -> Any:
        """The compiled guide (cached); an invalid or too costly guide is a RequestError naming it."""
        with self._lock:
            if spec in self._grammars:
                self._grammars.move_to_end(spec)
                return self._grammars[spec]
        future = self._pool.submit(_compile, self._compiler, spec, self.json_whitespace)
        try:
            grammar = future.result(timeout=self.timeout)
        except FutureTimeout:
            raise RequestError(f"{GUIDE_INPUT} ({spec.type}) did not compile within {self.timeout:g} s",
                               "send a simpler schema, regular expression or grammar") from None
        except (RuntimeError, ValueError) as exc:  # xgrammar's parse errors are RuntimeErrors (ValueError: JSON)
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            reason = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", lines[0])  # xgrammar's "[time] file.cc:line: " prefix
            raise RequestError(f"{GUIDE_INPUT} is not a valid {spec.type.replace('_', ' ')}: {reason}",
                               f"fix the {GUIDE_INPUT} input") from None
        with self._lock:
            self._grammars[spec] = grammar
            while len(self._grammars) > self.cached:
                self._grammars.popitem(last=False)
        return grammar

    def guide(self, spec: GuideSpec, end_id: int | None) -> Guide:
        """A new request's matcher for ``spec``; the grammar, once complete, allows ``end_id`` only (none: the
        answer ends where the grammar does)."""
        grammar = self.compile(spec)
        if end_id is None:
            matcher = self._xgrammar.GrammarMatcher(grammar, terminate_without_stop_token=True)
        else:
            matcher = self._xgrammar.GrammarMatcher(grammar, override_stop_tokens=[end_id])
        return Guide(matcher, self._xgrammar, self.vocab_size)


class ReleaseGuides:
    """A release's guides: its tokenizer (a folder) loaded and the compiler made at the first guided request, so a
    server that serves none never imports xgrammar; call it as ``GuideCompiler.guide``. Thread-safe."""

    def __init__(self, tokenizer_dir: Path, vocab_size: int) -> None:
        self.tokenizer_dir, self.vocab_size = tokenizer_dir, vocab_size
        self._compiler: GuideCompiler | None = None
        self._lock = threading.Lock()

    def __call__(self, spec: GuideSpec, end_id: int | None) -> Guide:
        with self._lock:
            if self._compiler is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(str(self.tokenizer_dir), trust_remote_code=False)
                self._compiler = GuideCompiler(tokenizer, self.vocab_size)
        return self._compiler.guide(spec, end_id)


class Guide:
    """One request's matcher, at the end of the tokens the request has kept so far (:meth:`accept`); one request
    at a time (the loop resets it when a request starts)."""

    def __init__(self, matcher: Any, xgrammar: Any, vocab_size: int) -> None:
        self._matcher = matcher
        self._xgrammar = xgrammar
        self.vocab_size = vocab_size
        self.seconds = 0.0  # in the matcher since the answer started: what guided decoding costs besides the engines

    def reset(self) -> None:
        """Back to the start of the answer."""
        self._matcher.reset()
        self.seconds = 0.0

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - started

    @property
    def finished(self) -> bool:
        """Whether the grammar is complete and nothing may follow (its end token accepted, or none needed)."""
        return bool(self._matcher.is_terminated())

    def accept(self, tokens: Sequence[int]) -> None:
        """Advance past tokens the request keeps; each must be one the masks allowed."""
        with self._timed():
            for token in tokens:
                if not self._matcher.accept_token(int(token)):
                    raise RuntimeError(f"token {token} was kept although the grammar forbids it")

    def admissible(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` (a proposal) the grammar accepts from here, in order."""
        accepted = 0
        with self._timed():
            for token in tokens:
                if self._matcher.is_terminated() or not self._matcher.accept_token(int(token)):
                    break
                accepted += 1
            if accepted:
                self._matcher.rollback(accepted)
        return accepted

    def masks(self, tokens: Sequence[int] = ()) -> torch.Tensor:
        """The allowed tokens here and after each of ``tokens`` (which the grammar must accept in order):
        ``[len(tokens) + 1, ceil(vocab / 32)]`` int32 bitmask rows, the matcher left where it was."""
        with self._timed():
            return self._masks(tokens)

    def _masks(self, tokens: Sequence[int]) -> torch.Tensor:
        bitmask = self._xgrammar.allocate_token_bitmask(len(tokens) + 1, self.vocab_size)  # all allowed
        advanced = 0
        try:
            for index, token in enumerate(tokens):
                self._matcher.fill_next_token_bitmask(bitmask, index)
                if not self._matcher.accept_token(int(token)):
                    raise RuntimeError(f"token {token} is not admissible: cut proposals with admissible() first")
                advanced += 1
                if self._matcher.is_terminated():
                    return bitmask  # the end token: what follows it is cut from the answer, the rows stay all-allowed
            self._matcher.fill_next_token_bitmask(bitmask, len(tokens))
            return bitmask
        finally:
            if advanced:
                self._matcher.rollback(advanced)

    def constrained(self, call: EngineCall) -> EngineCall:
        """``call`` under this guide: a verification with the masks along its drafted tokens, a generation of n
        tokens as n one-token calls, each with the mask after the tokens before it (the matcher rolled back
        after, to where it was), stopping early at the end token or a complete grammar."""

        async def guided(request: EngineRequest) -> EngineOutput:
            if request.draft_tokens:
                return await call(replace(request, token_masks=self.masks(request.draft_tokens)))
            tokens: list[int] = []
            logits: list[torch.Tensor] = []
            advanced = 0
            try:
                for step in range(request.max_new_tokens):
                    output = await call(replace(
                        request, input_ids=list(request.input_ids) + tokens, max_new_tokens=1,
                        min_new_tokens=1 if step < request.min_new_tokens else 0,
                        seed=None if request.seed is None else (request.seed + step) & 0x7FFF_FFFF_FFFF_FFFF,
                        token_masks=self.masks()))
                    if not output.tokens:
                        break
                    token = output.tokens[0]
                    with self._timed():
                        if not self._matcher.accept_token(token):
                            raise RuntimeError(f"the engine returned token {token}, which its mask forbids")
                    advanced += 1
                    tokens.append(token)
                    if output.logits is not None:
                        logits.append(output.logits[0])
                    if token == request.end_id or self._matcher.is_terminated():
                        break
            finally:
                if advanced:
                    with self._timed():
                        self._matcher.rollback(advanced)
            return EngineOutput(tokens, torch.stack(logits) if logits and request.return_logits else None)

        return guided
