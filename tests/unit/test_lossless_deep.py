"""Losslessness deep into accepted paths: speculative output == AR token for token, on CPU in
float64, with a drafter that is right most of the time (synthetic.NoisyOracle), so that long paths
are accepted and committed — the paths where acceptance, K/V compaction and the recurrent-state
commit can go wrong while short paths stay right.

Every family × every policy (chain, best-first, top-k, Sequoia) × both drivers (the eager one in
decode.py and the static-shape one in fast.py, run eagerly) × the replay path (replay.drafter_taus
and replay.replay). Besides the tokens, each step's τ must be the one the continuation dictates for
the tree built from that step's lattice (the deepest root path that spells it), so a step that
accepts too little, or too much, fails too; and the state left committed (K/V, recurrent and conv
state) must equal a plain pass over the same tokens, so a wrong state fails even where it flips
no argmax.

A test that never goes deep proves nothing about deep paths: the fixed runs below
(`test_deep_runs_are_lossless`) are deterministic and each must accept paths of τ ≥ 6 several
times; the property test then varies error rate, draft length, Markov transitions and seed.
tests/mutations/run.py plants bugs that only bite on long paths and checks that this module fails.
"""

from functools import lru_cache

import pytest
import torch
from hypothesis import given, settings, strategies as st

from specpilot.engine.decode import generate
from specpilot.engine.fast import FastDecoder
from specpilot.engine.replay import Continuation, drafter_taus, make_policy, replay, tree_tau
from specpilot.engine.synthetic import FAMILIES, NoisyOracle, random_model, tiny_config

POLICIES = ("chain", "best-first:12", "best-first:40", "topk:3:12", "topk:4:40", "sequoia:12", "sequoia:40")
# a rank-acceptance profile for Sequoia's shape: top-1 mostly right, as the oracle's is
PROFILE = torch.tensor([[0.85, 0.07, 0.04, 0.02]] * 15, dtype=torch.float64)
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
VOCAB = 97
N = 40  # generated tokens per run
DRIVERS = ("eager", "static")


pytestmark = pytest.mark.usefixtures("one_thread")


@lru_cache(maxsize=None)
def target(family):
    return random_model(tiny_config(family, vocab=VOCAB), seed=1, dtype=torch.float64)


@lru_cache(maxsize=None)
def truth(family):
    """AR's continuation, 16 tokens past N: the static driver drafts its full length at the limit."""
    return generate(target(family), PROMPT, N + 16, eos=set()).tokens


@lru_cache(maxsize=None)
def policy(spec):
    return make_policy(spec, PROFILE)


def run(driver, family, spec, p, draft_len, seed, markov):
    """Decode N tokens with a noisy oracle; returns (tokens, taus, step records)."""
    tgt, cont = target(family), truth(family)
    oracle = NoisyOracle(cont, len(PROMPT), p, seed, VOCAB, markov=markov)
    rec = []
    if driver == "eager":
        made = []  # the decoding cache generate makes, to compare its committed state afterwards
        tgt.new_cache = lambda *a, **kw: made.append(type(tgt).new_cache(tgt, *a, **kw)) or made[-1]
        try:
            res = generate(tgt, PROMPT, N, oracle, draft_len, eos=set(), policy=policy(spec), record=rec)
        finally:
            del tgt.new_cache
        cache = made[0]
    else:
        dec = FastDecoder(tgt, oracle, draft_len, policy(spec), max_len=256, graphs=False)
        res = dec.generate(PROMPT, N, eos=set(), record=rec)
        cache = dec.cache
    assert_committed_state_is_ar(family, cache)
    return res.tokens, [s.tau for s in res.steps], rec


@torch.no_grad()
def assert_committed_state_is_ar(family, cache):
    """What decoding left committed — K/V of every position, recurrent and conv state — equals one
    plain pass over the prompt and the continuation's tokens up to the committed length: a wrong
    state that happens not to flip an argmax fails here."""
    tgt, static = target(family), not hasattr(cache, "pending")
    L = int(cache.length)
    ref = tgt.new_cache(L)
    tgt(torch.tensor([PROMPT + truth(family)[: L - len(PROMPT)]]), ref, logits=False)
    ref.commit(L)
    tol = {"rtol": 1e-9, "atol": 1e-9}
    for i in ref.k:
        torch.testing.assert_close(cache.k[i][:, :, :L], ref.k[i][:, :, :L], **tol)
        torch.testing.assert_close(cache.v[i][:, :, :L], ref.v[i][:, :, :L], **tol)
    for i in ref.h:
        torch.testing.assert_close(cache.h[i], ref.h[i], **tol)
        torch.testing.assert_close(cache.conv[i], ref.conv[i].transpose(1, 2) if static else ref.conv[i], **tol)


def dictated_taus(family, spec, rec):
    """τ of each recorded step as the continuation dictates it: the deepest root path of the tree
    the policy builds (on the host) from the step's lattice that spells the continuation."""
    cont, out, at = truth(family), [], 0  # cont[at] is the step's root (the newest token)
    for s in rec:
        out.append(1 if s.lattice is None else tree_tau(policy(spec)(cont[at], s.lattice), cont[at + 1:]))
        at += len(s.emitted)
    return out


def check(driver, family, spec, p, draft_len, seed, markov):
    tokens, taus, rec = run(driver, family, spec, p, draft_len, seed, markov)
    assert tokens == truth(family)[:N], f"{driver} driver, {family}, {spec}: output differs from AR"
    assert taus == dictated_taus(family, spec, rec), f"{driver} driver, {family}, {spec}: τ not the dictated one"
    return taus, rec


def check_replay(family, spec, p, draft_len, seed, markov, online_taus, rec):
    """replay.drafter_taus (the drafter driven against the known continuation) and replay.replay
    (the policy re-scored on the recorded lattices) give the online τ of every step."""
    cont = Continuation(list(PROMPT), truth(family)[:N], (), None)
    oracle = NoisyOracle(truth(family), len(PROMPT), p, seed, VOCAB, markov=markov)
    assert drafter_taus(cont, oracle, draft_len, set(), policy(spec)) == online_taus
    assert replay(rec, spec, PROFILE) == online_taus


@pytest.mark.parametrize("spec", ["chain", "best-first:12", "topk:3:12", "sequoia:12"])
@pytest.mark.parametrize("family", sorted(FAMILIES, key=lambda f: f != "hybrid"))  # the hybrid first: fail fast
def test_deep_runs_are_lossless(family, spec):
    """A fixed run per family and policy (deterministic: seeded drafter, fixed target), through
    both drivers and the replay: lossless, and deep — several steps accept τ ≥ 6."""
    markov = spec != "chain"
    for driver in DRIVERS:
        taus, rec = check(driver, family, spec, 0.1, 10, 0, markov)
        assert sum(t >= 6 for t in taus) >= 2, f"{driver} driver, {family}, {spec}: never went deep ({taus})"
        if driver == "eager":
            check_replay(family, spec, 0.1, 10, 0, markov, taus, rec)


@settings(max_examples=40, deadline=None)
@given(family=st.sampled_from(FAMILIES), spec=st.sampled_from(POLICIES), driver=st.sampled_from(DRIVERS),
       p=st.sampled_from([0.0, 0.03, 0.1, 0.25, 0.5]), draft_len=st.integers(1, 15), markov=st.booleans(),
       seed=st.integers(0, 10_000))
def test_noisy_oracle_is_lossless(family, spec, driver, p, draft_len, markov, seed):
    """Error rates from none (every step accepts the whole tree depth) to one in two (short paths)."""
    taus, rec = check(driver, family, spec, p, draft_len, seed, markov)
    if driver == "eager":
        check_replay(family, spec, p, draft_len, seed, markov, taus, rec)


def test_the_oracle_proposes_the_continuation_with_its_error_rate():
    """The drafter itself: without errors its top-1 chain is the continuation; at p its top-1 is
    wrong at about a fraction p of positions, with the true token at a lower rank or missing."""
    cont = list(range(10, 90))
    clean = NoisyOracle(cont, 5, 0.0, seed=1)
    clean.reset(0)
    clean.observe([1, 2, 3, 4, 5], [2, 3, 4, 5, 10])
    assert clean.propose(8).chain() == cont[1:9]
    clean.observe([10, 11, 12], [11, 12, 13])
    lat = clean.propose(15)
    assert lat.chain() == cont[4:19] and lat.trans is None
    noisy = NoisyOracle(cont, 1, 0.3, seed=2, markov=True)
    noisy.reset(0)
    noisy.observe([7], [10])
    lat = noisy.propose(15)
    assert lat.trans.shape == (14, 16, 16)
    assert all(len(set(lat.tokens[i, :4].tolist())) == 4 and lat.tokens[i, 4] == -1 for i in range(15))
    many = NoisyOracle(cont, 1, 0.3, seed=3)
    many.reset(0)
    many.observe([7], [10])
    tops = [many.propose(15).tokens[:, 0] for _ in range(40)]
    rate = sum(int((t != torch.tensor(cont[1:16])).sum()) for t in tops) / (40 * 15)
    assert 0.2 < rate < 0.4
    with pytest.raises(ValueError, match="p = 1.5"):
        NoisyOracle(cont, 1, 1.5)
