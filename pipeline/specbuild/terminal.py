"""The rich consoles specbuild writes to: for people at a terminal, and for logs (CI, ``demo.log``) elsewhere.

At a terminal rich wraps text at the terminal's width. Elsewhere it would assume 80 columns and break lines
mid-phrase, which makes logs hard to read and grep; there, text is never wrapped (soft wrap: a line is one line
however long), and tables, rules and progress lines get :data:`LOG_WIDTH` columns unless ``COLUMNS`` names a
width. ``--json`` output does not go through these consoles.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

LOG_WIDTH = 160  # columns of a table or rule in a log: wide enough for a report's paths side by side


def make_console(*, stderr: bool = True) -> Console:
    """A console on stderr (or stdout) that wraps only at a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, soft_wrap=True, width=None if os.environ.get("COLUMNS") else LOG_WIDTH)
