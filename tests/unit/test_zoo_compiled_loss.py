"""Training's compilation (zoo/train.py compiled_loss) on the CPU: the loss and gradients of the
eager model, from one compiled graph per kind of block (and one for the loss), or from one graph of
the whole model."""

import pytest
import torch
from torch._dynamo.utils import counters

from specpilot.engine.synthetic import random_model, tiny_config
from specpilot.zoo import train


def compiled_equals_eager(m, scope: str) -> None:
    x = torch.randint(0, 61, (2, 17), generator=torch.Generator().manual_seed(0))
    loss = train.compiled_loss(m, scope)(x)
    loss.backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    eager = train.next_token_loss(m(x[:, :-1]).logits, x[:, 1:])
    eager.backward()
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-5)
    for g, p in zip(grads, m.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)


def test_blocks_of_one_kind_share_their_compiled_code():
    torch._dynamo.reset()
    counters.clear()
    m = random_model(tiny_config("hybrid", vocab=61, hidden=32, layers=4, heads=2), seed=3)
    kinds = {b.kind for b in m.model.layers}
    assert len(kinds) == 2 and len(m.model.layers) == 4
    compiled_equals_eager(m, "block")
    assert counters["stats"]["unique_graphs"] == len(kinds) + 1  # one per kind of block, one for the loss


def test_model_scope_compiles_one_graph():
    torch._dynamo.reset()
    counters.clear()
    compiled_equals_eager(random_model(tiny_config("llama", vocab=61, hidden=32, layers=3, heads=2), seed=4), "model")
    assert counters["stats"]["unique_graphs"] == 1


def test_an_unknown_scope_is_named():
    with pytest.raises(ValueError, match="compile scope 'layers'"):
        train.compiled_loss(random_model(tiny_config("llama", vocab=61, hidden=32, layers=1, heads=2)), "layers")
