"""Systems under evaluation, each in a process of its own: the GPU worker's domain, shared by the
embedded mode (the controller gets `LocalWorkers` injected) and the gRPC server (`server.py`).

- `SystemProcess`: one built system in a child process (`local.py`, JSON lines on stdin/stdout),
  every call under a hard timeout; the child is killed on a timeout and on `close()`. It never
  times anything: whoever calls `generate` times the round trip.
- `LocalWorkers`: the GPU worker interface over the local machine's devices. `start(system,
  device)` builds the system's code when it carries a patch (a worktree of the engine's repository
  at the pinned revision, `build.py`) and starts its process on the device (`cpu:N` pins a core);
  `code_tree` names the git tree of a system's code (the memory's reproduce check compares it).

Imports only the standard library, `specpilot.gitrun` / `specpilot.patches` and this service:
the gRPC GPU worker runs where only torch, grpcio, protobuf and prometheus-client are installed.
"""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

from specpilot import gitrun
from specpilot.devices import device_list

from .build import BuildError, build_worktree, remove_worktree

CHILD = "specpilot.services.gpu_worker.local"


class SystemProcess:
    """A handle on one system in its own process; every call answers within `timeout` or raises."""

    def __init__(self, engine: dict, device: str, timeout: float, on_close=None):
        self.timeout, self.device, self._on_close = timeout, device, on_close
        self.log = tempfile.TemporaryFile(mode="w+")
        self._lock = threading.Lock()
        engine = dict(engine)
        root = engine.pop("root", None)  # a built worktree: the child loads the engine's code from there
        spec = {"engine": engine, "device": device, **({"root": str(root)} if root else {})}
        self.proc = subprocess.Popen([sys.executable, "-m", CHILD, json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        reply = self._read("start")
        if "error" in reply:  # the child answered instead of loading the system
            self.close()
            raise RuntimeError(f"worker on {device} could not load the system: {reply['error']}")

    def _read(self, what: str) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else ""
        try:
            if line:
                return json.loads(line)
        except json.JSONDecodeError:
            pass
        self.close()
        self.log.seek(0)
        why = (f"no answer within {self.timeout} s" if not ready else "the worker exited" if not line
               else "the worker wrote something else than a JSON line")
        raise RuntimeError(f"worker on {self.device}: {what} failed ({why}): {last_error(self.log.read())}")

    def call(self, msg: dict, what: str) -> dict:
        with self._lock:  # one request at a time on the child's pipe
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker on {self.device}: {what} failed (the worker exited)")
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
            reply = self._read(what)
        if "error" in reply:
            raise ValueError(f"worker on {self.device} refused the {what} call: {reply['error']}")
        return reply

    def generate(self, requests: list[dict]) -> tuple[list[list[int]], list[list[int]]]:
        """(outputs, prompt ids) of the requests, once the device has finished."""
        reply = self.call({"requests": requests}, "generate")
        return reply["outputs"], reply["prompt_ids"]

    def score(self, prompt_ids, tokens) -> SimpleNamespace:
        """Teacher-forced scores (the system's target, float32 head) of one output."""
        reply = self.call({"score": [{"prompt_ids": list(prompt_ids), "tokens": list(tokens)}]}, "score")
        return SimpleNamespace(**reply["scores"][0])

    def profile(self, spec: dict) -> dict:
        """The cost model's measurements of this system (`profiling.measure`)."""
        return self.call({"profile": spec}, "profile")["profile"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close()


def last_error(log: str) -> str:
    """What a child's stderr says went wrong, on one line: the last exception line of a traceback,
    else its last line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", ln)]
    line = (errors or lines or ["it printed nothing"])[-1]
    return line if len(line) <= 500 else line[:500].rsplit(" ", 1)[0] + " …"


def code_tree(repo: Path | str, base_rev: str, patch: str) -> str:
    """The git tree id of `base_rev` with `patch` applied (the code a system runs)."""
    if not patch.strip():
        return gitrun.run(repo, "rev-parse", f"{base_rev}^{{tree}}", check=True).stdout.strip()
    dest = Path(tempfile.mkdtemp(prefix="specpilot-tree-")) / "wt"
    build_worktree(repo, base_rev, patch, dest)
    try:
        gitrun.run(dest, "add", "-A", check=True)
        return gitrun.run(dest, "write-tree", check=True).stdout.strip()
    finally:
        remove_worktree(repo, dest)


class LocalWorkers:
    """The GPU worker interface on this machine's devices (the embedded mode; the gRPC server's core).

    A system is {"config": EngineConfig fields, "patch": unified diff ("" = none), "base_rev": the
    pinned engine revision the patch applies to}."""

    kind = "local"

    def __init__(self, repo: Path | str | None = None):
        self.repo = Path(repo) if repo else None

    def devices(self, dep: dict) -> list[str]:
        return device_list(dep["devices"])

    def start(self, system: dict, device: str, timeout: float) -> SystemProcess:
        engine, patch, on_close = dict(system["config"]), system.get("patch", ""), None
        if patch.strip():
            if self.repo is None or not system.get("base_rev"):
                raise BuildError("a system with a patch needs the engine's git repository and a base revision")
            dest = Path(tempfile.mkdtemp(prefix="specpilot-system-")) / "wt"
            build_worktree(self.repo, system["base_rev"], patch, dest)
            engine["root"] = str(dest)
            on_close = lambda: remove_worktree(self.repo, dest)  # noqa: E731
        try:
            return SystemProcess(engine, device, timeout, on_close)
        except BaseException:
            if on_close:
                on_close()
            raise

    def code_tree(self, base_rev: str, patch: str) -> str:
        if self.repo is None:
            raise BuildError("naming a system's code needs the engine's git repository")
        return code_tree(self.repo, base_rev, patch)

    def health(self) -> list[dict]:
        return [{"address": "local", "device": "local processes", "kind": "local", "healthy": True}]
