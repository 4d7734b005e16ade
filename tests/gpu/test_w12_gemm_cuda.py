"""kernels/w12/gemm.py on CUDA at Llama-3.1-8B's shapes: `w12_linear` and `bf16_linear` within one
bf16 ulp of the float32 reference at 1, 16 and 64 rows (with escapes planted; outputs above 2^-10 of
the largest: near-zero sums carry the float32 ordering error, as cuBLAS's do), bit-identical from
run to run, and the same outputs from a captured CUDA graph."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("triton")

from specpilot.kernels.w12 import format as w12f  # noqa: E402
from specpilot.kernels.w12.gemm import Workspace, bf16_linear, w12_linear  # noqa: E402
from specpilot.kernels.w12.reference import scale_floor, ulps  # noqa: E402

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096),
          "lm_head": (4096, 128256)}  # (K, N)


def weight(k, n, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).bfloat16()
    w[1, :9] = 0
    w[n // 2, 3] = 1e-39  # a denormal
    w[n - 1, k - 2] = -40.0  # an outlier
    return w


@pytest.mark.parametrize("name", list(SHAPES))
def test_both_kernels_match_the_reference_and_repeat_bit_for_bit(name):
    k, n = SHAPES[name]
    w = weight(k, n)
    p = w12f.pack(w)
    assert p.escapes >= 11
    exact = w12f.unpack(p)
    assert torch.equal(exact.view(torch.int16), w.view(torch.int16))
    seen = {}
    for m in (1, 16, 64):
        x = torch.randn(m, k, device="cuda").bfloat16()
        ref = (x.float() @ w.float().T).bfloat16()
        for kind, fn, wt in (("w12", w12_linear, p), ("bf16", bf16_linear, w)):
            out = torch.full((m + 3, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            fn(x, wt, out=out[:m])
            assert torch.isnan(out[m:]).all(), f"{kind} wrote rows past M"
            again = fn(x, wt)
            assert torch.equal(out[:m].view(torch.int16), again.view(torch.int16)), f"{kind} M={m}: runs differ"
            seen[f"{kind} M={m}"] = ulps(out[:m], ref, scale_floor(ref))
    print(name, seen)
    assert max(seen.values()) <= 1, seen


def test_a_captured_graph_gives_what_eager_calls_give():
    k, n = SHAPES["o"]  # split K: the tickets are reset by each call's last programs
    w = weight(k, n, seed=1)
    p = w12f.pack(w)
    x = torch.randn(8, k, device="cuda").bfloat16()
    ws = Workspace("cuda")
    o12, o16 = torch.empty(8, n, dtype=torch.bfloat16, device="cuda"), torch.empty(8, n, dtype=torch.bfloat16, device="cuda")
    w12_linear(x, p, out=o12, ws=ws)
    bf16_linear(x, w, out=o16, ws=ws)
    e12, e16 = o12.clone(), o16.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(3):
            w12_linear(x, p, out=o12, ws=ws)
            bf16_linear(x, w, out=o16, ws=ws)
    o12.zero_()
    o16.zero_()
    for _ in range(2):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(o12.view(torch.int16), e12.view(torch.int16))
    assert torch.equal(o16.view(torch.int16), e16.view(torch.int16))


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_view_only_kernel_matches_its_reference_and_repeats(name):
    """w12_linear(quick=True), two-level verification's Q pass: x @ format.quick(w)ᵀ (low bits at their
    midpoint, escapes exact) within one bf16 ulp at 1, 16 and 64 rows, the same from run to run."""
    k, n = SHAPES[name]
    w = weight(k, n, seed=2)
    p = w12f.pack(w)
    view = w12f.quick(p).float()
    for m in (1, 16, 64):
        x = torch.randn(m, k, device="cuda").bfloat16()
        ref = (x.float() @ view.T).bfloat16()
        out = w12_linear(x, p, quick=True)
        assert torch.equal(out.view(torch.int16), w12_linear(x, p, quick=True).view(torch.int16)), f"M={m}: runs differ"
        assert ulps(out, ref, scale_floor(ref)) <= 1, (name, m)
