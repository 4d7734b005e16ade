"""Two-level verification (engine/tlv.py): lossless whatever the Q pass says.

In float64 on the CPU, with a drafter that is right most of the time (synthetic.NoisyOracle) so
that chains and subtrees are accepted deep, for every family: TLV's tokens equal AR's, each exact
pass commits exactly the τ its tree dictates (the deepest root path that spells the
continuation), and the state left committed equals a plain pass over the same tokens. The same
holds with a planted Q pass that is wrong at random nodes (it sends the chain down a wrong child,
or names a wrong bonus): only the exact pass accepts. The Q pass itself reads the W12 views
(dropped bits at their midpoint, escapes exact) and leaves the committed state untouched.
The static driver runs the same cycle on the device (fast.FastDecoder._two_level) for device
drafters: on targets and drafters built to echo (test_fast_deep_drafters), its τ equals the eager
cycle's step for step and its tokens AR's, with the true Q pass and with a Q pass of another
model, alone and at batch.
tests/mutations/run.py plants an exact pass that trusts the Q pass's chain, and a static cycle
whose drafter keeps chain C, and checks that this module fails.
"""

import random
from functools import lru_cache

import pytest
import torch
from hypothesis import given, settings, strategies as st

from specpilot.engine import trees
from specpilot.engine.decode import generate
from specpilot.engine.drafters import Drafter, Lattice, NgramDrafter
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.engine.replay import tree_tau
from specpilot.engine.synthetic import FAMILIES, NoisyOracle, random_model, tiny_config
from specpilot.engine.tlv import TwoLevel, agreement, join, quick_model
from specpilot.kernels.w12 import format as w12

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
VOCAB = 97
N = 40  # generated tokens per run

pytestmark = pytest.mark.usefixtures("one_thread")


@lru_cache(maxsize=None)
def target(family):
    return random_model(tiny_config(family, vocab=VOCAB), seed=1, dtype=torch.float64)


@lru_cache(maxsize=None)
def truth(family):
    return generate(target(family), PROMPT, N + 32, eos=set()).tokens


class Planted(TwoLevel):
    """TLV whose Q pass is replaced, at a share `wrong` of the nodes, by a wrong argmax: a child of
    the node whose token is not the Q pass's, or a random token. Records every cycle's tree."""

    def __init__(self, *args, wrong: float = 0.0, seed: int = 0, **kw):
        super().__init__(*args, **kw)
        self.wrong, self.rng, self.cycles = wrong, random.Random(seed), []

    def quick_pass(self, cache, tree, feature_layers=()):
        argmax, feats = super().quick_pass(cache, tree, feature_layers)
        kids = {}
        for i, p in enumerate(tree.parents[1:], 1):
            kids.setdefault(p, []).append(tree.tokens[i])
        out = []
        for i, a in enumerate(argmax):
            if self.rng.random() < self.wrong:
                options = [t for t in kids.get(i, []) if t != a] + [self.rng.randrange(VOCAB)]
                a = self.rng.choice(options)
            out.append(a)
        return out, feats

    def tree(self, *args, **kw):
        cycle = super().tree(*args, **kw)
        self.cycles.append(cycle)
        return cycle


def two_level(family, nodes, q_depth, wrong=0.0, seed=0):
    return Planted(target(family), nodes, q_depth, round_bf16=True, wrong=wrong, seed=seed)


def run(family, nodes, q_depth, p, draft_len, seed, markov, wrong):
    """TLV decodes N tokens; returns (tokens, taus, the cycles, the decoding cache)."""
    tgt, cont = target(family), truth(family)
    tl = two_level(family, nodes, q_depth, wrong, seed)
    oracle = NoisyOracle(cont, len(PROMPT), p, seed, VOCAB, markov=markov)
    made = []
    tgt.new_cache = lambda *a, **kw: made.append(type(tgt).new_cache(tgt, *a, **kw)) or made[-1]
    try:
        res = generate(tgt, PROMPT, N, oracle, draft_len, eos=set(), tlv=tl)
    finally:
        del tgt.new_cache
    return res, tl.cycles, made[0]


@torch.no_grad()
def assert_committed_state_is_ar(family, cache):
    tgt, L = target(family), cache.length
    ref = tgt.new_cache(L)
    tgt(torch.tensor([PROMPT + truth(family)[: L - len(PROMPT)]]), ref, logits=False)
    ref.commit(L)
    tol = {"rtol": 1e-9, "atol": 1e-9}
    for i in ref.k:
        torch.testing.assert_close(cache.k[i][:, :, :L], ref.k[i][:, :, :L], **tol)
        torch.testing.assert_close(cache.v[i][:, :, :L], ref.v[i][:, :, :L], **tol)
    for i in ref.h:
        torch.testing.assert_close(cache.h[i], ref.h[i], **tol)
        torch.testing.assert_close(cache.conv[i], ref.conv[i], **tol)


def check(family, nodes=24, q_depth=6, p=0.1, draft_len=10, seed=0, markov=True, wrong=0.0):
    res, cycles, cache = run(family, nodes, q_depth, p, draft_len, seed, markov, wrong)
    where = f"{family}, N={nodes}, q_depth={q_depth}, p={p}, wrong={wrong}, seed={seed}"
    assert res.tokens == truth(family)[:N], f"TLV differs from AR ({where})"
    cont, at, dictated = truth(family), 0, []
    cyc = iter(cycles)
    for s in res.steps:  # each exact pass commits what its tree dictates, no more, no less
        dictated.append(tree_tau(next(cyc).tree, cont[at + 1:]) if s.chain else 1)
        at += s.tau
    assert [s.tau for s in res.steps] == dictated, f"τ not the dictated one ({where})"
    assert all(s.rows <= nodes + 1 and 2 <= s.chain <= s.rows for s in res.steps if s.chain)
    assert_committed_state_is_ar(family, cache)
    return res


@pytest.mark.parametrize("family", sorted(FAMILIES, key=lambda f: f != "hybrid"))
def test_deep_cycles_are_lossless(family):
    """A fixed run per family: lossless, and deep — some exact pass commits more tokens than tree
    ① could hold (q_depth + 1), which only the chain with the second draft's subtree can."""
    res = check(family)
    assert max(s.tau for s in res.steps) > 6 + 1, [s.tau for s in res.steps]
    wrong = check(family, wrong=0.3, seed=1)  # a Q pass wrong at 30 % of the nodes: still AR's tokens
    assert min(s.tau for s in wrong.steps) >= 1


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(FAMILIES), nodes=st.sampled_from([1, 3, 12, 24, 40]), q_depth=st.integers(1, 10),
       p=st.sampled_from([0.0, 0.1, 0.3, 0.6]), draft_len=st.integers(1, 12), markov=st.booleans(),
       wrong=st.sampled_from([0.0, 0.1, 0.5, 1.0]), seed=st.integers(0, 10_000))
def test_noisy_oracle_tlv_is_lossless(family, nodes, q_depth, p, draft_len, markov, wrong, seed):
    check(family, nodes, q_depth, p, draft_len, seed, markov, wrong)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_q_pass_reads_the_views_and_leaves_the_committed_state(family):
    tgt = target(family)
    cache = tgt.new_cache(64)
    tgt(torch.tensor([PROMPT]), cache, commit_all=True)
    cache.commit(len(PROMPT))
    before = {k: v.clone() for k, v in cache.state().items()}
    oracle = NoisyOracle(truth(family), len(PROMPT), 0.3, 0, VOCAB, markov=True)
    oracle.observe(PROMPT, PROMPT[1:] + [truth(family)[0]])
    tree = trees.best_first(truth(family)[0], oracle.propose(8), 12)
    tl = two_level(family, 12, 8)
    argmax, _ = tl.quick_pass(cache, tree)
    after = cache.state()
    assert cache.length == len(PROMPT) and cache.pending == 0 and not cache.pending_tree and not cache.pending_h
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    # each node's argmax is the quick model's over its root path as a chain, after the exact prefix
    for i in range(len(tree)):
        path, j = [], i
        while j >= 0:
            path.append(tree.tokens[j])
            j = tree.parents[j]
        ref = tgt.new_cache(64)
        tgt(torch.tensor([PROMPT]), ref, commit_all=True)
        ref.commit(len(PROMPT))
        assert int(tl.quick(torch.tensor([path[::-1]]), ref, greedy=True).argmax[0, -1]) == argmax[i]


def test_quick_weights_are_the_w12_views_with_midpoint_low_bits():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(130, 70, generator=g) * 0.05).to(torch.bfloat16)
    w[3, 5], w[7, 9], w[0, 0] = 0.0, 1e30, -3e-20  # escapes: restored exactly
    p = w12.pack(w)
    q, exact = w12.quick(p), w12.unpack(p)
    assert torch.equal(exact.view(torch.int16), w.view(torch.int16))
    esc = torch.zeros(w.numel(), dtype=torch.bool)
    esc[p.esc_idx.long()] = True
    esc = esc.view(w.shape)
    assert esc[3, 5] and esc[7, 9] and esc[0, 0]
    assert torch.equal(q[esc].view(torch.int16), w[esc].view(torch.int16))
    low = w.view(torch.int16) & 0xF
    same = (low == w12.MIDPOINT) & ~esc
    assert torch.equal(q[same].view(torch.int16), w[same].view(torch.int16))
    err = (q.double() - w.double()).abs()
    assert bool((err <= 2.0 ** -4 * w.double().abs()).all())  # within 8 units of the 7-bit mantissa
    assert bool((q[~esc] != w[~esc]).any())  # and the view really drops bits


def test_a_weight_without_a_view_is_refused_unless_rounded():
    tgt = target("llama")
    with pytest.raises(ValueError, match="not bf16 values"):
        TwoLevel(tgt, 8, 4)
    assert 0.8 < agreement(tgt, two_level("llama", 8, 4).quick, PROMPT + truth("llama")) <= 1.0


def test_join_hangs_the_subtree_under_the_chain():
    sub = trees.Tree((7, 8, 9, 10), (-1, 0, 0, 1))
    t = join([1, 2, 7], sub)
    assert t.tokens == (1, 2, 7, 8, 9, 10) and t.parents == (-1, 0, 1, 2, 2, 3)
    assert join([1, 7], trees.Tree((7,), (-1,))).parents == (-1, 0)
    with pytest.raises(ValueError, match="subtree's root"):
        join([1, 2], sub)


class Forgetful(Drafter):
    kind = "forgetful"

    def propose(self, m, known=None):
        return Lattice.empty()


def test_options_are_checked_with_one_line_errors():
    base = {"target": "t", "drafter": "ngram", "mode": "tlv"}
    EngineConfig(**base).validate()
    for extra, field in (({"tlv_nodes": 0}, "tlv_nodes"), ({"tlv_nodes": 64}, "tlv_nodes"),
                         ({"tlv_q_depth": 16}, "tlv_q_depth"), ({"admit_steps": 2}, "admit_steps"),
                         ({"draft_lens": "8,4"}, "draft_lens")):
        with pytest.raises(ValueError, match=field) as e:
            EngineConfig(**base, **extra).validate()
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="needs a drafter"):
        EngineConfig(target="t", mode="tlv").validate()
    tl = two_level("llama", 8, 4)
    with pytest.raises(ValueError, match="driver 'static' cannot run two-level verification with a ngram drafter"):
        generate(target("llama"), PROMPT, 4, NgramDrafter(), tlv=tl, driver="static")
    with pytest.raises(ValueError, match="forgetful drafter cannot forget"):
        generate(target("llama"), PROMPT, 4, Forgetful(), tlv=tl)


def test_the_engine_runs_tlv_on_the_micro_pair_as_ar():
    from specpilot.entrypoints.demo import micro_pair
    from specpilot.zoo.workloads import Request

    tgt, drafter, _ = micro_pair()
    req = [Request(id="a", prompt_ids=[5, 17, 300, 12, 9, 41, 7])]
    out = {}
    for mode, driver in (("ar", "auto"), ("tlv", "auto"), ("tlv", "static")):
        eng = Engine(EngineConfig(target=str(tgt), drafter=str(drafter), mode=mode, draft_len=8, dtype="float64",
                                  max_new_tokens=24, tlv_nodes=16, tlv_q_depth=6, driver=driver))
        out[mode, driver] = eng.run(req)
    ar = out["ar", "auto"]["outputs"][0]["tokens"]
    assert out["tlv", "auto"]["outputs"][0]["tokens"] == ar == out["tlv", "static"]["outputs"][0]["tokens"]
    assert out["tlv", "auto"]["driver"] == "eager" and out["tlv", "auto"]["time_s"]["quick"] > 0
    assert out["tlv", "static"]["driver"] == "static"
    two = [Request(id="b", prompt_ids=[9, 4, 12]), *req]
    assert [r.tokens for r in eng.generate_batch(two, 2)] == [r.tokens for r in map(eng.generate, two)]
    with pytest.raises(ValueError, match="records of two-level cycles"):
        eng.generate(req[0], record=[])


# ---- the static driver's cycle (device drafters) ---------------------------------------------------
def echo_pair(family, kind):
    from test_fast_deep_drafters import echo_drafter, echo_target

    tgt = echo_target(family)
    return tgt, echo_drafter(kind, tgt)


def static_and_eager(family, kind, nodes, q_depth, other_quick=False, n=N):
    """(static result, eager result, AR tokens) of TLV on the echo pair; with `other_quick` the Q
    pass is a different random model of the target's shape (wrong at most nodes)."""
    from test_fast_deep_drafters import DRAFT

    from specpilot.engine.fast import FastDecoder

    tgt, d = echo_pair(family, kind)
    tl = TwoLevel(tgt, nodes, q_depth, round_bf16=True)
    if other_quick:
        tl.quick = random_model(tgt.cfg, seed=7, dtype=torch.float64)
    dec = FastDecoder(tgt, d, DRAFT, None, max_len=256, graphs=False, compile=False, tlv=tl)
    fast = dec.generate(PROMPT, n, eos=set())
    eager = generate(tgt, PROMPT, n, echo_pair(family, kind)[1], DRAFT, eos=set(), driver="eager", tlv=tl)
    return fast, eager, generate(tgt, PROMPT, n, eos=set(), driver="eager").tokens, dec


def untruncated(res, nodes, n=N):
    """The steps the eager cycle drafts in full (its drafts and chain stop at the token limit;
    the static one's do not): those that start with room for every node and position."""
    from test_fast_deep_drafters import DRAFT

    out, at = [], 0
    for i, s in enumerate(res.steps):
        if n - at - 1 >= nodes + DRAFT:
            out.append(i)
        at += s.tau
    return out


@pytest.mark.parametrize("other_quick", [False, True])
@pytest.mark.parametrize("kind", ["sequential", "block_markov"])
@pytest.mark.parametrize("family", ["llama", "hybrid"])
def test_the_static_cycle_equals_the_eager_one_and_ar(family, kind, other_quick):
    nodes, q_depth = 12, 4
    fast, eager, ar, _ = static_and_eager(family, kind, nodes, q_depth, other_quick)
    assert fast.tokens == eager.tokens == ar
    full = untruncated(eager, nodes)
    assert len(full) >= 2
    assert [fast.steps[i].tau for i in full] == [eager.steps[i].tau for i in full]
    if not other_quick:  # deep: an exact pass commits more than tree ① holds, through C and draft ②
        assert max(fast.steps[i].tau for i in full) > q_depth + 2, [s.tau for s in fast.steps]


@settings(max_examples=12, deadline=None)
@given(family=st.sampled_from(["llama", "hybrid"]), kind=st.sampled_from(["sequential", "block", "block_markov"]),
       nodes=st.sampled_from([1, 2, 5, 12, 30]), q_depth=st.integers(1, 9), other_quick=st.booleans())
def test_static_cycles_of_any_shape_are_lossless(family, kind, nodes, q_depth, other_quick):
    fast, eager, ar, dec = static_and_eager(family, kind, nodes, q_depth, other_quick, n=24)
    assert fast.tokens == ar
    full = untruncated(eager, nodes, 24)
    assert [fast.steps[i].tau for i in full] == [eager.steps[i].tau for i in full]
    assert all(s.tau <= dec.spec.max_depth + 1 and s.drafted <= nodes for s in fast.steps)


def test_static_cycles_at_batch_equal_ar_per_request():
    from test_fast_deep_drafters import DRAFT

    from specpilot.engine.fast import FastDecoder

    tgt, d = echo_pair("hybrid", "block_markov")
    tl = TwoLevel(tgt, 12, 4, round_bf16=True)
    prompts = [PROMPT, [7, 7, 2], PROMPT[::-1], [11, 3, 5, 8, 13, 2], [4]]
    limits = [30, 12, 25, 1, 18]
    dec = FastDecoder(tgt, d, DRAFT, None, max_len=256, graphs=False, compile=False, lanes=3, tlv=tl)
    res = dec.generate_batch(prompts, limits, eos=set())
    for p, n, r in zip(prompts, limits, res):
        assert r.tokens == generate(tgt, p, n, eos=set(), driver="eager").tokens
    assert max(s.tau for r in res for s in r.steps) > 4 + 2


def test_the_static_cycle_with_a_draft_lm_equals_the_eager_one_and_ar():
    """A standalone draft LM (the echo target, slightly perturbed): its static cache forgets C
    (`mark` / `rewind` of its lengths) as the eager one truncates."""
    from test_fast_deep_drafters import DRAFT

    from specpilot.engine.drafters import DraftLM
    from specpilot.engine.fast import FastDecoder
    from specpilot.engine.synthetic import perturbed

    tgt, _ = echo_pair("llama", "block")
    tl = TwoLevel(tgt, 12, 4, round_bf16=True)
    fast = FastDecoder(tgt, DraftLM(perturbed(tgt, 3, 0.02)), DRAFT, None, max_len=256, graphs=False, compile=False,
                       tlv=tl).generate(PROMPT, N, eos=set())
    eager = generate(tgt, PROMPT, N, DraftLM(perturbed(tgt, 3, 0.02)), DRAFT, eos=set(), driver="eager", tlv=tl)
    assert fast.tokens == eager.tokens == generate(tgt, PROMPT, N, eos=set(), driver="eager").tokens
    full = untruncated(eager, 12)
    assert [fast.steps[i].tau for i in full] == [eager.steps[i].tau for i in full]
    assert max(fast.steps[i].tau for i in full) > 4 + 1, [s.tau for s in fast.steps]  # past tree ①'s depth
