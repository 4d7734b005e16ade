"""Speculative output == AR output, token for token, in float64, for every family and drafter kind
(docs/METHOD.md §3: float64 so that near-ties cannot split the two)."""

from functools import lru_cache

import pytest
import torch
from hypothesis import given, settings, strategies as st

from specpilot.engine.cache import Cache
from specpilot.engine.decode import generate
from specpilot.engine.drafters import DraftLM, FeatureDrafter, NgramDrafter
from specpilot.engine.model import causal_mask
from specpilot.engine.replay import continuation, drafter_taus, make_policy
from specpilot.engine.synthetic import FAMILIES, perturbed, random_drafter_net, random_model, tiny_config

KINDS = ("sequential", "sequential_norm", "block", "block_lead", "block_lead_copy", "block_markov", "block_markov_lead", "block_markov_lead_copy",
         "block_markov_lead_norm", "ngram", "draft_lm_self", "draft_lm_noisy")


@lru_cache(maxsize=None)
def target(family: str, seed: int):
    return random_model(tiny_config(family, vocab=97), seed=seed, dtype=torch.float64)


def make_drafter(kind: str, family: str, seed: int):
    tgt = target(family, seed)
    if kind == "ngram":
        return NgramDrafter()
    if kind.startswith("draft_lm"):
        # a draft LM must be attention-only: hybrids get a dense model of the same vocabulary
        base = tgt if not tgt.cfg.is_hybrid else target("llama", seed)
        return DraftLM(base if kind == "draft_lm_self" else perturbed(base, seed + 1, 0.3))
    norm = kind.endswith("_norm")  # input norms on both halves of a row
    kind = kind.removesuffix("_norm")
    copy = kind.endswith("_copy")  # the block drafter's pointer head
    kind = kind.removesuffix("_copy")
    lead = kind.endswith("_lead")  # the first mask row reads the drafted position-1 token
    net = random_drafter_net(kind.removesuffix("_lead"), tgt.cfg, seed=seed + 7, dtype=torch.float64, block=6,
                             lead_token=lead, input_norm=norm, copy_head=copy)
    return FeatureDrafter(net, tgt)


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(FAMILIES), kind=st.sampled_from(KINDS), seed=st.integers(0, 2),
       data=st.data(), draft_len=st.integers(1, 7), max_new=st.integers(1, 40))
def test_speculative_equals_ar(family, kind, seed, data, draft_len, max_new):
    # repetitive prompts give the n-gram drafter something to find
    unit = data.draw(st.lists(st.integers(1, 96), min_size=1, max_size=10))
    prompt = (unit * data.draw(st.integers(1, 4)))[:24]
    tgt = target(family, seed)
    ar = generate(tgt, prompt, max_new)
    spec = generate(tgt, prompt, max_new, make_drafter(kind, family, seed), draft_len=draft_len)
    assert spec.tokens == ar.tokens
    assert all(1 <= s.tau <= s.drafted + 1 for s in spec.steps)
    assert sum(s.tau for s in spec.steps) + 1 >= len(spec.tokens)  # prefill emits the first token


def test_full_acceptance_reaches_max_tau():
    """A drafter that is the target itself is always right: every step commits draft_len + 1."""
    tgt = target("llama", 0)
    res = generate(tgt, [5, 6, 7], 33, DraftLM(tgt), draft_len=7, eos=set())
    assert [s.tau for s in res.steps] == [8, 8, 8, 8]
    assert res.tokens == generate(tgt, [5, 6, 7], 33, eos=set()).tokens


def test_eos_inside_an_accepted_block_ends_like_ar():
    tgt = target("qwen3", 1)
    free = generate(tgt, [3, 1, 4, 1, 5], 30, eos=set()).tokens
    stop = free[9]  # make the 10th generated token an EOS
    ar = generate(tgt, [3, 1, 4, 1, 5], 30, eos={stop})
    spec = generate(tgt, [3, 1, 4, 1, 5], 30, DraftLM(tgt), draft_len=7, eos={stop})
    assert ar.tokens == free[: free.index(stop) + 1]
    assert spec.tokens == ar.tokens


def test_token_limit_inside_an_accepted_block():
    tgt = target("llama", 2)
    for limit in (1, 2, 5, 9, 10, 11):
        ar = generate(tgt, [9, 8, 7], limit, eos=set())
        spec = generate(tgt, [9, 8, 7], limit, DraftLM(tgt), draft_len=4, eos=set())
        assert len(ar.tokens) == limit
        assert spec.tokens == ar.tokens


@settings(max_examples=40, deadline=None)
@given(family=st.sampled_from(FAMILIES), kind=st.sampled_from(KINDS), seed=st.integers(0, 2),
       data=st.data(), draft_len=st.integers(1, 7), max_new=st.integers(1, 40),
       policy=st.sampled_from(["chain", "best-first:6", "topk:2:6"]), eos_at=st.integers(-1, 12))
def test_drafter_replay_gives_the_online_taus(family, kind, seed, data, draft_len, max_new, policy, eos_at):
    """replay.drafter_taus on the AR continuation == the τ of every pass of online decoding."""
    unit = data.draw(st.lists(st.integers(1, 96), min_size=1, max_size=10))
    prompt = (unit * data.draw(st.integers(1, 4)))[:24]
    tgt = target(family, seed)
    free = generate(tgt, prompt, max_new, eos=set()).tokens
    eos = {free[eos_at]} if 0 <= eos_at < len(free) else set()  # an EOS inside the continuation, or none
    build, rec_on, rec_off = make_policy(policy), [], []
    online = generate(tgt, prompt, max_new, make_drafter(kind, family, seed), draft_len=draft_len, eos=eos,
                      policy=build, record=rec_on)
    d = make_drafter(kind, family, seed)
    cont = continuation(tgt, prompt, max_new, tuple(d.target_layers))
    assert cont.tokens == free
    assert drafter_taus(cont, d, draft_len, eos, build, rec_off) == [s.tau for s in online.steps]
    if policy == "chain":  # unrecorded, the stock chain lets drafters stop at their first miss: the same τs
        assert drafter_taus(cont, make_drafter(kind, family, seed), draft_len, eos) == [s.tau for s in online.steps]
    # the same drafts at every step (what the drafter saw — tokens and target features — was the same)
    assert [(s.room, s.tree_tokens, s.emitted) for s in rec_off] == [(s.room, s.tree_tokens, s.emitted) for s in rec_on]


def test_drafter_replay_names_a_layer_mismatch():
    tgt = target("llama", 0)
    d = make_drafter("block", "llama", 0)
    with pytest.raises(ValueError, match="target layers"):
        drafter_taus(continuation(tgt, [1, 2, 3], 5, ()), d, 4, set())


@pytest.mark.parametrize("family", FAMILIES)
def test_a_pass_without_a_cache_equals_the_masked_and_the_cached_pass(family):
    """Passes without a cache (training, features) run attention as plain causal, with no mask
    tensor: the same logits as an explicit causal mask and as a prefill into a cache."""
    m = target(family, 3)
    T = 21  # longer than the sliding family's window
    tokens = torch.randint(1, 97, (2, T), generator=torch.Generator().manual_seed(5))
    plain = m(tokens).logits
    masked = m(tokens, tree_mask=causal_mask(T, "cpu")).logits
    cached = m(tokens, Cache(m.cfg, 2, T, "cpu", torch.float64)).logits
    torch.testing.assert_close(plain, masked, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(plain, cached, rtol=1e-12, atol=1e-12)
