"""kernels/w12/gemm.py against its references (reference.py) in Triton's interpreter on the CPU:
fresh random bf16 weights with planted escapes (zeros, denormals, an outlier, an infinity), shapes
that are not whole records, row counts around the 16-row pad, split K on and off: within one bf16 ulp,
rows past M untouched, two runs bit-identical. Each check runs in a fresh interpreter (Triton picks
the interpreter when the kernels are defined). Also: both kernels compile for sm_90 without spills,
the W12 decode stays in the dot's register operand, and the bench's dry run writes its JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import json, sys, torch
from specpilot.kernels.w12 import format as F
from specpilot.kernels.w12.gemm import Config, Workspace, bf16_linear, w12_linear
from specpilot.kernels.w12.reference import bf16_linear_ref, ulps, w12_linear_ref, w12_quick_ref
N, K, rows, splits, seed = json.loads(sys.argv[1])
g = torch.Generator().manual_seed(seed)
w = (torch.randn(N, K, generator=g) * 0.02).bfloat16()
w[0, : min(K, 40)] = 0                     # more escapes in one tile than one correction block holds
w[N // 2, K // 3] = 3e-39                   # a denormal
w[N - 1, K - 1] = -48.0                     # an outlier far above its channel's window
w[N // 3, 1] = float("inf")
p = F.pack(w)
assert p.escapes >= 43, p.escapes
ws = Workspace("cpu")
seen = {}
for m in rows:
    x = torch.randn(m, K, generator=g).bfloat16()
    x[:, 1] = 0.5                           # finite products with the infinity (0 · inf would be nan)
    quick = lambda x, p, cfg, out=None, ws=None: w12_linear(x, p, cfg, out=out, ws=ws, quick=True)
    for kind, fn, wt, ref in (("w12", w12_linear, p, w12_linear_ref(x, p)), ("bf16", bf16_linear, w, bf16_linear_ref(x, w)),
                              ("w12-view", quick, p, w12_quick_ref(x, p))):
        for s in splits:
            cfg = Config(16 if m <= 16 else 32, 128 if s == 1 else 64, s)  # 2 records a step, or 1 a split
            out = torch.full((m + 2, N), float("nan"), dtype=torch.bfloat16)
            fn(x, wt, cfg, out=out[:m], ws=ws)
            again = fn(x, wt, cfg, ws=ws)
            seen[f"{kind} M={m} splits={s}"] = {
                "ulp": ulps(out[:m], ref), "untouched": bool(torch.isnan(out[m:]).all()),
                "repeat": bool(torch.equal(out[:m].view(torch.int16), again.view(torch.int16))),
                "tickets_reset": int(ws.count.abs().sum())}
print(json.dumps(seen))
"""


def run_check(args) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", CHECK, json.dumps(args)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", [
    (200, 192, [1, 3, 16, 17], [1, 2], 0),   # two tiles, the second part padding; 3 records
    (64, 128, [1, 17], [1, 2], 1),           # one tile, mostly padding
    (130, 101, [3], [1, 2], 2),              # an odd K: the last record half padding, x read as padded pairs
    (40, 70, [70], [1], 3),                  # more than 64 rows: two launches
])
def test_kernels_equal_the_reference_within_one_ulp(case):
    seen = run_check(list(case))
    assert len(seen) == 3 * len(case[2]) * len(case[3])
    print(case, "max ulp", max(v["ulp"] for v in seen.values()))
    for name, v in seen.items():
        assert v["ulp"] <= 1, (name, v)
        assert v["untouched"], f"{name}: wrote rows past M"
        assert v["repeat"], f"{name}: two runs differ"
        assert v["tickets_reset"] == 0, f"{name}: split tickets not reset"


def test_bad_inputs_get_one_line_naming_them():
    import torch

    from specpilot.kernels.w12 import format as F
    from specpilot.kernels.w12.gemm import Config, bf16_linear, w12_linear

    p = F.pack(torch.randn(64, 128).bfloat16())
    with pytest.raises(ValueError, match=r"x of shape \(2, 100\) does not fit a weight of 128 inputs"):
        w12_linear(torch.zeros(2, 100, dtype=torch.bfloat16), p)
    with pytest.raises(ValueError, match="x must be bfloat16, got torch.float32"):
        bf16_linear(torch.zeros(2, 128), torch.zeros(64, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bk a positive multiple of 64"):
        w12_linear(torch.zeros(2, 128, dtype=torch.bfloat16), p, Config(16, 96, 1))
    with pytest.raises(ValueError, match=r"out must be a bfloat16 \[2, 64\] tensor"):
        w12_linear(torch.zeros(2, 128, dtype=torch.bfloat16), p, out=torch.zeros(2, 64))


def test_heuristic_splits_only_the_narrow_shapes():
    from specpilot.kernels.w12.gemm import heuristic

    for k, n in ((4096, 4096), (4096, 6144), (14336, 4096)):  # 32, 48, 32 tiles: too few for 132 SMs
        assert heuristic(1, n, k, 132).splits > 1
    assert heuristic(1, 128256, 4096, 132).splits == 1
    assert [heuristic(m, 4096, 4096, 132).bm for m in (1, 16, 17, 64)] == [16, 16, 32, 64]
    # the record-decoding kernels take 64-input steps at 64 rows, the same splits; the bf16 one 128
    assert [heuristic(m, 4096, 4096, 132, decode=True).bk for m in (1, 16, 32, 64)] == [128, 128, 128, 64]
    assert heuristic(64, 4096, 4096, 132, decode=True).splits == heuristic(64, 4096, 4096, 132).splits == 4
    assert heuristic(64, 4096, 4096, 132).bk == 128


W12_TYPES = dict(x="*bf16", x32="*i32", rec16="*i16", rec8="*u8", lo="*u8", esc_idx="*i32", esc_val="*i16",
                 tile_ptr="*i32", out="*bf16", part="*fp32", count="*i32")
BF16_TYPES = dict(x="*bf16", w="*bf16", out="*bf16", part="*fp32", count="*i32")
INTS = ("M", "N", "K", "TK", "TILES", "SPLIT_RECS", "stride_xm", "stride_wn", "stride_om")
ALIGNED = ("K", "TK", "SPLIT_RECS", "stride_xm", "stride_wn", "stride_om")  # multiples of 16 at the 8B shapes


@pytest.mark.parametrize("bm,records,splits,warps,stages", [(16, 2, 1, 4, 3), (16, 2, 4, 4, 3), (64, 2, 2, 4, 3),
                                                             (64, 4, 1, 8, 2)])  # the heuristic's, and the sweep's extremes
def test_both_kernels_compile_for_sm90_without_spills(bm, records, splits, warps, stages, tmp_path):
    from specpilot.kernels import aot
    from specpilot.kernels.w12 import gemm

    if not aot.available():
        pytest.skip("this Triton wheel has no ptxas / cuobjdump")
    c12 = aot.compile_kernel(gemm._w12_gemm, dict(BM=bm, R=records, S=splits, EB=gemm.EB, INTERPRET=False, QUICK=False),
                             warps=warps, stages=stages, ints=INTS, types=W12_TYPES, aligned=tuple(W12_TYPES) + ALIGNED)
    c16 = aot.compile_kernel(gemm._bf16_gemm, dict(BM=bm, BK=64 * records, S=splits, INTERPRET=False),
                             warps=warps, stages=stages, ints=INTS, types=BF16_TYPES, aligned=tuple(BF16_TYPES) + ALIGNED)
    for name, c in (("w12", c12), ("bf16", c16)):
        res = aot.resources(c, tmp_path)
        print(name, bm, records, splits, warps, stages, res)
        assert res["local_bytes"] == 0, (name, res)
        assert res["shared_bytes"] <= 227 * 1024, (name, res)
        ttgir = c.asm["ttgir"]
        assert "ttng.warp_group_dot" in ttgir, name  # Hopper's wgmma
        assert "ttg.async_copy_global_to_local" in ttgir, f"{name}: the weight loads are not pipelined"
    # the decoded weight is made in the dot's register-operand layout (wgmma's A from registers)
    decoded = [line for line in c12.asm["ttgir"].splitlines() if "tt.bitcast" in line and "xbf16, #ttg.dot_op<{opIdx = 0" in line]
    assert decoded, "the W12 decode is not in the dot operand layout"


def test_the_view_only_pass_never_loads_the_low_bits(tmp_path):
    """Compiled for sm_90, the Q pass's kernel copies only int16 views of the records (the low bytes
    are the only uint8 records data) and spills nothing."""
    from specpilot.kernels import aot
    from specpilot.kernels.w12 import gemm

    if not aot.available():
        pytest.skip("this Triton wheel has no ptxas / cuobjdump")
    ttgir = {}
    for quick in (False, True):
        c = aot.compile_kernel(gemm._w12_gemm, dict(BM=16, R=2, S=4, EB=gemm.EB, INTERPRET=False, QUICK=quick),
                               warps=4, stages=3, ints=INTS, types=W12_TYPES, aligned=tuple(W12_TYPES) + ALIGNED)
        assert aot.resources(c, tmp_path)["local_bytes"] == 0
        ttgir[quick] = [line for line in c.asm["ttgir"].splitlines() if "async_copy_global_to_local" in line]
    assert any("i8>" in line for line in ttgir[False]), "the full kernel's low-byte copies were not found"
    assert ttgir[True] and not any("i8>" in line for line in ttgir[True]), "the view-only kernel copies low bytes"


def test_bench_dry_run_writes_its_json(tmp_path):
    out = tmp_path / "w12.json"
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "w12_gemm.py"), "--dry-run", "--rows", "3",
                        "--no-sweep", "--out", str(out)], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(out.read_text())
    assert {"command", "device", "date", "git_sha", "gemm_speedup_min", "shapes"} <= set(got)
    assert set(got["shapes"]) == {"tiny", "tiny_split"}
    for shape in got["shapes"].values():
        c = shape["cells"]["3"]
        assert c["max_ulp"] <= 1 and c["w12_deterministic"] and c["bf16_deterministic"]
        assert c["speedup"] == pytest.approx(c["cublas_us"] / c["w12_us"])
    assert got["gemm_speedup_min"] == min(c["speedup"] for s in got["shapes"].values() for c in s["cells"].values())
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "w12_gemm.py"), "--shapes", "nope"], env=env,
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "--shapes: unknown nope" in bad.stderr


def test_ulps_orders_bf16_values_and_skips_entries_below_the_floor():
    import torch

    from specpilot.kernels.w12.reference import scale_floor, ulps

    ref = torch.tensor([1.0, -2.0, 1e-6, 0.0], dtype=torch.bfloat16)
    up = ref.view(torch.int16) + torch.tensor([1, 1, 0, 0], dtype=torch.int16)  # one step away from zero
    assert ulps(up.view(torch.bfloat16), ref) == 1
    flipped = torch.tensor([1.0, -2.0, -1e-6, -0.0], dtype=torch.bfloat16)
    assert ulps(flipped, ref) > 1000  # a sign flip near zero is thousands of ulps
    assert ulps(flipped, ref, scale_floor(ref)) == 0


def _ptx(asm: str, regs: dict) -> dict:
    """Runs the straight-line PTX of gemm.DECODE_ASM over int64 arrays of 32-bit register values: the
    five instructions it uses, as the PTX manual defines them."""
    m32 = 0xFFFFFFFF
    val = lambda tok: regs[tok] if tok in regs else int(tok, 0)
    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        d, *args = [t.strip() for t in rest.split(",")]
        a = [val(t) for t in args]
        if op == "prmt.b32":  # bytes of {b, a} picked by the selector's nibbles (no sign replication here)
            src = [(a[0] >> (8 * i)) & 0xFF for i in range(4)] + [(a[1] >> (8 * i)) & 0xFF for i in range(4)]
            assert all(((a[2] >> (4 * i)) & 0x8) == 0 for i in range(4)), line
            r = sum(src[(a[2] >> (4 * i)) & 0x7] << (8 * i) for i in range(4))
        elif op == "shr.u32":
            r = a[0] >> a[1]
        elif op == "and.b32":
            r = a[0] & a[1]
        elif op == "mad.lo.u32":
            r = (a[0] * a[1] + a[2]) & m32
        elif op == "lop3.b32":  # bit i of the result: the table's bit at index (a_i·4 + b_i·2 + c_i)
            lut = a[3]
            r = sum(((lut >> (((a[0] >> i) & 1) * 4 + ((a[1] >> i) & 1) * 2 + ((a[2] >> i) & 1))) & 1) << i
                    for i in range(32))
        else:
            raise AssertionError(f"the PTX interpreter does not know {op}")
        regs[d] = r & m32
    return regs


def test_the_decode_assembly_is_format_decode():
    """The compiled kernel decodes with gemm.DECODE_ASM (the interpreter cannot run assembly). Its text,
    run by a small PTX interpreter, equals format.decode on every view pair (65,536) with low bytes and
    windows drawn at random, four elements an instance as Triton packs them ($4 $5: two int16 each,
    $6: four bytes, $7 $8: lo << 7 as two int16 each; $0 $1 the even weights, $2 $3 the odd ones)."""
    import numpy as np
    import torch

    from specpilot.kernels.w12 import format as F
    from specpilot.kernels.w12.gemm import DECODE_ASM

    rng = np.random.default_rng(0)
    v = rng.permutation(1 << 16).reshape(-1, 4).astype(np.int64)  # every pair of views once
    b = rng.integers(0, 256, v.shape)
    lo = rng.integers(1, 240, v.shape)
    lo[:3] = [[1, 1, 1, 1], [239, 239, 239, 239], [1, 239, 120, 2]]  # the window's ends
    pair = lambda x, i: x[:, i] | (x[:, i + 1] << 16)
    regs = {"$4": pair(v, 0), "$5": pair(v, 2), "$6": b[:, 0] | b[:, 1] << 8 | b[:, 2] << 16 | b[:, 3] << 24,
            "$7": pair(lo << 7, 0), "$8": pair(lo << 7, 2)}
    out = _ptx(DECODE_ASM, regs)
    lanes = lambda r0, r1: np.stack([out[r0] & 0xFFFF, out[r0] >> 16, out[r1] & 0xFFFF, out[r1] >> 16], 1)
    got = {"even": lanes("$0", "$1"), "odd": lanes("$2", "$3")}
    for name, view, low in (("even", v & 0xFF, b & 0xF), ("odd", v >> 8, b >> 4)):
        want = F.decode(torch.from_numpy(view.reshape(-1, 1)), torch.from_numpy(low.reshape(-1, 1)),
                        torch.from_numpy(lo.reshape(-1)))
        want = (want.view(torch.int16).to(torch.int64) & 0xFFFF).numpy().reshape(view.shape)
        assert np.array_equal(got[name], want), f"{name} weights: {int((got[name] != want).sum())} differ"
