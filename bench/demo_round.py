"""`make demo`'s rounds, timed: runs `specpilot demo --json` (what `make demo` runs, on the
embedded default: the shipped micro pair, the CPU cores as the two devices) in a fresh run folder
and memory store, and writes the final system's speed-ups over stock and over plain AR with their
95 % lower bounds, every judged candidate and the wall time.

    python bench/demo_round.py --out bench/results/demo_round_cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha  # noqa: E402


def candidates(rounds: list[dict]) -> list[dict]:
    keep = ("name", "gain", "lower_bound", "accepted", "pruned", "error")  # what `demo --json` reports per candidate
    return [{"round": r["round"], **{k: c.get(k) for k in keep}} for r in rounds for c in r["candidates"]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=2, help="the demo's default: 2")
    ap.add_argument("--repeats", type=int, help="swapped repeats per verdict (default: the demo's)")
    args = ap.parse_args(argv)
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "specpilot.entrypoints.cli", "demo", "--json", "--rounds", str(args.rounds),
               "--run-dir", f"{tmp}/run", "--store", f"sqlite:///{tmp}/memory.db"] + \
              (["--repeats", str(args.repeats)] if args.repeats else [])
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t
    if r.returncode != 0:
        print(f"demo failed ({r.returncode}): {(r.stdout + r.stderr).strip().splitlines()[-1:]}", file=sys.stderr)
        return 1
    demo = json.loads(r.stdout)
    final = demo.get("final") or {}
    out = {
        "command": "python bench/demo_round.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": f"{os.cpu_count()} CPU threads ({platform.machine()}), Python {platform.python_version()}, "
                  f"torch {torch.__version__}",
        "date": datetime.date.today().isoformat(),
        "git_sha": git_sha(),
        "load_average_before": os.getloadavg()[0],
        "demo_wall_s": wall,
        "rounds_s": demo.get("seconds"),
        "final_system": final.get("label"),
        "speedup_over_stock": (final.get("speedup_over_stock") or {}).get("gain"),
        "speedup_over_stock_lower_bound": (final.get("speedup_over_stock") or {}).get("lower_bound"),
        "speedup_over_ar": (final.get("speedup_over_ar") or {}).get("gain"),
        "speedup_over_ar_lower_bound": (final.get("speedup_over_ar") or {}).get("lower_bound"),
        "accepted": [a["entry"] for rd in demo["rounds"] for a in rd["accepted"]],
        "candidates": candidates(demo["rounds"]),
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "candidates"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
