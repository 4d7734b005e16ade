"""Build a zoo preset (timed) and measure τ of every tree policy on its pairs.

  python bench/zoo_trees.py --zoo zoo/checkpoints/micro --prompts 164 --jobs 2 --out results.json   (CPU)
  python bench/zoo_trees.py --preset small --device cuda --out results.json   (build on the GPU, measure there)

Per target (dense, hybrid) and drafter (block, block + Markov), on HumanEval prompts: each prompt's
greedy continuation once (`engine/replay.py` `continuation`), then the drafter driven through
exactly the calls of online decoding and accepted against it (`drafter_taus`: online τ step for
step, without the target's verify passes; test_drafter_replay_gives_the_online_taus) for chain and
best-first:32, and once more with best-first:63 recording its lattices (16 drafted positions); every
other policy is replayed on those lattices (chain, best-first 16/32/63, top-k at 16, Sequoia at 16
fitted on the record, oracle at 8 and 16 positions, best-first without the transitions: Markov
head's or pointer head's).
`--jobs N` deals the prompts to N processes of one torch thread each (the figures are the same).
Also the memory a hybrid needs for tree verification at N = 32 with per-node state snapshots
against root-path replay.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import multiprocessing
import pickle
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import deal, git_sha  # noqa: E402

from specpilot.engine.checkpoint import load_model  # noqa: E402
from specpilot.engine.drafters import Lattice, load_drafter  # noqa: E402
from specpilot.engine.engine import load_tokenizer  # noqa: E402
from specpilot.engine.replay import acceptance_profile, continuation, drafter_taus, make_policy, replay  # noqa: E402
from specpilot.zoo.workloads import humaneval  # noqa: E402

KINDS = ("block", "block-markov")
DRAFT_LEN = 16


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


def measure_prompts(prompts: list[list[int]], zoo: Path, role: str, new_tokens: int, device: str,
                    replay_device: str | None = None, threads: int | None = None) -> dict:
    """Per drafter kind of target `role`: per prompt, the exact τs of chain and best-first:32 and the
    best-first:63 record (pickled); with the seconds spent (continuations apart). The continuations
    are made on `device`, the drafters run on `replay_device` (default: the same)."""
    if threads:
        torch.set_num_threads(threads)
    t_all = time.perf_counter()
    replay_device = replay_device or device
    target = load_model(zoo / role, torch.float32, replay_device)
    maker = target if replay_device == device else load_model(zoo / role, torch.float32, device)
    drafters = {k: load_drafter(str(zoo / f"{role}-{k}"), torch.float32, replay_device, target) for k in KINDS}
    eos = set(target.cfg.eos_token_id)
    layers = tuple(drafters["block"].target_layers)
    t = time.perf_counter()
    conts = [continuation(maker, p, new_tokens, layers).to(replay_device) for p in prompts]
    out = {"continuations_s": time.perf_counter() - t, "kinds": {}}
    for kind, d in drafters.items():
        t = time.perf_counter()
        row = {spec: [drafter_taus(c, d, DRAFT_LEN, eos, make_policy(spec)) for c in conts]
               for spec in ("chain", "best-first:32")}
        row["record"] = []
        for c in conts:
            rec: list = []
            drafter_taus(c, d, DRAFT_LEN, eos, make_policy("best-first:63"), rec)
            # pickled by value: thousands of lattice tensors handed between processes one file
            # descriptor each (torch's sharing) run out of descriptors
            row["record"].append(pickle.dumps(rec))
        row["replay_s"] = time.perf_counter() - t
        out["kinds"][kind] = row
    # per process: with the bench's wall time beside it, what the processes waited for shows
    print(f"{role}: {len(prompts)} prompts in {time.perf_counter() - t_all:.0f} s (continuations "
          f"{out['continuations_s']:.0f} s)", flush=True)
    return out


def summarize(row: dict) -> dict:
    """Pooled τ of the exact runs and of every replayed policy on the best-first:63 record."""
    rec = [s for r in row["record"] for s in pickle.loads(r)]
    profile = acceptance_profile(rec)
    rp = {spec: mean(replay(rec, spec, profile)) for spec in
          ("chain", "best-first:16", "best-first:32", "best-first:63", "topk:4:16", "sequoia:16", "oracle")}
    rp["oracle@8"] = mean(replay(truncated(rec, 8), "oracle"))
    rp["chain@8"] = mean(replay(truncated(rec, 8), "chain"))
    rp["best-first:32 unconditioned"] = mean(replay(truncated(rec, 16, drop_trans=True), "best-first:32"))
    exact = {spec: mean([t for p in row[spec] for t in p]) for spec in ("chain", "best-first:32")}
    return {"exact": exact, "replay": rp, "replay_steps": len(rec), "seconds": row["replay_s"]}


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
    ap.add_argument("--device", default="cpu", help="where the build trains (with --preset) and the continuations are made")
    ap.add_argument("--replay-device", help="where the drafters run (default: --device; with a GPU and many CPU "
                    "cores, cpu and --jobs N replays on N cores)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--jobs", type=int, default=1, help="processes, one torch thread each (default 1: this one)")
    ap.add_argument("--roles", default="dense,hybrid", help="targets to measure, in this order")
    ap.add_argument("--out", required=True)
    ap.add_argument("--workdir", default="/tmp")
    args = ap.parse_args()
    from specpilot.zoo.build import build

    result = {"command": " ".join(["python"] + sys.argv), "date": datetime.date.today().isoformat(),
              "git_sha": git_sha(), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "preset": args.preset, "jobs": args.jobs, "draft_len": DRAFT_LEN,
              "replay_device": args.replay_device or args.device,
              "new_tokens": args.new_tokens,
              "method": "exact: drafter_taus (online τ, step for step) against each prompt's continuation; "
                        "replay: policies on the best-first:63 record"}
    zoo = Path(args.zoo) if args.zoo else Path(args.workdir) / f"zoo-{args.preset}"
    if not args.zoo:
        t = time.perf_counter()
        manifest = build(args.preset, zoo, args.device)
        result["build_s"] = time.perf_counter() - t
        result["build_timings_s"] = manifest["timings"]
    manifest = json.loads((zoo / "zoo.json").read_text())
    result["preset"], result["models"] = manifest["preset"], manifest["models"]  # the zoo's, built here or not
    tok = load_tokenizer(zoo / "dense")
    prompts = [tok.encode(r.prompt).ids for r in humaneval(limit=args.prompts)]
    result["prompts"] = len(prompts)
    result["pairs"] = {}
    # CUDA cannot be forked: spawned processes, started once
    pool = concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) \
        if args.jobs > 1 else None
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    if not roles or set(roles) - {"dense", "hybrid"}:
        ap.error(f"--roles {args.roles!r}: expected dense, hybrid or both, comma-separated")
    for role in roles:
        t = time.perf_counter()
        got = deal(measure_prompts, prompts, args.jobs, pool, zoo, role, args.new_tokens, args.device, args.replay_device)
        for kind in KINDS:
            row = result["pairs"][f"{role}+{kind}"] = summarize(got["kinds"][kind])
            row["continuations_s"] = got["continuations_s"]
            print(role, kind, json.dumps(row), flush=True)
        result.setdefault("wall_s", {})[role] = time.perf_counter() - t
        Path(args.out).write_text(json.dumps(result, indent=1))  # what is measured so far survives a cut
    if pool:
        pool.shutdown()
    cfg = load_model(zoo / "hybrid", torch.float32, "cpu").cfg
    result["tree_memory_n32"] = {"this_target": snapshot_memory(cfg)}
    from specpilot.engine.config import ModelConfig

    big = ModelConfig(family="qwen3_next", vocab_size=151936, hidden_size=2048, intermediate_size=5120,
                      num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                      layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(48)],
                      linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                      linear_value_head_dim=128)
    result["tree_memory_n32"]["qwen3_next_80b_shape"] = snapshot_memory(big)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
