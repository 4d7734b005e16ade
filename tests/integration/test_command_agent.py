"""The command agent runs real programs in real git worktrees; its candidate is built by the GPU
worker and run in a worker process."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gitrepo import make_repo, worktrees

from specpilot.entrypoints.demo import micro_pair
from specpilot.services.gpu_worker.systems import SystemProcess
from specpilot.services.gpu_worker.build import build_worktree, remove_worktree
from specpilot.services.planner.agents import Context
from specpilot.services.planner.command_agent import CommandAgent, prompt
from specpilot.zoo.workloads import stdlib_completion

REPO = Path(__file__).resolve().parents[2]
TARGET, DRAFTER, _ = micro_pair()
STOCK = {"target": str(TARGET), "drafter": str(DRAFTER), "mode": "chain", "max_new_tokens": 12}
CONTEXT = Context(
    round=3, deployment={"target": "micro/dense", "drafter": "micro/dense-block", "gpu": "cpu", "batch": 1},
    incumbent={"mode": "chain", "draft_len": 8}, incumbent_patch="",
    costmodel={"budgets": [{"policy": "chain", "rows": 9, "tau": 2.5, "t_step_s": 0.0123, "c": 1.4, "speedup": 1.79},
                           {"policy": "best-first:32", "rows": 32, "tau": 3.1, "t_step_s": 0.02, "c": 2.0,
                            "speedup": 1.55}],
               "ceiling": {"factors": {"tree": 1.3, "kernels": 2.2, "off-profile": 1.05}}},
    direction="kernel:gemm", memory=[{"id": "best-first-tree", "version": 2, "title": "Best-first tree"}])


def script(tmp_path, body: str) -> str:
    """A python program (run as `python prog.py <prompt>`); returns the command."""
    prog = tmp_path / "prog.py"
    prog.write_text("import json, os, sys, pathlib\n" + textwrap.dedent(body))
    return f"{sys.executable} {prog}"


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path, {"engine/a.py": "x = 1\n", "kernels/k.py": "", "services/controller/c.py": "c = 1\n"})


def test_a_program_that_edits_the_engine_gives_a_candidate_the_worker_builds_and_runs(tmp_path):
    seen = tmp_path / "seen.json"
    cmd = script(tmp_path, f"""
        engine = pathlib.Path("engine/engine.py")
        old = '        n = getattr(req, "max_new_tokens", None) or self.cfg.max_new_tokens\\n'
        assert old in engine.read_text()
        engine.write_text(engine.read_text().replace(old, "        n = 5\\n"))
        pathlib.Path("engine/agent_notes.py").write_text("NOTE = 'new file'\\n")
        pathlib.Path({str(seen)!r}).write_text(json.dumps({{"argv": sys.argv, "env": dict(os.environ),
            "cwd": os.getcwd(), "prompt": pathlib.Path(sys.argv[-1]).read_text()}}))
        print("x" * 3000)
        print("Rationale: five tokens are enough for everyone.")
    """)
    before = worktrees(REPO)
    agent = CommandAgent(cmd, REPO, "HEAD", timeout=60, name="cmd")
    [cand] = agent.propose(CONTEXT)
    assert worktrees(REPO) == before  # the scratch worktree is gone
    assert cand.name == "cmd-r3" and cand.agent == "command" and not cand.options
    assert len(cand.rationale) == 2000 and cand.rationale.endswith("five tokens are enough for everyone.\n")
    assert "+        n = 5" in cand.patch and "b/engine/agent_notes.py" in cand.patch
    assert agent.last_log["paths"] == ["engine/agent_notes.py", "engine/engine.py"]
    assert agent.last_log["returncode"] == 0 and not agent.last_log["refused"]

    info = json.loads(seen.read_text())
    assert not Path(info["cwd"]).exists()  # removed afterwards
    assert info["argv"][-1] == info["env"]["SPECPILOT_PROMPT"]
    assert not Path(info["argv"][-1]).resolve().is_relative_to(Path(info["cwd"]).resolve())  # outside the worktree
    assert info["env"]["SPECPILOT_WORKTREE"] == info["cwd"]
    assert "| chain | 9 | 2.5 | 0.0123 | 1.4 | 1.79 |" in info["prompt"] and "kernel:gemm" in info["prompt"]

    wt = build_worktree(REPO, "HEAD", cand.patch, tmp_path / "wt")
    try:
        worker = SystemProcess(STOCK, "cpu:0", timeout=120, root=str(wt))
        try:
            outs, _ = worker.generate([{"id": r.id, "prompt": r.prompt} for r in stdlib_completion(limit=1)])
        finally:
            worker.close()
        assert [len(o) for o in outs] == [5]  # the agent's engine is what ran
    finally:
        remove_worktree(REPO, wt)


def test_the_program_sees_no_secret_of_the_parent_environment(repo, tmp_path, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-fake")
    seen = tmp_path / "env.json"
    cmd = script(tmp_path, f"pathlib.Path({str(seen)!r}).write_text(json.dumps(dict(os.environ)))\n")
    assert CommandAgent(cmd, repo, "HEAD").propose(CONTEXT) == []  # no change, no candidate
    env = json.loads(seen.read_text())
    assert set(env) <= {"PATH", "LANG", "HOME", "SPECPILOT_PROMPT", "SPECPILOT_WORKTREE", "PWD", "SHLVL", "_", "LC_CTYPE"}
    assert "hunter2" not in json.dumps(env) and "sk-fake" not in json.dumps(env)
    assert env["HOME"] != str(Path.home())


def test_a_program_that_times_out_is_killed_with_its_children_and_yields_nothing(repo, tmp_path):
    marker = tmp_path / "late"
    cmd = (f"echo 'x = 2' > engine/a.py; (sleep 2; touch {marker}) & "
           f"{sys.executable} -c 'import time; time.sleep(60)'")
    agent = CommandAgent(cmd, repo, "HEAD", timeout=1)
    t0 = time.monotonic()
    assert agent.propose(CONTEXT) == []
    assert time.monotonic() - t0 < 10
    assert agent.last_log["timed_out"] and "timeout" in agent.last_log["refused"]
    time.sleep(2.5)
    assert not marker.exists()  # the background child went with the group
    assert len(worktrees(repo)) == 1


def test_changes_outside_engine_and_kernels_are_refused(repo, tmp_path):
    cmd = script(tmp_path, """
        pathlib.Path("engine/a.py").write_text("x = 2\\n")
        pathlib.Path("services/controller/c.py").write_text("c = 'always accept'\\n")
    """)
    agent = CommandAgent(cmd, repo, "HEAD")
    assert agent.propose(CONTEXT) == []
    assert "services/controller/c.py" in agent.last_log["refused"]
    assert (repo / "services/controller/c.py").read_text() == "c = 1\n" and len(worktrees(repo)) == 1


@pytest.mark.parametrize("body, why", [
    ("pathlib.Path('engine/a.py').write_text('x = 3\\n'); sys.exit(3)", "status 3"),
    ("pathlib.Path('engine/w.bin').write_bytes(bytes(range(256)))", "binary"),
    ("os.remove('.git')", "git"),  # the worktree is wrecked: nothing can be read back
])
def test_misbehaviour_is_logged_not_raised(repo, tmp_path, body, why):
    agent = CommandAgent(script(tmp_path, body), repo, "HEAD")
    assert agent.propose(CONTEXT) == []
    assert why in agent.last_log["refused"]
    assert len(worktrees(repo)) == 1


def test_the_program_starts_from_the_incumbent_and_its_diff_is_against_it(repo, tmp_path):
    incumbent = "--- a/engine/a.py\n+++ b/engine/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 10\n"
    cmd = script(tmp_path, """
        p = pathlib.Path("engine/a.py")
        assert p.read_text() == "x = 10\\n", p.read_text()
        p.write_text(p.read_text() + "y = 20\\n")
    """)
    [cand] = CommandAgent(cmd, repo, "HEAD").propose(
        Context(**{**CONTEXT.__dict__, "incumbent_patch": incumbent}))
    assert "+y = 20" in cand.patch and "x = 10" in cand.patch and "+x = 10" not in cand.patch


def test_misuse_raises(repo, tmp_path):
    with pytest.raises(ValueError, match="no-such-rev"):
        CommandAgent("true", repo, "no-such-rev")
    with pytest.raises(ValueError):
        CommandAgent("true", tmp_path, "HEAD")  # not a repository
    bad = "--- a/engine/a.py\n+++ b/engine/a.py\n@@ -1 +1 @@\n-x = 7\n+x = 8\n"
    with pytest.raises(ValueError, match="incumbent|apply"):
        CommandAgent("true", repo, "HEAD").propose(Context(**{**CONTEXT.__dict__, "incumbent_patch": bad}))
    assert len(worktrees(repo)) == 1


def test_the_prompt_carries_the_round():
    text = prompt(CONTEXT, "/wt")
    for part in ("round 3", "micro/dense-block", '"draft_len": 8', "| best-first:32 | 32 | 3.1 | 0.02 | 2 | 1.55 |",
                 "- kernels: 2.2x", "**kernel:gemm**", "best-first-tree@2: Best-first tree", "lossless",
                 "`engine/` and `kernels/`"):
        assert part in text, part
