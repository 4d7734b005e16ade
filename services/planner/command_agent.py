"""The external command agent: any program (a coding agent, a script) that edits the engine.

`CommandAgent(command, repo, base_rev).propose(context)`:
1. checks out `base_rev` + the incumbent's patch in a scratch `git worktree` (this module's own
   git helpers: the planner imports neither the GPU worker nor the engine);
2. writes the round's brief as markdown (`prompt(context)`) to a file outside the worktree;
3. runs `command <prompt path>` through the shell, cwd = the worktree, in a scrubbed environment
   (PATH, LANG, HOME = an empty temporary folder, SPECPILOT_PROMPT, SPECPILOT_WORKTREE: nothing
   else of the planner's environment), in its own process group, killed on the hard timeout;
4. turns the program's edits (new files included, .gitignore respected) into one Candidate whose
   patch is the diff against the starting tree and whose rationale is the tail of its stdout.

The agent's misbehaviour (timeout, non-zero exit, changes outside engine/ or kernels/, a binary
or otherwise refused patch) yields no candidate and is recorded in `last_log`; only misuse (not a
repository, an unknown revision, an incumbent patch that does not apply) raises `ValueError`.
The worktree is always removed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from specpilot import gitrun, patches

from .agents import Candidate, Context

RATIONALE_CHARS = 2000


def _git(cwd: Path | str, *args: str) -> str:
    return gitrun.run(cwd, *args, check=True).stdout


def _tail(path: Path, n: int) -> str:
    data = path.read_bytes() if path.exists() else b""
    return data[-4 * n:].decode("utf-8", "replace")[-n:]


def prompt(context: Context, worktree: Path | str) -> str:
    """The round's brief for the program, as markdown."""
    cm = context.costmodel or {}
    out = [f"# SpecPilot, round {context.round}: improve the engine", "",
           f"Your working copy is `{worktree}` (the incumbent's code: the base revision"
           + (" plus the incumbent's patch)." if context.incumbent_patch.strip() else ", stock code)."), "",
           "## Deployment", ""]
    out += [f"- {k}: {v}" for k, v in context.deployment.items()]
    out += ["", "## Incumbent configuration (EngineConfig)", "", "```json",
            json.dumps(context.incumbent, indent=1, sort_keys=True, default=str), "```", "",
            "## Cost model: budgets", "", "| policy | rows | tau | t_step_s | c | speedup |", "|---|---|---|---|---|---|"]
    for row in cm.get("budgets", []):
        out.append("| " + " | ".join(_cell(row.get(k)) for k in ("policy", "rows", "tau", "t_step_s", "c", "speedup")) + " |")
    factors = (cm.get("ceiling") or {}).get("factors", {})
    out += ["", "## Ceiling factors (how much each could still give)", ""]
    out += [f"- {k}: {_cell(v)}x" for k, v in factors.items()] or ["- (not measured)"]
    out += ["", "## Direction", "", f"This round attacks: **{context.direction}**", "", "## Memory", ""]
    out += [f"- {e.get('id')}@{e.get('version')}: {e.get('title', '')}" for e in context.memory] or ["- (empty)"]
    if context.tried:
        out += ["", "## Already evaluated", "", ", ".join(context.tried)]
    out += ["", "## Rules", "",
            "- The output must stay lossless: greedy decoding must emit exactly the tokens the target "
            "alone would (every accepted token verified by an exact pass and equal to its argmax). "
            "A sealed controller checks this by token forcing and times your system against the incumbent.",
            "- Change only files under " + " and ".join(f"`{a}`" for a in patches.ALLOWED)
            + " (text files, no renames). Any change elsewhere discards the whole candidate.",
            "- Edit the files in place; do not commit. Your edits (new files included) are the candidate.",
            f"- End your output with a short rationale: its last {RATIONALE_CHARS} characters are kept.", ""]
    return "\n".join(out)


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


class CommandAgent:
    def __init__(self, command: str, repo: Path | str, base_rev: str, timeout: float = 600, name: str = "command"):
        self.command, self.repo, self.base_rev = command, Path(repo), base_rev
        self.timeout, self.name = timeout, name
        self.last_log: dict = {}
        try:
            _git(self.repo, "rev-parse", "--verify", "--quiet", f"{base_rev}^{{commit}}")
        except gitrun.GitFailed as e:
            raise ValueError(f"{base_rev!r} is not a commit of a git repository at {self.repo}: {e}") from None

    def propose(self, context: Context) -> list[Candidate]:
        tmp = Path(tempfile.mkdtemp(prefix="specpilot-command-"))
        wt, home, prompt_path = tmp / "wt", tmp / "home", tmp / "prompt.md"
        home.mkdir()
        log = self.last_log = {"command": self.command, "returncode": None, "timed_out": False,
                               "stdout": "", "stderr": "", "refused": None, "paths": []}
        try:
            try:
                _git(self.repo, "worktree", "add", "--detach", "--quiet", str(wt), f"{self.base_rev}^{{commit}}")
                if context.incumbent_patch.strip():
                    (tmp / "incumbent.patch").write_text(context.incumbent_patch.rstrip("\n") + "\n")
                    _git(wt, "apply", "--whitespace=nowarn", str(tmp / "incumbent.patch"))
                start = gitrun.tree_of_files(wt)
            except gitrun.GitFailed as e:
                raise ValueError(f"cannot prepare the worktree (base {self.base_rev}): {e}") from None
            prompt_path.write_text(prompt(context, wt), encoding="utf-8")
            self._run(wt, home, prompt_path, tmp, log)
            log["stdout"], log["stderr"] = _tail(tmp / "stdout", RATIONALE_CHARS), _tail(tmp / "stderr", RATIONALE_CHARS)
            if log["timed_out"]:
                log["refused"] = f"killed after the {self.timeout} s timeout"
                return []
            if log["returncode"] != 0:
                log["refused"] = f"the command exited with status {log['returncode']}"
                return []
            try:
                diff = gitrun.diff(wt, start, gitrun.tree_of_files(wt))
                log["paths"] = patches.check(diff)
            except (gitrun.GitFailed, patches.PatchRefused) as e:
                log["refused"] = str(e)
                return []
            if not diff.strip():
                return []
            return [Candidate(name=f"{self.name}-r{context.round}", agent="command", patch=diff,
                              rationale=log["stdout"])]
        finally:
            try:
                _git(self.repo, "worktree", "remove", "--force", "--force", str(wt))
            except gitrun.GitFailed:
                pass
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                _git(self.repo, "worktree", "prune")
            except gitrun.GitFailed:
                pass

    def _run(self, wt: Path, home: Path, prompt_path: Path, tmp: Path, log: dict) -> None:
        env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8"),
               "HOME": str(home), "SPECPILOT_PROMPT": str(prompt_path), "SPECPILOT_WORKTREE": str(wt)}
        with open(tmp / "stdout", "wb") as out, open(tmp / "stderr", "wb") as err:
            proc = subprocess.Popen(f"{self.command} {shlex.quote(str(prompt_path))}", shell=True, cwd=wt, env=env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
            deadline = time.monotonic() + self.timeout
            # wait without reaping, so that the group id stays its own until the group is killed
            while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                if time.monotonic() > deadline:
                    log["timed_out"] = True
                    break
                time.sleep(0.05)
            try:  # the whole group: on the timeout, and whatever it left running in the background
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            log["returncode"] = proc.wait()
