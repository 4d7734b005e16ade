"""`specpilot stack up`: the distributed stack as local processes, no containers needed;
`specpilot serve controller`: the controller's REST API and dashboard alone.

  specpilot stack up [--workers cpu,cpu] [--port 8700] [--redis URL] [--db URL] [--data DIR] [--json]

Starts the memory API (seeded), one gRPC GPU worker per listed device kind (cpu → one core each,
cpu:0, cpu:1, ...; a GPU kind such as h200 → cuda:0, cuda:1, ...), a Celery worker for the rounds
(queues rounds.<kind>), one for the planner, and the controller with its dashboard; prints the
dashboard's URL and the token; restarts a process that dies; stops everything on Ctrl-C or
SIGTERM. Redis must be running (--redis); the records and the memory go to --db (PostgreSQL) or to
SQLite files under --data. Logs: <data>/logs/, the processes: <data>/stack.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

KIND = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


def register(subparsers) -> None:
    st = subparsers.add_parser("stack", help="the distributed stack (controller, queues, gRPC workers) as local "
                               "processes", description=__doc__)
    sub = st.add_subparsers(dest="stack_command", metavar="COMMAND", required=True)
    up = sub.add_parser("up", help="start it and keep it running until Ctrl-C", description=__doc__)
    up.add_argument("--workers", default="cpu,cpu", metavar="KINDS",
                    help="one gRPC GPU worker per listed device kind (default cpu,cpu)")
    up.add_argument("--port", type=int, default=8700, help="the controller's port (default 8700)")
    up.add_argument("--memory-port", type=int, default=8710, help="the memory API's port (default 8710)")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--redis", default=None, metavar="URL", help="default redis://127.0.0.1:6379/0")
    up.add_argument("--db", default=None, metavar="URL", help="PostgreSQL for the round records and the memory, "
                    "e.g. postgresql+psycopg://postgres@127.0.0.1/specpilot (default: SQLite under --data)")
    up.add_argument("--data", default="specpilot-data", metavar="DIR", help="runs, logs, SQLite files")
    up.add_argument("--repo", default=None, metavar="DIR", help="the engine's git repository (default: this checkout)")
    up.add_argument("--json", action="store_true", help="print one JSON line (URLs, token, processes) once ready")
    up.set_defaults(func=run_up)


def worker_devices(spec: str) -> list[tuple[str, str]]:
    """'cpu,cpu' → [('cpu', 'cpu:0'), ('cpu', 'cpu:1')]; 'h200,h200' → [('h200', 'cuda:0'), ...]."""
    kinds = [k.strip() for k in spec.split(",") if k.strip()]
    if not kinds or not all(KIND.fullmatch(k) for k in kinds):
        raise ValueError(f"--workers {spec!r}: a comma-separated list of device kinds, e.g. cpu,cpu or h200,h200")
    out, n = [], {"cpu": 0, "gpu": 0}
    for k in kinds:
        slot = "cpu" if k == "cpu" else "gpu"
        out.append((k, f"{'cpu' if slot == 'cpu' else 'cuda'}:{n[slot]}"))
        n[slot] += 1
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


class Child:
    """One process of the stack, restarted by `Stack.supervise` when it dies."""

    def __init__(self, name: str, argv: list[str], env: dict, log: Path, announce: bool = False):
        self.name, self.argv, self.env, self.log, self.announce = name, argv, env, log, announce
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}
        self.restarts = 0

    def start(self) -> None:
        out = open(self.log, "a")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE if self.announce else out,
                                     stderr=out, text=True)
        if self.announce:  # the process prints one JSON line once it serves
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.name} did not start; see {self.log}")
            self.info = json.loads(line)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()

    def wait(self, timeout: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Stack:
    def __init__(self, args):
        from specpilot.entrypoints.bootstrap import find_repo
        from specpilot.settings import Settings

        self.data = Path(args.data).resolve()
        (self.data / "logs").mkdir(parents=True, exist_ok=True)
        self.repo = Path(args.repo).resolve() if args.repo else find_repo()
        self.devices = worker_devices(args.workers)
        env_token = os.environ.get("SPECPILOT_TOKEN")
        self.token = env_token or secrets.token_urlsafe(24)
        self.host, self.port, self.memory_port = args.host, args.port, args.memory_port
        self.memory_db = args.db or f"sqlite:///{self.data / 'memory.db'}"
        self.settings = Settings(redis_url=args.redis or Settings().redis_url, db_url=args.db,
                                 memory_url=f"http://{self.host}:{self.memory_port}", data_dir=self.data,
                                 repo=self.repo, token=self.token)
        self.children: list[Child] = []
        self.stopping = False

    def env(self, **extra) -> dict:
        return {**os.environ, **self.settings.env(), **extra}

    def check_redis(self) -> None:
        import redis

        try:
            redis.Redis.from_url(self.settings.redis_url, socket_timeout=3).ping()
        except redis.RedisError as e:
            raise RuntimeError(f"Redis at {self.settings.redis_url} does not answer ({e}): start redis-server or "
                               "pass --redis URL") from None

    def seed_memory(self) -> None:
        from specpilot.entrypoints.bootstrap import seed_memory

        seed_memory(self.memory_db)

    def child(self, name: str, argv: list[str], announce: bool = False, **env) -> Child:
        c = Child(name, argv, self.env(**env), self.data / "logs" / f"{name}.log", announce)
        c.start()
        self.children.append(c)
        return c

    def up(self) -> dict:
        from specpilot.entrypoints.bootstrap import stock_rev
        from specpilot.queue import PLANNER_QUEUE, rounds_queue

        self.check_redis()
        self.seed_memory()
        py = sys.executable
        mem = [py, "-m", "specpilot.entrypoints.cli", "serve", "memory-api", "--store", self.memory_db, "--host", self.host,
               "--port", str(self.memory_port)]
        if self.repo:
            mem += ["--repo", str(self.repo), "--stock-rev", stock_rev(self.repo)]
        self.child("memory-api", mem)
        workers = []
        for i, (kind, device) in enumerate(self.devices):
            argv = [py, "-m", "specpilot.services.gpu_worker.server", "--device", device, "--kind", kind,
                    "--host", self.host, "--port", "0", "--metrics-port", "0", "--idle", "600"]
            if self.repo:
                argv += ["--repo", str(self.repo)]
            c = self.child(f"gpu-worker-{i}", argv, announce=True)
            c.argv[c.argv.index("--port") + 1] = c.info["address"].rsplit(":", 1)[1]  # a restart keeps the address
            c.argv[c.argv.index("--metrics-port") + 1] = c.info["metrics"].rsplit(":", 1)[1].split("/")[0]
            workers.append(c.info["address"])
        self.settings = type(self.settings)(**{**self.settings.__dict__, "workers": tuple(workers)})
        queues = ",".join(sorted({rounds_queue(k) for k, _ in self.devices}))
        celery = [py, "-m", "celery", "--quiet"]
        common = ["worker", "--pool", "solo", "--concurrency", "1", "--without-gossip", "--without-mingle",
                  "--loglevel", "WARNING"]
        metrics = {"rounds-worker": free_port(), "planner-worker": free_port()}
        self.child("rounds-worker", celery + ["-A", "specpilot.entrypoints.rounds_worker"] + common
                   + ["-Q", queues, "-n", f"rounds-{os.getpid()}@%h"], SPECPILOT_METRICS_PORT=str(metrics["rounds-worker"]))
        self.child("planner-worker", celery + ["-A", "specpilot.services.planner.tasks"] + common
                   + ["-Q", PLANNER_QUEUE, "-n", f"planner-{os.getpid()}@%h"],
                   SPECPILOT_METRICS_PORT=str(metrics["planner-worker"]))
        self.child("controller", [py, "-m", "specpilot.entrypoints.cli", "serve", "controller", "--host", self.host,
                                  "--port", str(self.port)])
        url = f"http://{self.host}:{self.port}"
        deadline = time.time() + 120
        while not (_get(url + "/healthz") and _get(self.settings.memory_url + "/entries")):
            dead = [c.name for c in self.children if c.proc.poll() is not None]
            if dead or time.time() > deadline:
                raise RuntimeError(f"the stack did not come up ({', '.join(dead) or 'timeout'}); see {self.data / 'logs'}")
            time.sleep(0.3)
        scrape = {"controller": url + "/metrics", "memory-api": self.settings.memory_url + "/metrics",
                  **{c.name: c.info["metrics"] for c in self.children if c.info.get("metrics")},
                  **{k: f"http://127.0.0.1:{p}/metrics" for k, p in metrics.items()}}
        info = {"dashboard": url + "/", "api": url + "/api", "metrics": scrape, "token": self.token,
                "memory_api": self.settings.memory_url, "gpu_workers": workers, "redis": self.settings.redis_url,
                "db": self.settings.records_url, "data": str(self.data), "processes": self.processes()}
        self.write_state(info)
        return info

    def processes(self) -> dict:
        return {c.name: c.proc.pid for c in self.children if c.proc}

    def write_state(self, info: dict) -> None:
        tmp = self.data / "stack.json.tmp"
        tmp.write_text(json.dumps({**info, "processes": self.processes()}, indent=1))
        os.replace(tmp, self.data / "stack.json")
        self.info = info

    def supervise(self) -> None:
        while not self.stopping:
            for c in self.children:
                if not self.stopping and c.proc.poll() is not None:
                    print(f"specpilot stack: {c.name} exited ({c.proc.returncode}); restarting it", file=sys.stderr,
                          flush=True)
                    c.restarts += 1
                    try:
                        c.start()
                    except RuntimeError as e:
                        print(f"specpilot stack: {e}", file=sys.stderr, flush=True)
                    self.write_state(self.info)
            time.sleep(0.5)

    def down(self) -> None:
        self.stopping = True
        for c in reversed(self.children):
            c.stop()
        for c in reversed(self.children):
            c.wait(15)


def run_up(args) -> int:
    from specpilot.sqldb import check_url

    if args.db:
        check_url(args.db, "--db")
    stack = Stack(args)

    def stop(*_):
        stack.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        info = stack.up()
        if args.json:
            print(json.dumps(info), flush=True)
        else:
            print(f"SpecPilot stack is up: dashboard {info['dashboard']}\n  token {info['token']}  (Authorization: "
                  f"Bearer …)\n  gpu workers {', '.join(info['gpu_workers'])}\n  metrics {info['metrics']['controller']} "
              f"(every process's: {stack.data / 'stack.json'})\n  logs {stack.data / 'logs'}\n"
                  "Ctrl-C stops everything.", flush=True)
        stack.supervise()
    finally:
        stack.down()
    return 0


def serve_controller(args) -> int:
    import uvicorn

    from specpilot.entrypoints.bootstrap import controller_app
    from specpilot.settings import Settings
    from specpilot.sqldb import check_url

    s = Settings.from_env()
    if getattr(args, "store", None):  # `serve controller --store URL`: the round records' database
        s = dataclasses.replace(s, db_url=args.store)
    if s.db_url:
        check_url(s.db_url, "--store" if getattr(args, "store", None) else "SPECPILOT_DB_URL")
    token = s.token
    if not token:
        token = secrets.token_urlsafe(24)
        print(f"specpilot controller: SPECPILOT_TOKEN is not set; this run's token: {token}", file=sys.stderr,
              flush=True)
    s.data_dir.mkdir(parents=True, exist_ok=True)
    uvicorn.run(controller_app(s, token), host=args.host, port=args.port, log_level="warning")
    return 0
