"""How many kernels one compiled decode step is, per system: the static driver's step
(`FastDecoder._step`, what `generate` and `generate_batch` replay in a CUDA graph) compiled by
torch.compile, counting the kernels Inductor generates (fused elementwise and reductions) and the
matrix products and attention calls it leaves to libraries (FX nodes of the traced step); for the
one-pass speculative systems also those of two of its parts compiled alone, the drafter's
proposal (`propose`) and the tree built from its lattice (`tree`).

Nothing is timed. On a GPU a captured step's kernels run back to back, each a few µs at least, so
on a small target (the zoo small dense shape here, random float32 weights) the count bounds the
step from below where the kernels are tiny. Counted with Inductor's CPU backend, which fuses by the
same scheduler as its GPU one (the counts are a guide to the GPU's, not equal to them).

  python bench/step_kernels.py --out bench/results/step_kernels_cpu.json [--batches 1,16]
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
from batching import SMALL_DENSE  # noqa: E402
from common import git_sha  # noqa: E402

from specpilot.engine.config import ModelConfig  # noqa: E402
from specpilot.engine.drafters import FeatureDrafter  # noqa: E402
from specpilot.engine.fast import FastDecoder  # noqa: E402
from specpilot.engine.replay import make_policy  # noqa: E402
from specpilot.engine.synthetic import random_drafter_net, random_model  # noqa: E402
from specpilot.engine.tlv import TwoLevel  # noqa: E402

LIBRARY = ("linear", "matmul", "bmm", "mm", "addmm", "scaled_dot_product_attention", "baddbmm")


def count(fn) -> dict:
    """Compile `fn` (fullgraph, as the decoder does) and run it once: the kernels Inductor
    generated and the library calls (matrix products, attention) of its traced graphs. `fn` runs
    once uncompiled first, as the decoder's warm-up does: what a layer restores once (a W12
    weight's decoded copy on the CPU) is then a constant of the traced step."""
    import torch._inductor.metrics as metrics
    from torch._inductor.compile_fx import compile_fx

    calls = {"graphs": 0, "library": 0}

    def backend(gm, example_inputs):
        calls["graphs"] += 1
        calls["library"] += sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method")
                                and getattr(n.target, "__name__", str(n.target)) in LIBRARY)
        return compile_fx(gm, example_inputs)

    fn()
    metrics.reset()
    torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)()
    return {"generated_kernels": metrics.generated_kernel_count, **calls}


def systems(target, drafter) -> dict:
    return {"ar": (None, None, None), "chain": (drafter, None, None),
            "best-first:16": (drafter, make_policy("best-first:16"), None),
            "tlv:16:4": (drafter, None, TwoLevel(target, 16, 4, round_bf16=True))}


@torch.no_grad()
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--draft-len", type=int, default=16)
    a = ap.parse_args(argv)
    cfg = ModelConfig(**SMALL_DENSE)
    target = random_model(cfg, seed=0, dtype=torch.float32)
    drafter = FeatureDrafter(random_drafter_net("block_markov", cfg, seed=0, dtype=torch.float32,
                                                block=a.draft_len), target)
    out = {"command": " ".join(["python"] + sys.argv), "device": "cpu (Inductor's C++ backend)",
           "date": datetime.date.today().isoformat(), "git_sha": git_sha(), "torch": torch.__version__,
           "shape": "zoo small dense (random float32), block + Markov drafter", "draft_len": a.draft_len, "rows": []}
    for b in (int(x) for x in a.batches.split(",")):
        for name, (d, policy, tlv) in systems(target, drafter).items():
            t = time.perf_counter()
            dec = FastDecoder(target, d, a.draft_len, policy, max_len=256, graphs=False, compile=False, lanes=b,
                              tlv=tlv)
            dec._prefill([[1, 2, 3]] * b, list(range(b)))
            row = {"system": name, "batch": b, "rows_per_lane": dec.spec.rows, **count(dec._step)}
            if d is not None and tlv is None:  # two parts of the step alone: the drafter's proposal, the tree
                row["propose"] = count(lambda: dec.device_draft.propose(dec.root))
                row["tree"] = count(lambda: dec._build_tree(True))
            row["compile_s"] = round(time.perf_counter() - t, 1)
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
            Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    ar = {r["batch"]: r["generated_kernels"] + r["library"] for r in out["rows"] if r["system"] == "ar"}
    for r in out["rows"]:
        r["kernels_over_ar"] = round((r["generated_kernels"] + r["library"]) / ar[r["batch"]], 3)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
