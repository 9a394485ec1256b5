"""The rich consoles specbuild writes to: for people at a terminal, and for logs (CI, ``demo.log``) elsewhere; the
progress display of long in-process work (building a pair, distilling, measuring) on them.

At a terminal rich wraps text at the terminal's width. Elsewhere it would assume 80 columns and break lines
mid-phrase, which makes logs hard to read and grep; there, text is never wrapped (soft wrap: a line is one line
however long), and tables, rules and progress lines get :data:`LOG_WIDTH` columns unless ``COLUMNS`` names a
width. ``--json`` output does not go through these consoles.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress

LOG_WIDTH = 160  # columns of a table or rule in a log: wide enough for a report's paths side by side


def make_console(*, stderr: bool = True) -> Console:
    """A console on stderr (or stdout) that wraps only at a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, soft_wrap=True, width=None if os.environ.get("COLUMNS") else LOG_WIDTH)


def progress_display(console: Console | None = None) -> Progress:
    """A transient rich display for :func:`stage` tasks: spinner, description, bar, elapsed time (a task
    without steps still shows that it is alive)."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


@contextlib.contextmanager
def stage(progress: Progress | None, description: str, total: float | None = None) -> Iterator[Callable[[float], None]]:
    """A progress task for one build stage; yields ``advance(amount)``, a no-op without ``progress``."""
    if progress is None:
        yield lambda amount=1: None
        return
    task = progress.add_task(description, total=total)
    try:
        yield lambda amount=1: progress.advance(task, amount)
    finally:
        progress.update(task, completed=total if total is not None else 1, total=total or 1)
