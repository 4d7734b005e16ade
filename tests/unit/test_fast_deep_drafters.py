"""The static driver's device feature drafters deep into accepted paths, on the CPU in float64.

Random drafters rarely agree with a random target, so paths stay short (τ ≤ 3) and a drafter
that keeps the wrong row after acceptance looks right. Here the target is built to mostly echo
its newest token (its layers' outputs scaled down, its LM head the embedding), with the context
switching the echoed token now and then; the drafters are built to echo too (their input row is
the token embedding, attention averages the context, mask rows read it). Acceptance then runs
from 1 to the whole draft, and every step of the static driver must equal the eager driver's
(lattice, transitions, τ) and the output AR's."""

import dataclasses
from functools import lru_cache

import pytest
import torch

from specpilot.engine.decode import generate
from specpilot.engine.drafters import FeatureDrafter, FeatureDrafterNet
from specpilot.engine.fast import FastDecoder
from specpilot.engine.replay import make_policy
from specpilot.engine.synthetic import drafter_config, random_model, randomize, tiny_config

VOCAB, N, DRAFT = 97, 40, 8
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
# how much the target's layers add to the echo: enough that the echoed token changes several times
CONTEXT = {"llama": 0.7, "hybrid": 1.5}


pytestmark = pytest.mark.usefixtures("one_thread")


@lru_cache(maxsize=None)
def echo_target(family):
    m = random_model(tiny_config(family, vocab=VOCAB), seed=1, dtype=torch.float64)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight")):
                p.mul_(CONTEXT[family])
        m.lm_head.weight.copy_(m.model.embed_tokens.weight)
    return m


def echo_drafter(kind, tgt, small=0.05):
    """A drafter of `kind` whose rows carry their token's embedding: the echoed token drafted at
    every position (block kinds: the first mask row reads the lead token, the others the context's
    average through uniform attention)."""
    cfg = dataclasses.replace(drafter_config(kind, tgt.cfg, block=DRAFT, lead_token=kind != "sequential"),
                              num_key_value_heads=4)
    net = randomize(FeatureDrafterNet(cfg), 4).to(torch.float64).eval()
    H = cfg.hidden_size
    with torch.no_grad():
        net.fc_in.weight[:, :H].copy_(torch.eye(H))
        net.fc_in.weight[:, H:].mul_(small)
        for blk in net.layers:
            blk.self_attn.q_proj.weight.zero_()
            blk.self_attn.v_proj.weight.copy_(torch.eye(H))
            blk.self_attn.o_proj.weight.copy_(torch.eye(H))
            blk.input_layernorm.weight.fill_(1.0)
            blk.mlp.down_proj.weight.mul_(small)
        if hasattr(net, "mask_embedding"):
            net.mask_embedding.zero_()
        if hasattr(net, "markov_out"):
            net.markov_out.weight.mul_(small)
        net.norm.weight.copy_(tgt.model.norm.weight + (1.0 if tgt.cfg.zero_centered_norm else 0.0))
    return FeatureDrafter(net, tgt)


@pytest.mark.parametrize("policy", ["chain", "best-first:12"])
@pytest.mark.parametrize("kind", ["sequential", "block", "block_markov"])
@pytest.mark.parametrize("family", sorted(CONTEXT))
def test_static_feature_drafters_deep_paths_equal_eager_and_ar(family, kind, policy):
    tgt = echo_target(family)
    pol = make_policy(policy)
    fast, eager = [], []
    res = FastDecoder(tgt, echo_drafter(kind, tgt), DRAFT, pol, max_len=256, graphs=False,
                      compile=False).generate(PROMPT, N, eos=set(), record=fast)
    ref = generate(tgt, PROMPT, N, echo_drafter(kind, tgt), DRAFT, policy=pol, eos=set(), record=eager,
                   driver="eager")
    ar = generate(tgt, PROMPT, N, eos=set(), driver="eager").tokens
    assert res.tokens == ref.tokens == ar
    assert len(set(ar)) >= 3  # the echoed token changes: rows differ
    taus = [s.tau for s in res.steps]
    assert sum(t >= 5 for t in taus) >= 2 and min(taus) <= 2, taus  # deep and shallow steps both
    full = [i for i in range(len(eager)) if eager[i].room >= DRAFT]  # the eager driver drafts less near the limit
    assert sum(eager[i].tau >= 5 for i in full) >= 2  # deep steps among those compared
    for i in full:
        a, b = fast[i], eager[i]
        m = b.lattice.positions
        assert torch.equal(a.lattice.tokens[:m], b.lattice.tokens), f"step {i}"
        torch.testing.assert_close(a.lattice.logp[:m], b.lattice.logp, rtol=1e-9, atol=1e-9)
        assert (a.lattice.trans is None) == (b.lattice.trans is None)
        if b.lattice.trans is not None:
            torch.testing.assert_close(a.lattice.trans[: m - 1], b.lattice.trans, rtol=1e-9, atol=1e-9)
        assert a.tau == b.tau, f"step {i}"
