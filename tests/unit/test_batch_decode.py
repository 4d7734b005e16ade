"""Batched decoding (FastDecoder lanes, Engine.generate_batch): every request's tokens equal its own
AR tokens, whatever shares its steps — ragged prompts and limits, requests joining and leaving
mid-decode, idle lanes, EOS inside accepted blocks, trees and chains, every family, in float64;
and so under the batch's row selection (a shared node budget that starves some lanes, per-request
draft lengths), with each lane never accepting past its length.

The drafter is a noisy oracle per request (it proposes the request's own AR continuation with
errors), so accepted paths run deep and every lane accepts a different length each step."""

import random
from functools import lru_cache

import pytest
import torch
from hypothesis import given, settings, strategies as st

from specpilot.engine.decode import generate
from specpilot.engine.drafters import DraftLM, FeatureDrafter, NgramDrafter
from specpilot.engine.engine import Engine, EngineConfig, accepted_per_position
from specpilot.engine.fast import FastDecoder
from specpilot.engine.lengths import parse as parse_lengths
from specpilot.engine.replay import make_policy
from specpilot.engine.synthetic import (FAMILIES, NoisyOracle, random_drafter_net, random_eagle3_net, random_model,
                                        tiny_config)

VOCAB = 61
POLICIES = ("chain", "best-first:10", "topk:3:10")

pytestmark = pytest.mark.usefixtures("one_thread")


@lru_cache(maxsize=None)
def target(family):
    return random_model(tiny_config(family, vocab=VOCAB), seed=2, dtype=torch.float64)


@lru_cache(maxsize=None)
def ar(family, prompt: tuple, n: int) -> list[int]:
    return generate(target(family), list(prompt), n, eos=set()).tokens


class PerRequestOracle(NoisyOracle):
    """A NoisyOracle that finds its continuation by the prompt it is shown after a reset (and, in
    `noise`, a request's own error rate by its prompt's first token; `calibrated`: scores that say it)."""

    def __init__(self, family, p, seed, markov=False, noise: dict | None = None, calibrated=False):
        super().__init__([], 0, p, seed, VOCAB, markov=markov, calibrated=calibrated)
        self.family, self.noise, self.base = family, noise or {}, p

    def observe(self, committed, next_tokens, feats=None) -> None:
        if self.seen == 0:  # the prompt: its continuation, and noise of its own
            self.p = self.noise.get(committed[0], self.base)
            self.cont, self.prompt_len = ar(self.family, tuple(committed), 64), len(committed)
            mine = self.seed * 7919 + sum((i + 1) * t for i, t in enumerate(committed))
            self.rng, self.gen = random.Random(mine), torch.Generator().manual_seed(mine)
        super().observe(committed, next_tokens, feats)


prompts_st = st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12), min_size=1, max_size=5)


@settings(max_examples=25, deadline=None)
@given(family=st.sampled_from(FAMILIES), spec=st.sampled_from(POLICIES), lanes=st.integers(1, 3),
       prompts=prompts_st, data=st.data(), p=st.sampled_from([0.0, 0.2, 0.5]), seed=st.integers(0, 3),
       markov=st.booleans())
def test_every_request_gets_its_own_ar_tokens(family, spec, lanes, prompts, data, p, seed, markov):
    limits = data.draw(st.lists(st.integers(1, 30), min_size=len(prompts), max_size=len(prompts)))
    oracle = PerRequestOracle(family, p, seed, markov)
    dec = FastDecoder(target(family), oracle, 6, make_policy(spec, None), max_len=128, graphs=False, lanes=lanes)
    out = dec.generate_batch(prompts, limits, eos=set())
    for prompt, n, res in zip(prompts, limits, out):
        assert res.tokens == ar(family, tuple(prompt), n)
        assert all(1 <= s.tau <= s.drafted + 1 for s in res.steps)
        assert sum(s.tau for s in res.steps) + 1 >= len(res.tokens)


def test_paths_run_deep_and_lanes_accept_different_lengths():
    """The property above means something only if lanes accept long and unequal paths."""
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]
    dec = FastDecoder(target("hybrid"), PerRequestOracle("hybrid", 0.2, 1), 6, None, max_len=128, graphs=False,
                      lanes=3)
    out = dec.generate_batch(prompts, [30, 30, 30], eos=set())
    taus = [[s.tau for s in r.steps] for r in out]
    assert max(max(t) for t in taus) == 7
    assert any(len({t[i] for t in taus}) > 1 for i in range(min(map(len, taus))))


@pytest.mark.parametrize("family", ["llama", "hybrid"])
def test_a_new_prefill_length_mid_decode_leaves_the_decoding_lanes_alone(family):
    """Long prompts (a bucket not used before, whose every prompt count then runs once) admitted
    into lanes that free up while the other lanes decode: every request still gets its AR tokens."""
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [t % VOCAB for t in range(5, 45)], [t % VOCAB for t in range(50, 90)], [7, 7, 1]]
    limits = [40, 4, 20, 8, 10]
    dec = FastDecoder(target(family), PerRequestOracle(family, 0.2, 1), 6, None, max_len=128, graphs=False, lanes=4)
    out = dec.generate_batch(prompts, limits, eos=set())
    assert [r.tokens for r in out] == [ar(family, tuple(q), n) for q, n in zip(prompts, limits)]


def test_eos_and_limits_end_each_request_as_ar_does():
    tgt = target("qwen3")
    prompts = [[3, 1, 4], [1, 5, 9, 2], [6, 5], [3, 5, 8, 9]]
    free = [ar("qwen3", tuple(q), 30) for q in prompts]
    stop = free[0][6]  # the 7th token of the first request ends it (and any other that emits it)
    dec = FastDecoder(tgt, PerRequestOracle("qwen3", 0.1, 0), 5, None, max_len=128, graphs=False, lanes=2)
    out = dec.generate_batch(prompts, [30, 30, 3, 30], eos={stop})
    for q, n, res in zip(prompts, [30, 30, 3, 30], out):
        assert res.tokens == generate(tgt, q, n, eos={stop}).tokens


@pytest.mark.parametrize("drafter", [None, "ngram"])
def test_idle_lanes_leave_the_others_alone(drafter):
    """More lanes than requests: the idle lanes' rows run but commit nothing."""
    prompts = [[7, 7, 7, 7], [1, 2, 1, 2, 1]]
    dec = FastDecoder(target("sliding"), NgramDrafter() if drafter else None, 4, None, max_len=128, graphs=False,
                      lanes=4)
    out = dec.generate_batch(prompts, [25, 12], eos=set())
    assert [r.tokens for r in out] == [ar("sliding", tuple(q), n) for q, n in zip(prompts, [25, 12])]
    assert dec.cache.lengths[2:].tolist() == [0, 0]


def test_one_device_read_per_step_for_the_whole_batch(monkeypatch):
    """The host reads the device once per step (every lane's τ, path and bonus), plus once per
    prefill pass (its requests' first tokens: the prompts that find free lanes together share one),
    and the next step is already launched when it reads one."""
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3], [8, 9, 7, 9]]
    dec = FastDecoder(target("llama"), None, 4, None, max_len=128, graphs=False, lanes=2)
    reads = {"n": 0}
    for name in ("tolist", "item", "__int__"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _real=real, **k: reads.update(n=reads["n"] + 1)
                            or _real(self, *a, **k))
    out = dec.generate_batch(prompts, [9, 6, 11, 4], eos=set())
    monkeypatch.undo()
    # AR: a request of n tokens takes n - 1 steps. Lane 0 holds request 0 (8 steps), lane 1
    # request 1 (5). Each step is launched before the one before it is read, so a freed lane misses
    # the step already in flight: request 2 takes lane 1 from step 7 (10 steps: to step 16),
    # request 3 lane 0 from step 10 (3 steps). 16 steps, and the one launched past the end.
    # Requests 0 and 1 are prefilled in one pass, 2 and 3 each in their own.
    assert [len(r.steps) for r in out] == [8, 5, 10, 3]
    assert [r.prefill_with for r in out] == [2, 2, 1, 1]
    assert reads["n"] == 3 + 17


def device_drafter(kind: str, family: str = "llama"):
    tgt = target(family)
    if kind == "draft_lm":
        return DraftLM(target("llama"))  # the target itself: a perfect drafter
    base, copy = kind.removesuffix("+copy"), kind.endswith("+copy")
    if base == "eagle3":
        return FeatureDrafter(random_eagle3_net(tgt.cfg, seed=3, dtype=torch.float64, draft_vocab=40), tgt)
    return FeatureDrafter(random_drafter_net(base, tgt.cfg, seed=3, dtype=torch.float64, copy_head=copy), tgt)


def spied(dec: FastDecoder) -> list:
    """Every step's lattices [lanes, ...] as the device drafter proposes them."""
    seen, real = [], dec.device_draft.propose

    def spy(root):
        out = real(root)
        seen.append([None if t is None else t.clone() for t in out])
        return out

    dec.device_draft.propose = spy
    return seen


@pytest.mark.parametrize("kind, family, spec", [
    ("sequential", "llama", "chain"), ("block", "hybrid", "best-first:10"), ("block_markov", "qwen3", "topk:3:10"),
    ("block+copy", "llama", "best-first:10"), ("block_markov+copy", "sliding", "chain"), ("eagle3", "llama", "chain"),
    ("draft_lm", "llama", "best-first:10")])
def test_device_drafters_draft_each_lane_as_they_draft_one_request(kind, family, spec):
    """Each lane's drafter state is its request's own: every request's tokens are its AR tokens
    and, step by step, its lattices (tokens, scores, transitions) are those it gets decoded alone."""
    prompts, limits = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3]], [14, 9, 12]
    alone = []
    for q, n in zip(prompts, limits):
        dec = FastDecoder(target(family), device_drafter(kind, family), 5, make_policy(spec, None), max_len=128,
                          graphs=False)
        seen = spied(dec)
        res = dec.generate_batch([q], [n], eos=set())[0]
        assert res.tokens == ar(family, tuple(q), n)
        alone.append(seen[: len(res.steps)])
    dec = FastDecoder(target(family), device_drafter(kind, family), 5, make_policy(spec, None), max_len=128,
                      graphs=False, lanes=3)
    seen = spied(dec)
    out = dec.generate_batch(prompts, limits, eos=set())
    for b, (q, n, res) in enumerate(zip(prompts, limits, out)):
        assert res.tokens == ar(family, tuple(q), n)
        assert len(res.steps) == len(alone[b])
        for mine, solo in zip(seen, alone[b]):  # lane b held request b from the first step to its last
            assert torch.equal(mine[0][b], solo[0][0])
            torch.testing.assert_close(mine[1][b], solo[1][0], rtol=0, atol=1e-9)
            if solo[2] is not None:
                torch.testing.assert_close(mine[2][b], solo[2][0], rtol=0, atol=1e-9)


def test_a_perfect_draft_lm_accepts_its_whole_draft_in_every_lane():
    """The draft LM is the target: every lane accepts every drafted token (a lane reading another's
    cache would not), with continuous batching refilling the lanes."""
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3], [8, 9, 7, 9], [2, 7, 1]]
    dec = FastDecoder(target("llama"), DraftLM(target("llama")), 4, None, max_len=128, graphs=False, lanes=2)
    out = dec.generate_batch(prompts, [21] * 5, eos=set())
    for q, res in zip(prompts, out):
        assert res.tokens == ar("llama", tuple(q), 21)
        assert [s.tau for s in res.steps] == [5] * 4


def test_accepted_per_position_counts_steps_past_each_position():
    from specpilot.engine.decode import Step

    steps = [Step(tau=t, drafted=3, t_draft=0, t_verify=0, t_commit=0) for t in (1, 2, 4, 3)]
    assert accepted_per_position(steps) == [0.75, 0.5, 0.25]
    assert accepted_per_position([]) == []


@pytest.fixture(scope="module")
def zoo_target(tmp_path_factory):
    from specpilot.engine.checkpoint import save_model

    folder = tmp_path_factory.mktemp("t")
    save_model(target("llama"), folder)
    return str(folder)


def test_engine_generate_batch_and_run(zoo_target):
    from specpilot.zoo.workloads import Request

    reqs = [Request(id=f"r{i}", prompt_ids=q, max_new_tokens=n)
            for i, (q, n) in enumerate([([1, 2, 1, 2, 1, 2], 10), ([4, 4, 4], 7), ([9], 12)])]
    eng = Engine(EngineConfig(target=zoo_target, drafter="ngram", dtype="float64", draft_len=4))
    batched = eng.run(reqs, batch=2)
    one = eng.run(reqs, batch=1)
    assert [o["tokens"] for o in batched["outputs"]] == [o["tokens"] for o in one["outputs"]]
    apc = batched["accepted_per_position"]
    assert batched["batch"] == 2 and apc and apc == sorted(apc, reverse=True)
    with pytest.raises(ValueError, match="batch 0"):
        eng.generate_batch(reqs, 0)
    eager = Engine(EngineConfig(target=zoo_target, drafter="ngram", dtype="float64", driver="eager"))
    with pytest.raises(ValueError, match="driver 'eager' decodes one request at a time"):
        eager.generate_batch(reqs, 2)


# --------------------------------------------------------------------------- row selection at batch > 1

RULES = [("shared:2:10", None), ("shared:4:8", "6,4,2"), ("shared:1:3", "6,2"), ("chain", "6,3"),
         ("best-first:8", "5,2"), ("topk:3:8", "6,2")]


@settings(max_examples=25, deadline=None)
@given(family=st.sampled_from(FAMILIES), rule=st.sampled_from(RULES), lanes=st.integers(1, 3), prompts=prompts_st,
       data=st.data(), p=st.sampled_from([0.0, 0.2, 0.5]), seed=st.integers(0, 3), markov=st.booleans())
def test_every_request_gets_its_own_ar_tokens_under_the_batch_rules(family, rule, lanes, prompts, data, p, seed,
                                                                     markov):
    spec, lens = rule
    limits = data.draw(st.lists(st.integers(1, 30), min_size=len(prompts), max_size=len(prompts)))
    noise = {t: 0.7 for t in range(0, VOCAB, 3)}  # a third of the requests are hard to draft
    oracle = PerRequestOracle(family, p, seed, markov, noise=noise, calibrated=seed % 2 == 1)
    dec = FastDecoder(target(family), oracle, 6, make_policy(spec, None), max_len=128, graphs=False, lanes=lanes,
                      lengths=parse_lengths(lens, 6) if lens else None)
    out = dec.generate_batch(prompts, limits, eos=set())
    allowed = set(parse_lengths(lens, 6)) if lens else {6}
    for prompt, n, res in zip(prompts, limits, out):
        assert res.tokens == ar(family, tuple(prompt), n)
        for s in res.steps:
            assert s.positions in allowed and 1 <= s.tau <= s.positions + 1  # never past the lane's length
            assert s.rows == lanes * dec.spec.rows and 1 <= s.lanes <= lanes


def test_a_shared_budget_starves_unsure_lanes_and_feeds_sure_ones():
    """Three lanes, 2 nodes each in all, at most 8 for one: the requests the (calibrated) drafter is
    sure of take the budget, the unsure one is left with its bonus token; every output is AR's."""
    prompts, limits = [[3, 1, 4, 1, 5], [9, 2, 6], [6, 5, 3, 5]], [24, 24, 24]
    oracle = PerRequestOracle("hybrid", 0.0, 1, noise={9: 0.9}, calibrated=True)
    dec = FastDecoder(target("hybrid"), oracle, 6, make_policy("shared:2:8", None), max_len=128, graphs=False,
                      lanes=3)
    out = dec.generate_batch(prompts, limits, eos=set())
    assert [r.tokens for r in out] == [ar("hybrid", tuple(q), n) for q, n in zip(prompts, limits)]
    steps = min(len(r.steps) for r in out)
    drafted = [[r.steps[i].drafted for r in out] for i in range(steps)]
    assert all(sum(d) <= 6 and max(d) <= 8 for d in drafted)
    assert any(d[1] == 0 and max(d) > 2 for d in drafted)  # starved beside a lane past its even share
    assert all(s.rows == 3 * 9 for r in out for s in r.steps)  # every lane plans the cap's rows


def test_each_lane_picks_its_length_and_never_accepts_past_it():
    """Chains capped at lengths 3 / 2: a perfect drafter accepts the longest (3) every step; a
    hopeless one (its top-1 always wrong) drops to the shortest as its recent acceptance halves
    (1.5 → 0.75 → 0.375: needs 4, 2.5, 1.75); both outputs are AR's."""
    prompts, limits = [[3, 1, 4, 1, 5], [9, 2, 6]], [25, 25]
    dec = FastDecoder(target("sliding"), PerRequestOracle("sliding", 0.0, 2, noise={9: 1.0}), 6, None, max_len=128,
                      graphs=False, lanes=2, lengths=(3, 2))
    easy, hard = dec.generate_batch(prompts, limits, eos=set())
    assert easy.tokens == ar("sliding", (3, 1, 4, 1, 5), 25) and hard.tokens == ar("sliding", (9, 2, 6), 25)
    assert [s.positions for s in easy.steps] == [3] * 6 and [s.tau for s in easy.steps] == [4] * 6  # 24 after the first
    assert [s.positions for s in hard.steps] == [3, 3] + [2] * (len(hard.steps) - 2)
    assert all(s.tau == 1 for s in hard.steps)


@pytest.mark.parametrize("kind, family", [("block", "hybrid"), ("sequential", "llama"),
                                          ("block_markov+copy", "sliding"), ("draft_lm", "llama")])
def test_device_drafters_under_the_batch_rules(kind, family):
    prompts, limits = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3], [2, 7]], [14, 9, 12, 10]
    dec = FastDecoder(target(family), device_drafter(kind, family), 5, make_policy("shared:3:9", None), max_len=128,
                      graphs=False, lanes=3, lengths=(5, 3, 2))
    out = dec.generate_batch(prompts, limits, eos=set())
    for q, n, res in zip(prompts, limits, out):
        assert res.tokens == ar(family, tuple(q), n)
        assert all(1 <= s.tau <= s.positions + 1 and s.drafted <= 9 for s in res.steps)


def test_engine_batch_rules_at_batch_1_and_n(zoo_target):
    from specpilot.zoo.workloads import Request

    reqs = [Request(id=f"r{i}", prompt_ids=q, max_new_tokens=n)
            for i, (q, n) in enumerate([([1, 2, 1, 2, 1, 2], 10), ([4, 4, 4], 7), ([9], 12)])]
    eng = Engine(EngineConfig(target=zoo_target, drafter="ngram", dtype="float64", draft_len=4, mode="tree",
                              tree="shared:3:8", draft_lens="4,2"))
    assert eng.driver == "static"
    batched, one = eng.run(reqs, batch=2), eng.run(reqs, batch=1)
    truth = [ar("llama", tuple(r.prompt_ids), r.max_new_tokens) for r in reqs]
    assert [o["tokens"] for o in batched["outputs"]] == [o["tokens"] for o in one["outputs"]] == truth
    assert one["verified_rows_mean"] == 4  # alone: best-first:3 over 3 nodes and the root
    assert 9 <= batched["verified_rows_mean"] <= 2 * 9  # two lanes of 9 rows over the requests each pass decoded


# --------------------------------------------------------------------------- prompt admission

ADMIT = [("chain", None), ("best-first:10", None), ("topk:3:10", None), ("shared:2:10", "6,3")]


@settings(max_examples=25, deadline=None)
@given(family=st.sampled_from(FAMILIES), rule=st.sampled_from(ADMIT), lanes=st.integers(1, 3), prompts=prompts_st,
       data=st.data(), p=st.sampled_from([0.0, 0.2, 0.5]), seed=st.integers(0, 3), admit=st.sampled_from([1, 2, 8]))
def test_every_request_gets_its_own_ar_tokens_when_prompts_ride_verify_steps(family, rule, lanes, prompts, data, p,
                                                                              seed, admit):
    spec, lens = rule
    limits = data.draw(st.lists(st.integers(1, 30), min_size=len(prompts), max_size=len(prompts)))
    dec = FastDecoder(target(family), PerRequestOracle(family, p, seed), 6, make_policy(spec, None), max_len=128,
                      graphs=False, lanes=lanes, lengths=parse_lengths(lens, 6) if lens else None, admit_steps=admit)
    out = dec.generate_batch(prompts, limits, eos=set())
    for prompt, n, res in zip(prompts, limits, out):
        assert res.tokens == ar(family, tuple(prompt), n)
        assert res.prefill_steps <= admit and sum(s.tau for s in res.steps) + 1 >= len(res.tokens)


def admissions(dec: FastDecoder, seen: list) -> dict:
    """lane → [(the first step feeding its prompt, steps it takes)], recorded as `_feed_start` runs:
    with the next step launched before each read, the steps launched so far are the proposals made."""
    got, real = {}, dec._feed_start

    def spy(lane, prompt):
        k = real(lane, prompt)
        got.setdefault(lane, []).append((len(seen), k))
        return k

    dec._feed_start = spy
    return got


@pytest.mark.parametrize("kind, family, spec", [
    ("sequential", "llama", "chain"), ("block", "hybrid", "best-first:10"), ("block_markov+copy", "sliding", "chain"),
    ("eagle3", "qwen3", "topk:3:10"), ("draft_lm", "llama", "best-first:10")])
def test_a_fed_prompt_leaves_its_drafter_as_a_prefill_pass_does(kind, family, spec):
    """Two lanes, five requests: later ones ride a busy lane's verify steps, 6 prompt rows a step
    (a chain of draft length 5, or the tree's path rows). Every request gets its AR tokens,
    and from its first decode step on its lattices are those it gets decoded alone: its prompt
    reached the drafter's state exactly as a prefill pass puts it there, and its draft length
    starts as a prefilled request's does."""
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3], [2], [t % VOCAB for t in range(7, 20)]]
    limits = [14, 9, 12, 10, 8]
    alone = []
    for q, n in zip(prompts, limits):
        dec = FastDecoder(target(family), device_drafter(kind, family), 5, make_policy(spec, None), max_len=128,
                          graphs=False, lengths=(5, 4, 3, 2))
        seen = spied(dec)
        res = dec.generate_batch([q], [n], eos=set())[0]
        alone.append((seen[: len(res.steps)], [(s.tau, s.positions) for s in res.steps]))
    dec = FastDecoder(target(family), device_drafter(kind, family), 5, make_policy(spec, None), max_len=128,
                      graphs=False, lanes=2, lengths=(5, 4, 3, 2), admit_steps=3)
    seen = spied(dec)
    fed = admissions(dec, seen)
    out = dec.generate_batch(prompts, limits, eos=set())
    assert [r.tokens for r in out] == [ar(family, tuple(q), n) for q, n in zip(prompts, limits)]
    riders = [i for i, r in enumerate(out) if r.prefill_steps]  # the first wave had a pass (no lane was busy)
    assert riders[0] == 2 and len(riders) >= 2
    assert all(out[i].prefill_steps == -(-len(prompts[i]) // dec.feed) <= 3 for i in riders)
    starts = sorted((s, k, lane) for lane, runs in fed.items() for s, k in runs)  # in admission order
    assert len(starts) == len(riders)
    for b, (first, k, lane) in zip(riders, starts):
        solo, taus = alone[b]
        assert [(s.tau, s.positions) for s in out[b].steps] == taus  # its draft lengths too
        for j, lattice in enumerate(solo):  # its decode steps: from the step after the last one feeding it
            mine = seen[first + k + j]
            assert torch.equal(mine[0][lane], lattice[0][0])
            torch.testing.assert_close(mine[1][lane], lattice[1][0], rtol=0, atol=1e-9)
            if lattice[2] is not None:
                torch.testing.assert_close(mine[2][lane], lattice[2][0], rtol=0, atol=1e-9)


def test_only_prompts_that_fit_ride_and_only_beside_busy_lanes(monkeypatch):
    """AR (one row a lane a step): a prompt of at most `admit_steps` tokens rides the busy lane's
    steps, a longer one waits for a prefill pass; an idle batch always prefills in a pass. The host
    still reads the device once a step: a fed prompt's first token is in its last step's result."""
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3], [8, 9, 7, 9, 1, 1, 2], [4]]
    limits = [20, 4, 9, 3, 3]  # lane 0 decodes request 0 (19 steps) while lane 1 takes the others
    dec = FastDecoder(target("hybrid"), None, 4, None, max_len=128, graphs=False, lanes=2, admit_steps=3)
    reads = {"n": 0}
    for name in ("tolist", "item", "__int__"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _real=real, **k: reads.update(n=reads["n"] + 1)
                            or _real(self, *a, **k))
    out = dec.generate_batch(prompts, limits, eos=set())
    monkeypatch.undo()
    assert [r.tokens for r in out] == [ar("hybrid", tuple(q), n) for q, n in zip(prompts, limits)]
    # Lane 0: request 0, steps 0–18. Lane 1: request 1 (steps 0–2); request 2 is fed in steps 4–5
    # (step 3 was in flight when its lane freed) and decodes in 6–13; request 3 (7 tokens) gets a
    # pass and steps 15–16; request 4 is fed in step 18 and decodes in 19–20, when lane 0 is idle.
    assert [r.prefill_steps for r in out] == [0, 0, 2, 0, 1]
    assert [r.prefill_with for r in out] == [2, 2, 1, 1, 1]
    assert [len(r.steps) for r in out] == [19, 3, 8, 2, 2]
    assert reads["n"] == 2 + 22  # two passes; steps 0–20 and the one launched past the end


def test_admission_is_refused_in_one_line_for_a_bad_count():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="admit_steps"):
            FastDecoder(target("llama"), None, 4, None, max_len=64, graphs=False, lanes=2, admit_steps=bad)


def test_a_fed_request_drafts_its_longest_length_first_as_a_prefilled_one_does():
    """Lengths 4 / 3 / 2 and a perfect drafter: a request starts at the longest and keeps it. The
    steps that feed a prompt are not its acceptance (a one-token prompt fed in one step would
    otherwise halve its recent acceptance and start it at 3)."""
    prompts, limits = [[3, 1, 4, 1, 5], [9, 2, 6], [7]], [30, 3, 16]
    dec = FastDecoder(target("llama"), PerRequestOracle("llama", 0.0, 2), 6, None, max_len=128, graphs=False,
                      lanes=2, lengths=(4, 3, 2), admit_steps=2)
    out = dec.generate_batch(prompts, limits, eos=set())
    assert [r.tokens for r in out] == [ar("llama", tuple(q), n) for q, n in zip(prompts, limits)]
    assert [r.prefill_steps for r in out] == [0, 0, 1]
    assert [s.positions for s in out[2].steps] == [4] * 3 and [s.tau for s in out[2].steps] == [5] * 3


def test_engine_admits_prompts_into_verify_steps(zoo_target):
    from specpilot.zoo.workloads import Request

    reqs = [Request(id=f"r{i}", prompt_ids=q, max_new_tokens=n)
            for i, (q, n) in enumerate([([1, 2, 1, 2, 1, 2], 24), ([4, 4, 4], 5), ([9, 3], 12), ([5], 6)])]
    truth = [ar("llama", tuple(r.prompt_ids), r.max_new_tokens) for r in reqs]
    for mode, drafter in (("ar", None), ("chain", "ngram")):
        eng = Engine(EngineConfig(target=zoo_target, drafter=drafter, mode=mode, dtype="float64", draft_len=4,
                                  admit_steps=2))
        out = eng.run(reqs, batch=2)["outputs"]
        assert [o["tokens"] for o in out] == truth
        assert [o["prefill_steps"] for o in out][:3] == [0, 0, 2 if mode == "ar" else 1]  # AR feeds a token a step
    for bad, says in ((-1, "admit_steps -1: expected a count"), ("2", "admit_steps '2'")):
        with pytest.raises(ValueError, match=says):
            EngineConfig(target=zoo_target, mode="ar", admit_steps=bad).validate()
    with pytest.raises(ValueError, match="driver 'eager' cannot run it"):
        EngineConfig(target=zoo_target, mode="ar", admit_steps=2, driver="eager").validate()


def test_a_lane_feeding_a_prompt_gives_its_share_of_a_shared_budget_to_the_drafting_lanes():
    """shared:2:8 over two lanes: 4 nodes in all. Lane 1's lattice is sure (one candidate a
    position), lane 0's flat: drafting, lane 1 takes the 4; feeding a prompt (its rows the
    prompt's), its stale lattice takes none and lane 0 gets them."""
    dec = FastDecoder(target("llama"), PerRequestOracle("llama", 0.0, 1), 6, make_policy("shared:2:8", None),
                      max_len=128, graphs=False, lanes=2, admit_steps=2)
    tok, logp, _ = dec.lat
    tok.copy_(torch.arange(tok.shape[-1]).expand_as(tok))
    logp.zero_()
    logp[1, :, 1:] = -30.0
    dec.active.fill_(1)
    nodes = lambda rows: (rows.valid.sum(1) - 1).tolist()  # noqa: E731
    assert nodes(dec._build_tree(False)) == [0, 4]
    dec.feed_len[1], dec.fed[1] = 5, 0  # lane 1 feeds a prompt of 5 tokens
    assert nodes(dec._build_tree(False)) == [4, 0]
