"""Building a candidate system's code (docs/METHOD.md §2): a detached `git worktree` of the repository
at a pinned revision with the candidate's patch applied, and loading the engine from it.

- `build_worktree(repo, base_rev, patch, dest)` checks the patch (only files under engine/ and
  kernels/ may change: `ALLOWED`, see specpilot.patches), checks out `base_rev` in `dest` and
  applies the patch with `git apply`; it then re-checks what actually changed in the worktree.
  Every refusal or failure is a `BuildError` naming the file; the worktree is removed on failure.
- `remove_worktree(repo, path)` always cleans up (worktree remove --force, delete, prune).
- `use_root(root)` makes `specpilot.kernels` and `specpilot.engine` (with all their submodules)
  load from `root`/kernels and `root`/engine in this process. The worker process calls it before
  anything imports the engine; everything else (services, zoo, specpilot) stays the installed code.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

from specpilot import gitrun, patches

ALLOWED = patches.ALLOWED
SWITCHED = ("kernels", "engine")  # kernels first: the engine imports them


class BuildError(ValueError):
    """A candidate's code cannot be built: a refused or non-applying patch, or a bad revision."""


def _changed_paths(worktree: Path) -> list[str]:
    """Every path that differs from HEAD in the worktree: modified, deleted, new (ignored included)."""
    proc = gitrun.run(worktree, "-c", "core.quotePath=true", "status", "--porcelain", "-z",
                "--untracked-files=all", "--ignored", "--no-renames")
    if proc.returncode != 0:
        raise BuildError(f"git status in {worktree} failed: {gitrun.message(proc)}")
    return [entry[3:] for entry in proc.stdout.split("\0") if entry]


def build_worktree(repo: Path | str, base_rev: str, patch: str, dest: Path | str) -> Path:
    """A detached worktree of `repo` at `base_rev` in `dest` with `patch` applied; returns `dest`."""
    try:
        touched = patches.check(patch)
    except patches.PatchRefused as e:
        raise BuildError(str(e)) from None
    repo, dest = Path(repo), Path(dest)
    proc = gitrun.run(repo, "worktree", "add", "--detach", "--quiet", str(dest), f"{base_rev}^{{commit}}")
    if proc.returncode != 0:
        raise BuildError(f"cannot check out {base_rev!r} of {repo} in {dest}: {gitrun.message(proc)}")
    try:
        if patch.strip():
            with tempfile.NamedTemporaryFile("w", suffix=".patch", encoding="utf-8", newline="") as f:
                f.write(patch if patch.endswith("\n") else patch + "\n")
                f.flush()
                proc = gitrun.run(dest, "apply", "--whitespace=nowarn", f.name)
            if proc.returncode != 0:
                files = ", ".join(touched) or "(no file named)"
                raise BuildError(f"patch does not apply on {base_rev} (files: {files}): {gitrun.message(proc)}")
        for path in _changed_paths(dest):
            why = patches.path_problem(path)
            if why:
                raise BuildError(f"patch refused: it changed {path}: {why}")
    except BaseException:
        remove_worktree(repo, dest)
        raise
    return dest


def remove_worktree(repo: Path | str, path: Path | str) -> None:
    """Remove a worktree made by `build_worktree`, whatever state it is in."""
    gitrun.run(repo, "worktree", "remove", "--force", "--force", str(path))
    shutil.rmtree(path, ignore_errors=True)
    gitrun.run(repo, "worktree", "prune")


def use_root(root: Path | str) -> None:
    """Load `specpilot.kernels` and `specpilot.engine` from `root`'s kernels/ and engine/ folders
    in this process (their submodules follow, through the packages' __path__). Must run before
    anything imported them."""
    import specpilot

    root = Path(root).resolve()
    for name in SWITCHED:
        full = f"specpilot.{name}"
        loaded = [m for m in sys.modules if m == full or m.startswith(full + ".")]
        if loaded:
            raise RuntimeError(f"use_root({root}): {loaded[0]} is already imported")
        init = root / name / "__init__.py"
        if not init.is_file():
            raise BuildError(f"{root} has no {name}/__init__.py")
        spec = importlib.util.spec_from_file_location(full, init, submodule_search_locations=[str(init.parent)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[full]
            raise
        setattr(specpilot, name, module)
