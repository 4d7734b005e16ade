"""What a system under evaluation is, typed and checked where it enters (deployment file, REST,
CLI, the GPU worker's Build call), then carried as such.

Two kinds:
- `EngineSystem`: our engine with an EngineConfig (`config`), optionally a code patch against the
  pinned revision `base_rev`; `root` is the worktree the patch was built into (the worker sets it).
- `ServerSystem`: a serving process that speaks SGLang's `/generate` or the OpenAI `/v1/completions`
  API — SGLang's `launch_server`, vLLM's `serve`, or `specpilot serve engine`. The worker launches
  `launch` (or uses an already running server at `url` when `launch` is null), waits for
  `GET /health`, sends the workload greedily as token ids and collects the returned ids. `args`
  are extra flags appended to `launch` (what the search agent varies: `--speculative-num-steps`,
  `--draft-len`, …). `target` is the checkpoint the server serves: token forcing scores its output
  with that target, and prompts are tokenized by it.

As JSON: an engine system is `{"engine": {EngineConfig fields}, "patch": "...", "base_rev": "..."}`
(`patch`, `base_rev` optional), a server system `{"server": {"launch": [argv...] | null, "url": ...,
"api": "sglang" | "openai", "env": {...}, "args": {...}, "target": DIR, "ready_timeout": s}}`.
`{port}` in `launch`, `url` and `args` values is the port the worker picks, `{device}` the device
as the server sees it (`cpu`, or `cuda:0`: the worker makes the GPU it was given the only visible one). Standard library only: the GPU worker and the controller both import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

APIS = ("sglang", "openai")


class SystemSpecError(ValueError):
    """A system description that cannot be run; the message names the field."""


@dataclass(frozen=True)
class EngineSystem:
    config: dict
    patch: str = ""
    base_rev: str | None = None
    root: str | None = None

    def to_json(self) -> dict:
        out = {"engine": dict(self.config), "patch": self.patch, "base_rev": self.base_rev}
        return {**out, "root": self.root} if self.root else out


@dataclass(frozen=True)
class ServerSystem:
    url: str
    api: str = "sglang"
    launch: tuple[str, ...] | None = None
    env: dict = field(default_factory=dict)
    args: dict = field(default_factory=dict)
    target: str | None = None
    ready_timeout: float = 600.0
    model: str = "default"

    def argv(self, port: int, device: str) -> list[str]:
        """The command that starts the server: `launch` then each of `args` (a flag; its value when
        not null, an object as JSON), `{port}` and `{device}` filled in."""
        out = list(self.launch or [])
        for flag, value in self.args.items():
            out += [flag] if value is None else [flag, json.dumps(value, sort_keys=True) if isinstance(value, dict)
                                                 else str(value)]
        return [a.replace("{port}", str(port)).replace("{device}", device) for a in out]

    def to_json(self) -> dict:
        return {"server": {"url": self.url, "api": self.api, "launch": list(self.launch) if self.launch else None,
                           "env": dict(self.env), "args": dict(self.args), "target": self.target,
                           "ready_timeout": self.ready_timeout, "model": self.model}}


SystemSpec = EngineSystem | ServerSystem

SERVER_FIELDS = {"url", "api", "launch", "env", "args", "target", "ready_timeout", "model"}


def parse_server(d, where: str = "system") -> ServerSystem:
    """A server system from its JSON object (the value under "server")."""
    if not isinstance(d, dict):
        raise SystemSpecError(f"{where}: 'server' must be an object with url, api and launch")
    unknown = sorted(set(d) - SERVER_FIELDS)
    if unknown:
        raise SystemSpecError(f"{where}: server field {unknown[0]!r} is unknown (fields: {sorted(SERVER_FIELDS)})")
    url = d.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise SystemSpecError(f"{where}: server field 'url' = {url!r}: expected http://HOST:PORT (may hold {{port}})")
    api = d.get("api", "sglang")
    if api not in APIS:
        raise SystemSpecError(f"{where}: server field 'api' = {api!r}: expected one of {list(APIS)}")
    launch = d.get("launch")
    if launch is not None and (not isinstance(launch, list) or not launch or
                               not all(isinstance(a, str) and a for a in launch)):
        raise SystemSpecError(f"{where}: server field 'launch' = {launch!r}: expected a non-empty list of "
                              "strings (the command) or null (a server already running at url)")
    env = d.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise SystemSpecError(f"{where}: server field 'env' must map names to string values")
    args = d.get("args", {})
    if not isinstance(args, dict) or not all(isinstance(k, str) and k.startswith("-") and
                                             (v is None or isinstance(v, (str, int, float, dict)) and
                                              not isinstance(v, bool)) for k, v in args.items()):
        raise SystemSpecError(f"{where}: server field 'args' must map flags ('--name') to a value, an object "
                              f"(passed as JSON) or null, got {args!r}")
    if args and launch is None:
        raise SystemSpecError(f"{where}: server field 'args' needs 'launch' (flags are passed to the command the "
                              "worker starts)")
    target = d.get("target")
    if target is not None and (not isinstance(target, str) or not target):
        raise SystemSpecError(f"{where}: server field 'target' = {target!r}: expected the served checkpoint folder")
    ready = d.get("ready_timeout", 600.0)
    if isinstance(ready, bool) or not isinstance(ready, (int, float)) or ready <= 0:
        raise SystemSpecError(f"{where}: server field 'ready_timeout' = {ready!r}: expected seconds > 0")
    model = d.get("model", "default")
    if not isinstance(model, str) or not model:
        raise SystemSpecError(f"{where}: server field 'model' = {model!r}: expected the served model's name")
    return ServerSystem(url=url, api=api, launch=tuple(launch) if launch else None, env=dict(env), args=dict(args),
                        target=target, ready_timeout=float(ready), model=model)


def parse_system(d, where: str = "system") -> SystemSpec:
    """A system from its JSON form (module docstring); raises SystemSpecError naming the field."""
    if not isinstance(d, dict):
        raise SystemSpecError(f"{where}: expected an object with 'engine' or 'server', got {type(d).__name__}")
    kinds = [k for k in ("engine", "server") if k in d]
    if len(kinds) != 1:
        raise SystemSpecError(f"{where}: expected exactly one of 'engine' or 'server', got {sorted(d)}")
    if kinds == ["server"]:
        if set(d) != {"server"}:
            raise SystemSpecError(f"{where}: a server system has no {sorted(set(d) - {'server'})[0]!r}")
        return parse_server(d["server"], where)
    unknown = sorted(set(d) - {"engine", "patch", "base_rev", "root"})
    if unknown:
        raise SystemSpecError(f"{where}: field {unknown[0]!r} is unknown (an engine system has engine, patch, "
                              "base_rev)")
    config, patch, rev, root = d["engine"], d.get("patch") or "", d.get("base_rev"), d.get("root")
    if not isinstance(config, dict):
        raise SystemSpecError(f"{where}: 'engine' must be an object of engine settings (target, mode, …)")
    if "root" in config:
        raise SystemSpecError(f"{where}: 'root' is not an engine setting")
    if not isinstance(patch, str):
        raise SystemSpecError(f"{where}: 'patch' must be a unified diff (a string)")
    if rev is not None and (not isinstance(rev, str) or not rev):
        raise SystemSpecError(f"{where}: 'base_rev' = {rev!r}: expected a git revision")
    if patch.strip() and not rev:
        raise SystemSpecError(f"{where}: a system with a patch needs 'base_rev', the revision it applies to")
    if root is not None and not isinstance(root, str):
        raise SystemSpecError(f"{where}: 'root' must be a folder")
    return EngineSystem(config=dict(config), patch=patch, base_rev=rev, root=root)


def is_server(config: dict) -> bool:
    """Is this incumbent / candidate configuration (the round's `config`) a server system?"""
    return isinstance(config, dict) and "server" in config


def with_options(config: dict, options: dict) -> dict:
    """A candidate's configuration: the incumbent's with a variant's options on top. Engine
    settings replace the incumbent's; a server's `server_args` are added to its flags or replace
    them — an object-valued flag (vLLM's `--speculative-config`) is merged key by key."""
    if not is_server(config):
        return {**config, **options}
    server = dict(config["server"])
    args = dict(server.get("args", {}))
    for flag, value in options.get("server_args", {}).items():
        old = args.get(flag)
        args[flag] = {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
    server["args"] = args
    return {"server": server}


def server_program(config: dict) -> str | None:
    """Which serving program a server configuration launches: "sglang", "vllm", "specpilot" or
    None (not a server, or a command this cannot tell)."""
    if not is_server(config):
        return None
    argv = " ".join(config["server"].get("launch") or [])
    for name in ("sglang", "vllm"):
        if name in argv:
            return name
    return "specpilot" if "specpilot" in argv and "serve" in argv else None
