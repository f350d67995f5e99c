"""Where a report's numbers came from: the project's commit, recorded in every metrics file."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit() -> str | None:
    """The project's current commit, when run from a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
