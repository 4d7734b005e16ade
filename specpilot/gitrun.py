"""Running git for the services and the round: one environment, one error message, one diff form.

The memory's reproduce check, the GPU worker's worktree builds, the command agent and the round
all drive git as a subprocess. Here: the caller's GIT_* variables are dropped (a stray GIT_DIR or
GIT_INDEX_FILE would point git elsewhere), the locale is C (messages are parsed) and git never
prompts. Imports nothing of the project, so any service may use it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

# options that keep diffs in the form `git apply` reads, whatever the user's config says
DIFF_OPTS = ("-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false", "-c", "core.quotePath=true")
DIFF_ARGS = ("diff", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "--binary",
             "--src-prefix=a/", "--dst-prefix=b/")


class GitFailed(ValueError):
    """A git command exited non-zero; the message quotes git."""


def message(proc: subprocess.CompletedProcess) -> str:
    """git's own words (stderr, else stdout), at most six lines; the exit status when it said nothing."""
    text = (proc.stderr or "").strip() or (proc.stdout or "").strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "; ".join(lines[:6]) + (" ..." if len(lines) > 6 else "") if lines else f"exit status {proc.returncode}"


def run(cwd: Path | str, *args: str, index: Path | str | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """`git ARGS` in `cwd` (with `index` as GIT_INDEX_FILE when given); GitFailed on a non-zero
    exit when `check`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"})
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    proc = subprocess.run(["git", *args], cwd=str(cwd), env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise GitFailed(f"git {' '.join(args)} (in {cwd}) failed: {message(proc)}")
    return proc


def head_sha(path: Path | str) -> str:
    """The short commit of the worktree holding `path`, "+dirty" when tracked files differ from it;
    GIT_SHA from the environment wins (a machine's copy of the tree may have no .git, or a stale
    one); "unknown" outside a repository."""
    if os.environ.get("GIT_SHA"):
        return os.environ["GIT_SHA"]
    head = run(path, "rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return "unknown"
    dirty = run(path, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


def tree_of_files(path: Path | str) -> str:
    """The tree id of the current files of the git worktree holding `path` (tracked or not,
    .gitignore respected), through a throwaway index: the worktree's own index and HEAD are left as
    they are. The tree's objects go to the repository's object store."""
    top = run(path, "rev-parse", "--show-toplevel", check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="specpilot-index-") as tmp:
        index = Path(tmp) / "index"
        run(top, "add", "-A", "--", ".", index=index, check=True)
        return run(top, "write-tree", index=index, check=True).stdout.strip()


def diff(cwd: Path | str, a: str, b: str) -> str:
    """The unified diff (a/ b/ prefixes, binary-safe, no rename detection) from tree-ish `a` to `b`."""
    return run(cwd, *DIFF_OPTS, *DIFF_ARGS, a, b, check=True).stdout
