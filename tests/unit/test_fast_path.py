"""The static-shape driver (engine/fast.py), run eagerly on the CPU in float64: its pieces against
their eager counterparts (device trees vs trees.py, the tree form of the delta rule vs the
recurrence, a static commit vs the eager cache's), and whole decoding against AR, step by step
against the eager driver for every device drafter, and deep into accepted paths."""

import copy
import gc
import weakref
from functools import lru_cache

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from specpilot.engine import fast, treeops, trees
from specpilot.engine.decode import generate
from specpilot.engine.drafters import TOP_K, DraftLM, FeatureDrafter, Lattice, NgramDrafter
from specpilot.engine.fast import FastDecoder
from specpilot.engine.gdn import gated_delta_rule, root_paths, tree_gated_delta_rule, tree_state
from specpilot.engine.replay import make_policy
from specpilot.engine.synthetic import FAMILIES, NoisyOracle, perturbed, random_drafter_net, random_model, tiny_config

POLICIES = ("chain", "best-first:12", "best-first:40", "topk:3:10", "topk:4:40", "sequoia:12")
PROFILE = torch.tensor([[0.6, 0.2, 0.1, 0.05]] * 15, dtype=torch.float64)


def lattice(m, k, seed, markov, holes=False):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.stack([torch.randperm(60, generator=g)[:k] for _ in range(m)])
    logp = torch.log_softmax(torch.randn(m, k, generator=g, dtype=torch.float64) * 2, -1).sort(-1, True).values
    if holes:  # fewer candidates than k at some positions (an n-gram lattice's shape)
        cut = torch.randint(0, k + 1, (m,), generator=g)  # 0: no candidate at all (the drafter stopped)
        for i, c in enumerate(cut.tolist()):
            tokens[i, c:], logp[i, c:] = -1, float("-inf")
    trans = torch.randn(m - 1, k, k, generator=g, dtype=torch.float64) * 2 if markov and m > 1 else None
    return Lattice(tokens, logp, trans)


def root_path_tokens(tokens, parents):
    """The set of root paths (as token tuples) of a tree."""
    paths = {0: ()}
    for i in range(1, len(tokens)):
        paths[i] = paths[parents[i]] + (tokens[i],)
    return {paths[i] for i in range(1, len(tokens))}


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(1, 15), markov=st.booleans(), holes=st.booleans(),
       policy=st.sampled_from(POLICIES))
def test_device_trees_equal_host_trees(seed, m, markov, holes, policy):
    lat = lattice(m, TOP_K, seed, markov, holes)
    pol = make_policy(policy, PROFILE)
    host = pol(7, lat)
    spec = treeops.spec_for(pol.name, pol.args, m, pol.shape)
    rows = treeops.build(spec, torch.tensor([7]), lat.tokens, lat.logp, lat.trans)
    assert rows.tokens.shape[0] == spec.rows  # the static budget, whatever the lattice
    tree = treeops.to_tree(rows)
    assert tree.tokens[0] == 7 and all(tree.parents[i] < i for i in range(1, len(tree)))
    assert root_path_tokens(tree.tokens, tree.parents) == root_path_tokens(host.tokens, host.parents)
    assert max(tree.depths) <= spec.max_depth


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 24), heads=st.integers(1, 3))
def test_tree_delta_rule_is_the_recurrence_along_each_root_path(seed, n, heads):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    q, k, v = rnd(n, heads, 5), F.normalize(rnd(n, heads, 5), dim=-1), rnd(n, heads, 4)
    gate, beta = -torch.rand(n, heads, generator=g, dtype=torch.float64) * 2, torch.rand(n, heads, generator=g,
                                                                                          dtype=torch.float64)
    h0 = rnd(heads, 5, 4)
    par = torch.tensor([0] + parents[1:])
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while True:
            anc[i, j] = True
            if j == 0:
                break
            j = parents[j]
    out, kug = tree_gated_delta_rule(q, k, v, gate, beta, h0, anc)
    for path in root_paths(parents):
        idx = torch.tensor(path)
        ref_o, ref_h = gated_delta_rule(q[idx][None], k[idx][None], v[idx][None], gate[idx][None], beta[idx][None],
                                        h0[None])
        torch.testing.assert_close(out[idx], ref_o[0], rtol=1e-10, atol=1e-10)
        for t, node in enumerate(path):
            torch.testing.assert_close(tree_state(h0, kug, anc[node], torch.tensor(node)), ref_h[0, t],
                                       rtol=1e-10, atol=1e-10)
    assert par.shape[0] == n


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_static_commit_equals_eager_commit(family):
    """A tree pass and the commit of an accepted path leave the state a chain pass over those
    tokens leaves (K/V prefix, recurrent and conv state)."""
    tgt = random_model(tiny_config(family, vocab=61), seed=3, dtype=torch.float64)
    prompt = torch.tensor([[5, 9, 2, 7, 7, 1]])
    parents, tokens = [-1, 0, 0, 1, 1, 3, 2, 5], [4, 8, 3, 6, 1, 9, 2, 4]
    path = [0, 1, 3, 5, 7]
    st_ = tgt.static_cache(64)
    st_.plan(6, commit_all=True)
    tgt(prompt, st_, logits=False)
    st_.length.fill_(6)
    par, depth = torch.tensor([0] + parents[1:]), torch.tensor(trees.Tree(tuple(tokens), tuple(parents)).depths)
    st_.plan(8, par, depth, max_depth=4)
    tgt(torch.tensor([tokens]), st_)
    st_.commit(torch.tensor(path + [0, 0, 0]), torch.tensor(len(path)))
    ref = tgt.new_cache(64)
    tgt(torch.cat((prompt, torch.tensor([[tokens[i] for i in path]])), 1), ref)
    ref.commit(6 + len(path))
    assert int(st_.length) == ref.length
    for i in ref.k:
        torch.testing.assert_close(st_.k[i][:, :, : ref.length], ref.k[i][:, :, : ref.length])
        torch.testing.assert_close(st_.v[i][:, :, : ref.length], ref.v[i][:, :, : ref.length])
    for i in ref.h:
        torch.testing.assert_close(st_.h[i], ref.h[i], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(st_.conv[i], ref.conv[i].transpose(1, 2))


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_padded_prefill_into_a_lane_leaves_the_exact_prompts_state(family):
    """A prefill padded to more rows (`valid` real ones) into lane 1 of 3, the lane given as a
    tensor (as a captured prefill gets it): that lane's K/V of the prompt, recurrent and conv state
    and last row's logits equal an unpadded pass's; the other lanes are untouched."""
    tgt = random_model(tiny_config(family, vocab=61), seed=4, dtype=torch.float64)
    prompt = [5, 9, 2, 7, 7, 1, 3]
    exact = tgt.static_cache(64)
    exact.plan(len(prompt), commit_all=True)
    want = tgt(torch.tensor([prompt]), exact, logits="last").logits
    padded = tgt.static_cache(64, lanes=3)
    for t in (padded.kv, *padded.h.values(), *padded.conv.values()):
        t.normal_()
    before = [t.clone() for t in (padded.kv, *padded.h.values(), *padded.conv.values())]
    lane, valid = torch.tensor([1]), torch.tensor([len(prompt)])
    padded.reset(lane)
    padded.plan(16, commit_all=True, lane=lane, valid=valid)
    got = tgt(torch.tensor([prompt + [11] * 9]), padded, logits="last").logits
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for i in exact.k:
        torch.testing.assert_close(padded.k[i][1, :, : len(prompt)], exact.k[i][0, :, : len(prompt)])
        torch.testing.assert_close(padded.v[i][1, :, : len(prompt)], exact.v[i][0, :, : len(prompt)])
    for i in exact.h:
        torch.testing.assert_close(padded.h[i][1], exact.h[i][0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(padded.conv[i][1], exact.conv[i][0])
    after = (padded.kv, *padded.h.values(), *padded.conv.values())
    for old, new in zip(before, after):
        for other in (0, 2):
            assert torch.equal(new[:, :, other] if new is padded.kv else new[other],
                               old[:, :, other] if new is padded.kv else old[other])


@lru_cache(maxsize=None)
def target(family):
    return random_model(tiny_config(family, vocab=97), seed=1, dtype=torch.float64)


PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@lru_cache(maxsize=None)
def continuation(family, n=60):
    return generate(target(family), PROMPT, n, eos=set()).tokens


def device_drafter(kind, tgt):
    if kind == "draft_lm":
        base = tgt if not tgt.cfg.is_hybrid else target("llama")
        return DraftLM(perturbed(base, 3, 0.05))
    if kind == "ngram":
        return NgramDrafter()
    return FeatureDrafter(random_drafter_net(kind.removesuffix("_copy"), tgt.cfg, seed=4, dtype=torch.float64, block=8,
                                             copy_head=kind.endswith("_copy")), tgt)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["sequential", "block", "block_markov", "block_copy", "block_markov_copy", "draft_lm",
                                  "ngram"])
def test_static_drafters_propose_what_eager_ones_do(family, kind):
    """Step by step, the same lattices and the same τ as the eager driver (but the last steps,
    where the eager driver drafts fewer positions near the token limit), and AR's tokens."""
    tgt = target(family)
    d = device_drafter(kind, tgt)
    prompt = [1, 2, 3, 1, 2, 3, 4, 5]
    pol = make_policy("best-first:12")
    fast, eager = [], []
    res = FastDecoder(tgt, d, 6, pol, max_len=256, graphs=False).generate(prompt, 40, eos=set(), record=fast)
    generate(tgt, prompt, 40, d, 6, policy=pol, eos=set(), record=eager)
    assert res.tokens == generate(tgt, prompt, 40, eos=set()).tokens
    full = [i for i, (a, b) in enumerate(zip(fast, eager)) if a.room >= 6]
    assert len(full) >= 3
    for i in full:
        a, b = fast[i].lattice, eager[i].lattice
        m = b.positions
        assert torch.equal(a.tokens[:m], b.tokens)
        torch.testing.assert_close(a.logp[:m], b.logp)
        assert (a.trans is None) == (b.trans is None)
        if b.trans is not None:
            torch.testing.assert_close(a.trans[: m - 1], b.trans)
        assert fast[i].tau == eager[i].tau
        assert sorted(fast[i].tree_tokens) == sorted(eager[i].tree_tokens)  # same nodes (device order differs)


@pytest.mark.parametrize("family", ["llama", "hybrid"])
@pytest.mark.parametrize("kind", ["sequential", "block_markov", "block_copy", "block_markov_copy", "draft_lm"])
@torch.no_grad()
def test_every_lane_drafts_what_it_drafts_alone(family, kind):
    """Three ragged prompts prefilled into three lanes in one padded pass: each lane's first lattice
    (tokens, scores, transitions: the pointer head and the Markov head run for every lane at once)
    is the one a decoder of one lane drafts for that prompt alone. Every prompt repeats a
    permutation of the vocabulary, so whatever the lead token, the pointer head finds sources."""
    tgt = target(family)
    d = device_drafter(kind, tgt)
    g = torch.Generator().manual_seed(0)
    prompts = [(torch.randperm(97, generator=g).tolist() * 2)[:n] for n in (194, 120, 101)]
    many = FastDecoder(tgt, d, 6, make_policy("best-first:12"), max_len=256, graphs=False, lanes=3)
    many._prefill(prompts, [0, 1, 2])
    got = many.device_draft.propose(many.root)
    for b, prompt in enumerate(prompts):
        one = FastDecoder(tgt, d, 6, make_policy("best-first:12"), max_len=256, graphs=False)
        one._prefill([prompt], [0])
        want = one.device_draft.propose(one.root)
        assert torch.equal(got[0][b], want[0][0])
        torch.testing.assert_close(got[1][b], want[1][0], rtol=1e-10, atol=1e-10)
        assert (got[2] is None) == (want[2] is None)
        if want[2] is not None:
            torch.testing.assert_close(got[2][b], want[2][0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("family", FAMILIES)
def test_static_ar_and_bias_equal_eager(family):
    tgt = target(family)
    prompt = [7, 7, 3, 8]
    bias = torch.zeros(97, dtype=torch.float64)
    bias[[5, 11]] = 2.0
    assert FastDecoder(tgt, max_len=128, graphs=False).generate(prompt, 30).tokens == generate(tgt, prompt, 30).tokens
    biased = FastDecoder(tgt, max_len=128, graphs=False, logit_bias=bias).generate(prompt, 30, eos=set())
    assert biased.tokens == generate(tgt, prompt, 30, eos=set(), logit_bias=bias).tokens


def test_admissions_split_into_passes_of_powers_of_two():
    """A prefill of 13 prompts runs as passes of 8, 4 and 1 (few graph shapes on CUDA, all run at a
    bucket's first use); buckets are powers of two from 16, capped at the cache."""
    assert fast.pow2_runs(13) == [(0, 8), (8, 12), (12, 13)]
    assert fast.pow2_runs(16) == [(0, 16)] and fast.pow2_runs(0) == []
    for n in range(1, 70):
        runs = fast.pow2_runs(n)
        assert runs[0][0] == 0 and runs[-1][1] == n and all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    assert [fast.bucket(n, 100) for n in (1, 16, 17, 64, 65, 99)] == [16, 16, 32, 64, 100, 100]
    assert fast.admit_counts(64, 16) == [1, 2, 4, 8, 16] and fast.admit_counts(64, 12) == [1, 2, 4, 8]
    assert fast.admit_counts(fast.ADMIT_ROWS, 32) == [1] and fast.admit_counts(16, 1) == [1]


def test_capacity_is_checked():
    dec = FastDecoder(target("llama"), max_len=64, graphs=False)
    with pytest.raises(ValueError, match="capacity"):
        dec.generate(list(range(40)), 30)


@torch.no_grad()
def test_capacity_is_exact_at_the_boundary():
    """The largest request a decoder takes runs to its end and through the step the pipelined
    driver launches past it, in the worst case (every step accepts the whole chain and the last
    one starts one token short of the limit); one more token is refused, and would overflow."""
    tgt, m, n_new = target("llama"), 6, 72  # τ = 7 every step: the last step starts at token 71
    dec = FastDecoder(tgt, NoisyOracle([], 0, 0.0), m, max_len=128, graphs=False, compile=False)
    assert dec.capacity == fast.capacity(dec.spec, 128) == 128 - 2 * (m + 1) + 2

    def worst_case(prompt):
        dec.host = NoisyOracle(generate(tgt, prompt, n_new + 2 * m, eos=set()).tokens, len(prompt), 0.0)
        res = dec.generate(prompt, n_new, eos=set())
        assert [s.tau for s in res.steps] == [m + 1] * ((n_new - 2) // (m + 1) + 1)
        dec.fn()  # the step launched past the end

    fits = [1 + i % 90 for i in range(dec.capacity - n_new)]
    worst_case(fits)
    with pytest.raises(ValueError, match="capacity"):
        dec.generate(fits + [5], n_new)
    dec.capacity += 1  # were one more token allowed, the worst case would write past the cache
    with pytest.raises((IndexError, RuntimeError)):
        worst_case(fits + [5])


def test_decoder_size_follows_its_spec():
    """`decoder` builds the smallest size (1024 doubled) whose capacity holds the request, by the
    same formula the decoder checks: a 63-token n-gram chain takes a 900-token request (which a
    decoder sized for a 15-deep path refused, every call)."""
    tgt, ngram = target("llama"), NgramDrafter()
    cap = fast.capacity(fast.plan(ngram, 63, None)[1], 1024)
    assert fast.decoder(tgt, ngram, 63, None, None, cap).cache.max_len == 1024
    assert fast.decoder(tgt, ngram, 63, None, None, cap + 1).cache.max_len == 2048
    res = generate(tgt, [1 + i % 90 for i in range(880)], 20, ngram, 63, eos=set(), driver="static")
    assert res.driver == "static" and len(res.tokens) == 20


def test_decoders_die_with_their_target():
    """A target's decoders (caches, buffers, on CUDA graph pools) are freed with it, and a copy of
    the target builds its own."""
    tgt = random_model(tiny_config("llama", vocab=97), seed=1, dtype=torch.float64)
    dec = fast.decoder(tgt, None, 8, None, None, 64)
    assert fast.decoder(tgt, None, 8, None, None, 64) is dec  # kept while the target lives
    twin = copy.deepcopy(tgt)
    assert fast.decoder(twin, None, 8, None, None, 64) is not dec
    assert dec.generate(PROMPT, 8).tokens == fast.decoder(twin, None, 8, None, None, 64).generate(PROMPT, 8).tokens
    gone = weakref.ref(dec)
    del dec, tgt
    gc.collect()
    assert gone() is None


def test_a_host_lattice_with_undeclared_transitions_is_refused():
    """The static step walks transitions only for a host drafter that declares them (`transitions`):
    one that returns them undeclared is told so, not silently decoded without them."""

    class Undeclared(NgramDrafter):
        def propose(self, m, known=None):
            return lattice(m, TOP_K, 0, markov=True)

    assert not Undeclared.transitions
    with pytest.raises(ValueError, match="does not declare them"):
        FastDecoder(target("llama"), Undeclared(), 4, max_len=64, graphs=False).generate(PROMPT, 8)


def test_static_profile_splits_each_step_by_kernel_class():
    """profile_static: every step of the decoder carries the same device split, the classes the
    system has are timed (a dense target has no recurrent class), `other` holds the rest."""
    from specpilot.engine import profiler

    tgt = target("llama")
    d = FeatureDrafter(random_drafter_net("block_markov", tgt.cfg, seed=4, dtype=torch.float64, block=8), tgt)
    res = profiler.profile_static(tgt, PROMPT, 20, d, 6, make_policy("best-first:12"), eos=set(), graphs=False)
    assert res.tokens == continuation("llama")[:20] and res.steps
    for s in res.steps:
        assert s.n == 13 and set(s.kernels) == set(profiler.KERNEL_CLASSES)
        assert s.kernels["recurrent"].seconds == 0.0
        for c in ("target_linear", "lm_head", "attention", "drafter", "tree_build", "sampling_acceptance"):
            assert s.kernels[c].seconds > 0.0, c
        assert s.kernels["target_linear"].bytes >= sum(p.numel() * 8 for p in tgt.model.layers.parameters()
                                                       if p.dim() == 2)
        assert s.kernels["other"].seconds == pytest.approx(max(s.t_step - s.profiled_seconds, 0.0))


@pytest.mark.parametrize("family", ["hybrid", "llama"])
@torch.no_grad()
def test_prefill_committed_whole_keeps_only_the_final_state(family):
    """commit_all: the chunked form's final state, not a state per position, and the same cache."""
    tgt = target(family)
    ids = torch.tensor([PROMPT * 3])
    whole, snap = tgt.new_cache(64), tgt.new_cache(64)
    a = tgt(ids, whole, commit_all=True).logits
    b = tgt(ids, snap).logits
    assert all(whole.pending_h[i].shape[1] == 1 for i in whole.pending_h)  # no per-position snapshot
    whole.commit(ids.shape[1])
    snap.commit(ids.shape[1])
    torch.testing.assert_close(a, b)
    for k, v in snap.state().items():
        torch.testing.assert_close(whole.state()[k], v, rtol=1e-10, atol=1e-10)
    if tgt.cfg.is_hybrid:
        again = tgt.new_cache(64)
        tgt(ids, again, commit_all=True)
        with pytest.raises(ValueError, match="commit all"):
            again.commit(3)
