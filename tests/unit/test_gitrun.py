"""The one way the project runs git: the caller's GIT_* variables never redirect it; failures quote git."""

import pytest

from specpilot import gitrun


def test_git_ignores_the_callers_git_variables_and_quotes_git_on_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "stray-index"))
    gitrun.run(tmp_path, "init", "-q", check=True)
    (tmp_path / "a.txt").write_text("a\n")
    tree = gitrun.tree_of_files(tmp_path)  # untracked files count, through a throwaway index
    assert gitrun.run(tmp_path, "cat-file", "-t", tree, check=True).stdout.strip() == "tree"
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "stray-index").exists()
    (tmp_path / "a.txt").write_text("b\n")
    patch = gitrun.diff(tmp_path, tree, gitrun.tree_of_files(tmp_path))
    assert patch.startswith("diff --git a/a.txt b/a.txt") and "-a\n+b" in patch
    with pytest.raises(gitrun.GitFailed, match="no-such-rev"):
        gitrun.run(tmp_path, "rev-parse", "--verify", "no-such-rev", check=True)
    assert gitrun.message(gitrun.run(tmp_path, "rev-parse", "--verify", "-q", "x")) == "exit status 1"
