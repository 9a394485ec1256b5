"""The commands in README.md's code blocks, read as a shell reads them (product/test_readme_commands.py runs them;
serve/test_openai_api.py sends the curl ones to a served release)."""

from __future__ import annotations

import re
import shlex

from locations import REPO_ROOT

README = REPO_ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
# Commands that start so need a server: tests/serve/test_openai_api.py sends them, as written but for the address,
# to a served release with a chat template and checks their answers.
NEEDS_THE_SERVER = "curl "


def readme_commands(text: str) -> list[tuple[str, str]]:
    """``(kind, command)`` in README order: ``("shell", line)`` per command line of a shell block (its
    comment dropped, as shlex.join writes it), ``("python", block)`` per Python block."""
    commands = []
    for language, body in FENCE.findall(text):
        if language in SHELL_LANGUAGES:
            lines = (shlex.split(line, comments=True) for line in body.splitlines())
            commands += [("shell", shlex.join(words)) for words in lines if words]
        elif language == "python":
            commands.append(("python", body))
    return commands
