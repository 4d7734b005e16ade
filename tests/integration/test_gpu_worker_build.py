"""The GPU worker builds a candidate's code in a git worktree (real git) and runs its engine from
there (real worker processes), under the editable install and under an installed wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gitrepo import git, make_repo, worktrees

from specpilot.entrypoints.demo import micro_pair
from specpilot.services.gpu_worker.systems import SystemProcess
from specpilot.services.gpu_worker.build import ALLOWED, BuildError, build_worktree, remove_worktree
from specpilot.zoo.workloads import stdlib_completion

REPO = Path(__file__).resolve().parents[2]
TARGET, DRAFTER, _ = micro_pair()
STOCK = {"target": str(TARGET), "drafter": str(DRAFTER), "mode": "chain", "max_new_tokens": 12}
REQS = [{"id": r.id, "prompt": r.prompt} for r in stdlib_completion(limit=1)]
CAP = ("        n = getattr(req, \"max_new_tokens\", None) or self.cfg.max_new_tokens\n",
       "        n = 3  # patched: every answer is 3 tokens\n")


@pytest.fixture
def repo(tmp_path):
    """A small repository shaped like the project."""
    return make_repo(tmp_path, {"engine/a.py": "x = 1\n", "kernels/k.py": "k = 1\n", "services/controller/c.py":
                                "c = 1\n", "setup.py": "", "tests/t.py": "", "zoo/z.py": "", "specpilot/__init__.py": ""})


def diff_of(repo, edit, where: Path) -> str:
    """The patch that `edit(worktree)` makes on HEAD, made with git in a scratch worktree at `where`."""
    scratch = build_worktree(repo, "HEAD", "", where)
    try:
        edit(scratch)
        git(scratch, "add", "-A")
        return git(scratch, "diff", "--cached", "--binary", "-M", "HEAD")
    finally:
        remove_worktree(repo, scratch)


def test_a_patch_is_applied_in_a_detached_worktree_and_removed_afterwards(repo, tmp_path):
    def edit(wt):
        (wt / "engine/a.py").write_text("x = 2\n")
        (wt / "kernels/new.py").write_text("n = 1\n")

    patch = diff_of(repo, edit, tmp_path / "scratch")
    head = git(repo, "rev-parse", "HEAD").strip()
    wt = build_worktree(repo, "HEAD", patch, tmp_path / "wt")
    assert (wt / "engine/a.py").read_text() == "x = 2\n" and (wt / "kernels/new.py").read_text() == "n = 1\n"
    assert git(wt, "rev-parse", "HEAD").strip() == head
    assert subprocess.run(["git", "symbolic-ref", "-q", "HEAD"], cwd=wt).returncode != 0  # detached
    assert (repo / "engine/a.py").read_text() == "x = 1\n"  # the repository itself is untouched
    assert len(worktrees(repo)) == 2
    remove_worktree(repo, wt)
    assert not wt.exists() and len(worktrees(repo)) == 1
    assert ALLOWED == ("engine/", "kernels/")


def test_an_empty_patch_is_the_base_revision(repo, tmp_path):
    wt = build_worktree(repo, "HEAD", "", tmp_path / "wt")
    assert (wt / "engine/a.py").read_text() == "x = 1\n" and not git(wt, "status", "--porcelain")
    remove_worktree(repo, wt)


def _symlink(wt):
    os.symlink("../services/controller/c.py", wt / "engine/c.py")


@pytest.mark.parametrize("edit, path", [
    (lambda wt: (wt / "services/controller/c.py").write_text("c = 2\n"), "services/controller/c.py"),
    (lambda wt: (wt / "tests/t.py").write_text("t = 1\n"), "tests/t.py"),
    (lambda wt: (wt / "setup.py").write_text("s = 1\n"), "setup.py"),
    (lambda wt: (wt / "zoo/z.py").write_text("z = 1\n"), "zoo/z.py"),
    (lambda wt: (wt / "specpilot/__init__.py").write_text("p = 1\n"), "specpilot/__init__.py"),
    (lambda wt: (wt / "engine/a.py").rename(wt / "services/a.py"), "a.py"),  # a rename
    (lambda wt: (wt / "engine/w.bin").write_bytes(bytes(range(256))), "engine/w.bin"),  # binary
    (_symlink, "engine/c.py"),
])
def test_patches_outside_engine_and_kernels_or_tricks_are_refused(repo, tmp_path, edit, path):
    patch = diff_of(repo, edit, tmp_path / "scratch")
    with pytest.raises(BuildError) as e:
        build_worktree(repo, "HEAD", patch, tmp_path / "wt")
    assert path in str(e.value) and "refused" in str(e.value)
    assert not (tmp_path / "wt").exists() and len(worktrees(repo)) == 1


def test_a_path_escaping_with_dotdot_is_refused(repo, tmp_path):
    patch = "--- a/engine/../services/controller/c.py\n+++ b/engine/../services/controller/c.py\n@@ -1 +1 @@\n-c = 1\n+c = 2\n"
    with pytest.raises(BuildError, match=r"engine/\.\./services/controller/c\.py"):
        build_worktree(repo, "HEAD", patch, tmp_path / "wt")
    assert (repo / "services/controller/c.py").read_text() == "c = 1\n"


def test_a_patch_that_does_not_apply_is_reported_with_gits_message_and_cleaned_up(repo, tmp_path):
    stale = "--- a/engine/a.py\n+++ b/engine/a.py\n@@ -1 +1 @@\n-x = 7\n+x = 8\n"
    with pytest.raises(BuildError) as e:
        build_worktree(repo, "HEAD", stale, tmp_path / "wt")
    assert "engine/a.py" in str(e.value) and "patch does not apply" in str(e.value)
    assert not (tmp_path / "wt").exists() and len(worktrees(repo)) == 1

    malformed = "--- a/engine/a.py\n+++ b/engine/a.py\n@@ -1,5 +1,5 @@\n-x = 1\n"
    with pytest.raises(BuildError) as e:
        build_worktree(repo, "HEAD", malformed, tmp_path / "wt")
    assert "engine/a.py" in str(e.value) and "corrupt patch" in str(e.value)

    with pytest.raises(BuildError, match="No valid patches"):
        build_worktree(repo, "HEAD", "this is not a patch\n", tmp_path / "wt")
    assert not (tmp_path / "wt").exists() and len(worktrees(repo)) == 1


def test_an_unknown_revision_is_a_build_error(repo, tmp_path):
    with pytest.raises(BuildError, match="no-such-rev"):
        build_worktree(repo, "no-such-rev", "", tmp_path / "wt")


# ---------------------------------------------------------------- the worker runs the worktree's engine

PROBE = """
import json, sys
from specpilot.services.gpu_worker.systems import SystemProcess
from specpilot.services.gpu_worker.build import use_root
use_root(sys.argv[1])
import specpilot, specpilot.engine.engine, specpilot.kernels, specpilot.zoo, specpilot.services.gpu_worker.local
names = ["specpilot", "specpilot.engine", "specpilot.engine.engine", "specpilot.kernels", "specpilot.zoo",
         "specpilot.services.gpu_worker.local"]
print(json.dumps({n: sys.modules[n].__file__ for n in names}))
"""


def capped_engine(tmp_path) -> Path:
    """A worktree of this repository whose engine answers every request with 3 tokens."""
    def edit(wt):
        f = wt / "engine/engine.py"
        assert CAP[0] in f.read_text()
        f.write_text(f.read_text().replace(CAP[0], CAP[1]))

    patch = diff_of(REPO, edit, tmp_path / "scratch")
    return build_worktree(REPO, "HEAD", patch, tmp_path / "wt")


def check_where(wt: Path, installed: Path, env: dict, cwd: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE, str(wt)], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    files = {k: Path(v).resolve() for k, v in json.loads(proc.stdout).items()}
    for name in ("specpilot.engine", "specpilot.engine.engine", "specpilot.kernels"):
        assert files[name].is_relative_to(wt.resolve()), (name, files[name])
    for name in ("specpilot", "specpilot.zoo", "specpilot.services.gpu_worker.local"):
        assert files[name].is_relative_to(installed.resolve()), (name, files[name])


def run_systems(wt: Path) -> None:
    patched = SystemProcess(STOCK, "cpu:0", timeout=120, root=str(wt))  # the worktree's engine
    stock = SystemProcess(STOCK, "cpu:0", timeout=120)
    try:
        assert [len(o) for o in patched.generate(REQS)[0]] == [3]
        assert [len(o) for o in stock.generate(REQS)[0]] == [12]
    finally:
        patched.close()
        stock.close()


def test_the_worker_runs_the_patched_engine_of_a_worktree(tmp_path, monkeypatch):
    wt = capped_engine(tmp_path)
    try:
        monkeypatch.chdir(tmp_path)
        check_where(wt, REPO, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, tmp_path)
        run_systems(wt)
    finally:
        remove_worktree(REPO, wt)


NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                    ".hypothesis", "out", ".whl")


@pytest.mark.slow
def test_under_a_wheel_install_the_worker_also_runs_the_worktrees_engine(tmp_path, monkeypatch):
    src, dist, site, elsewhere = (tmp_path / d for d in ("src", "dist", "site", "elsewhere"))
    shutil.copytree(REPO, src, ignore=NOT_COPIED)
    elsewhere.mkdir()
    build = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    [wheel] = dist.glob("specpilot-*.whl")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                              str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr

    wt = capped_engine(tmp_path)
    try:
        monkeypatch.chdir(elsewhere)
        monkeypatch.setenv("PYTHONPATH", str(site))
        monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
        check_where(wt, site, dict(os.environ), elsewhere)
        run_systems(wt)  # the worker processes inherit PYTHONPATH: their code is the wheel's
    finally:
        remove_worktree(REPO, wt)
