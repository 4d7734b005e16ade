"""The certified LM head (kernels/certified_head): its argmax equals F.linear(h, W).argmax(-1) on
adversarial near-ties in float64 and float32 (CPU, the torch reference), its bound discards most of
a random head, a row whose candidates cannot be certified still gets the exact answer; the Triton
kernels equal the reference in Triton's interpreter and compile for sm_90 without spills."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from specpilot.kernels.certified_head import CertifiedHead, CertifiedHeadError, reference


def adversarial_head(seed: int, V: int, H: int, M: int, dtype, log_scale: float, S: int, grid: bool = False):
    """A head W [V, H] and hidden states h [M, H] full of near-ties: exact duplicate rows, rows one
    ulp apart, rows that differ by less than their quantization step (so the int8 logits rank them
    otherwise than the exact ones), rows scaled by a few ulps, hidden states aligned with a row; the
    weights and hidden states scaled by 10^±log_scale. With `grid`, every row first lies on its own
    int8 grid (integers up to ±127 times a power of two): no quantization error, a radius of
    rounding terms only, far below a bf16 logit's spacing."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(V, H, generator=g, dtype=torch.float64) * 0.02
    step = W.abs().amax(1, keepdim=True) / 127
    base = torch.randint(0, V, (V,), generator=g)
    kind = torch.randint(0, 5, (V,), generator=g)
    for v in range(V):
        b = int(base[v])
        if b >= v:  # copies of a lower row only, so that the lowest-index rule matters
            continue
        if kind[v] == 0:
            W[v] = W[b]
        elif kind[v] == 1:
            W[v] = W[b] + torch.randn(H, generator=g, dtype=torch.float64) * step[b] * 0.3
        elif kind[v] == 2:
            W[v] = W[b] * (1 + 1e-7 * torch.randn((), generator=g, dtype=torch.float64))
    if grid:
        t = torch.exp2((W.abs().amax(1, keepdim=True) / 127).log2().round())
        n = (W / t).round().clamp(-127, 127)
        top = n.abs().argmax(1, keepdim=True)
        n.scatter_(1, top, 127 * n.gather(1, top).sign().clamp_min(0) * 2 - 127)
        W = n * t
    scale = 2.0 ** round(log_scale * 3.32) if grid else 10.0 ** log_scale
    W = (W * scale).to(dtype)
    one_ulp = (kind == 3) & (base < torch.arange(V))
    for v in one_ulp.nonzero().flatten().tolist():  # one ulp apart in the model's dtype, at one or every entry
        b = int(base[v])
        k = int(torch.randint(0, H, (), generator=g))
        W[v] = W[b]
        up = torch.nextafter(W[b], torch.full_like(W[b], float("inf")))
        if v % 2:
            W[v, k] = up[k]
        else:
            W[v] = up
    h = torch.randn(M, H, generator=g, dtype=torch.float64)
    for m in range(M):
        if m % 2 == 0:  # aligned with a row, so that it and its near copies lead
            row = W[int(torch.randint(0, V, (), generator=g))].double() / scale
            h[m] = row / row.norm().clamp_min(1e-30) * H ** 0.5 + 1e-3 * h[m]
    h = (h / scale).to(dtype)
    return CertifiedHead.from_weight(W, candidates=S), h


@settings(max_examples=300, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), V=st.integers(1, 300), H=st.integers(1, 40), M=st.sampled_from([1, 5]),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]), log_scale=st.sampled_from([-12.0, -3.0, 0.0, 4.0, 12.0]),
       S=st.sampled_from([1, 3, 32]), grid=st.booleans())
def test_argmax_equals_the_exact_heads_on_near_ties(seed, V, H, M, dtype, log_scale, S, grid):
    head, h = adversarial_head(seed, V, H, M, dtype, log_scale, S, grid)
    assert torch.equal(head.argmax(h), F.linear(h, head.weight).argmax(-1))


def test_argmax_holds_where_the_int8_logits_rank_otherwise():
    """Rows closer than their quantization step: the int8 logits' argmax is another token, and the
    certified head still returns the exact one."""
    for dtype in (torch.float64, torch.float32):
        flipped = 0
        for seed in range(40):
            head, h = adversarial_head(seed, 64, 16, 5, dtype, 0.0, 32)
            zhat, _, _ = reference.bounds(head, h)
            exact = F.linear(h, head.weight).argmax(-1)
            flipped += int((zhat.argmax(-1) != exact).sum())
            assert torch.equal(head.argmax(h), exact), seed
        assert flipped >= 5, f"{dtype}: only {flipped} rows where the int8 logits rank another token first"


def test_bounds_hold_the_exact_logits():
    """lb ≤ F.linear's logit ≤ ub for every token, and the radius is no looser than needed by much:
    the widest gap is within 20× the actual worst error (random fp32 head)."""
    g = torch.Generator().manual_seed(3)
    W = torch.randn(3000, 96, generator=g) * 0.02
    h = torch.randn(5, 96, generator=g)
    head = CertifiedHead.from_weight(W)
    zhat, ub, lb = reference.bounds(head, h)
    z = F.linear(h, W).double()
    assert bool((lb <= z).all() and (z <= ub).all())
    err = (z - zhat.double()).abs().amax()
    assert float((ub - lb).amax() / 2) < 20 * float(err) * 96 ** 0.5


def test_most_tokens_are_discarded_on_a_random_head():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(128256, 256, generator=g) * 0.02
    h = torch.randn(4, 256, generator=g)
    head = CertifiedHead.from_weight(W)
    _, ub, lb = reference.bounds(head, h)
    survivors = (ub >= lb.amax(1, keepdim=True)).sum(1)
    print(f"survivors of 128256 tokens per row: {survivors.tolist()}")
    assert int(survivors.max()) < 64, survivors.tolist()  # of 128256
    cert = reference.certify(ub, lb, head.candidates)
    assert bool(cert.certified.all())
    assert torch.equal(head.argmax(h), F.linear(h, W).argmax(-1))


def test_a_row_that_cannot_be_certified_takes_the_full_exact_head():
    """One candidate on a head of near copies: no row is certified, every answer still exact."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(1, 32, generator=g, dtype=torch.float64)
    W = base + 1e-4 * torch.randn(500, 32, generator=g, dtype=torch.float64)
    h = torch.randn(5, 32, generator=g, dtype=torch.float64)
    head = CertifiedHead.from_weight(W, candidates=1)
    _, ub, lb = reference.bounds(head, h)
    assert not bool(reference.certify(ub, lb, 1).certified.any())
    assert torch.equal(head.argmax(h), F.linear(h, W).argmax(-1))


def test_zero_and_non_finite_hidden_states_are_exact():
    g = torch.Generator().manual_seed(2)
    W = torch.randn(100, 8, generator=g)
    h = torch.randn(3, 8, generator=g)
    h[0] = 0
    h[1, 3] = float("inf")
    head = CertifiedHead.from_weight(W)
    assert torch.equal(head.argmax(h), F.linear(h, W).argmax(-1))


def test_radius_rounds_up_and_the_int8_copy_reconstructs_the_weight():
    g = torch.Generator().manual_seed(4)
    W = torch.randn(50, 64, generator=g)
    W[3] = 0  # a zero row: scale 0, q 0
    head = CertifiedHead.from_weight(W)
    assert head.q.dtype == torch.int8 and head.scale.dtype == torch.float32 and head.radius.dtype == torch.float32
    assert int(head.q.abs().max()) == 127 and int(head.q[3].abs().max()) == 0
    err = (W.double() - head.scale.double()[:, None] * head.q.double()).norm(dim=1)
    assert bool((head.radius.double() >= err).all())
    assert bool(((W.double() - head.scale.double()[:, None] * head.q.double()).abs()
                 <= head.scale.double()[:, None] / 2 * (1 + 1e-6)).all())


@pytest.mark.parametrize("weight, message", [
    (torch.zeros(4), r"non-empty \[V, H\] matrix, got \(4,\)"),
    (torch.zeros(4, 3, dtype=torch.int32), r"dtype must be one of bf16, fp16, fp32, fp64, got torch.int32"),
    (torch.tensor([[1.0, float("nan")]]), r"non-finite entries"),
])
def test_bad_weights_are_named(weight, message):
    with pytest.raises(CertifiedHeadError, match=message):
        CertifiedHead.from_weight(weight)


def test_bad_hidden_states_are_named():
    head = CertifiedHead.from_weight(torch.randn(10, 4))
    with pytest.raises(CertifiedHeadError, match=r"hidden states must be \[M ≥ 1, 4\], got \(2, 5\)"):
        head.argmax(torch.zeros(2, 5))
    with pytest.raises(CertifiedHeadError, match=r"must be torch.float32 on cpu like the head, got torch.float64"):
        head.argmax(torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(CertifiedHeadError, match=r"candidates must be an integer ≥ 1, got 0"):
        CertifiedHead.from_weight(torch.randn(10, 4), candidates=0)


KERNEL_CHECK = """
import json, sys, torch
import torch.nn.functional as F
from specpilot.kernels.certified_head import CertifiedHead, kernel, reference
V, H, M, S, dtype, aligned, dup = json.loads(sys.argv[1])
dtype = getattr(torch, dtype)
g = torch.Generator().manual_seed(V + H + M)
W = (torch.randn(V, H, generator=g) * 0.02).to(dtype)
if dup:  # the second half copies the first: exact ties, the lower index wins
    W[V // 2:] = W[:V - V // 2].clone()
h = torch.randn(M, H, generator=g)
if aligned:  # every other row aligned with a token's row (one of the copies): certified with few candidates
    h[::2] = W[V - 1 - torch.randint(0, V // 2, (len(h[::2]),), generator=g)].float() * 30
h = h.to(dtype)
head = CertifiedHead.from_weight(W, candidates=S)
zk, ubk, lbmax, _ = kernel.bounds(head, h, store_z=True)
zr, ubr, lbr = reference.bounds(head, h)
eps = torch.finfo(dtype).eps
cr = reference.certify(ubr, lbr, S)
out = {"z": float(((zk - zr).abs() / zr.abs().amax()).max()),
       "ub": float((ubk - ubr).abs().max() / ubr.abs().max() / eps),
       "L": float((lbmax.amax(1) - lbr.amax(1)).abs().max() / lbr.abs().max() / eps),
       "kernel": kernel.argmax(head, h).tolist(), "reference": reference.argmax(head, h).tolist(),
       "exact": F.linear(h, W).argmax(-1).tolist(), "certified": cr.certified.tolist()}
print(json.dumps(out))
"""


@pytest.mark.parametrize("shape", [
    (300, 72, 1, 32, "float32", True, False),  # V, H not multiples of a tile; one row
    (1000, 200, 5, 4, "bfloat16", True, True),  # bf16 weights (fp32 dot operands in the interpreter); exact ties
    (700, 64, 20, 1, "float32", False, True),  # one candidate: most rows fall back to the full exact head; ties
    (20, 16, 3, 32, "bfloat16", False, False),  # the candidates cover the vocabulary
])
def test_kernels_equal_the_reference_in_the_interpreter(shape):
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", KERNEL_CHECK, json.dumps(shape)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["z"] < 1e-5, out
    assert out["ub"] <= 4 and out["L"] <= 4, out  # a few roundings of the model's dtype (relative to the largest)
    assert out["kernel"] == out["reference"] == out["exact"], out
    if shape[3] == 1:
        assert not all(out["certified"]), out  # the fallback ran
    if shape[6]:
        assert all(t < shape[0] - shape[0] // 2 for t in out["kernel"][::2]), out  # the lower copy
    if shape[5]:
        assert out["certified"][0], out


def test_kernels_compile_for_sm90_without_spills(tmp_path):
    pytest.importorskip("triton")
    from specpilot.kernels import aot
    from specpilot.kernels.certified_head import kernel

    if not aot.available():
        pytest.skip("this Triton wheel has no ptxas / cuobjdump")
    got = {}
    for (name, BM), res in kernel.resources(tmp_path, H=4096).items():
        got[f"{name} BM={BM}" if BM else name] = res
        assert res["local_bytes"] == 0, (name, BM, res)
        assert res["shared_bytes"] <= 227 * 1024, (name, BM, res)
    print(json.dumps(got))
