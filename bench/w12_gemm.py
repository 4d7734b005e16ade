"""Few-row GEMMs on the GPU at Llama-3.1-8B's shapes: cuBLAS (`torch.mm`), `bf16_linear` and
`w12_linear` (kernels/w12/gemm.py), per shape and row count, in CUDA graphs of 20 calls over 20
distinct weight copies (so L2 does not hold the weight), with a short sweep of launch configs for
the two Triton kernels, each cell checked against the float32 reference (max ulp), beside the floor:
the weight's bytes at the measured device-to-device copy bandwidth.

    python bench/w12_gemm.py [--out bench/results/w12_gemm.json] [--shapes qkv,o] [--rows 1,8,16,32,64]
    TRITON_INTERPRET=1 python bench/w12_gemm.py --dry-run --out /tmp/w12_dry.json   # CPU: tiny shapes, wall times

Every call's time is the median over replays of the graph's CUDA-event time over 20; each best
config is timed twice (`*_us` and `*_us_again`) to show the noise. Ulps count outputs above 2^-10 of
the largest (`reference.scale_floor`; cuBLAS's beside ours). A cell that fails prints one line
and the others go on; the JSON is written after every shape.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha  # noqa: E402
from gpu_fastpath import copy_bandwidth  # noqa: E402

import torch  # noqa: E402

from specpilot.kernels.w12 import format as w12f  # noqa: E402
from specpilot.kernels.w12 import gemm  # noqa: E402
from specpilot.kernels.w12.reference import scale_floor, ulps  # noqa: E402

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096),
          "lm_head": (4096, 128256)}  # name: (K, N)
DRY_SHAPES = {"tiny": (192, 200), "tiny_split": (640, 64)}
CALLS = 20  # calls per graph replay


def graph_us(calls, replays: int) -> float:
    """Median µs per call of a CUDA graph that makes calls[0](), …, calls[-1]() (each warmed up)."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / len(calls))
    del g
    return statistics.median(times)


def wall_us(calls, replays: int) -> float:
    """The dry run's stand-in for `graph_us`: wall µs per call on the CPU."""
    t = time.perf_counter()
    for _ in range(replays):
        for c in calls:
            c()
    return (time.perf_counter() - t) * 1e6 / (replays * len(calls))


def cell(name, k, n, m, weights, packed, xs, ref, quick_ref, sms, timer, replays, sweep: bool) -> dict:
    """One (shape, rows) cell: cuBLAS, then each Triton kernel's configs (best one timed twice): the
    bf16 GEMM, the W12 GEMM and its view-only variant (quick, against x @ format.quick(w)ᵀ)."""
    dev = weights[0].device
    out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
    ws = gemm.Workspace(dev)
    x = xs
    row = {"rows": m}
    floor = scale_floor(ref)
    torch.mm(x, weights[0].T, out=out)
    row["cublas_max_ulp"] = ulps(out, ref, floor)  # the same measure for cuBLAS, beside ours
    row["cublas_us"] = timer([lambda w=w: torch.mm(x, w.T, out=out) for w in weights], replays)
    row["cublas_us_again"] = timer([lambda w=w: torch.mm(x, w.T, out=out) for w in weights], replays)
    for kind, run, ws_in, want in (
            ("bf16", lambda w, c: gemm.bf16_linear(x, w, c, out=out, ws=ws), weights, ref),
            ("w12", lambda w, c: gemm.w12_linear(x, w, c, out=out, ws=ws), packed, ref),
            ("quick", lambda w, c: gemm.w12_linear(x, w, c, out=out, ws=ws, quick=True), packed, quick_ref)):
        tried, decode = {}, kind != "bf16"  # each kernel's own heuristic
        cands = gemm.configs(m, n, k, sms, decode) if sweep else [gemm.heuristic(m, n, k, sms, decode)]
        for cfg in cands:
            try:
                run(ws_in[0], cfg)
                got = ulps(out, want, scale_floor(want))
                tried[cfg] = (timer([lambda w=w, c=cfg: run(w, c) for w in ws_in], max(5, replays // 2)), got)
            except Exception as e:  # noqa: BLE001 — a config that does not launch (shared memory) is skipped
                print(f"  {name} M={m} {kind} {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        if not tried:
            raise RuntimeError(f"no {kind} config ran")
        best = min(tried, key=lambda c: tried[c][0])
        row[f"{kind}_us"] = timer([lambda w=w: run(w, best) for w in ws_in], replays)
        row[f"{kind}_us_again"] = timer([lambda w=w: run(w, best) for w in ws_in], replays)
        row[f"{kind}_config"] = asdict(best)
        row[f"{kind}_max_ulp"] = max(u for _, u in tried.values())
        row[f"{kind}_sweep"] = [{**asdict(c), "us": t, "max_ulp": u} for c, (t, u) in tried.items()]
        run(ws_in[0], best)
        a = out.clone()
        run(ws_in[0], best)
        row[f"{kind}_deterministic"] = bool(torch.equal(a.view(torch.int16), out.view(torch.int16)))
    row["max_ulp"] = max(row["bf16_max_ulp"], row["w12_max_ulp"], row["quick_max_ulp"])
    row["speedup"] = row["cublas_us"] / row["w12_us"]
    row["quick_over_cublas"] = row["cublas_us"] / row["quick_us"]
    row["quick_over_w12"] = row["w12_us"] / row["quick_us"]
    row["bf16_over_cublas"] = row["cublas_us"] / row["bf16_us"]
    return row


def weights_of(k, n, copies, device, seed=0):
    """`copies` bf16 [n, k] weights (randn · 0.02 with a few planted escapes: zeros, a denormal, an
    outlier) and their W12 packs; copies share the values, not the memory."""
    g = torch.Generator(device=device).manual_seed(seed)
    w = (torch.randn(n, k, generator=g, device=device) * 0.02).bfloat16()
    w[0, :7] = 0
    w[n // 2, k // 3] = 1e-39
    w[n - 1, k - 1] = 24.0
    p = w12f.pack(w)
    weights = [w] + [w.clone() for _ in range(copies - 1)]
    packed = [p] + [w12f.W12(p.shape, p.records.clone(), p.lo, p.esc_idx, p.esc_val, p.tile_ptr) for _ in range(copies - 1)]
    return weights, packed


def run_shape(name, k, n, rows, copies, device, sms, timer, replays, sweep, bw) -> dict:
    weights, packed = weights_of(k, n, copies, device)
    p = packed[0]
    res = {"K": k, "N": n, "copies": copies, "escapes": p.escapes, "bf16_bytes": 2 * n * k,
           "w12_bytes": p.records.numel() + p.lo.numel() + 6 * p.escapes, "cells": {}}
    if bw:
        res["floor_bf16_us"] = res["bf16_bytes"] / bw * 1e6
        res["floor_us"] = res["w12_bytes"] / bw * 1e6
    exact, view = w12f.unpack(p).float(), w12f.quick(p).float()
    for m in rows:
        try:
            x = torch.randn(m, k, device=device).bfloat16()
            ref, quick_ref = (x.float() @ exact.T).bfloat16(), (x.float() @ view.T).bfloat16()
            res["cells"][str(m)] = cell(name, k, n, m, weights, packed, x, ref, quick_ref, sms, timer, replays, sweep)
            c = res["cells"][str(m)]
            print(f"{name:8s} M={m:3d} cublas {c['cublas_us']:8.1f} bf16 {c['bf16_us']:8.1f} w12 {c['w12_us']:8.1f} µs "
                  f"quick {c['quick_us']:8.1f} µs speedup {c['speedup']:.2f} ulp {c['max_ulp']}", flush=True)
        except Exception as e:  # noqa: BLE001 — one failing cell must not stop the others
            print(f"{name} M={m}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            traceback.print_exc(limit=2)
    del weights, packed
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()
    return res


def summary(out: dict) -> dict:
    cells = [c for s in out["shapes"].values() for c in s["cells"].values()]
    return {"gemm_speedup_min": min((c["speedup"] for c in cells), default=None),
            "bf16_over_cublas_min": min((c["bf16_over_cublas"] for c in cells), default=None),
            "quick_over_w12_min": min((c["quick_over_w12"] for c in cells), default=None),
            "max_ulp": max((c["max_ulp"] for c in cells), default=None),
            "deterministic": all(c["bf16_deterministic"] and c["w12_deterministic"] and c["quick_deterministic"]
                                 for c in cells)}


def table(out: dict) -> str:
    lines = [f"{'shape':8s} {'M':>3s} {'cublas':>8s} {'bf16':>8s} {'w12':>8s} {'quick':>8s} {'floor':>7s} {'w12×':>5s} "
             f"{'bf16×':>5s} ulp"]
    for name, s in out["shapes"].items():
        for m, c in s["cells"].items():
            lines.append(f"{name:8s} {m:>3s} {c['cublas_us']:8.1f} {c['bf16_us']:8.1f} {c['w12_us']:8.1f} {c['quick_us']:8.1f} "
                         f"{s.get('floor_us', float('nan')):7.1f} {c['speedup']:5.2f} {c['bf16_over_cublas']:5.2f} "
                         f"{c['max_ulp']}")
    return "\n".join(lines)


def main(argv=None, timer=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/w12_gemm.json")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--rows", default="1,8,16,32,64")
    ap.add_argument("--copies", type=int, default=CALLS, help="distinct weight copies a graph cycles through")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--no-sweep", action="store_true", help="only the heuristic's config")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1), wall times")
    args = ap.parse_args(argv)
    shapes = DRY_SHAPES if args.dry_run else SHAPES
    names = list(shapes) if args.dry_run else args.shapes.split(",")
    bad = [s for s in names if s not in shapes]
    if bad:
        ap.error(f"--shapes: unknown {', '.join(bad)}; known: {', '.join(shapes)}")
    rows = [int(r) for r in args.rows.split(",")]
    if args.dry_run:
        device, timer, copies, replays, bw = torch.device("cpu"), timer or wall_us, 2, 1, None
        dev_name, sms = "cpu (dry run: interpreter, wall times)", 132
        rows = [r for r in rows if r <= 17][:2] or [1]
    else:
        if not torch.cuda.is_available():
            print("error: bench/w12_gemm.py needs a CUDA GPU (or --dry-run)", file=sys.stderr)
            return 2
        device, timer, copies, replays = torch.device("cuda"), timer or graph_us, args.copies, args.replays
        dev_name, sms = torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count
        bw = copy_bandwidth()
        print(f"copy bandwidth {bw / 1e12:.2f} TB/s on {dev_name} ({sms} SMs)")
    out = {"command": "python " + " ".join(sys.argv), "device": dev_name, "date": datetime.date.today().isoformat(),
           "git_sha": git_sha(), "torch": torch.__version__, "triton": gemm.triton.__version__,
           "copy_bandwidth_Bps": bw, "calls_per_replay": CALLS, "shapes": {}}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        k, n = shapes[name]
        out["shapes"][name] = run_shape(name, k, n, rows, copies, device, sms, timer, replays, not args.no_sweep, bw)
        out.update(summary(out))
        path.write_text(json.dumps(out, indent=1))
    print(table(out))
    print(f"gemm_speedup_min {out['gemm_speedup_min']}, bf16_over_cublas_min {out['bf16_over_cublas_min']}, "
          f"max ulp {out['max_ulp']}, deterministic {out['deterministic']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
