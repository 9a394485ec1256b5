"""How ``specbuild draft`` makes a draft: :class:`DraftOptions`, read by the run (:mod:`specbuild.drafts.distill`),
its data (:mod:`specbuild.drafts.distill_data`) and its training (:mod:`specbuild.drafts.distill_training`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specbuild.errors import UsageError

PRECISIONS = ("auto", "float32", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
ANSWERS = ("greedy", "greedy+sampled")
TEACHERS = ("labels", "joint")


@dataclass(frozen=True)
class DraftOptions:
    """How to make the draft. ``steps`` sets the schedule's length; ``minutes`` stops the run earlier."""

    layers: int = 2
    hidden: int | None = None  # None: the target's hidden size (layers copied from the target)
    minutes: float = 30.0
    steps: int = 1500
    prompts: int = 1200
    held_out: int = 48  # prompts kept out of training, for the acceptance summary
    max_new_tokens: int = 96
    data_share: float = 0.4  # at most this share of the budget goes to the target's answers
    generate_batch: int = 32
    batch_tokens: int = 2048
    learning_rate: float = 1e-3
    top_k: int = 32
    seed: int = 0
    checkpoint_every: int = 100
    threads: int = 2
    precision: str = "auto"  # "auto": bfloat16 where the CPU has bfloat16 matrix units, else float32
    device: str = "auto"  # "auto": CUDA when there is a GPU, else the CPU
    answers: str = "greedy"  # "greedy+sampled": a sampled answer to every training prompt as well
    sample_temperature: float = 0.7
    teacher: str = "labels"  # "joint": the target's full distribution computed in each training step
    head_vocabulary: int | None = None  # a sub-vocabulary head of this many ids, ranked from the target's answers

    def validate(self) -> None:
        checks = [(self.layers >= 1, "--layers must be at least 1"), (self.minutes > 0, "--minutes must be > 0"),
                  (self.steps >= 1, "--steps must be at least 1"), (self.prompts > self.held_out >= 1,
                  "prompts must outnumber the held-out prompts (at least 1)"),
                  (0 < self.data_share < 1, "data_share must be between 0 and 1"),
                  (self.hidden is None or self.hidden >= 1, "--hidden must be positive"),
                  (self.precision in PRECISIONS, f"--precision must be one of {', '.join(PRECISIONS)}"),
                  (self.device in DEVICES, f"--device must be one of {', '.join(DEVICES)}"),
                  (self.answers in ANSWERS, f"--answers must be one of {', '.join(ANSWERS)}"),
                  (self.sample_temperature > 0, "the sampling temperature must be > 0"),
                  (self.teacher in TEACHERS, f"--teacher must be one of {', '.join(TEACHERS)}"),
                  (self.head_vocabulary is None or self.head_vocabulary >= 1, "--head-vocabulary must be positive")]
        for ok, message in checks:
            if not ok:
                raise UsageError(message, "see `specbuild draft --help`")

    def architecture(self) -> dict[str, Any]:
        """The settings a resumed run must share with the run it continues (``steps`` may grow to train on)."""
        return {key: getattr(self, key) for key in ("layers", "hidden", "prompts", "held_out", "max_new_tokens",
                                                    "top_k", "seed", "batch_tokens", "learning_rate", "answers",
                                                    "sample_temperature", "teacher")}
