"""What a candidate's code patch may touch: only files under engine/ and kernels/ (docs/METHOD.md §1),
as plain text edits. Shared by the GPU worker (it refuses such a patch before building) and the
planner (it drops such a candidate). Pure text: no git, no engine.

`check(patch)` reads every file name a unified diff names — `diff --git` headers and the
`---` / `+++` lines outside hunk bodies (a removed line "-- x" inside a hunk is not a header) — and
raises `PatchRefused`, naming the path, for a name outside engine/ or kernels/, a name that is not
a plain relative path (absolute, `..`, `.git`, quoted), a binary patch, a rename or copy, a
symlink or a submodule.
"""

from __future__ import annotations

import re

ALLOWED = ("engine/", "kernels/")
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_REFUSED = {"rename from": "a rename", "rename to": "a rename", "copy from": "a copy", "copy to": "a copy",
            "similarity index": "a rename or copy", "dissimilarity index": "a rename or copy",
            "GIT binary patch": "a binary patch", "Binary files ": "a binary patch"}
_MODES = {"120000": "a symlink", "160000": "a submodule"}


class PatchRefused(ValueError):
    """The patch touches something a candidate may not change; `path` names it."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path


def path_problem(path: str) -> str | None:
    """Why a candidate may not change `path` (relative to the repository root); None if it may."""
    parts = path.split("/")
    if path.startswith("/") or "\\" in path or any(p in ("", ".", "..", ".git") for p in parts):
        return "not a plain relative path"
    if not path.startswith(ALLOWED):
        return "outside " + " and ".join(ALLOWED)
    return None


def _refuse(path: str | None, why: str) -> PatchRefused:
    return PatchRefused(f"patch refused: {path or '(unknown file)'}: {why} "
                        f"(a patch may only edit files under {', '.join(ALLOWED)})", path)


def _strip_prefix(name: str, line: str) -> str:
    """`a/engine/x.py` -> `engine/x.py` (git apply's -p1)."""
    if name.startswith('"'):
        raise _refuse(name, "quoted file names are not accepted")
    if "/" not in name:
        raise _refuse(name, f"cannot tell the path from {line!r}")
    return name.split("/", 1)[1]


def touched_paths(patch: str) -> list[str]:
    """Every path the patch names, in order, without repeats; raises PatchRefused for binary,
    rename/copy, symlink, submodule or quoted-name parts (naming the file)."""
    paths: list[str] = []
    current = None  # the file of the section being read
    lines = patch.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        hunk = _HUNK.match(line)
        if hunk:  # skip the body by its line counts
            old = int(hunk.group(1)) if hunk.group(1) is not None else 1
            new = int(hunk.group(2)) if hunk.group(2) is not None else 1
            while (old > 0 or new > 0) and i < len(lines):
                body = lines[i]
                if body.startswith("\\"):
                    pass
                elif body == "" or body[0] == " ":
                    old, new = old - 1, new - 1
                elif body[0] == "-":
                    old -= 1
                elif body[0] == "+":
                    new -= 1
                else:
                    break  # a short hunk: git apply reports it
                i += 1
            continue
        if line.startswith("diff --git "):
            rest = line[len("diff --git "):]
            if '"' in rest:
                raise _refuse(rest, "quoted file names are not accepted")
            half = (len(rest) - 1) // 2  # "a/P b/P": both names the same, P at [2:half]
            if not (rest.startswith("a/") and rest[half:half + 3] == " b/" and rest[2:half] == rest[half + 3:]):
                raise _refuse(rest, "a diff header with two different names (rename or copy)")
            current = rest[2:half]
            paths.append(current)
        elif line.startswith(("--- ", "+++ ")):
            name = line[4:].split("\t")[0]
            if name != "/dev/null":
                current = _strip_prefix(name, line)
                paths.append(current)
        elif line.startswith(("new file mode ", "deleted file mode ", "old mode ", "new mode ")):
            mode = line.rsplit(" ", 1)[1]
            if mode in _MODES:
                raise _refuse(current, _MODES[mode])
        else:
            for head, what in _REFUSED.items():
                if line.startswith(head):
                    raise _refuse(current, what)
    return list(dict.fromkeys(paths))


def check(patch: str) -> list[str]:
    """The paths the patch touches; raises PatchRefused (naming the first bad path) unless every
    one may change."""
    paths = touched_paths(patch)
    for path in paths:
        why = path_problem(path)
        if why:
            raise _refuse(path, why)
    return paths
