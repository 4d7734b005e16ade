"""Bits per weight of W12 checkpoints (kernels/w12/format.py, engine/w12io.py), measured on the CPU:

  OMP_NUM_THREADS=1 python bench/w12_format.py --out bench/results/w12_format.json

1. Every shipped micro checkpoint (`--micro`, default zoo/checkpoints/micro: targets, draft LMs and
   feature drafters): `pack_checkpoint` into a temporary folder, its report's bits per weight
   (file bytes of the packed tensors' parts — views, low bits, one exponent byte a channel,
   escapes — over their weight count) and escape rate, and whether `read_tensors` of the W12
   folder gives the bf16 folder's tensors bit for bit (`roundtrip_bit_exact`).

2. A Llama-3.1-8B-shaped model (`--dims hidden,layers,heads,kv_heads,head_dim,intermediate,vocab`,
   default 4096,32,32,8,128,14336,128256; untied LM head) with SYNTHETIC weight statistics — not a
   real checkpoint — generated in memory, never written. Every weight matrix is drawn as

       w[n, k] = std · c[n] · t[n, k] / sqrt(ν / (ν − 2)),   c[n] = exp(σ · z[n]),   z ~ N(0, 1),

   with t Student-t of ν degrees of freedom (torch.distributions.StudentT; divided by its standard
   deviation, so std is the weights' scale before the channel factor), c a log-normal per output
   channel (row) factor of median 1, then a fraction 1e-4 of the weights set to exactly 0, and the
   result rounded to bf16. Projections (q, k, v, o, gate, up, down): std 0.02, ν = 5, σ = 0.3;
   embeddings: std 0.01, ν = 6, σ = 0.2; LM head: std 0.02, ν = 4, σ = 0.3. Norms (1-D) stay
   bf16 and are not counted: the figure is over the packed matrices, as `w12 stats` reports it.

   Measured: `--samples` matrices (default 2) of each distinct projection shape ([4096, 4096]:
   q and o; [1024, 4096]: k and v; [14336, 4096]: gate and up; [4096, 14336]: down — the
   generator draws every matrix of one shape from the same law), and the embedding and the LM
   head whole. A matrix is packed in blocks of at most `--block-rows` rows to bound memory: W12
   chooses its window per row and stores its bytes per row, so a matrix's bytes and escapes are
   the sums over its blocks, exactly. The headline bits_per_weight is the weight-count-weighted
   total of the whole model: each shape's measured bits per weight weighted by the number of its
   weights in the model (count × N × K). For every shape, unpack(pack(w)) is checked bit for bit
   on every block packed (`roundtrip_bit_exact`, with the block shapes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha  # noqa: E402

from specpilot.engine.checkpoint import read_tensors  # noqa: E402
from specpilot.engine.w12io import pack_checkpoint  # noqa: E402
from specpilot.kernels.w12.format import pack, unpack  # noqa: E402

LLAMA_8B = "4096,32,32,8,128,14336,128256"
ZEROS = 1e-4  # share of exact zeros
LAWS = {"projection": {"std": 0.02, "dof": 5.0, "channel_sigma": 0.3},
        "embedding": {"std": 0.01, "dof": 6.0, "channel_sigma": 0.2},
        "lm_head": {"std": 0.02, "dof": 4.0, "channel_sigma": 0.3}}


def checkpoint_folders(paths: list[str]) -> list[Path]:
    """Each path is a checkpoint folder or a zoo folder of them."""
    out = []
    for p in map(Path, paths):
        out += [p] if (p / "config.json").is_file() else sorted(d for d in p.iterdir() if (d / "config.json").is_file())
    return out


def bit_identical(a: dict, b: dict) -> bool:
    def raw(t):
        return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(raw(a[k]), raw(b[k])) for k in a)


def measure_checkpoint(folder: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        r = pack_checkpoint(folder, Path(tmp) / "w12")
        exact = bit_identical(read_tensors(folder), read_tensors(Path(tmp) / "w12"))
    return {"path": str(folder), "bits_per_weight": r["bits_per_weight"], "escape_rate": r["escape_rate"],
            "weights": r["weights"], "packed_tensors": r["packed_tensors"], "kept_tensors": r["kept_tensors"],
            "bytes_before": r["bytes_before"], "bytes_after": r["bytes_after"], "roundtrip_bit_exact": exact}


def shape_groups(dims: list[int]) -> dict[str, dict]:
    """Every distinct weight matrix of the model: its shape, law and how many the model has."""
    hidden, layers, heads, kv_heads, head_dim, inter, vocab = dims
    q, kv = heads * head_dim, kv_heads * head_dim
    attn = ({"q_o": {"shape": [q, hidden], "count": 2 * layers, "law": "projection"}} if q == hidden else
            {"q": {"shape": [q, hidden], "count": layers, "law": "projection"},
             "o": {"shape": [hidden, q], "count": layers, "law": "projection"}})
    return {**attn, "k_v": {"shape": [kv, hidden], "count": 2 * layers, "law": "projection"},
            "gate_up": {"shape": [inter, hidden], "count": 2 * layers, "law": "projection"},
            "down": {"shape": [hidden, inter], "count": layers, "law": "projection"},
            "embedding": {"shape": [vocab, hidden], "count": 1, "law": "embedding"},
            "lm_head": {"shape": [vocab, hidden], "count": 1, "law": "lm_head"}}


def draw(rows: int, k: int, law: dict, seed: int) -> torch.Tensor:
    """A bf16 block of `rows` channels × k inputs of the module docstring's law."""
    torch.manual_seed(seed)
    dof = law["dof"]
    t = torch.distributions.StudentT(dof).sample((rows, k))
    t *= law["std"] / (dof / (dof - 2)) ** 0.5
    t *= torch.exp(law["channel_sigma"] * torch.randn(rows, 1))
    t[torch.rand(rows, k) < ZEROS] = 0.0
    return t.to(torch.bfloat16)


def measure_matrix(shape, law: dict, seed: int, block_rows: int) -> dict:
    """Bytes, escapes and the round trip of one matrix, packed in blocks of rows."""
    n, k = shape
    nbytes = escapes = 0
    exact, blocks = True, set()
    for b, r0 in enumerate(range(0, n, block_rows)):
        w = draw(min(block_rows, n - r0), k, law, seed * 1000 + b)
        p = pack(w)
        nbytes, escapes = nbytes + p.nbytes(), escapes + p.escapes
        exact &= bool(torch.equal(unpack(p).view(torch.int16), w.view(torch.int16)))
        blocks.add(tuple(w.shape))
        del w, p
    return {"nbytes": nbytes, "escapes": escapes, "exact": exact, "blocks": sorted(blocks)}


def measure_synthetic(dims: list[int], samples: int, block_rows: int, log) -> dict:
    t0 = time.perf_counter()
    groups = shape_groups(dims)
    for gi, (name, g) in enumerate(groups.items()):
        n, k = g["shape"]
        measured = min(samples, g["count"]) if g["law"] == "projection" else g["count"]
        ms = [measure_matrix(g["shape"], LAWS[g["law"]], 100 * gi + i, block_rows) for i in range(measured)]
        weights = n * k
        g.update(weights=weights, measured=measured,
                 bits_per_weight=8 * sum(m["nbytes"] for m in ms) / (measured * weights),
                 escape_rate=sum(m["escapes"] for m in ms) / (measured * weights),
                 roundtrip_bit_exact=all(m["exact"] for m in ms),
                 block_shapes=sorted({tuple(b) for m in ms for b in m["blocks"]}))
        log(f"  {name:10s} {str(g['shape']):16s} ×{g['count']:3d}  measured {measured}: {g['bits_per_weight']:.5f} "
            f"bits/weight, escapes {100 * g['escape_rate']:.4f} %, bit-exact {g['roundtrip_bit_exact']} "
            f"({time.perf_counter() - t0:.0f} s)")
    total = sum(g["count"] * g["weights"] for g in groups.values())
    return {"model": "Llama-3.1-8B-shaped" if ",".join(map(str, dims)) == LLAMA_8B else "custom dims",
            "dims": dict(zip(("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab"), dims)),
            "tied_head": False, "statistics": "synthetic (module docstring), not a real checkpoint",
            "laws": LAWS, "zero_fraction": ZEROS, "samples_per_projection_shape": samples, "block_rows": block_rows,
            "weights": total,
            "measured_weights": sum(g["measured"] * g["weights"] for g in groups.values()),
            "bits_per_weight": sum(g["count"] * g["weights"] * g["bits_per_weight"] for g in groups.values()) / total,
            "escape_rate": sum(g["count"] * g["weights"] * g["escape_rate"] for g in groups.values()) / total,
            "roundtrip_bit_exact": all(g["roundtrip_bit_exact"] for g in groups.values()),
            "groups": groups, "seconds": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--micro", action="append", metavar="DIR",
                    help="a checkpoint folder or a zoo folder of them (repeatable; default zoo/checkpoints/micro)")
    ap.add_argument("--dims", default=LLAMA_8B, help="hidden,layers,heads,kv_heads,head_dim,intermediate,vocab")
    ap.add_argument("--samples", type=int, default=2, help="matrices measured per projection shape")
    ap.add_argument("--block-rows", type=int, default=8016, help="rows packed at once (bounds memory)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dims = [int(x) for x in args.dims.split(",")]
    if len(dims) != 7 or min(dims) < 1 or args.samples < 1 or args.block_rows < 1:
        ap.error("--dims takes 7 positive integers; --samples and --block-rows positive integers")
    result = {"command": " ".join(["python"] + sys.argv), "device": "cpu", "date": datetime.date.today().isoformat(),
              "git_sha": git_sha(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "checkpoints": {}}
    for folder in checkpoint_folders(args.micro or ["zoo/checkpoints/micro"]):
        row = result["checkpoints"][folder.name] = measure_checkpoint(folder)
        print(f"{folder.name:22s} {row['bits_per_weight']:.4f} bits/weight, escapes {100 * row['escape_rate']:.4f} %, "
              f"{row['weights']:,} weights, bit-exact {row['roundtrip_bit_exact']}", flush=True)
    print(f"synthetic model, dims {args.dims}:", flush=True)
    result["synthetic"] = syn = measure_synthetic(dims, args.samples, args.block_rows, lambda s: print(s, flush=True))
    print(f"total {syn['bits_per_weight']:.5f} bits/weight over {syn['weights']:,} weights (measured "
          f"{syn['measured_weights']:,}), escapes {100 * syn['escape_rate']:.4f} %, bit-exact "
          f"{syn['roundtrip_bit_exact']}, {syn['seconds']:.0f} s")
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
