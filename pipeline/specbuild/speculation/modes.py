"""How a release verifies drafts against the draft's probabilities (``speculation.verification``), with no torch:
the value the spec, packaging and the loop share (the rules themselves are :mod:`specbuild.speculation.rules`')."""

from __future__ import annotations

from typing import Literal

# token: rejection sampling token by token (rules.verify_rejection); block: the drafted block as a whole
# (rules.verify_block, Sun et al. 2024)
VerificationMode = Literal["token", "block"]
VERIFICATION_MODES: tuple[VerificationMode, ...] = ("token", "block")
