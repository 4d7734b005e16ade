"""What every benchmark script shares: the commit it measures."""

from __future__ import annotations

from pathlib import Path

from specpilot import gitrun


def git_sha() -> str:
    """The commit of this checkout (gitrun.head_sha: GIT_SHA wins, "+dirty" for changed files)."""
    return gitrun.head_sha(Path(__file__).resolve().parent)
