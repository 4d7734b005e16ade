"""The certified head on CUDA (Triton kernels) on a bf16 128256 × 4096 head: its argmax equals
F.linear's on random and adversarial hidden states, except where F.linear's own rounding decides a
near tie (two logits closer than the two summation orders can tell apart: then either answer is
the exact head's, and the test checks that this is the only way they differ); and argmax runs in
a CUDA graph."""

import pytest
import torch
import torch.nn.functional as F

from specpilot.kernels.certified_head import CertifiedHead, kernel, reference

V, H = 128256, 4096


@pytest.fixture(scope="module")
def head():
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False  # cuBLAS accumulates in fp32
    g = torch.Generator(device="cuda").manual_seed(0)
    W = (torch.randn(V, H, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    W[V // 2: V // 2 + 1000] = W[:1000]  # exact ties with lower rows
    return CertifiedHead.from_weight(W)


def hidden_states(head, kind: str, M: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    W = head.weight
    if kind == "random":
        return torch.randn(M, H, device="cuda", generator=g).to(torch.bfloat16)
    rows = torch.randint(0, V, (M,), device="cuda", generator=g)
    if kind == "tied":  # aligned with a copied row: its lower copy must win
        rows = V // 2 + rows % 1000
    h = W[rows].float() * 40 + torch.randn(M, H, device="cuda", generator=g) * (0.3 if kind != "near" else 3.0)
    return h.to(torch.bfloat16)


def explained(head, h, got, want) -> torch.Tensor:
    """Rows where got ≠ want is a near tie of the exact logits that rounding decides."""
    W = head.weight
    both = torch.stack((got, want), 1)
    z = torch.einsum("mk,msk->ms", h.double(), W[both].double())
    slack = 3 * reference.constants(W.dtype, H)[1] * torch.einsum("mk,msk->ms", h.double().abs(), W[both].double().abs())
    ulp = torch.finfo(torch.bfloat16).eps * z.abs().amax(1)
    return (got == want) | ((z[:, 0] - z[:, 1]).abs() <= 2 * slack.amax(1) + ulp)


@pytest.mark.parametrize("kind", ["random", "aligned", "tied", "near"])
@pytest.mark.parametrize("M", [1, 8, 64])
def test_argmax_equals_cublas(head, kind, M):
    assert kernel.runs(head)
    mismatches = 0
    for seed in range(8):
        h = hidden_states(head, kind, M, seed)
        got, want = head.argmax(h), F.linear(h, head.weight).argmax(-1)
        assert bool(explained(head, h, got, want).all()), (kind, M, seed, got.tolist(), want.tolist())
        mismatches += int((got != want).sum())
        if kind == "tied":
            assert bool((got < V // 2).all())
    assert mismatches <= max(1, M // 8), mismatches


def test_argmax_in_a_cuda_graph(head):
    h = hidden_states(head, "aligned", 8, 1)
    static = h.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        head.argmax(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = head.argmax(static)
    for seed, kind in ((2, "aligned"), (3, "random"), (4, "tied")):  # certified rows and fallbacks
        static.copy_(hidden_states(head, kind, 8, seed))
        graph.replay()
        torch.cuda.synchronize()
        want = F.linear(static, head.weight).argmax(-1)
        assert bool(explained(head, static, out, want).all()), (kind, out.tolist(), want.tolist())
