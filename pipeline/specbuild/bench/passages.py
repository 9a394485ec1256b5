"""Prose passages and short functions from text every machine has, for the bench's ``long`` workload and the
distillation prompts.

Sources, each optional but the first: the Python standard library's docstrings, the installed packages'
descriptions (their ``METADATA``) and docstrings, and Debian's ``/usr/share/doc`` README files (gzip'd ones
too; licences, copyright files and changelogs skipped). Passages are cleaned to prose (markup stripped; code,
tables, lists of options and doctests left out), kept between :data:`MIN_CHARS` and :data:`MAX_CHARS`, and
deduplicated exactly (normalised text) and nearly (word shingles, :func:`near_duplicates`). Files are read in
sorted order with caps per source, so a machine always yields the same passages, in a few seconds.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import inspect
import re
import sysconfig
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

MIN_CHARS, MAX_CHARS = 200, 900
DEBIAN_DOC = Path("/usr/share/doc")
SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__", "testing", "_vendor"})
SKIPPED_DOC = re.compile(r"copyright|licen[cs]e|changelog|changes|news|history|authors|thanks|todo|\.(?:html?|"
                         r"css|js|png|jpe?g|svg|gif|pdf|xml|json|ya?ml|py|sh|c|h|pl)(?:\.gz)?$", re.I)
OWN_DISTRIBUTIONS = frozenset({"specbuild"})  # the project's own text is not local prose to learn from
FILES_PER_PACKAGE = 12
PASSAGES_PER_PACKAGE = 40
DOC_BYTES = 200_000
SHINGLE_WORDS = 5
NEAR_JACCARD = 0.6

DOCSTRING = re.compile(r'^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t][^\n]*?:[ \t]*\n[ \t]*[rRuU]?("""|\'\'\')(.*?)\1',
                       re.S | re.M)
MODULE_DOCSTRING = re.compile(r'\A(?:[ \t]*#[^\n]*\n|[ \t]*\n)*[ \t]*[rRuU]?("""|\'\'\')(.*?)\1', re.S)
FUNCTION = re.compile(r"^( {0,4})def [A-Za-z_]\w*\(", re.M)
MARKUP = ((re.compile(r"```.*?```|~~~.*?~~~", re.S), "\n\n"),  # fenced code blocks
          (re.compile(r"<!--.*?-->|<[^>\n]+>", re.S), " "),  # HTML comments and tags
          (re.compile(r"!\[[^\]]*\]\([^)]*\)"), ""),  # images and badges
          (re.compile(r"\[([^\]]+)\]\([^)]*\)"), r"\1"),  # markdown links: their text
          (re.compile(r":[\w:.-]+:`~?([^`<]+?)(?:\s*<[^>]*>)?`"), r"\1"),  # reST roles
          (re.compile(r"`([^`]+?)\s*<[^>]*>`_+"), r"\1"),  # reST links
          (re.compile(r"``([^`]+)``|`([^`]+)`_*"), r"\1\2"),  # literals
          (re.compile(r"\*\*([^*]+)\*\*|__([^_]+)__"), r"\1\2"))  # bold
NOT_LETTER = re.compile(r"[^\w\s]|[\d_]")
CODE_CHARS = re.compile(r"[{}\[\]()=<>;|\\$@#_/*+%^~]")
HEADING = re.compile(r"^[^\n]*\n[ \t]*[=\-~^*#]{3,}[ \t]*$", re.M)  # a title and its underline
URL = re.compile(r"https?://|www\.")
SENTENCE_END = re.compile(r"[.!?](?:\s|$)")


@dataclass(frozen=True)
class Passage:
    """A prose passage and where it came from (``stdlib``, ``package`` or ``debian``)."""

    text: str
    source: str


@lru_cache(maxsize=2)
def local_passages(doc_root: Path = DEBIAN_DOC) -> tuple[Passage, ...]:
    """Every source's passages, deduplicated, in a fixed order (standard library, packages, Debian)."""
    found = [*(Passage(t, "stdlib") for t in _stdlib_docstrings()),
             *(Passage(t, "package") for t in _package_texts()),
             *(Passage(t, "debian") for t in _debian_texts(doc_root))]
    unique = {_normalised(p.text): p for p in reversed(found)}  # the first of exact duplicates wins
    kept = [p for p in found if unique[_normalised(p.text)] is p]
    duplicates = near_duplicates([p.text for p in kept])
    return tuple(p for index, p in enumerate(kept) if index not in duplicates)


def stdlib_functions(per_file: int = 2) -> list[str]:
    """Short (4-13 line) functions and methods from the standard library's sources, at most ``per_file`` a file."""
    functions: list[str] = []
    for source in _sources(_stdlib_files()):
        lines, found = source.splitlines(), 0
        for match in FUNCTION.finditer(source):
            start, indent = source.count("\n", 0, match.start()), len(match.group(1))
            end = start + 1
            while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
                end += 1
            body = [line[indent:] for line in lines[start:end]]
            while body and not body[-1].strip():
                body.pop()
            if 4 <= len(body) <= 13 and max(map(len, body)) <= 100:
                functions.append("\n".join(body))
                found += 1
                if found == per_file:
                    break
    return list(dict.fromkeys(functions))


def prose(text: str) -> list[str]:
    """The prose paragraphs of a docstring, README or description, markup stripped, short neighbours joined."""
    text = inspect.cleandoc(text.replace("\r\n", "\n").replace("\t", "    "))
    for pattern, replacement in MARKUP:
        text = pattern.sub(replacement, text)
    text = HEADING.sub("\n\n", text)
    passages, pending = [], ""
    after_literal = False
    for block in re.split(r"\n[ \t]*\n", text):
        lines = [line for line in block.splitlines() if line.strip()]
        literal, after_literal = after_literal, block.rstrip().endswith("::")
        if not lines or literal or not _is_prose(lines):
            passages.append(pending)
            pending = ""
            continue
        paragraph = " ".join(" ".join(lines).split()).replace(" ::", ":").replace("::", ":")
        pending = f"{pending} {paragraph}".strip()
        if len(pending) >= MIN_CHARS:
            passages.append(pending)
            pending = ""
    passages.append(pending)
    return [p for p in passages if MIN_CHARS <= len(p) <= MAX_CHARS and p[-1] in ".!?"]


def _is_prose(lines: list[str]) -> bool:
    """Sentences of words: not code, a table, a heading, a list of options, a doctest or a link list."""
    text = " ".join(lines)
    first = lines[0].lstrip()
    if (any(line.startswith(("    ", ">>>", "...", "$ ", "|", "+-", "..")) for line in lines)
            or first.startswith(("#", "-", "*", "=", ".. ", ":", "@"))
            or len(URL.findall(text)) > 1 or not SENTENCE_END.search(text) or len(text.split()) < 8):
        return False
    size = len(text)
    return (len(NOT_LETTER.findall(text)) <= 0.15 * size and len(CODE_CHARS.findall(text)) <= 0.02 * size
            and sum(map(str.isupper, text)) <= 0.15 * size)


def near_duplicates(texts: list[str]) -> set[int]:
    """Indices of texts nearly equal to an earlier one: word-shingle Jaccard similarity of at least
    :data:`NEAR_JACCARD`, with candidates found through each text's four smallest shingle hashes (a min-hash)."""
    seen: dict[int, list[int]] = {}
    shingles: list[frozenset[int]] = []
    duplicates = set()
    for index, text in enumerate(texts):
        mine = word_shingles(text, SHINGLE_WORDS)
        shingles.append(mine)
        anchors = sorted(mine)[:4]
        candidates = {other for anchor in anchors for other in seen.get(anchor, ())}
        if any(jaccard(mine, shingles[other]) >= NEAR_JACCARD for other in candidates):
            duplicates.add(index)
            continue
        for anchor in anchors:
            seen.setdefault(anchor, []).append(index)
    return duplicates


def word_shingles(text: str, width: int) -> frozenset[int]:
    """Stable hashes (crc32: the same in every process) of the text's normalised ``width``-word windows."""
    words = _normalised(text).split()
    windows = [" ".join(words[i:i + width]) for i in range(max(1, len(words) - width + 1))]
    return frozenset(zlib.crc32(window.encode("utf-8")) for window in windows)


def jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def _normalised(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


# --- sources ---------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _stdlib_files() -> tuple[Path, ...]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return tuple(path for path in sorted(stdlib.rglob("*.py"))
                 if not SKIPPED_DIRS & set(path.relative_to(stdlib).parts))


def _stdlib_docstrings() -> Iterator[str]:
    for source in _sources(_stdlib_files()):
        yield from _docstring_prose(source)


def _package_texts() -> Iterator[str]:
    """Each installed distribution's description, then the docstrings of a few of its modules (sorted by name)."""
    by_name = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name and name not in OWN_DISTRIBUTIONS:
            by_name.setdefault(name, dist)
    for name in sorted(by_name):
        dist = by_name[name]
        texts = prose(dist.metadata.get_payload() or dist.metadata["Description"] or "")  # type: ignore[attr-defined]
        files = sorted(str(f) for f in dist.files or () if str(f).endswith(".py")
                       and not SKIPPED_DIRS & set(Path(str(f)).parts))
        for source in _sources(Path(str(dist.locate_file(f))) for f in files[:FILES_PER_PACKAGE]):
            texts.extend(_docstring_prose(source))
        yield from texts[:PASSAGES_PER_PACKAGE]


def _debian_texts(root: Path) -> Iterator[str]:
    """README-like files of ``root`` (``/usr/share/doc``), gzip'd or not; nothing when it is absent."""
    if not root.is_dir():
        return
    for path in sorted(root.glob("*/*")):
        name = path.name.lower()
        if not path.is_file() or SKIPPED_DOC.search(name) or not name.startswith(("readme", "faq", "usage", "intro")) \
                and not name.endswith((".txt", ".txt.gz", ".md", ".md.gz", ".rst", ".rst.gz")):
            continue
        try:
            raw = gzip.open(path).read(DOC_BYTES) if name.endswith(".gz") else path.read_bytes()[:DOC_BYTES]
        except (OSError, EOFError, zlib.error):
            continue
        yield from prose(raw.decode("utf-8", errors="replace"))


def _sources(paths: Iterable[Path]) -> Iterator[str]:
    for path in paths:
        try:
            yield path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue


def _docstring_prose(source: str) -> Iterator[str]:
    for pattern in (MODULE_DOCSTRING, DOCSTRING):
        for match in pattern.finditer(source):
            yield from prose(match.group(2))
