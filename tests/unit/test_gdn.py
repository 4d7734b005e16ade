"""The parallel (chunked) gated delta rule equals the one-position-at-a-time recurrence."""

import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from specpilot.engine.gdn import chunked_gated_delta_rule, gated_delta_rule


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 80), chunk=st.sampled_from([1, 4, 16, 64]), heads=st.integers(1, 3),
       seed=st.integers(0, 10_000), start_state=st.booleans())
def test_chunked_equals_recurrent(T, chunk, heads, seed, start_state):
    gen = torch.Generator().manual_seed(seed)
    B, Dk, Dv = 2, 8, 6

    def r(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64)

    q, k, v = r(B, T, heads, Dk), F.normalize(r(B, T, heads, Dk), dim=-1), r(B, T, heads, Dv)
    g = -torch.rand(B, T, heads, generator=gen, dtype=torch.float64) * 3
    beta = torch.rand(B, T, heads, generator=gen, dtype=torch.float64)
    h = r(B, heads, Dk, Dv) if start_state else torch.zeros(B, heads, Dk, Dv, dtype=torch.float64)
    o1, states = gated_delta_rule(q, k, v, g, beta, h)
    o2, last = chunked_gated_delta_rule(q, k, v, g, beta, h, chunk)
    torch.testing.assert_close(o2, o1, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(last, states[:, -1], rtol=1e-10, atol=1e-10)
    o3, final = gated_delta_rule(q, k, v, g, beta, h, every_state=False)  # one state in flight
    assert torch.equal(o3, o1) and torch.equal(final, states[:, -1])


def test_chunked_form_is_differentiable_like_the_recurrence():
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(1, 9, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3)]
    args[1] = F.normalize(args[1], dim=-1)
    g = -torch.rand(1, 9, 2, generator=gen, dtype=torch.float64)
    beta = torch.rand(1, 9, 2, generator=gen, dtype=torch.float64)
    h = torch.zeros(1, 2, 4, 4, dtype=torch.float64)
    grads = []
    for fn in (gated_delta_rule, lambda *a: chunked_gated_delta_rule(*a, chunk=4)):
        xs = [t.clone().requires_grad_() for t in (*args, g, beta)]
        fn(*xs, h)[0].square().sum().backward()
        grads.append([x.grad for x in xs])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_compiled_conv_form_equals_conv1d(monkeypatch):
    """Under torch.compile the GDN conv is written as shifted products (one fused kernel): the same
    values as conv1d, on every position and channel."""
    from specpilot.engine.config import ModelConfig
    from specpilot.engine.model import GatedDeltaNet

    cfg = ModelConfig(family="qwen3_next", vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, layer_types=["linear_attention"],
                      linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=4,
                      linear_value_head_dim=4)
    gdn = GatedDeltaNet(cfg, 0).double()
    torch.nn.init.normal_(gdn.conv1d.weight, generator=torch.Generator().manual_seed(1))
    x = torch.randn(3, cfg.linear_conv_kernel_dim - 1 + 11, gdn.conv_dim, generator=torch.Generator().manual_seed(2),
                    dtype=torch.float64)
    eager = gdn.conv(x)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    shifted = gdn.conv(x)
    assert shifted.shape == eager.shape == (3, 11, gdn.conv_dim)
    torch.testing.assert_close(shifted, eager, rtol=1e-12, atol=1e-12)
