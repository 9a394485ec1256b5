"""The request settings, one row each: what a request may set that the release otherwise decides.

Every surface derives from this table, as every metric surface derives from ``stats.METRICS``: the ensemble's and
the orchestrator's inputs (:mod:`specbuild.package.contract`), a row's inputs read once
(:mod:`specbuild.triton_models.public_rows`), the merge with the release's defaults (:func:`resolve`), the Python
client's keywords (:mod:`specbuild.serve.client`), the OpenAI API's extra fields (:mod:`specbuild.serve.openai_api`),
``specbuild generate``'s options and the engine-free adapter's verdict
(:mod:`specbuild.runtimes.tensorrt_llm_llmapi.requests`). A setting goes by one name (:attr:`RequestSetting.name`)
from the release's parameters to the loop: the ensemble input, the OpenAI field, the client keyword, the
orchestrator parameter it falls back to and the loop's request field. Adding one is a row here and its consumer
(the orchestrator's request parsing or the loop), nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

SettingValue = bool | int
# TensorRT-LLM's LLM API fixes the draft length when it loads the models.
FIXED_K = "fixed when TensorRT-LLM loads the models (its LLM API has no per-request draft length)"
# Why the engine-free runtime captures nothing (its check refuses capture.enabled; a request's store=true is refused):
# its adapter gets text from TensorRT-LLM's LLM-API Triton model (docs/deployment.md, section 6, cites the file).
TEXT_ONLY = ("TensorRT-LLM's LLM-API model returns the text only, not the token ids a capture record holds (the text "
             "re-tokenized is not the ids the target generated)")


@dataclass(frozen=True)
class Fixed:
    """The engine-free runtime's verdict: TensorRT-LLM's LLM API does this one way for every request, so a request
    may restate it, not change it (refused with :attr:`why`)."""

    why: str  # ``{fixed}`` stands for what it does
    fixed: str | None = None  # the adapter's parameter holding what it does; None: it never does it (false)

    def refusal(self, name: str, sent: SettingValue | None, release: object) -> tuple[str, str] | None:
        """``(message, fix)`` when ``sent`` asks for something else than what the release does; None when it
        restates it or leaves it out."""
        fixed = False if self.fixed is None else getattr(release, self.fixed)
        if sent is None or sent == fixed:
            return None
        return f"{name}={sent!r}: {self.why.format(fixed=fixed)}", f"send {name}={json.dumps(fixed)} or leave it out"


@dataclass(frozen=True)
class RequestSetting:
    """One request setting: its input, its default, its help and what each surface does with it."""

    name: str
    kind: type[bool] | type[int]
    help: str  # the input's description; ``generate``'s option help (a flag's with the server default named)
    engine_free: Fixed  # what the tensorrt-llm-llmapi adapter does with it
    flag: bool = False  # ``specbuild generate`` has an option for it
    minimum: int | None = None  # the least value the OpenAI API accepts (an int setting)
    # a request that leaves it out runs with this; None: the release's default, the orchestrator parameter of the
    # same name (package.contract.OrchestratorParameters, from the spec)
    default: SettingValue | None = None

    @property
    def dtype(self) -> Literal["TYPE_BOOL", "TYPE_INT32"]:
        return "TYPE_BOOL" if self.kind is bool else "TYPE_INT32"

    @property
    def option_help(self) -> str:
        return self.help + ("  [default: the server's]" if self.kind is bool else "")


REQUEST_SETTINGS: tuple[RequestSetting, ...] = (
    RequestSetting("num_draft_tokens", int, "K for this request; 0 = target alone",
                   Fixed("this release drafts {fixed} tokens per round, " + FIXED_K, "num_draft_tokens"),
                   flag=True, minimum=0),
    RequestSetting("use_draft_logits", bool, "rejection sampling on draft logits (else token match)",
                   Fixed("TensorRT-LLM verifies the draft's tokens by token matching here")),
    RequestSetting("adaptive_draft", bool, "adapt K from this request's acceptance",
                   Fixed("the draft length is " + FIXED_K)),
    RequestSetting("prompt_lookup", bool, "draft from the request's own tokens first",
                   Fixed("TensorRT-LLM drafts with the draft model only here"), flag=True),
    RequestSetting("break_even", bool, "false: draft every round even where this request's acceptance says drafting "
                   "does not pay (the release's per-request break-even)",
                   Fixed("TensorRT-LLM decides when to draft here, for its whole batch (max_concurrency), not per "
                         "request")),
    RequestSetting("store", bool, "false: this request is not captured (a release whose capture section is enabled "
                   "writes each finished request's token ids to its capture store; OpenAI's store field)",
                   Fixed(f"this release captures nothing: {TEXT_ONLY}"), flag=True,
                   default=True),
)

Sent = Mapping[str, "SettingValue | None"]  # a request's settings by name, None where it left one out


def resolve(sent: Sent, release: object) -> dict[str, SettingValue]:
    """What a request runs with: each setting as sent, else the row's default, else the release's (``release``: the
    orchestrator's parameters)."""
    chosen = {}
    for row in REQUEST_SETTINGS:
        value = sent.get(row.name)
        if value is None:
            value = getattr(release, row.name) if row.default is None else row.default
        chosen[row.name] = value
    return chosen


def read_settings(get: Callable[[str], Any]) -> dict[str, SettingValue | None]:
    """A request's settings, each ``get(name)`` as its kind (None: left out)."""
    values = {row: get(row.name) for row in REQUEST_SETTINGS}
    return {row.name: None if value is None else row.kind(value) for row, value in values.items()}
