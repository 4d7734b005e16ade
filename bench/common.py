"""What every benchmark script shares: the commit it measures."""

from __future__ import annotations

import os
import subprocess


def git_sha() -> str:
    """GIT_SHA from the caller (a machine's copy of the tree may have no .git, or a stale one), else
    git's own answer, with "+dirty" when tracked files differ from that commit."""
    if os.environ.get("GIT_SHA"):
        return os.environ["GIT_SHA"]
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if r.returncode != 0:
        return "unknown"
    # tracked files that differ from that commit (a copied tree whose .git lags): say so
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return r.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
