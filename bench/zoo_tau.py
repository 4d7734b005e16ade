"""Chain τ of every drafter of a built zoo set, on as many prompts as wanted.

  python bench/zoo_tau.py --zoo zoo/checkpoints/micro --prompts 164 --out results.json   (CPU)

The build measures τ on 8 prompts per workload (its time budget); this measures the same figure on
more, with a 95 % bootstrap interval over prompts. Per target, each prompt's AR continuation is
computed once (`engine/replay.py` `continuation`) and every drafter is replayed on it
(`drafter_taus`: the τ of each step of online decoding, without the target's verify passes).
With `--online` every drafter also decodes every prompt online, to check the two agree step for
step and to time both.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ar_decode import git_sha  # noqa: E402

from specpilot.engine.checkpoint import load_model  # noqa: E402
from specpilot.engine.decode import generate  # noqa: E402
from specpilot.engine.drafters import load_drafter  # noqa: E402
from specpilot.engine.replay import continuation, drafter_taus  # noqa: E402
from specpilot.zoo import tokenizer as tok_mod  # noqa: E402
from specpilot.zoo.build import pooled_tau  # noqa: E402
from specpilot.zoo import workloads  # noqa: E402


def bootstrap(per_prompt: list[list[int]], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of pooled_tau with prompts resampled with replacement."""
    rng = random.Random(seed)
    stats = sorted(pooled_tau(rng.choices(per_prompt, k=len(per_prompt))) for _ in range(n))
    return stats[int(0.025 * n)], stats[int(0.975 * n) - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--zoo", default="zoo/checkpoints/micro", help="a built zoo folder (with zoo.json)")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per workload (HumanEval has 164)")
    ap.add_argument("--new-tokens", type=int, help="default: the build's")
    ap.add_argument("--online", action="store_true", help="also decode online and compare step for step")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    zoo = Path(args.zoo)
    manifest = json.loads((zoo / "zoo.json").read_text())
    draft_len = manifest["tau_measure"]["draft_len"]
    new = args.new_tokens or manifest["tau_measure"]["new_tokens"]
    result = {"command": " ".join(["python"] + sys.argv), "date": datetime.date.today().isoformat(),
              "git_sha": git_sha(), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "preset": manifest["preset"], "draft_len": draft_len, "new_tokens": new,
              "manifest_tau": {f"{m['target'] or m['name']}+{m['kind'] if m['role'] == 'drafter' else 'ngram'}":
                               (m["tau"] if m["role"] == "drafter" else m["tau"]["ngram"]) for m in manifest["models"]},
              "tau": {}}
    workload_reqs = {"humaneval": workloads.humaneval(limit=args.prompts),
                     "stdlib": workloads.stdlib_completion(limit=args.prompts)}
    result["prompts"] = {k: len(v) for k, v in workload_reqs.items()}
    for target_entry in (m for m in manifest["models"] if m["role"] == "target"):
        role = target_entry["name"]
        target = load_model(zoo / target_entry["path"], torch.float32, args.device)
        tok = tok_mod.load(zoo / target_entry["path"])
        eos = set(target.cfg.eos_token_id)
        drafters = {"ngram": load_drafter("ngram")}
        for m in manifest["models"]:
            if m["role"] == "drafter" and m["target"] == role:
                drafters[m["kind"]] = load_drafter(str(zoo / m["path"]), torch.float32, args.device, target)
        layers = next((tuple(d.target_layers) for d in drafters.values() if d.target_layers), ())
        for w, reqs in workload_reqs.items():
            t = time.perf_counter()
            conts = [continuation(target, tok_mod.encode(tok, q.prompt)[-512:], new, layers)
                     for q in tqdm(reqs, desc=f"{role} {w} continuations", leave=False)]
            cont_s = time.perf_counter() - t
            for kind, d in drafters.items():
                t = time.perf_counter()
                per_prompt = [drafter_taus(c, d, draft_len, eos) for c in conts]
                lo, hi = bootstrap(per_prompt)
                row = {"tau": pooled_tau(per_prompt), "ci95": [lo, hi], "steps": sum(map(len, per_prompt)),
                       "replay_s": time.perf_counter() - t, "continuations_s": cont_s}
                if args.online:
                    t = time.perf_counter()
                    online = [[s.tau for s in generate(target, c.prompt, new, d, draft_len=draft_len).steps]
                              for c in conts]
                    row.update(online_tau=pooled_tau(online), online_s=time.perf_counter() - t,
                               online_prompts_equal=sum(a == b for a, b in zip(online, per_prompt)))
                result["tau"].setdefault(f"{role}+{kind}", {})[w] = row
                print(f"{role:7s} {kind:13s} {w:9s} τ {row['tau']:.2f}  [{lo:.2f}, {hi:.2f}]  "
                      f"({row['steps']} steps, {row['replay_s']:.1f} s)"
                      + (f"  online τ {row['online_tau']:.2f} ({row['online_s']:.1f} s, "
                         f"{row['online_prompts_equal']}/{len(conts)} prompts step for step)" if args.online else ""),
                      flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
