"""The distributed stack end to end on this machine: `specpilot stack up --workers cpu,cpu`, then
`POST /api/rounds` of the demo's deployment (1 round), timed from the POST until the record is
final by the wall clock; the workers' health and the controller's specpilot_* series afterwards.

  python bench/stack_round.py [--db URL] [--redis URL] --out bench/results/stack_round_cpu.json

Redis must be running; `--db` (PostgreSQL) or SQLite under a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from common import git_sha
from specpilot.services.controller.round import demo_deployment


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis", default="redis://127.0.0.1:6379/12")
    p.add_argument("--db", default=None)
    p.add_argument("--port", type=int, default=8793)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    data = Path(tempfile.mkdtemp(prefix="specpilot-stack-"))
    cmd = [sys.executable, "-m", "specpilot.entrypoints.cli", "stack", "up", "--workers", "cpu,cpu", "--port", str(args.port),
           "--memory-port", str(args.port + 1), "--redis", args.redis, "--data", str(data), "--json"]
    if args.db:
        cmd += ["--db", args.db]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(data / "stack.err", "w"), text=True)
    try:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"the stack did not start: {(data / 'stack.err').read_text()[-2000:]}")
        info = json.loads(line)
        up_s = time.time() - t0
        c = httpx.Client(base_url=info["dashboard"].rstrip("/"), timeout=30,
                         headers={"Authorization": f"Bearer {info['token']}"})
        dep = demo_deployment()
        t1 = time.time()
        ident = c.post("/api/rounds", json={"deployment": dep, "rounds": 1}).json()["id"]
        while (got := c.get(f"/api/rounds/{ident}").json())["state"] not in ("done", "failed", "cancelled"):
            time.sleep(1.0)
        round_s = time.time() - t1
        workers = c.get("/api/workers").json()
        series = sorted({ln.split("{")[0].split(" ")[0] for ln in c.get("/metrics").text.splitlines()
                         if ln.startswith("specpilot_")})
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    out = {"command": " ".join(["python bench/stack_round.py", *sys.argv[1:]]),
           "device": f"{torch.get_num_threads()} CPU threads ({platform.processor() or platform.machine()}), "
                     f"Python {platform.python_version()}, torch {torch.__version__}",
           "date": time.strftime("%Y-%m-%d"), "git_sha": git_sha(), "deployment": dep,
           "stack_up_s": round(up_s, 1), "round_wall_s": round(round_s, 1), "state": got["state"],
           "error": got["error"], "rounds": got["rounds"], "speedup_over_stock": got["speedup_over_stock"],
           "speedup_over_ar": got["speedup_over_ar"],
           "workers": [{k: w[k] for k in ("device", "kind", "healthy")} for w in workers],
           "controller_metric_families": series}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("stack_up_s", "round_wall_s", "state", "speedup_over_stock")}))
    return 0 if got["state"] == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
