"""kernels/gdn_chunk.py against its reference, engine/gdn.py's chunked rule: outputs, final state
and the gradients of every input, in Triton's interpreter on the CPU (float32). The interpreter
is chosen when the kernels are defined, so each check runs in a fresh interpreter."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

CHECK = """
import json, sys, torch
from specpilot.engine.gdn import chunked_gated_delta_rule as reference
from specpilot.kernels.gdn_chunk import chunked_gated_delta_rule as fused
B, T, H, K, V, C, with_state, decay = json.loads(sys.argv[1])
g0 = torch.Generator().manual_seed(T)
def inputs():
    q = torch.randn(B, T, H, K, generator=g0)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g0), dim=-1)
    v = torch.randn(B, T, H, V, generator=g0)
    g = -torch.rand(B, T, H, generator=g0) * decay
    beta = torch.rand(B, T, H, generator=g0)
    h = torch.randn(B, H, K, V, generator=g0) * 0.3
    return [q, k, v, g, beta, h]
a = [t.requires_grad_() for t in inputs()]
b = [t.detach().clone().requires_grad_() for t in a]
out = {}
(o1, h1), (o2, h2) = fused(*a, chunk=C), reference(*b, chunk=C)
wo, wh = torch.randn(o1.shape, generator=g0), torch.randn(h1.shape, generator=g0)
loss1 = (o1 * wo).sum() + ((h1 * wh).sum() if with_state else 0)
loss2 = (o2 * wo).sum() + ((h2 * wh).sum() if with_state else 0)
loss1.backward(); loss2.backward()
err = lambda x, y: float((x - y).abs().max() / y.abs().max().clamp_min(1e-6))
out["o"], out["state"] = err(o1, o2), err(h1, h2)
for name, x, y in zip(("q", "k", "v", "g", "beta", "h0"), a, b):
    out[name] = err(x.grad, y.grad)
print(json.dumps(out))
"""


@pytest.mark.parametrize("shape", [
    (1, 40, 2, 16, 16, 16, True, 0.7),  # T not a multiple of the chunk: a padded last chunk
    (2, 130, 2, 64, 32, 64, True, 0.7),  # the recipe's chunk and key size, value size apart
    (1, 64, 1, 32, 32, 32, False, 0.7),  # the final state unused: its gradient arrives as None
    # four diagonal blocks in the inverse, three chunks; a slow decay, so that blocks far apart
    # still interact
    (1, 150, 1, 16, 16, 64, True, 0.02),
])
def test_fused_rule_equals_the_torch_form_forward_and_backward(shape):
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", CHECK, json.dumps(shape)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    errors = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(errors) == {"o", "state", "q", "k", "v", "g", "beta", "h0"}
    assert max(errors.values()) < 1e-4, errors


def test_fused_rule_names_the_sizes_it_cannot_take():
    import torch

    from specpilot.kernels.gdn_chunk import chunked_gated_delta_rule

    q = torch.zeros(1, 8, 2, 8)
    with pytest.raises(ValueError, match=r"powers of two from 16 to 64 \(larger ones need more shared memory than an "
                                         r"H100 / H200 program has\); got \{'key head size': 8, 'value head size': 8\}"):
        chunked_gated_delta_rule(q, q, q, q[..., 0], q[..., 0], torch.zeros(1, 2, 8, 8))


def test_every_kernel_compiles_for_the_h200(tmp_path):
    """The interpreter runs the arithmetic, not the compiler: each launched kernel also compiles for
    sm_90 (Triton's own ptxas, no GPU needed), within the shared memory an H100 / H200 program may use."""
    from specpilot.kernels import aot, gdn_chunk

    if not aot.available():
        pytest.skip("this Triton wheel has no ptxas / cuobjdump")
    M = gdn_chunk.MAX_SIZE  # the largest sizes the kernels take
    for name in gdn_chunk.LAUNCHED:
        res = aot.resources(aot.compile_kernel(getattr(gdn_chunk, name), dict(NC=8, H=8, K=M, V=M, C=M)), tmp_path)
        assert res["shared_bytes"] <= 227 * 1024, (name, res)
