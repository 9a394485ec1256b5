"""Which captured requests ``specbuild draft --from-capture`` holds out: the newest, by time *and* by source.

A draft trained on one request and measured on its near-copy measures memory, not agreement, so records are
first grouped by where they came from, and each group lands whole on one side:

- **The template's wrapping is cut.** The longest token prefix and suffix that every captured prompt shares
  (the chat template's system turn and its assistant header) say nothing about the source: they are removed
  before comparing.
- **One prompt template, one group.** Prompts whose first :data:`PREFIX_TOKENS` tokens (after the cut) are equal
  share a group: a template whose fixed lead-in is followed by a varying passage or question.
- **Near-duplicates, one group.** Prompts whose token :data:`SHINGLE_TOKENS`-gram sets have a Jaccard similarity of
  at least :data:`SIMILAR` share a group (found through MinHash signatures banded for locality-sensitive hashing,
  each candidate pair then checked exactly): a template whose varying part sits anywhere, a retried request.
- Groups are transitive (union-find): a chain of near-duplicates is one group.

Then the groups are ordered by their newest record's ``finished_at``, newest first, and held out whole until the
held-out records reach the asked share: the held-out side is the newest traffic, and no group sits on both sides
(a group held out for its newest record takes its older records along). A template whose lead-in is shorter than
:data:`PREFIX_TOKENS` and whose variable part is most of the prompt is beyond both rules; such prompts share little
text with each other, which is what the rules are for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specbuild.capture.records import CaptureRecord
from specbuild.errors import UsageError

PREFIX_TOKENS = 12  # a template's fixed lead-in: about one instruction sentence
SHINGLE_TOKENS = 4
SIMILAR = 0.5  # token 4-gram Jaccard similarity that makes two prompts one group
HASHES, BANDS = 64, 32  # 2 hashes a band: a pair at the threshold is a candidate with probability 1 - 0.75**32
_PRIME = (1 << 61) - 1


@dataclass(frozen=True)
class CaptureSplit:
    """Record indices on each side (oldest first) and how many groups the records formed."""

    train: tuple[int, ...]
    held_out: tuple[int, ...]
    groups: int


def split_by_time_and_source(records: Sequence[CaptureRecord], share: float) -> CaptureSplit:
    """Hold out the newest ``share`` of ``records`` (at least one record), whole groups only (module docstring)."""
    if not 0 < share < 1:
        raise UsageError(f"a held-out share of {share}", "pass a share between 0 and 1 (e.g. 0.1)")
    groups = source_groups([record.prompt_ids for record in records])
    newest: dict[int, float] = {}
    sizes: dict[int, int] = {}
    for record, group in zip(records, groups):
        newest[group] = max(newest.get(group, record.finished_at), record.finished_at)
        sizes[group] = sizes.get(group, 0) + 1
    wanted = max(1, round(share * len(records)))
    held: set[int] = set()
    count = 0
    for group in sorted(newest, key=lambda group: (-newest[group], group)):
        if count >= wanted:
            break
        held.add(group)
        count += sizes[group]
    if count == len(records):
        raise UsageError(f"the {len(records)} usable captured records form {len(sizes)} group(s) of one prompt "
                         "template or near-duplicates, so none can be held out apart from the training records",
                         "capture more varied traffic (or more of it) before distilling from it")
    by_time = sorted(range(len(records)), key=lambda index: (records[index].finished_at, index))
    return CaptureSplit(train=tuple(i for i in by_time if groups[i] not in held),
                        held_out=tuple(i for i in by_time if groups[i] in held), groups=len(sizes))


def apart_from(held_out: Sequence[Sequence[int]], candidates: Sequence[Sequence[int]]) -> list[int]:
    """The indices of ``candidates`` (prompts to train on from elsewhere) that share no group with a held-out
    prompt: the same rules keep the original pool's templates off the held-out side too."""
    groups = source_groups([*held_out, *candidates])
    held = set(groups[:len(held_out)])
    return [index for index, group in enumerate(groups[len(held_out):]) if group not in held]


def source_groups(prompts: Sequence[Sequence[int]]) -> list[int]:
    """A group number per prompt: equal lead-ins or near-duplicates after the shared wrapping is cut (see above)."""
    cores = _without_shared_wrapping(prompts)
    parent = list(range(len(cores)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    def join(first: int, second: int) -> None:
        parent[root(first)] = root(second)

    lead_ins: dict[tuple[int, ...], int] = {}
    for index, core in enumerate(cores):
        join(index, lead_ins.setdefault(core[:PREFIX_TOKENS], index))
    shingles = [_shingles(core) for core in cores]
    buckets: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    rows = HASHES // BANDS
    for index, grams in enumerate(shingles):
        signature = _minhash(grams)
        for band in range(BANDS):
            buckets.setdefault((band, signature[band * rows:(band + 1) * rows]), []).append(index)
    checked: set[tuple[int, int]] = set()
    for members in buckets.values():
        for position, first in enumerate(members):
            for second in members[position + 1:]:
                if root(first) == root(second) or (first, second) in checked:
                    continue
                checked.add((first, second))
                if jaccard(shingles[first], shingles[second]) >= SIMILAR:
                    join(first, second)
    numbers: dict[int, int] = {}
    return [numbers.setdefault(root(index), len(numbers)) for index in range(len(cores))]


def jaccard(first: frozenset[tuple[int, ...]], second: frozenset[tuple[int, ...]]) -> float:
    union = len(first | second)
    return len(first & second) / union if union else 1.0


def _without_shared_wrapping(prompts: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """Each prompt without the longest prefix and suffix that all prompts share (none for a single prompt)."""
    rows = [tuple(prompt) for prompt in prompts]
    if len(rows) < 2:
        return rows
    shortest = min(map(len, rows))
    head = next((n for n in range(shortest) if len({row[n] for row in rows}) > 1), shortest)
    tail = next((n for n in range(shortest - head) if len({row[-1 - n] for row in rows}) > 1), shortest - head)
    return [row[head:len(row) - tail] for row in rows]


def _shingles(tokens: tuple[int, ...]) -> frozenset[tuple[int, ...]]:
    if len(tokens) <= SHINGLE_TOKENS:
        return frozenset({tokens})
    return frozenset(tokens[i:i + SHINGLE_TOKENS] for i in range(len(tokens) - SHINGLE_TOKENS + 1))


def _minhash(grams: frozenset[tuple[int, ...]]) -> tuple[int, ...]:
    """:data:`HASHES` minimum hashes of the shingles (universal hashing of the tuple's hash: int tuples hash the
    same in every process, so the groups are reproducible)."""
    values = [hash(gram) & _PRIME for gram in grams]
    return tuple(min(((1 + 2 * seed) * 0x9E3779B97F4A7C15 % _PRIME * value + seed) % _PRIME for value in values)
                 for seed in range(HASHES))
