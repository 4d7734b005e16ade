"""The repository stands alone: no file points at design notes outside it, and every
`docs/METHOD.md §N` the code cites is a section of docs/METHOD.md."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SKIP = {".git", ".venv", "runs", "node_modules", "__pycache__"}
OUTSIDE = re.compile(r"DESIGN\.md|\.\./shared|FACTS\.md|research/loop")


def _texts():
    for path in REPO.rglob("*"):
        if path.is_file() and not SKIP & set(path.relative_to(REPO).parts) and path.suffix in (".py", ".md", ".toml",
                                                                                                ".proto", ".cfg"):
            yield path, path.read_text(encoding="utf-8", errors="replace")


def test_no_file_points_outside_the_repository():
    me = Path(__file__).resolve()
    hits = [f"{p.relative_to(REPO)}:{t[:m.start()].count(chr(10)) + 1}" for p, t in _texts() if p != me
            for m in OUTSIDE.finditer(t)]
    assert hits == []


def test_cited_method_sections_exist():
    sections = set(re.findall(r"^## §(\d+)", (REPO / "docs" / "METHOD.md").read_text(), re.M))
    cited = {(str(p.relative_to(REPO)), n) for p, t in _texts() for n in re.findall(r"METHOD\.md §(\d+)", t)}
    assert cited, "the code cites docs/METHOD.md"
    assert {c for c in cited if c[1] not in sections} == set()
