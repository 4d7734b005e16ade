"""Where a speculative step's time goes on the CPU: AR against chain speculation on a zoo pair.

  python bench/zoo_cpu_step.py --zoo zoo/checkpoints/micro --out bench/results/zoo_cpu_step.json

The demo's workload (the first 3 HumanEval prompts × 48 new tokens, 16 drafted positions, eager
driver, float32): per generated token for AR and for speculation, and per speculative step the
drafting (propose + observe), the verify pass and the commit, from `generate`'s own step timings.
Each mode runs `--repeats` times, alternating; the load average of the machine is recorded, since
the figures are wall-clock times of a shared machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha  # noqa: E402

from specpilot.engine.checkpoint import load_model  # noqa: E402
from specpilot.engine.decode import generate  # noqa: E402
from specpilot.engine.drafters import load_drafter  # noqa: E402
from specpilot.zoo import tokenizer as tok_mod  # noqa: E402
from specpilot.zoo import workloads  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--zoo", default="zoo/checkpoints/micro")
    ap.add_argument("--target", default="dense")
    ap.add_argument("--drafter", default="dense-block-markov")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--draft-len", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    zoo = Path(args.zoo)
    target = load_model(zoo / args.target, torch.float32, "cpu")
    tok = tok_mod.load(zoo / args.target)
    drafter = load_drafter(str(zoo / args.drafter), torch.float32, "cpu", target)
    prompts = [tok_mod.encode(tok, q.prompt) for q in workloads.humaneval(limit=args.prompts)]
    load_before = os.getloadavg()
    runs = []
    for _ in range(args.repeats):
        row = {}
        for mode in ("ar", "spec"):
            t, n, steps = time.perf_counter(), 0, []
            for p in prompts:
                r = generate(target, p, args.new_tokens, drafter if mode == "spec" else None, draft_len=args.draft_len)
                n, steps = n + len(r.tokens), steps + r.steps
            row[f"{mode}_ms_per_token"] = (time.perf_counter() - t) / n * 1e3
            if mode == "spec":
                k = len(steps)
                row.update(tau=sum(s.tau for s in steps) / k, draft_ms=sum(s.t_draft for s in steps) / k * 1e3,
                           verify_ms=sum(s.t_verify for s in steps) / k * 1e3,
                           commit_ms=sum(s.t_commit for s in steps) / k * 1e3)
        row["spec_over_ar"] = row["ar_ms_per_token"] / row["spec_ms_per_token"]
        runs.append(row)
        print(json.dumps({k: round(v, 3) for k, v in row.items()}), flush=True)
    med = {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0]}
    result = {"command": " ".join(["python"] + sys.argv), "device": f"cpu ({os.cpu_count()} cores, "
              f"{torch.get_num_threads()} torch threads)", "date": datetime.date.today().isoformat(),
              "git_sha": git_sha(), "torch": torch.__version__, "load_average_before": load_before,
              "load_average_after": os.getloadavg(), "params": {"target": sum(p.numel() for p in target.parameters())},
              "median": med, "runs": runs}
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
