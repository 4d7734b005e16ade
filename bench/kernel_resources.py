"""What the Triton kernels of kernels/gdn_chunk.py need from an sm_90 GPU (H100 / H200) at the small
recipe's training shape (chunk 64, key and value heads of 64): registers and local-memory bytes (spills)
a thread, shared memory a program, per warp count. Compiled ahead of time with the ptxas and cuobjdump
of Triton's wheel, so it runs on a machine without a GPU; the timings are `gdn_train_step.py`'s.

    python bench/kernel_resources.py [--warps 4,8] [--out bench/results/gdn_kernel_resources.json]
    git show REV:kernels/gdn_chunk.py > /tmp/old.py   # an earlier version's kernels, by name
    python bench/kernel_resources.py --module /tmp/old.py --kernels _fwd,_bwd [--stages 1]

A result names the kernel file it compiled and the first 12 hex digits of its sha256.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha  # noqa: E402

from specpilot.kernels import aot, gdn_chunk  # noqa: E402

SHAPE = dict(NC=8, H=8, K=64, V=64, C=64)  # 512 positions in chunks of 64, 8 heads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warps", default="4,8", help="warp counts, comma-separated")
    ap.add_argument("--module", default=None, help="a kernel file to compile instead of kernels/gdn_chunk.py")
    ap.add_argument("--kernels", default=None, help="kernel names, comma-separated (default: the module's LAUNCHED)")
    ap.add_argument("--stages", type=int, default=3, help="software-pipelining stages, as the kernels are launched (3: Triton's default)")
    ap.add_argument("--out", default=None, help="JSON file to write")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    if not aot.available():
        print("error: this Triton wheel has no ptxas / cuobjdump (triton/backends/nvidia/bin): reinstall triton", file=sys.stderr)
        return 2
    module = gdn_chunk
    if args.module:
        spec = importlib.util.spec_from_file_location("kernel_file", args.module)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    names = args.kernels.split(",") if args.kernels else module.LAUNCHED
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        print(f"error: {args.module or 'kernels/gdn_chunk.py'} has no kernel {', '.join(missing)}", file=sys.stderr)
        return 2
    kernels = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in (int(x) for x in args.warps.split(",")):
            for name in names:
                res = aot.resources(aot.compile_kernel(getattr(module, name), SHAPE, warps=w, stages=args.stages), Path(tmp))
                kernels.setdefault(name, {})[f"{w}_warps"] = res
                if not args.json:
                    print(f"{name:11s} {w} warps: {res['registers']:3d} registers, {res['local_bytes']:5d} B local, "
                          f"{res['shared_bytes'] // 1024:4d} KiB shared")
    out = {"command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(), "git_sha": git_sha(),
           "device": "none (compiled for sm_90 with Triton's ptxas)", "triton": gdn_chunk.triton.__version__,
           "module": args.module or "kernels/gdn_chunk.py",
           "module_sha256": hashlib.sha256(Path(module.__file__).read_bytes()).hexdigest()[:12],
           "shape": SHAPE, "stages": args.stages, "kernels": kernels}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    if args.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
