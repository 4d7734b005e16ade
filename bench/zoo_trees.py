"""Build a zoo preset (timed) and measure τ of every tree policy on its pairs.

  python bench/zoo_trees.py --preset small --device cuda --out results.json   (GPU machine)
  python bench/zoo_trees.py --preset micro --zoo zoo/checkpoints/micro --out results.json   (CPU, shipped)

Per target (dense, hybrid) and drafter (block, block + Markov): online τ of chain and best-first:32
on HumanEval prompts, and exact replay of every policy on lattices recorded with 16 drafted
positions (chain, best-first 16/32/63, top-k at 16, Sequoia at 16 fitted on the record, oracle at
8 and 16 positions, best-first without the Markov transitions). Also the memory a hybrid needs for
tree verification at N = 32 with per-node state snapshots against root-path replay.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha  # noqa: E402

from specpilot.engine.checkpoint import load_model  # noqa: E402
from specpilot.engine.decode import generate  # noqa: E402
from specpilot.engine.drafters import Lattice, load_drafter  # noqa: E402
from specpilot.engine.replay import acceptance_profile, make_policy, replay  # noqa: E402
from specpilot.engine.engine import load_tokenizer  # noqa: E402
from specpilot.zoo.workloads import humaneval  # noqa: E402


def truncated(steps, m: int, drop_trans: bool = False):
    """The same records with lattices cut to m positions (and/or without Markov transitions)."""
    out = []
    for s in steps:
        lat = s.lattice
        if lat is not None:
            lat = Lattice(lat.tokens[:m], lat.logp[:m], None if drop_trans or lat.trans is None else lat.trans[: m - 1])
        out.append(type(s)(lat, s.room, s.tau, s.tree_tokens, s.argmax, s.emitted))
    return out


def mean(xs):
    return sum(xs) / max(1, len(xs))


def measure_pair(target, drafter, prompts, new_tokens):
    online = {}
    for spec in ("chain", "best-first:32"):
        steps = []
        for p in prompts:
            steps += generate(target, p, new_tokens, drafter, draft_len=16, policy=make_policy(spec)).steps
        online[spec] = mean([s.tau for s in steps])
    rec = []
    for p in prompts:
        r = []
        generate(target, p, new_tokens, drafter, draft_len=16, policy=make_policy("best-first:63"), record=r)
        rec += r
    profile = acceptance_profile(rec)
    rp = {spec: mean(replay(rec, spec, profile)) for spec in
          ("chain", "best-first:16", "best-first:32", "best-first:63", "topk:4:16", "sequoia:16", "oracle")}
    rp["oracle@8"] = mean(replay(truncated(rec, 8), "oracle"))
    rp["chain@8"] = mean(replay(truncated(rec, 8), "chain"))
    rp["best-first:32 unconditioned"] = mean(replay(truncated(rec, 16, drop_trans=True), "best-first:32"))
    return {"online": online, "replay": rp, "replay_steps": len(rec)}


def snapshot_memory(cfg, n: int = 32) -> dict:
    """Bytes a tree pass of n nodes keeps for Gated DeltaNet layers, from the shapes: a float32
    state per node and layer (snapshots), against per-node delta-rule inputs plus, on the eager
    driver, one running state per root path for the layer in flight (an upper bound: a tree of n
    nodes has at most n paths; the static driver keeps no state per path)."""
    gdn = cfg.layer_types.count("linear_attention")
    H, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    state = H * dk * dv * 4
    conv_dim = 2 * cfg.linear_num_key_heads * dk + H * dv
    per_node = (H * (2 * dk + dv + 2) + conv_dim) * 4
    return {"gdn_layers": gdn, "snapshots_bytes": n * gdn * state,
            "replay_stash_bytes": n * gdn * per_node, "replay_paths_bytes_max": n * state}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="micro")
    ap.add_argument("--zoo", help="an already built zoo folder (skips the build)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workdir", default="/tmp")
    args = ap.parse_args()
    from specpilot.zoo.build import build

    result = {"command": " ".join(["python"] + sys.argv), "date": datetime.date.today().isoformat(),
              "git_sha": git_sha(), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "preset": args.preset}
    zoo = Path(args.zoo) if args.zoo else Path(args.workdir) / f"zoo-{args.preset}"
    if not args.zoo:
        t = time.perf_counter()
        manifest = build(args.preset, zoo, args.device)
        result["build_s"] = time.perf_counter() - t
        result["build_timings_s"] = manifest["timings"]
    manifest = json.loads((zoo / "zoo.json").read_text())
    result["models"] = manifest["models"]
    tok = load_tokenizer(zoo / "dense")
    prompts = [tok.encode(r.prompt).ids for r in humaneval(limit=args.prompts)]
    result["pairs"] = {}
    for role in ("dense", "hybrid"):
        target = load_model(zoo / role, torch.float32, args.device)
        if target.cfg.is_hybrid:
            result["tree_memory_n32"] = {"this_target": snapshot_memory(target.cfg)}
        for kind in ("block", "block-markov"):
            d = load_drafter(str(zoo / f"{role}-{kind}"), torch.float32, args.device, target)
            t = time.perf_counter()
            result["pairs"][f"{role}+{kind}"] = measure_pair(target, d, prompts, args.new_tokens)
            result["pairs"][f"{role}+{kind}"]["seconds"] = time.perf_counter() - t
            print(role, kind, json.dumps(result["pairs"][f"{role}+{kind}"]), flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))  # what is measured so far survives a cut
    from specpilot.engine.config import ModelConfig

    big = ModelConfig(family="qwen3_next", vocab_size=151936, hidden_size=2048, intermediate_size=5120,
                      num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                      layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(48)],
                      linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                      linear_value_head_dim=128)
    result.setdefault("tree_memory_n32", {})["qwen3_next_80b_shape"] = snapshot_memory(big)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
