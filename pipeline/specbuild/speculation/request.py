"""One request as the speculative loop sees it: what the client asked for, in token ids."""

from __future__ import annotations

from dataclasses import dataclass, field

from specbuild.speculation.cost import CostModel
from specbuild.speculation.guide import Guide
from specbuild.speculation.guide_spec import GuideSpec
from specbuild.speculation.lookup import PromptLookup
from specbuild.speculation.modes import VerificationMode
from specbuild.speculation.rules import GREEDY, SamplingParams


@dataclass
class TokenRequest:
    """What one client asked for, in token ids."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams = GREEDY
    seed: int | None = None
    end_id: int | None = None
    min_tokens: int = 0  # the end token is not generated before this many tokens
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    num_draft_tokens: int = 4
    use_draft_logits: bool = True
    verification: VerificationMode = "token"  # how the draft's logits are judged (rules.verify's mode)
    adaptive_draft: bool = False  # the draft length follows each round's outcome (drafting.next_draft_length)
    prompt_lookup: PromptLookup | None = None  # None: drafts come from the draft model only
    # The release's cost model: drafting switches off while it does not pay for this request (None: never).
    break_even: CostModel | None = None
    # Tokens the target makes per call when it runs alone: 1 streams token by token.
    target_only_chunk: int | None = None
    guide: Guide | None = None  # the request's grammar matcher (GuideCompiler.guide); None: unconstrained
    # a guide the target engine applies itself (a tensorrt-llm release's target: the tensorrtllm backend's guided
    # decoding): the target alone, the whole answer in one call, since the backend's grammar starts at each call's
    # first new token (package/backend_guides.py)
    engine_guide: GuideSpec | None = None
