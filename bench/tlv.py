"""Two-level verification (TLV) against one-pass best-first at the same node budget. Parts, each
writing its JSON under --out-dir as it finishes:

  tau    a zoo pair (--zoo: its dense target and --drafter) on HumanEval prompts through Engine (the
         path `specpilot generate` takes), bf16: best-first:N (tree mode) and TLV with N nodes (Q-pass
         tree depth --q-depth); τ per exact pass (tokens an exact target pass commits, run()'s
         tau_mean) of each and their ratio (bar ≥ 1.6); the Q pass's top-1 agreement with the exact
         pass, teacher-forced on TLV's outputs (bar ≥ 0.97); tokens/s of each and TLV over best-first
         (on CUDA both run the static driver, captured; `--tlv-driver eager` runs TLV's cycle on the
         eager one, which times its drafts apart); token forcing of TLV's outputs against stock's
         (chain, the same drafter), δ calibrated on AR (`--no-force` skips it).
  qpass  the Llama-3.1-8B shape with random bf16 weights (CUDA): one eager pass (as TLV runs it,
         engine/tlv.tree_pass) over a random tree of N nodes after a 512-token prompt, for the exact
         target with bf16 weights, the Q pass (view-only W12 GEMM) and the exact target with W12
         weights → q_over_exact_bf16 at each N (bar ≤ 0.8 at N = 32).
  merge  tau.json and qpass.json of DIR → one result with the headline figures and the cost model's
         projected speed-up of TLV over best-first (tlv_cycle with the measured pass times at the 8B
         shape, the pair's measured draft time per step and the τs of `tau`; only where TLV ran on
         the eager driver, the one that times drafts apart).

  python bench/tlv.py tau --zoo zoo/checkpoints/micro --device cpu --prompts 16 --out-dir /tmp/tlv
  python bench/tlv.py tau qpass --zoo out/small --out-dir DIR; python bench/tlv.py merge DIR --out bench/results/tlv.json
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_fastpath import LLAMA_8B, forcing, parts_main, random_model, requests  # noqa: E402

from specpilot.engine import trees  # noqa: E402
from specpilot.engine.config import ModelConfig  # noqa: E402
from specpilot.engine.engine import Engine, EngineConfig  # noqa: E402
from specpilot.engine.tlv import agreement, quick_model, tree_pass  # noqa: E402
from specpilot.engine.weights import apply  # noqa: E402
from specpilot.services.planner.costmodel import tlv_cycle  # noqa: E402

PROMPT_LEN = 512


def run_system(zoo: Path, args, mode: str, **extra) -> tuple[Engine, dict]:
    """One system through Engine on every prompt, after a first call that builds, compiles and
    captures (not counted)."""
    cfg = EngineConfig(target=str(zoo / "dense"), drafter=None if mode == "ar" else str(zoo / args.drafter),
                       mode=mode, draft_len=args.draft_len, dtype="bfloat16", device=args.device,
                       max_new_tokens=args.new_tokens, **extra)
    engine = Engine(cfg)
    reqs = requests(args.prompts, args.new_tokens)
    engine.generate(reqs[0])
    res = engine.run(reqs)
    print(f"  {mode:5s} {extra}: τ {res['tau_mean']:.3f}  {res['tokens_per_s']:.1f} tok/s  {res['steps']} passes "
          f"({res['driver']} driver)", flush=True)
    return engine, res


def summary(res: dict) -> dict:
    return {"tau_per_exact_pass": res["tau_mean"], "tokens_per_s": res["tokens_per_s"], "exact_passes": res["steps"],
            "driver": res["driver"],
            "draft_s_per_pass": res["time_s"]["draft"] / max(1, res["steps"]),
            "quick_s_per_pass": res["time_s"]["quick"] / max(1, res["steps"]), "time_s": res["time_s"]}


def part_tau(args) -> dict:
    zoo, n = Path(args.zoo), args.nodes
    _, best = run_system(zoo, args, "tree", tree=f"best-first:{n}")
    engine, tlv = run_system(zoo, args, "tlv", tlv_nodes=n, tlv_q_depth=args.q_depth, driver=args.tlv_driver)
    agree, positions = 0.0, 0
    for r, o in zip(requests(args.prompts, args.new_tokens), tlv["outputs"], strict=True):
        seq = engine.encode(r) + list(o["tokens"])
        agree += agreement(engine.target, engine.tlv.quick, seq) * len(seq)
        positions += len(seq)
    out = {"zoo": str(zoo), "drafter": args.drafter, "prompts": len(tlv["outputs"]), "new_tokens": args.new_tokens,
           "nodes": n, "q_depth": args.q_depth, "draft_len": args.draft_len, "best_first": summary(best),
           "tlv": summary(tlv), "tau_ratio": tlv["tau_mean"] / best["tau_mean"],
           "tlv_over_best_first": tlv["tokens_per_s"] / best["tokens_per_s"],
           "q_agreement": agree / positions, "agreement_positions": positions,
           "outputs_equal_best_first": sum(a["tokens"] == b["tokens"] for a, b in zip(tlv["outputs"], best["outputs"]))}
    if args.force:
        _, stock = run_system(zoo, args, "chain")
        _, ar = run_system(zoo, args, "ar")
        res = forcing(zoo, {"tlv": tlv["outputs"]}, stock["outputs"], ar["outputs"],
                      requests(args.prompts, args.new_tokens), args.device)["tlv"]
        out |= {"forcing": res, "forcing_passed": res["passed"], "stock_tokens_per_s": stock["tokens_per_s"],
                "ar_tokens_per_s": ar["tokens_per_s"]}
    return out


def random_tree(nodes: int, vocab: int, seed: int) -> trees.Tree:
    """A tree of nodes + 1 rows whose every node hangs from one of the four latest (a bushy path,
    as best-first trees are)."""
    rng = random.Random(seed)
    parents = (-1, *(rng.randrange(max(0, i - 4), i) for i in range(1, nodes + 1)))
    return trees.Tree(tuple(rng.randrange(vocab) for _ in range(nodes + 1)), parents)


def pass_ms(model, tree: trees.Tree, reps: int = 20) -> float:
    """Median ms of one eager pass over `tree` after a PROMPT_LEN-token prompt (its rows dropped)."""
    cache = model.new_cache(PROMPT_LEN + 80)
    with torch.no_grad():
        model(torch.arange(PROMPT_LEN, device="cuda")[None] + 1000, cache, commit_all=True, greedy=True)
    cache.commit(PROMPT_LEN)
    times = []
    for _ in range(reps + 3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        tree_pass(model, cache, tree)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times[3:])


def part_qpass(args) -> dict:
    model = random_model(ModelConfig(**LLAMA_8B))
    shapes = {n: random_tree(n, LLAMA_8B["vocab_size"], n) for n in args.pass_nodes}
    out = {"prompt_len": PROMPT_LEN, "cells": {}}
    exact = {n: pass_ms(model, t) for n, t in shapes.items()}
    quick = quick_model(model)
    q = {n: pass_ms(quick, t) for n, t in shapes.items()}
    del quick
    gc.collect()
    torch.cuda.empty_cache()
    apply(model, "w12", "bf16")
    w12 = {n: pass_ms(model, t) for n, t in shapes.items()}
    for n in shapes:
        out["cells"][str(n)] = {"exact_bf16_ms": exact[n], "quick_ms": q[n], "exact_w12_ms": w12[n],
                                "q_over_exact_bf16": q[n] / exact[n], "q_over_exact_w12": q[n] / w12[n]}
        print(f"  N={n:2d}  exact bf16 {exact[n]:.3f} ms  Q {q[n]:.3f} ms  exact w12 {w12[n]:.3f} ms  "
              f"Q/exact {q[n] / exact[n]:.3f}", flush=True)
    return out


PARTS = {"tau": part_tau, "qpass": part_qpass}


def merge(folder: Path) -> dict:
    parts = {p: json.loads((folder / f"{p}.json").read_text()) for p in PARTS if (folder / f"{p}.json").exists()}
    out = {"command": " ".join(["python"] + sys.argv)}
    for key in ("device", "date", "git_sha"):
        out[key] = ", ".join(dict.fromkeys(str(p.get(key)) for p in parts.values()))
    tau, qp = parts.get("tau", {}), parts.get("qpass", {})
    out |= {k: tau[k] for k in ("tau_ratio", "tlv_over_best_first", "q_agreement", "forcing_passed", "nodes",
                                "prompts") if k in tau}
    if "best_first" in tau:
        out["tau_best_first"] = tau["best_first"]["tau_per_exact_pass"]
        out["tau_tlv"] = tau["tlv"]["tau_per_exact_pass"]
    cells = qp.get("cells", {})  # the tree size measured nearest TLV's node budget
    cell = cells[min(cells, key=lambda n: abs(int(n) - tau.get("nodes", 32)))] if cells else None
    if cell:
        out["q_over_exact_bf16"] = cell["q_over_exact_bf16"]
        out["q_over_exact_w12"] = cell["q_over_exact_w12"]
    if cell and "tlv" in tau and tau["tlv"].get("driver", "eager") == "eager":
        # T_step = draft + exact pass; T_cycle = two drafts + Q + exact (glue apart)
        # one draft's time: half of what TLV's two drafts took per exact pass (the static driver does not
        # time its drafts apart)
        t_draft, t_exact = tau["tlv"]["draft_s_per_pass"] / 2, cell["exact_bf16_ms"] / 1e3
        t_cycle = tlv_cycle(t_draft, cell["quick_ms"] / 1e3, t_exact)
        out["projected_tlv_over_best_first_8b"] = out["tau_tlv"] / out["tau_best_first"] * (t_draft + t_exact) / t_cycle
        out["projection_inputs"] = {"t_draft_s": t_draft, "t_exact_s": t_exact, "t_cycle_s": t_cycle}
    out["parts"] = parts
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="+", help="tau | qpass, or: merge DIR")
    ap.add_argument("--zoo", default="out/small", help="tau: a zoo folder with dense and the drafter")
    ap.add_argument("--drafter", default="dense-block-markov")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=164)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--nodes", type=int, default=32, help="N: nodes of best-first and of TLV's trees")
    ap.add_argument("--q-depth", type=int, default=8)
    ap.add_argument("--draft-len", type=int, default=16)
    ap.add_argument("--pass-nodes", default="15,31,63", help="qpass: tree sizes")
    ap.add_argument("--tlv-driver", choices=("auto", "eager"), default="auto", help="tau: TLV's driver")
    ap.add_argument("--no-force", dest="force", action="store_false")
    ap.add_argument("--out-dir", default="bench/results/tlv_parts")
    ap.add_argument("--out", default="bench/results/tlv.json", help="merge: the merged result")
    args = ap.parse_args()
    args.pass_nodes = [int(x) for x in args.pass_nodes.split(",")]
    return parts_main("bench/tlv.py", PARTS, args, merge, ("tau_ratio", "q_agreement", "forcing_passed"))


if __name__ == "__main__":
    sys.exit(main())
