"""Forward + backward of one Gated DeltaNet layer and of its delta rule alone, at the small
recipe's training shape, as the target trainer runs them (bf16 autocast on a GPU; eager, and
compiled as `train.compiled_loss` compiles a block; and the Triton kernels of kernels/gdn_chunk.py
where Triton and a GPU are there), for several chunk sizes of the chunked rule.

  python bench/gdn_train_step.py --device cuda --out results.json

Where a hybrid target's training step goes beyond a dense one's: the rule alone against the
whole layer (projections, conv, norm), per chunk size. Medians of `--reps` timed repetitions
after warm-up, with CUDA events around each.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha, top_kernels  # noqa: E402

from specpilot.engine import gdn  # noqa: E402
from specpilot.engine.model import GatedDeltaNet  # noqa: E402
from specpilot.kernels import gdn_chunk  # noqa: E402
from specpilot.zoo.build import PRESETS, target_config  # noqa: E402


def timed_ms(fn, reps: int, device: str) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if device.startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, help="default: the small recipe's target batch")
    ap.add_argument("--chunks", default="32,64", help="chunk sizes; the Triton kernels take up to 64")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--warps", default=str(gdn_chunk.WARPS), help="Triton warps per program to time, e.g. 4,8")
    ap.add_argument("--profile", action="store_true",
                    help="with the Triton kernels: each kernel's device time per forward + backward, per warps")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    r = PRESETS["small"]
    cfg = target_config(r, hybrid=True)
    B, T, dev = args.batch or r.target_batch, r.seq, args.device
    cuda = dev.startswith("cuda")
    torch.manual_seed(0)
    layer = GatedDeltaNet(cfg, 0).to(dev)
    x = torch.randn(B, T, cfg.hidden_size, device=dev, requires_grad=True)
    H, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    h0 = torch.zeros(B, H, dk, dv, device=dev)
    conv0 = torch.zeros(B, layer.conv_dim, cfg.linear_conv_kernel_dim - 1, device=dev)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
        _, _, conv_in = layer(x, h0, conv0, snapshots=False)
        _, _, _, _, b, a = layer.split(x)
        rule_in = [t.detach().requires_grad_() for t in layer.rule_inputs(layer.conv(conv_in.transpose(1, 2)), b, a)]

    def step(f):
        def run():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
                out = f()
            out.float().square().mean().backward()
        return run

    results = {}
    for chunk in (int(c) for c in args.chunks.split(",")):
        def rule(c=chunk):
            return gdn.chunked_gated_delta_rule(*rule_in, h0, chunk=c)[0]

        def whole(c=chunk, triton_rule=False):
            layer.chunk, layer.triton_rule = c, triton_rule
            return layer(x, h0, conv0, snapshots=False)[0]

        row = {"rule_eager_ms": timed_ms(step(rule), args.reps, dev),
               "layer_eager_ms": timed_ms(step(whole), args.reps, dev)}
        if cuda and gdn_chunk.available() and chunk <= gdn_chunk.MAX_SIZE:  # the Triton kernels, uncompiled
            for w in (int(w) for w in args.warps.split(",")):
                run = step(lambda c=chunk, w=w: gdn_chunk.chunked_gated_delta_rule(*rule_in, h0, chunk=c, warps=w)[0])
                row[f"rule_triton_{w}warps_ms"] = timed_ms(run, args.reps, dev)
                if args.profile:  # the seven kernels by name (LAUNCHED), ms per forward + backward
                    row[f"rule_triton_{w}warps_kernels"] = {
                        k["name"]: k["ms_per_step"] for k in top_kernels(lambda: [run() for _ in range(5)], 5, dev, n=40)
                        if k["name"] in gdn_chunk.LAUNCHED}
            row["layer_triton_ms"] = timed_ms(step(lambda c=chunk: whole(c, True)), args.reps, dev)
        if not args.no_compile:
            t = time.perf_counter()
            crule = torch.compile(lambda c=chunk: gdn.chunked_gated_delta_rule(*rule_in, h0, chunk=c)[0])
            step(crule)()
            row["rule_compile_s"] = time.perf_counter() - t
            row["rule_compiled_ms"] = timed_ms(step(crule), args.reps, dev)
        results[f"chunk_{chunk}"] = row
        print(f"chunk {chunk}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} "
                                            + " ".join(f"{n} {t:.3f}" for n, t in v.items()) for k, v in row.items()),
              flush=True)
    out = {"command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(),
           "git_sha": git_sha(), "device": torch.cuda.get_device_name() if cuda else "cpu",
           "torch": torch.__version__, "batch": B, "seq": T, "heads": H, "key_dim": dk, "value_dim": dv,
           "reps": args.reps, "results": results}
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
