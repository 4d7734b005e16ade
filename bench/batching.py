"""Batched decoding through the path users run (`Engine.generate_batch` → the static driver's lanes
and, on CUDA, its captured step): total output tokens per second at each batch size, AR and the
n-gram chain and a (random) block drafter on the device, on a random bf16 model of the zoo small dense shape (hidden 512, 8 layers, vocab
16384). Every batch size decodes the same prompts to the same token limit; the result also says
how many requests' tokens equal their batch-1 tokens (bf16: GEMMs over more rows may round
differently — lossless is judged in float64 by the tests, here only reported).

Random weights: τ of the n-gram drafter here says nothing about real text; the figure this measures
is the batch path's own throughput (is it host-bound, does it scale with the batch). With --zoo DIR
the systems are a zoo's trained dense pair instead (DIR/dense and the drafter --drafter, `block`
mode) on HumanEval prompts: real acceptance, requests ending at EOS at different steps, and each
batch size's speculative systems over AR at that batch (`spec_over_ar`).

  python bench/batching.py --out bench/results/batching.json [--batches 1,8,16,32] [--prompts 32]
  python bench/batching.py --zoo out/small --modes ar,block --tree shared:8:16 --batches 1,16 --prompts 164 --out F
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from specpilot.engine.checkpoint import save_model
from specpilot.engine.config import ModelConfig
from specpilot.engine.drafters import save_drafter
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.engine.synthetic import random_drafter_net, random_model
from specpilot.zoo.workloads import Request, humaneval

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha, top_kernels  # noqa: E402

SMALL_DENSE = dict(family="llama", vocab_size=16384, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                   num_attention_heads=8, num_key_value_heads=4, head_dim=64, layer_types=["full_attention"] * 8,
                   rms_norm_eps=1e-5, eos_token_id=[16383])


def breakdown(res, total: float) -> dict:
    """Where a run's wall time went: the prefill passes (each counted once, however many requests
    it admitted; a prompt admitted into verify steps has none), the decode steps (each step's wall,
    replay to read, counted once however many lanes shared it) and the rest (the host's bookkeeping
    between steps)."""
    steps = [s for r in res for s in r.steps]
    n = sum(1 / max(1, s.lanes) for s in steps)
    wall = [s.t_draft + s.t_quick + s.t_verify + s.t_commit for s in steps]  # the static driver times all in t_verify
    step_s = sum(w / max(1, s.lanes) for w, s in zip(wall, steps))
    prefill = sum(r.prefill_s / getattr(r, "prefill_with", 1) for r in res  # older engines: a pass a request
                  if not getattr(r, "prefill_steps", 0))  # a prompt fed in verify steps: in their walls
    walls = sorted(wall)
    return {"steps": round(n), "prefill_s": round(prefill, 4), "step_s": round(step_s, 4),
            "other_s": round(total - prefill - step_s, 4),
            "step_ms_median": round(1e3 * walls[len(walls) // 2], 4) if walls else None}


def profile(eng, reqs, b: int, dev: str) -> dict:
    """One decode of `reqs` (b of them, one batch) under the profiler: its steps timed first without
    it (`breakdown`), then the heaviest operators per step (device time on a GPU: whether the step
    is the device's or the host's shows as the "(all)" row's device ms against the step's wall)."""
    run = (lambda: eng.generate_batch(reqs, b)) if b > 1 else (lambda: [eng.generate(reqs[0])])
    t0 = time.perf_counter()
    res = run()
    wall = time.perf_counter() - t0
    steps = max(len(r.steps) for r in res)
    rows = top_kernels(run, steps, dev, total=True)
    for r in rows[:12] + rows[-1:]:
        print(f"  {r['ms_per_step'] * 1e3:9.1f} us/step {r['calls_per_step']:7.2f}x  {r['name']}", flush=True)
    return breakdown(res, wall) | {"top": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,8,16,32")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--tree", default=None, metavar="POLICY", help="drafter modes verify this tree policy (e.g. "
                    "best-first:8, shared:8:16) instead of a chain")
    ap.add_argument("--draft-len", type=int, default=8, help="drafted positions per step")
    ap.add_argument("--draft-lens", default=None, metavar="L,L,...", help="per-request draft lengths (EngineConfig)")
    ap.add_argument("--admit-steps", type=int, default=0, metavar="K", help="prompt admission (EngineConfig): a "
                    "prompt whose prefill fits K verify steps rides a busy batch's steps")
    ap.add_argument("--ragged", action="store_true", help="token limits spread over [new_tokens / 4, new_tokens] "
                    "(the same at every batch size): lanes free up while others decode, as under a queue")
    ap.add_argument("--modes", default="ar,chain,block", help="ar | chain (the n-gram drafter) | block (a random "
                    "block drafter on the device, or --zoo's --drafter)")
    ap.add_argument("--zoo", default=None, metavar="DIR", help="a zoo folder: its trained dense pair on HumanEval prompts")
    ap.add_argument("--drafter", default="dense-block-markov", help="with --zoo: the drafter folder in it")
    ap.add_argument("--profile", action="store_true", help="after each timed run, the heaviest operators per step "
                    "of the first batch's requests (torch.profiler; device time on a GPU) and the step's wall")
    a = ap.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",")]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if a.zoo:
        reqs = [dataclasses.replace(r, max_new_tokens=a.new_tokens) for r in humaneval(a.prompts)]
        shape = f"zoo {Path(a.zoo).name}: dense target, {a.drafter} (trained, bf16), HumanEval prompts"
    else:
        g = torch.Generator().manual_seed(0)
        reqs = [Request(id=f"p{i}", prompt_ids=tuple(torch.randint(1, 16000, (a.prompt_len,), generator=g).tolist()),
                        max_new_tokens=a.new_tokens) for i in range(a.prompts)]
        shape = "zoo small dense (random bf16)"
    if a.ragged:
        g = torch.Generator().manual_seed(1)
        reqs = [dataclasses.replace(r, max_new_tokens=int(torch.randint(max(1, a.new_tokens // 4), a.new_tokens + 1,
                                                                        (1,), generator=g))) for r in reqs]
    out = {"command": " ".join(["python"] + sys.argv), "device": torch.cuda.get_device_name() if dev == "cuda" else
           "cpu", "date": datetime.date.today().isoformat(), "git_sha": git_sha(), "torch": torch.__version__,
           "shape": shape, "prompts": len(reqs), "prompt_len": None if a.zoo else a.prompt_len,
           "new_tokens": a.new_tokens, "ragged": a.ragged, "admit_steps": a.admit_steps, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        if a.zoo:
            target, block = str(Path(a.zoo) / "dense"), str(Path(a.zoo) / a.drafter)
        else:
            target, block = tmp, f"{tmp}/block"
            save_model(random_model(ModelConfig(**SMALL_DENSE), seed=0, dtype=torch.bfloat16), tmp)
            save_drafter(random_drafter_net("block", ModelConfig(**SMALL_DENSE), seed=0), block, torch.bfloat16)
        for mode in a.modes.split(","):
            drafter = {"ar": None, "chain": "ngram", "block": block}[mode]
            spec_mode = "tree" if a.tree else "chain"
            extra = {"tree": a.tree} if a.tree and mode != "ar" else {}
            extra.update({"draft_lens": a.draft_lens} if a.draft_lens and mode != "ar" else {})
            eng = Engine(EngineConfig(target=target, drafter=drafter, mode="ar" if mode == "ar" else spec_mode, draft_len=a.draft_len,
                                      dtype="bfloat16", device=dev, max_new_tokens=a.new_tokens,
                                      admit_steps=a.admit_steps, **extra))
            ref = None
            for b in batches:
                eng.generate_batch(reqs[: max(b, 2)], b) if b > 1 else eng.generate(reqs[0])  # build + capture
                t0 = time.perf_counter()
                res = eng.generate_batch(reqs, b) if b > 1 else [eng.generate(r) for r in reqs]
                wall = time.perf_counter() - t0
                toks = [r.tokens for r in res]
                ref = toks if b == 1 else ref
                n = sum(map(len, toks))
                row = {"mode": mode, "tree": extra.get("tree"), "draft_lens": extra.get("draft_lens"), "batch": b, "seconds": round(wall, 4), "output_tokens": n,
                       "tokens_per_s": round(n / wall, 1),
                       "tau_mean": round(sum(r.tau_mean for r in res) / len(res), 3),
                       "verified_rows_per_step": round(sum(s.rows for r in res for s in r.steps) /
                                                       max(1, sum(len(r.steps) for r in res)), 2),
                       "equal_to_batch_1": None if ref is None else sum(x == y for x, y in zip(toks, ref)),
                       "fed_prompts": sum(1 for r in res if getattr(r, "prefill_steps", 0)),
                       **breakdown(res, wall)}
                if a.profile:
                    row["profile"] = profile(eng, reqs[:b], b, dev)
                out["runs"].append(row)
                print(json.dumps(row), flush=True)
                Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    base = {r["mode"]: r["tokens_per_s"] for r in out["runs"] if r["batch"] == 1}
    ar = {r["batch"]: r["tokens_per_s"] for r in out["runs"] if r["mode"] == "ar"}
    for r in out["runs"]:
        r["over_batch_1"] = round(r["tokens_per_s"] / base[r["mode"]], 3) if r["mode"] in base else None
        r["spec_over_ar"] = round(r["tokens_per_s"] / ar[r["batch"]], 3) if r["mode"] != "ar" and r["batch"] in ar \
            else None
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
