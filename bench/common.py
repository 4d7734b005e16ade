"""What every benchmark script shares: the commit it measures."""

from __future__ import annotations

import os
import subprocess


def git_sha() -> str:
    """GIT_SHA from the caller (a machine's copy of the tree may have no .git), else git's own answer."""
    if os.environ.get("GIT_SHA"):
        return os.environ["GIT_SHA"]
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "unknown"
