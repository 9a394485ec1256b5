"""A traffic-trained draft's provenance, as the release's manifest records it.

``specbuild draft --from-capture`` leaves ``specbuild-capture.json`` in the draft checkpoint it writes: the capture
window and size, the base draft's checksum and the acceptance and predicted speedup it measured before and after on
held-out captured records (and on the bundled prompts). It holds figures, times and local paths, never a token id or
a text. Packaging reads it (refusing one it cannot read by name) so the manifest says what traffic the draft learnt
from and what it gained; a draft without it was not trained on traffic.

The file is not served: the torch and tensorrt-llm runtimes build engines from the checkpoint's weights, config and
tokenizer only, and the engine-free runtime loads the checkpoint from where it is, outside the release.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specbuild.errors import CheckpointError

PROVENANCE_FILE = "specbuild-capture.json"
PROVENANCE_FORMAT = 1
_MAX_BYTES = 1 << 20  # figures only: a file this large is not one specbuild wrote

Figure = float | dict[str, float]  # one value, or one per K ({"1": 0.61, "2": ...})


class _Section(BaseModel):
    """A section of the file: the fields the manifest records, checked; others (figures a later draft adds) kept
    out of the manifest."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class CaptureWindow(_Section):
    first_finished_at: datetime
    last_finished_at: datetime
    records: int = Field(ge=1)
    bytes: int = Field(ge=0)
    stores: list[str] = Field(min_length=1)


class BaseDraft(_Section):
    path: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class HeldOut(_Section):
    records: int = Field(ge=0)
    acceptance_before: Figure | None
    acceptance_after: Figure | None
    predicted_speedup_before: Figure | None
    predicted_speedup_after: Figure | None


class TrafficProvenance(_Section):
    """The file (format :data:`PROVENANCE_FORMAT`, checked before its shape)."""

    format: int
    capture: CaptureWindow
    base_draft: BaseDraft
    held_out: HeldOut
    bundled: dict[str, Any] = Field(description="the bundled prompts' acceptance before and after (kinds the "
                                    "traffic lacks, not forgotten), as the distillation wrote it")

    def manifest_record(self) -> dict[str, Any]:
        """What the manifest says of the draft: the capture window and size (how many stores, not where they
        are), the base draft's checksum and the measured figures."""
        return {"capture": {**self.capture.model_dump(mode="json", exclude={"stores"}),
                            "stores": len(self.capture.stores)},
                "base_draft": self.base_draft.model_dump(mode="json"),
                "held_out": self.held_out.model_dump(mode="json"), "bundled": self.bundled}


def read_traffic_provenance(draft_checkpoint: str | Path) -> TrafficProvenance | None:
    """The provenance in ``draft_checkpoint`` (None: it has none, so its draft was not trained on traffic); a file
    of another format version or shape is a :class:`CheckpointError` naming it and what is wrong."""
    path = Path(draft_checkpoint) / PROVENANCE_FILE
    if not path.is_file():
        return None
    fix = f"run `specbuild draft --from-capture` again for a new {PROVENANCE_FILE}, or remove the file if this draft " \
          "was not trained on captured traffic"
    try:
        if path.stat().st_size > _MAX_BYTES:
            raise ValueError(f"{path.stat().st_size} bytes, over {_MAX_BYTES}")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable JSON file: {exc}", fix) from None
    if not isinstance(data, dict) or data.get("format") != PROVENANCE_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise CheckpointError(f"{path} is of format {found!r}; this specbuild reads format {PROVENANCE_FORMAT}", fix)
    try:
        return TrafficProvenance.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise CheckpointError(f"{path}: {where}: {error['msg']}", fix) from None
