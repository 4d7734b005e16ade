"""Systems under evaluation, each in a process of its own: the GPU worker's domain, shared by the
embedded mode (the controller gets `LocalWorkers` injected) and the gRPC server (`server.py`).

- `SystemProcess`: one built system in a child process (`local.py`, JSON lines on stdin/stdout),
  every call under a hard timeout; the child is killed on a timeout and on `close()`. It never
  times anything: whoever calls `generate` times the round trip.
- `LocalWorkers`: the GPU worker interface over the local machine's devices. `start(system,
  device)` builds the system's code when it carries a patch (a worktree of the engine's repository
  at the pinned revision, `build.py`) and starts its process on the device (`cpu:N` pins a core);
  `code_tree` names the git tree of a system's code (the memory's reproduce check compares it).
- `ServerProcess`: a server system (a serving process with an HTTP API) launched on a device,
  with the same calls.

Imports only the standard library, `specpilot.gitrun` / `specpilot.patches` /
`specpilot.systemspec` and this service: the gRPC GPU worker runs where only torch, grpcio, protobuf and prometheus-client are installed.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from specpilot import gitrun
from specpilot.devices import device_list
from specpilot.systemspec import EngineSystem, ServerSystem, SystemSpec

from .build import BuildError, build_worktree, remove_worktree

CHILD = "specpilot.services.gpu_worker.local"
ZYGOTE_MODULE = "specpilot.services.gpu_worker.zygote"


class SystemProcess:
    """A handle on one engine system in its own process; every call answers within `timeout` or
    raises. `root`: a built worktree, where the child loads the engine's code from."""

    def __init__(self, engine: dict, device: str, timeout: float, on_close=None, root: str | None = None):
        self.timeout, self.device, self._on_close = timeout, device, on_close
        self.acceptance = None  # of the last generate
        self.log = tempfile.TemporaryFile(mode="w+")
        self._lock = threading.Lock()
        spec = {"engine": dict(engine), "device": device, **({"root": str(root)} if root else {})}
        self.proc = ZYGOTE.spawn(json.dumps(spec), self.log)
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

    def generate(self, requests: list[dict], batch: int = 1) -> tuple[list[list[int]], list[list[int]]]:
        """(outputs, prompt ids) of the requests, `batch` at a time, once the device has finished."""
        reply = self.call({"requests": requests, "batch": batch}, "generate")
        self.acceptance = reply.get("acceptance")  # target passes and tokens accepted per drafted position
        return reply["outputs"], reply["prompt_ids"]

    def encode(self, requests: list[dict]) -> list[list[int]]:
        """The prompt ids of the requests, as the system's target tokenizes them."""
        return self.call({"encode": requests}, "encode")["prompt_ids"]

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


class ServerProcess:
    """A server system (SGLang, vLLM, `specpilot serve engine`) on one device, with the calls of
    `SystemProcess`. The worker launches the server's command in a process group of its own — the
    GPU it was given made the only visible one (`CUDA_VISIBLE_DEVICES`), or on `cpu:N` pinned to
    that core with one thread — waits for `GET /health` within the system's `ready_timeout`, and
    kills the whole group on `close()`. `generate` sends each request greedily as token ids
    (`batch` in flight at once), each to its own `max_new_tokens`, and returns the ids the server sent
    back. Text prompts are tokenized with the served target's tokenizer.json in this process; outputs
    are scored by the served target in AR (`reference`), a process started on the first score — so
    while the server is timed no second copy of the target holds the device's memory."""

    def __init__(self, spec: ServerSystem, device: str, timeout: float):
        self.spec, self.device, self.timeout = spec, device, timeout
        self.acceptance, self.proc, self._reference, self._tokenizer = None, None, None, None
        self.log = tempfile.TemporaryFile(mode="w+")
        port = free_port() if spec.launch else 0
        self.url = spec.url.replace("{port}", str(port)).rstrip("/")
        if spec.launch:
            env, pin = {**os.environ, **spec.env}, None
            if device.startswith("cuda"):
                env.setdefault("CUDA_VISIBLE_DEVICES", device.split(":")[1] if ":" in device else "0")
            elif device.startswith("cpu:"):
                core = int(device.split(":")[1])
                env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
                pin = lambda: os.sched_setaffinity(0, {core})  # noqa: E731
            seen = "cuda:0" if device.startswith("cuda") else "cpu"
            try:
                self.proc = subprocess.Popen(spec.argv(port, seen), env=env, stdin=subprocess.DEVNULL, stdout=self.log,
                                             stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=pin)
            except OSError as e:
                raise RuntimeError(f"server on {device}: cannot start {spec.launch[0]!r} ({e})") from None
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.spec.ready_timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server on {self.device} exited ({self.proc.returncode}) before it was ready: "
                                   f"{last_error(self.log.read())}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server on {self.device}: {self.url}/health did not answer 200 within "
                                   f"{self.spec.ready_timeout:.0f} s (raise the system's 'ready_timeout')")
            time.sleep(0.2)

    def reference(self) -> SystemProcess:
        if self._reference is None:
            if not self.spec.target:
                raise ValueError("a server system needs 'target' (the checkpoint it serves) to tokenize and score")
            self._reference = SystemProcess({"target": self.spec.target, "mode": "ar"}, self.device, self.timeout)
        return self._reference

    def prompt_ids(self, requests: list[dict]) -> list[list[int]]:
        """Each request's prompt ids: its own, or its text tokenized by the target's tokenizer."""
        out = []
        for r in requests:
            if r.get("prompt_ids") is not None:
                out.append(list(r["prompt_ids"]))
                continue
            if self._tokenizer is None:
                path = Path(self.spec.target or "") / "tokenizer.json"
                if not self.spec.target or not path.is_file():
                    raise ValueError(f"request {r.get('id')!r} is text, but the server system names no 'target' with "
                                     "a tokenizer.json; give prompt_ids or the served checkpoint as 'target'")
                from tokenizers import Tokenizer

                try:
                    self._tokenizer = Tokenizer.from_file(str(path))
                except Exception as e:  # noqa: BLE001 — the tokenizers library raises plain Exceptions
                    raise ValueError(f"{path}: cannot be read as a tokenizer ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
            out.append(self._tokenizer.encode(r["prompt"]).ids)
        return out

    def _post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            line = " ".join(e.read().decode("utf-8", "replace").split())[:300]
            raise ValueError(f"server on {self.device}: {path} answered {e.code}: {line}") from None
        except (OSError, ValueError) as e:
            raise RuntimeError(f"server on {self.device}: {path} failed ({e})") from None

    def _complete(self, ids: list[int], n: int) -> tuple[list[int], int]:
        """(returned ids, verify steps when the server tells them) of one greedy request."""
        if self.spec.api == "sglang":
            r = self._post("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0}})
            meta = r.get("meta_info") or {}
            out = r.get("output_ids")
            steps = meta.get("spec_verify_ct") or 0
        else:
            r = self._post("/v1/completions", {"model": self.spec.model, "prompt": ids, "max_tokens": n,
                                               "temperature": 0, "return_token_ids": True})
            out, steps = ((r.get("choices") or [{}])[0]).get("token_ids"), 0
        if not isinstance(out, list) or not all(isinstance(t, int) for t in out):
            raise ValueError(f"server on {self.device}: the reply carries no returned token ids "
                             f"({'output_ids' if self.spec.api == 'sglang' else 'choices[0].token_ids'})")
        return out, int(steps)

    def generate(self, requests: list[dict], batch: int = 1) -> tuple[list[list[int]], list[list[int]]]:
        ids = self.prompt_ids(requests)
        missing = next((r for r in requests if not r.get("max_new_tokens")), None)
        if missing is not None:
            raise ValueError(f"request {missing.get('id')!r}: a server system needs each request's max_new_tokens "
                             "(a deployment's or `specpilot pair --max-new-tokens` sets it)")
        limits = [int(r["max_new_tokens"]) for r in requests]
        with ThreadPoolExecutor(batch) as pool:  # `batch` requests in flight, as a busy server sees them
            done = list(pool.map(self._complete, ids, limits))
        self.acceptance = {"steps": sum(s for _, s in done), "accepted": []}  # per position: not told by servers
        return [o for o, _ in done], ids

    def score(self, prompt_ids, tokens) -> SimpleNamespace:
        return self.reference().score(prompt_ids, tokens)

    def profile(self, spec: dict) -> dict:
        raise ValueError("a server system has no cost-model profile (its steps run inside the server); "
                         "its settings are judged by timing alone")

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._reference is not None:
            self._reference.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Forked:
    """A worker forked by the zygote, with the part of `subprocess.Popen` that SystemProcess uses
    (it is the zygote's child: liveness by pid, which the kernel frees as soon as it exits)."""

    def __init__(self, pid: int, stdin, stdout):
        self.pid, self.stdin, self.stdout, self.returncode = pid, stdin, stdout, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.returncode = -1  # exited; the zygote, its parent, had the status
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(0.005)
        return self.returncode


class Zygote:
    """Starts workers: forked by the zygote (zygote.py) while this interpreter's start-up
    environment is the one the zygote started with — a change to those variables would not reach a
    fork — else, or when the zygote cannot run, as a fresh interpreter."""

    START_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "LD_LIBRARY_PATH", "LD_PRELOAD")

    def __init__(self):
        self._lock, self._sock, self._proc, self._env = threading.Lock(), None, None, None

    def _start_env(self) -> dict:
        return {k: os.environ.get(k) for k in self.START_ENV}

    def _fork(self, spec: str, fds: list[int]) -> int | None:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                if self._sock is not None:
                    self._sock.close()
                self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                self._proc = subprocess.Popen([sys.executable, "-m", ZYGOTE_MODULE, str(theirs.fileno())],
                                              pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL)
                theirs.close()
                self._env = self._start_env()
            if self._env != self._start_env():
                return None
            req = {"argv": [spec], "env": dict(os.environ), "cwd": os.getcwd()}
            try:
                socket.send_fds(self._sock, [json.dumps(req).encode()], fds)
                return json.loads(self._sock.recv(1 << 16))["pid"]
            except (OSError, ValueError, KeyError):  # the zygote died: a fresh interpreter this time
                self._proc.kill()
                self._proc.wait()  # so that the next start sees it gone and starts a new one
                return None

    def spawn(self, spec: str, log):
        """The worker process of one system (`local.py` with `spec`): text pipes on stdin and
        stdout, stderr into the file `log`."""
        (r_in, w_in), (r_out, w_out) = os.pipe(), os.pipe()
        try:
            pid = self._fork(spec, [r_in, w_out, log.fileno()])
        finally:
            os.close(r_in), os.close(w_out)
        if pid is not None:
            return Forked(pid, os.fdopen(w_in, "w"), os.fdopen(r_out))
        os.close(w_in), os.close(r_out)
        return subprocess.Popen([sys.executable, "-m", CHILD, spec], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=log, text=True)


ZYGOTE = Zygote()


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
    A system is a `specpilot.systemspec` EngineSystem (built here when it carries a patch) or
    ServerSystem (launched here: `ServerProcess`)."""

    kind = "local"

    def __init__(self, repo: Path | str | None = None):
        self.repo = Path(repo) if repo else None

    def devices(self, dep: dict) -> list[str]:
        return device_list(dep["devices"])

    def start(self, system: SystemSpec, device: str, timeout: float) -> SystemProcess | ServerProcess:
        if isinstance(system, ServerSystem):
            return ServerProcess(system, device, timeout)
        on_close, root = None, system.root
        if system.patch.strip():
            if self.repo is None or not system.base_rev:
                raise BuildError("a system with a patch needs the engine's git repository and a base revision")
            dest = Path(tempfile.mkdtemp(prefix="specpilot-system-")) / "wt"
            build_worktree(self.repo, system.base_rev, system.patch, dest)
            root = str(dest)
            on_close = lambda: remove_worktree(self.repo, dest)  # noqa: E731
        try:
            return SystemProcess(system.config, device, timeout, on_close, root)
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
