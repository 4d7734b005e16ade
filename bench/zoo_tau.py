"""Chain τ of every drafter of a built zoo set, on as many prompts as wanted.

  python bench/zoo_tau.py --zoo zoo/checkpoints/micro --prompts 164 --out results.json   (CPU)

The build measures τ on 8 prompts per workload (its time budget); this measures the same figure on
more, with a 95 % bootstrap interval over prompts. Per target, each prompt's AR continuation is
computed once (`engine/replay.py` `continuation`) and every drafter is replayed on it
(`drafter_taus`: the τ of each step of online decoding, without the target's verify passes).
With `--online` every drafter also decodes every prompt online, to check the two agree step for
step and to time both. `--jobs N` splits each workload's prompts over N processes (each loads the
set, and runs one torch thread; on a GPU they share it): the figures are the same, the times are
summed over processes. Chain replays let position-by-position drafters (sequential, draft LM) stop
drafting at their first miss (`Drafter.propose`'s `known`): the same τ, fewer drafter passes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import multiprocessing
import random
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import deal, git_sha  # noqa: E402

from specpilot.engine.checkpoint import load_model  # noqa: E402
from specpilot.engine.decode import generate  # noqa: E402
from specpilot.engine.drafters import load_drafter  # noqa: E402
from specpilot.engine.replay import continuation  # noqa: E402
from specpilot.zoo import tokenizer as tok_mod  # noqa: E402
from specpilot.zoo import workloads  # noqa: E402
from specpilot.zoo.build import PROMPT_TOKENS, pooled_tau, prompt_taus  # noqa: E402


def bootstrap(per_prompt: list[list[int]], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of pooled_tau with prompts resampled with replacement."""
    rng = random.Random(seed)
    stats = sorted(pooled_tau(rng.choices(per_prompt, k=len(per_prompt))) for _ in range(n))
    return stats[int(0.025 * n)], stats[int(0.975 * n) - 1]


def load_pair(zoo: Path, manifest: dict, role: str, device: str, maker_device: str):
    """(target, the target on maker_device, tokenizer, {kind: drafter}) of one target of a built
    set, in float32 (the target is loaded once when the devices agree)."""
    entry = next(m for m in manifest["models"] if m["role"] == "target" and m["name"] == role)
    target = load_model(zoo / entry["path"], torch.float32, device)
    maker = target if maker_device == device else load_model(zoo / entry["path"], torch.float32, maker_device)
    drafters = {"ngram": load_drafter("ngram")}
    for m in manifest["models"]:
        if m["role"] == "drafter" and m["target"] == role:
            drafters[m["kind"]] = load_drafter(str(zoo / m["path"]), torch.float32, device, target)
    return target, maker, tok_mod.load(zoo / entry["path"]), drafters


def measure(prompts: list[str], zoo: Path, role: str, new: int, device: str, online: bool,
            replay_device: str | None = None, threads: int | None = None) -> dict:
    """Per drafter kind of target `role`: each prompt's replayed step τs (and online ones), with
    the seconds spent; `continuations_s` is the AR continuations' time. The continuations are made
    on `device`, the drafters run on `replay_device` (default: the same). threads: torch's (pool
    workers: 1, without progress bars)."""
    if threads:
        torch.set_num_threads(threads)
    manifest = json.loads((zoo / "zoo.json").read_text())
    draft_len = manifest["tau_measure"]["draft_len"]
    replay_device = replay_device or device
    target, maker, tok, drafters = load_pair(zoo, manifest, role, replay_device, device)
    layers = next((tuple(d.target_layers) for d in drafters.values() if d.target_layers), ())
    t = time.perf_counter()
    conts = [continuation(maker, tok_mod.encode(tok, p)[-PROMPT_TOKENS:], new, layers).to(replay_device)
             for p in tqdm(prompts, desc=f"{role} continuations", leave=False, disable=threads is not None)]
    out = {"continuations_s": time.perf_counter() - t, "kinds": {}}
    for kind, d in drafters.items():
        t = time.perf_counter()
        row = {"replay": prompt_taus(target, d, conts, draft_len)}
        row["replay_s"] = time.perf_counter() - t
        if online:
            t = time.perf_counter()
            row["online"] = [[s.tau for s in generate(target, c.prompt, new, d, draft_len=draft_len).steps]
                             for c in conts]
            row["online_s"] = time.perf_counter() - t
        out["kinds"][kind] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--zoo", default="zoo/checkpoints/micro", help="a built zoo folder (with zoo.json)")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per workload (HumanEval has 164)")
    ap.add_argument("--new-tokens", type=int, help="default: the build's")
    ap.add_argument("--online", action="store_true", help="also decode online and compare step for step")
    ap.add_argument("--jobs", type=int, default=1, help="processes per workload (default 1)")
    ap.add_argument("--device", default="cpu", help="where the continuations are made")
    ap.add_argument("--replay-device", help="where the drafters run (default: --device; with a GPU and many "
                    "CPU cores, cpu and --jobs N replays on N cores)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    zoo = Path(args.zoo)
    manifest = json.loads((zoo / "zoo.json").read_text())
    draft_len = manifest["tau_measure"]["draft_len"]
    new = args.new_tokens or manifest["tau_measure"]["new_tokens"]
    result = {"command": " ".join(["python"] + sys.argv), "date": datetime.date.today().isoformat(),
              "git_sha": git_sha(), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "preset": manifest["preset"], "draft_len": draft_len, "new_tokens": new,
              "jobs": args.jobs, "replay_device": args.replay_device or args.device,
              "manifest_tau": {f"{m['target'] or m['name']}+{m['kind'] if m['role'] == 'drafter' else 'ngram'}":
                               (m["tau"] if m["role"] == "drafter" else m["tau"]["ngram"]) for m in manifest["models"]},
              "tau": {}}
    workload_reqs = {"humaneval": workloads.humaneval(limit=args.prompts),
                     "stdlib": workloads.stdlib_completion(limit=args.prompts)}
    result["prompts"] = {k: len(v) for k, v in workload_reqs.items()}
    roles = [m["name"] for m in manifest["models"] if m["role"] == "target"]
    # CUDA cannot be forked: spawned processes, started once
    pool = concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) \
        if args.jobs > 1 else None
    for w, reqs in workload_reqs.items():  # HumanEval first: the bars are on it
        for role in tqdm(roles, desc=w, leave=False):
            t = time.perf_counter()
            got = deal(measure, [q.prompt for q in reqs], args.jobs, pool, zoo, role, new, args.device, args.online,
                       args.replay_device)
            result.setdefault("wall_s", {})[f"{role}+{w}"] = time.perf_counter() - t
            for kind, r in got["kinds"].items():
                per_prompt = r["replay"]
                lo, hi = bootstrap(per_prompt)
                row = {"tau": pooled_tau(per_prompt), "ci95": [lo, hi], "steps": sum(map(len, per_prompt)),
                       "replay_s": r["replay_s"], "continuations_s": got["continuations_s"]}
                if args.online:
                    row.update(online_tau=pooled_tau(r["online"]), online_s=r["online_s"],
                               online_prompts_equal=sum(a == b for a, b in zip(r["online"], per_prompt)))
                result["tau"].setdefault(f"{role}+{kind}", {})[w] = row
                print(f"{role:7s} {kind:13s} {w:9s} τ {row['tau']:.2f}  [{lo:.2f}, {hi:.2f}]  "
                      f"({row['steps']} steps, {row['replay_s']:.1f} s)"
                      + (f"  online τ {row['online_tau']:.2f} ({row['online_s']:.1f} s, "
                         f"{row['online_prompts_equal']}/{len(per_prompt)} prompts step for step)" if args.online else ""),
                      flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
    if pool:
        pool.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
