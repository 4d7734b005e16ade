"""A `specpilot` command's own JSON answer as a result file, with what produced it.

  python bench/cli_json.py --out bench/results/selftest_cpu.json -- selftest --json

Runs `specpilot ARGS` (which must print one JSON object: give it `--json`), and writes that object
under "result" beside command, device, date, git_sha, wall_s and the machine's load average before
the run — so a figure quoted from a command traces to a file the command wrote, not one assembled
by hand.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the specpilot command and its flags")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if "--json" not in args:
        ap.error("give the command --json: its answer must be one JSON object")
    load = os.getloadavg()[0]
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "specpilot.entrypoints.cli", *args], capture_output=True, text=True)
    wall = time.perf_counter() - t
    try:
        answer = json.loads(r.stdout)
    except json.JSONDecodeError:
        print(f"specpilot {' '.join(args)} did not print one JSON object (exit {r.returncode}): "
              f"{(r.stderr or r.stdout).strip().splitlines()[-1:]}", file=sys.stderr)
        return 1
    out = {"command": "specpilot " + " ".join(args), "device": f"cpu ({os.cpu_count()} cores, {platform.machine()})",
           "date": datetime.date.today().isoformat(), "git_sha": git_sha(), "exit_code": r.returncode,
           "wall_s": wall, "load_average_before": load, "result": answer}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out} ({wall:.0f} s, exit {r.returncode})")
    return 0 if r.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
