"""Commit / rollback: after verifying T tokens and keeping n, the cache equals the cache of a model
that only ever saw the n accepted tokens (GDN state, conv state and KV alike)."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from specpilot.engine.synthetic import FAMILIES, random_model, tiny_config

MODELS = {f: random_model(tiny_config(f, vocab=97), seed=4, dtype=torch.float64) for f in FAMILIES}


def states_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=1e-12, msg=f"state {k} differs")


@settings(max_examples=30, deadline=None)
@given(family=st.sampled_from(FAMILIES), prefix=st.lists(st.integers(0, 96), min_size=1, max_size=12),
       block=st.lists(st.integers(0, 96), min_size=1, max_size=8), data=st.data())
def test_rollback_equals_decoding_the_accepted_prefix(family, prefix, block, data):
    m = MODELS[family]
    n = data.draw(st.integers(0, len(block)))
    a = m.new_cache(64)
    m(torch.tensor([prefix]), a)
    a.commit(len(prefix))
    m(torch.tensor([block]), a)  # a verify pass over the whole block…
    a.commit(n)  # …rolled back to the n accepted tokens

    b = m.new_cache(64)
    for t in prefix + block[:n]:  # the accepted tokens alone, one at a time
        m(torch.tensor([[t]]), b)
        b.commit(1)
    assert a.length == b.length == len(prefix) + n
    states_equal(a.state(), b.state())
    # and the next step sees the same thing
    nxt = torch.tensor([[block[0]]])
    torch.testing.assert_close(m(nxt, a).logits, m(nxt, b).logits, rtol=1e-10, atol=1e-10)


def test_commit_more_than_pending_is_an_error():
    m = MODELS["llama"]
    c = m.new_cache(16)
    m(torch.tensor([[1, 2]]), c)
    with pytest.raises(ValueError, match="pending"):
        c.commit(3)


def test_cache_overflow_names_the_limit():
    m = MODELS["llama"]
    c = m.new_cache(4)
    with pytest.raises(ValueError, match="holds 4 positions"):
        m(torch.tensor([[1, 2, 3, 4, 5]]), c)


def test_truncate_refuses_recurrent_caches():
    c = MODELS["hybrid"].new_cache(8)
    with pytest.raises(ValueError, match="recurrent"):
        c.truncate(0)
