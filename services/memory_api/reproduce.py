"""The reproduce check (docs/METHOD.md §7): an entry is stored only if applying it, with its
requirements, to stock reproduces the accepted system's code exactly.

`reproduce` checks out `stock_rev` in a temporary detached `git worktree` of the repository,
applies each entry's `delta` (a unified diff) in order with `git apply --index`, and compares
`git write-tree` with the expected tree id. Every failure is a `ReproduceError` naming the entry:

- stale:     a delta does not apply (git's message names the file / hunk);
- malformed: a delta is not a patch git can read;
- tampered:  everything applied but the final tree differs (up to 10 differing paths listed).

The worktree is always removed. Helpers compute tree ids (`tree_of`, `tree_of_worktree`) and the
delta a candidate's worktree is against a base revision (`diff_between`).

Only `git` (through `specpilot.gitrun`) and the memory's own entries are used here.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from specpilot import gitrun

from .entries import Entry

MAX_PATHS = 10
_MALFORMED = ("corrupt patch", "no valid patches", "unrecognized input", "patch fragment without header",
              "patch with only garbage", "git diff header lacks filename", "bad git-diff", "unexpected end")


class ReproduceError(ValueError):
    """Applying the entries to stock does not reproduce the expected code; the message names the entry."""

    def __init__(self, message: str, *, kind: str, key: str | None = None, paths: Sequence[str] = ()):
        super().__init__(message)
        self.kind = kind  # "stale" | "malformed" | "tampered" | "git"
        self.key = key
        self.paths = tuple(paths)


def _git(cwd: Path | str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        return gitrun.run(cwd, *args, check=check)
    except gitrun.GitFailed as e:
        raise ReproduceError(str(e), kind="git") from None


def _resolve_tree(repo: Path | str, rev: str, what: str) -> str:
    proc = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{tree}}", check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ReproduceError(f"{what} {rev!r} is not a commit or tree in {repo}", kind="git")
    return proc.stdout.strip()


def tree_of(repo: Path | str, rev_or_dir: str | Path) -> str:
    """The tree id of a commit / tree (a `str` revision), or of a directory's current files (a `Path`)."""
    if isinstance(rev_or_dir, Path):
        return tree_of_worktree(rev_or_dir)
    return _resolve_tree(repo, rev_or_dir, "revision")


def tree_of_worktree(path: Path | str) -> str:
    """The tree id of the current files of the git worktree containing `path` (tracked or not,
    .gitignore respected), computed in a temporary index: the worktree's own index and HEAD are
    left as they are. The tree's objects are written to the repository's object store."""
    try:
        return gitrun.tree_of_files(path)
    except gitrun.GitFailed as e:
        raise ReproduceError(str(e), kind="git") from None


def diff_between(repo: Path | str, base_rev: str, worktree_path: Path | str) -> str:
    """The unified diff (git format, `a/` `b/` prefixes, binary-safe, no rename detection) taking
    `base_rev` of `repo` to the current files of `worktree_path`; "" when they are equal.
    `worktree_path` must share `repo`'s object store (a `git worktree` of it, or the repo itself)."""
    base = _resolve_tree(repo, base_rev, "base revision")
    result = tree_of_worktree(worktree_path)
    if _git(worktree_path, "cat-file", "-e", base, check=False).returncode != 0:
        raise ReproduceError(f"{worktree_path} does not share the object store of {repo} "
                             f"(base tree {base} unknown there); use a `git worktree` of it", kind="git")
    return _git(worktree_path, *gitrun.DIFF_OPTS, *gitrun.DIFF_ARGS, base, result).stdout


def _apply(wt: Path, entry: Entry, patch_dir: Path, stock_rev: str) -> None:
    patch = patch_dir / f"{entry.id}@{entry.version}.patch"
    delta = entry.delta if entry.delta.endswith("\n") else entry.delta + "\n"
    patch.write_text(delta, encoding="utf-8", newline="")
    proc = _git(wt, "apply", "--index", "--whitespace=nowarn", str(patch), check=False)
    if proc.returncode == 0:
        return
    why = gitrun.message(proc)
    if any(m in why.lower() for m in _MALFORMED):
        raise ReproduceError(f"entry {entry.key}: malformed delta, git cannot read it as a patch: {why}",
                             kind="malformed", key=entry.key)
    raise ReproduceError(
        f"entry {entry.key}: delta does not apply on stock {stock_rev} plus the entries before it "
        f"(stale, or tampered context): {why}", kind="stale", key=entry.key)


def reproduce(repo: Path, stock_rev: str, order: list[Entry], expected_tree: str) -> None:
    """Raise `ReproduceError` unless stock + the entries' deltas (in `order`) == `expected_tree`."""
    repo = Path(repo)
    last = order[-1].key if order else "(no entries)"
    try:
        expected = _resolve_tree(repo, expected_tree, "expected tree")
    except ReproduceError as exc:
        raise ReproduceError(f"entry {last}: {exc}", kind="git", key=order[-1].key if order else None) from None
    tmp = Path(tempfile.mkdtemp(prefix="specpilot-reproduce-"))
    wt = tmp / "wt"
    added = False
    try:
        proc = _git(repo, "worktree", "add", "--detach", "--quiet", str(wt), stock_rev, check=False)
        if proc.returncode != 0:
            raise ReproduceError(f"entry {last}: cannot check out stock {stock_rev!r}: {gitrun.message(proc)}",
                                 kind="git", key=order[-1].key if order else None)
        added = True
        for entry in order:
            if entry.delta.strip():
                _apply(wt, entry, tmp, stock_rev)
        result = _git(wt, "write-tree").stdout.strip()
        if result != expected:
            names = _git(repo, "diff", "--name-only", "--no-renames", expected, result).stdout.split("\n")
            names = [n for n in names if n]
            shown = ", ".join(names[:MAX_PATHS]) + (f" (and {len(names) - MAX_PATHS} more)"
                                                    if len(names) > MAX_PATHS else "")
            applied = ", ".join(e.key for e in order) or "none"
            raise ReproduceError(
                f"entry {last}: stock {stock_rev} + [{applied}] gives tree {result}, not the accepted "
                f"system's {expected} (tampered or incomplete delta); differing paths: {shown or '(none)'}",
                kind="tampered", key=order[-1].key if order else None, paths=names)
    finally:
        removed = not added or _git(repo, "worktree", "remove", "--force", str(wt), check=False).returncode == 0
        shutil.rmtree(tmp, ignore_errors=True)
        if not removed:  # only then: prune drops the registration of the directory just deleted
            _git(repo, "worktree", "prune", check=False)
