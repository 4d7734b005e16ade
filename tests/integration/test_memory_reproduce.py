"""The reproduce check on real git repositories (temporary ones; /work/main's git state is only read)."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from specpilot.services.memory_api.entries import Entry, Requirement
from specpilot.services.memory_api.graph import resolve
from specpilot.services.memory_api.reproduce import (
    ReproduceError,
    diff_between,
    reproduce,
    tree_of,
    tree_of_worktree,
)

MAIN = Path(__file__).resolve().parents[2]
ID = ("-c", "user.name=test", "-c", "user.email=test@example.com", "-c", "commit.gpgsign=false")


def git(cwd, *args) -> str:
    return subprocess.run(["git", *ID, *args], cwd=str(cwd), check=True, capture_output=True, text=True).stdout


def commit_all(cwd, msg: str) -> str:
    git(cwd, "add", "-A")
    git(cwd, "commit", "-q", "--allow-empty", "-m", msg)
    return git(cwd, "rev-parse", "HEAD").strip()


def worktrees(repo) -> list[str]:
    return [ln for ln in git(repo, "worktree", "list", "--porcelain").splitlines() if ln.startswith("worktree ")]


STOCK = {
    "engine/decode.py": "def generate(model, prompt, n):\n    out = []\n    for _ in range(n):\n"
                        "        out.append(model(prompt + out))\n    return out\n",
    "engine/trees.py": "POLICIES = ['chain']\n\n\ndef parse(spec):\n    return spec.split(':')\n",
    "README.md": "engine\n",
}


def write(root: Path, files: dict[str, str | None]) -> None:
    for rel, text in files.items():
        p = root / rel
        if text is None:
            p.unlink()
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


class Repo:
    """A temporary repository with a stock commit, and candidate edits made in worktrees of it."""

    def __init__(self, root: Path):
        self.path = root / "repo"
        self.path.mkdir()
        git(self.path, "init", "-q")
        write(self.path, STOCK)
        self.stock = commit_all(self.path, "stock")
        self.n = 0

    def candidate(self, base: str, files: dict[str, str | None]) -> tuple[str, str, str]:
        """Edit `base` in a worktree: (delta, tree of the worktree, commit of it)."""
        self.n += 1
        wt = self.path.parent / f"cand{self.n}"
        git(self.path, "worktree", "add", "-q", "--detach", str(wt), base)
        try:
            write(wt, files)
            delta, tree = diff_between(self.path, base, wt), tree_of_worktree(wt)
            rev = commit_all(wt, f"candidate {self.n}")
        finally:
            git(self.path, "worktree", "remove", "--force", str(wt))
        return delta, tree, rev


A_TREES = STOCK["engine/trees.py"].replace("['chain']", "['chain', 'best-first']") + (
    "\n\ndef best_first(lat, n):\n    nodes = sorted(lat)[:n]\n    return nodes\n"
)
B_TREES = A_TREES.replace("    nodes = sorted(lat)[:n]\n", "    nodes = sorted(lat, reverse=True)[:n]\n").replace(
    "['chain', 'best-first']", "['chain', 'best-first', 'topk']"
)


@pytest.fixture
def setup(tmp_path):
    r = Repo(tmp_path)
    delta_a, tree_a, rev_a = r.candidate(r.stock, {"engine/trees.py": A_TREES, "engine/new.py": "X = 1\n"})
    delta_b, tree_b, _ = r.candidate(rev_a, {"engine/trees.py": B_TREES, "README.md": None})
    a = Entry(id="tree-best-first", version=1, title="best-first", delta=delta_a)
    b = Entry(id="tree-topk", version=1, title="topk", requires=(Requirement("tree-best-first"),), delta=delta_b)
    return r, a, b, tree_a, tree_b


def test_two_entries_reproduce_exactly(setup):
    r, a, b, tree_a, tree_b = setup
    order = resolve([Requirement("tree-topk")], {"tree-best-first": [a], "tree-topk": [b]})
    assert [e.key for e in order] == [a.key, b.key]
    assert "sorted(lat, reverse=True)" in b.delta and "+    nodes = sorted(lat)[:n]" in a.delta
    reproduce(r.path, r.stock, order, tree_b)
    reproduce(r.path, r.stock, [a], tree_a)
    # byte for byte: the reproduced tree holds exactly the candidate's file contents
    assert git(r.path, "cat-file", "-p", f"{tree_b}:engine/trees.py") == B_TREES
    assert worktrees(r.path) == [f"worktree {r.path}"]


def test_order_matters_and_missing_requirement_is_stale(setup):
    r, a, b, _, tree_b = setup
    with pytest.raises(ReproduceError, match="tree-topk@1") as e:
        reproduce(r.path, r.stock, [b], tree_b)
    assert e.value.kind == "stale" and "engine/trees.py" in str(e.value)
    with pytest.raises(ReproduceError, match="tree-topk@1"):
        reproduce(r.path, r.stock, [b, a], tree_b)
    assert worktrees(r.path) == [f"worktree {r.path}"]


def test_tampered_added_line_gives_a_different_tree(setup):
    r, a, b, _, tree_b = setup
    bad = dataclasses.replace(b, delta=b.delta.replace("reverse=True", "reverse=False"))
    assert bad.delta != b.delta
    with pytest.raises(ReproduceError, match="tree-topk@1") as e:
        reproduce(r.path, r.stock, [a, bad], tree_b)
    assert e.value.kind == "tampered" and e.value.paths == ("engine/trees.py",)
    assert "engine/trees.py" in str(e.value)
    assert worktrees(r.path) == [f"worktree {r.path}"]


def test_tampered_context_line_does_not_apply(setup):
    r, a, b, _, tree_b = setup
    bad = dataclasses.replace(b, delta=b.delta.replace(" def best_first(lat, n):", " def best_first(lat, m):"))
    assert bad.delta != b.delta
    with pytest.raises(ReproduceError, match="tree-topk@1") as e:
        reproduce(r.path, r.stock, [a, bad], tree_b)
    assert e.value.kind == "stale" and "engine/trees.py" in str(e.value)
    assert worktrees(r.path) == [f"worktree {r.path}"]


def test_stale_delta_after_stock_changed(setup):
    r, a, b, _, tree_b = setup
    git(r.path, "checkout", "-q", r.stock)
    write(r.path, {"engine/trees.py": STOCK["engine/trees.py"].replace("['chain']", "['chain', 'oracle']")})
    new_stock = commit_all(r.path, "stock moved")
    with pytest.raises(ReproduceError, match="tree-best-first@1") as e:
        reproduce(r.path, new_stock, [a, b], tree_b)
    assert e.value.kind == "stale" and e.value.key == "tree-best-first@1"
    assert "engine/trees.py" in str(e.value)
    assert worktrees(r.path) == [f"worktree {r.path}"]


def test_malformed_delta(setup):
    r, a, _, tree_a, _ = setup
    for text in ("this is not a patch\n", a.delta.replace("@@ -1,", "@@ -x,", 1)):
        bad = Entry(id="broken", version=2, title="broken", delta=text)
        with pytest.raises(ReproduceError, match="broken@2") as e:
            reproduce(r.path, r.stock, [bad], tree_a)
        assert e.value.kind == "malformed", str(e.value)
    assert worktrees(r.path) == [f"worktree {r.path}"]


def test_empty_delta_is_a_no_op(setup):
    r, a, _, tree_a, _ = setup
    switch = Entry(id="draft-length", version=1, title="switch")
    reproduce(r.path, r.stock, [switch], tree_of(r.path, r.stock))
    reproduce(r.path, r.stock, [switch, a, Entry(id="x", version=1, title="x", delta="\n")], tree_a)
    reproduce(r.path, r.stock, [], tree_of(r.path, r.stock))
    with pytest.raises(ReproduceError, match="draft-length@1") as e:
        reproduce(r.path, r.stock, [switch], tree_a)  # the switch alone does not give A's code
    assert e.value.kind == "tampered" and set(e.value.paths) == {"engine/new.py", "engine/trees.py"}
    assert worktrees(r.path) == [f"worktree {r.path}"]


def test_bad_expected_tree_and_bad_stock_name_the_entry(setup):
    r, a, _, tree_a, _ = setup
    with pytest.raises(ReproduceError, match="tree-best-first@1"):
        reproduce(r.path, r.stock, [a], "0" * 40)
    with pytest.raises(ReproduceError, match="tree-best-first@1"):
        reproduce(r.path, "no-such-rev", [a], tree_a)
    assert worktrees(r.path) == [f"worktree {r.path}"]


def test_tree_of_worktree_matches_commit(setup, tmp_path):
    r, *_ = setup
    assert tree_of_worktree(r.path) == tree_of(r.path, r.stock) == tree_of(r.path, "HEAD")
    assert tree_of(r.path, r.path) == tree_of(r.path, r.stock)
    (r.path / "engine" / "extra.py").write_text("Y = 2\n")  # untracked files count
    t = tree_of_worktree(r.path)
    assert git(r.path, "status", "--porcelain") == "?? engine/extra.py\n"  # the real index is untouched
    rev = commit_all(r.path, "extra")
    assert t == tree_of(r.path, rev)
    assert diff_between(r.path, rev, r.path) == ""


def test_many_differing_paths_listed_up_to_ten(tmp_path):
    r = Repo(tmp_path)
    _, tree, _ = r.candidate(r.stock, {f"engine/m{i:02d}.py": f"V = {i}\n" for i in range(13)})
    with pytest.raises(ReproduceError) as e:
        reproduce(r.path, r.stock, [Entry(id="s", version=1, title="s")], tree)
    msg = str(e.value)
    assert "entry s@1" in msg and "engine/m09.py" in msg and "engine/m10.py" not in msg and "3 more" in msg
    assert len(e.value.paths) == 13


def test_real_engine_source(tmp_path):
    """engine/ at /work/main's HEAD (read with `git archive`) as stock; a small edit of trees.py."""
    data = subprocess.run(["git", "archive", "--format=tar", "HEAD", "engine"], cwd=MAIN, check=True,
                          capture_output=True).stdout
    repo = tmp_path / "real"
    repo.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(repo, filter="data")
    assert (repo / "engine" / "trees.py").is_file()
    git(repo, "init", "-q")
    stock = commit_all(repo, "stock engine")
    wt = tmp_path / "cand"
    git(repo, "worktree", "add", "-q", "--detach", str(wt), stock)
    src = (wt / "engine" / "trees.py").read_text()
    assert "MAX_DEPTH = 15" in src
    (wt / "engine" / "trees.py").write_text(src.replace("MAX_DEPTH = 15", "MAX_DEPTH = 12  # shallower trees"))
    delta, expected = diff_between(repo, stock, wt), tree_of_worktree(wt)
    git(repo, "worktree", "remove", "--force", str(wt))
    assert delta.startswith("diff --git a/engine/trees.py b/engine/trees.py")
    assert "+MAX_DEPTH = 12  # shallower trees" in delta
    entry = Entry(id="tree-depth", version=1, title="shallower trees", delta=delta)
    reproduce(repo, stock, [entry], expected)
    with pytest.raises(ReproduceError, match="tree-depth@1"):
        reproduce(repo, stock, [entry], tree_of(repo, stock))
    assert worktrees(repo) == [f"worktree {repo}"]
