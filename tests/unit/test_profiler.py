"""engine/profiler.py: the decode-step profiler by kernel class (CPU, tiny random models)."""

from __future__ import annotations

import functools

import pytest
import torch

from specpilot.engine import decode, profiler, trees
from specpilot.engine.drafters import FeatureDrafter
from specpilot.engine.model import Attention, GatedDeltaNet
from specpilot.engine.synthetic import random_drafter_net, random_model, tiny_config

PROMPT = [5, 17, 3, 42, 8, 11]
NEW = 10
TOL = 2e-3  # seconds: clock reads of nested regions


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {fam: random_model(tiny_config(fam, vocab=97)) for fam in ("llama", "hybrid")}


def no_hooks(target, drafter=None):
    for m in target.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks, m
        assert "forward" not in vars(m) and "forward_tree" not in vars(m)
    if drafter is not None:
        assert "propose" not in vars(drafter) and "observe" not in vars(drafter)
    assert trees.chain is profiler.trees.chain and trees.chain.__name__ == "chain"
    assert trees.Tree.accept.__name__ == "accept" and trees.Tree.ancestor_mask.__name__ == "ancestor_mask"


def check_step_sums(res):
    assert res.steps and len(res.steps) == len(res.step_wall)
    for s in res.steps:
        assert set(s.kernels) == set(profiler.KERNEL_CLASSES)
        for c, st in s.kernels.items():
            assert st.seconds >= 0 and st.bytes >= 0 and st.flops >= 0, (c, st)
        assert s.profiled_seconds <= s.t_step + TOL
        assert s.kernels["other"].seconds >= 0
        assert sum(st.seconds for st in s.kernels.values()) == pytest.approx(max(s.t_step, s.profiled_seconds))


def linear_flops_one_row(target) -> float:
    return sum(2.0 * m.in_features * m.out_features for m in target.model.layers.modules()
               if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("family", ["llama", "hybrid"])
def test_ar_profile(models, family):
    target = models[family]
    res = profiler.profile_generate(target, PROMPT, NEW, eos=set())
    assert res.tokens == res.reference_tokens == decode.generate(target, PROMPT, NEW, eos=set()).tokens
    assert len(res.tokens) == NEW and res.t_ar > 0
    check_step_sums(res)
    for s in res.steps:
        assert s.n == 1 and s.tau == 1
        assert s.kernels["target_linear"].flops == linear_flops_one_row(target)
        assert s.kernels["lm_head"].flops == 2.0 * target.cfg.hidden_size * target.cfg.vocab_size
        assert s.kernels["target_linear"].seconds > 0 and s.kernels["attention"].seconds > 0
        assert s.kernels["drafter"].seconds == 0 and s.kernels["tree_build"].seconds == 0
        assert s.kernels["sampling_acceptance"].seconds > 0
    recurrent = sum(s.kernels["recurrent"].seconds for s in res.steps)
    if family == "hybrid":
        assert recurrent > 0 and all(s.kernels["recurrent"].flops > 0 for s in res.steps)
    else:
        assert recurrent == 0 and all(s.kernels["recurrent"].flops == 0 for s in res.steps)
    assert list(res.by_n) == [1] and res.by_n[1].n == 1
    no_hooks(target)


@pytest.mark.parametrize("family", ["llama", "hybrid"])
@pytest.mark.parametrize("tree", [False, True])
def test_speculative_profile(models, family, tree):
    target = models[family]
    drafter = FeatureDrafter(random_drafter_net("sequential", target.cfg, seed=1), target)
    policy = functools.partial(trees.best_first, n=6) if tree else None
    res = profiler.profile_generate(target, PROMPT, NEW, drafter=drafter, draft_len=4, policy=policy, eos=set())
    ref = decode.generate(target, PROMPT, NEW, drafter, 4, eos=set(), policy=policy)
    assert res.tokens == res.reference_tokens == ref.tokens
    check_step_sums(res)
    assert all(s.kernels["drafter"].seconds > 0 for s in res.steps[:-1])  # the last step may not draft
    assert any(s.kernels["tree_build"].seconds > 0 for s in res.steps)
    if family == "hybrid":
        assert all(s.kernels["recurrent"].seconds > 0 for s in res.steps)
    # Linear FLOPs scale with the rows verified
    for s in res.steps:
        assert s.kernels["target_linear"].flops == pytest.approx(s.n * linear_flops_one_row(target))
    assert sorted(res.by_n) == sorted({s.n for s in res.steps})
    no_hooks(target, drafter)


def test_hooks_removed_on_error(models):
    target = models["llama"]

    class Boom(Exception):
        pass

    def policy(root, lat):
        raise Boom

    drafter = FeatureDrafter(random_drafter_net("sequential", target.cfg, seed=1), target)
    with pytest.raises(Boom):
        profiler.profile_generate(target, PROMPT, NEW, drafter=drafter, draft_len=4, policy=policy, eos=set())
    no_hooks(target, drafter)
    assert decode.generate(target, PROMPT, 4, eos=set()).tokens  # still usable


def test_steps_feed_the_cost_model(models):
    costmodel = pytest.importorskip("specpilot.services.planner.costmodel")
    res = profiler.profile_generate(models["llama"], PROMPT, 4, eos=set())
    assert profiler.KERNEL_CLASSES == costmodel.KERNEL_CLASSES
    p = costmodel.Profile(**res.steps[0].as_profile())
    assert p.n == 1 and p.kernels["target_linear"].flops == res.steps[0].kernels["target_linear"].flops
    agg = costmodel.aggregate(costmodel.Profile(**s.as_profile()) for s in res.steps)
    assert agg.t_step == pytest.approx(res.by_n[1].t_step)


def test_shape_counts_attention_and_recurrent(models):
    target = models["hybrid"]
    res = profiler.profile_generate(target, PROMPT, 2, eos=set())
    c = target.cfg
    n_attn = sum(isinstance(m, Attention) for m in target.modules())
    n_gdn = sum(isinstance(m, GatedDeltaNet) for m in target.modules())
    keys = len(PROMPT) + 1  # the first decode step sees the prompt and its own row
    s = res.steps[0]
    assert s.kernels["attention"].flops == n_attn * 4.0 * keys * c.head_dim * c.num_attention_heads
    assert s.kernels["recurrent"].flops == n_gdn * 4.0 * c.linear_num_value_heads * c.linear_key_head_dim \
        * c.linear_value_head_dim


def test_lane_groups_fill_every_batch():
    p = [[1], [2], [3]]
    assert profiler.lane_groups(p, 2) == [[[1], [2]], [[3], [1]]]
    assert profiler.lane_groups(p, 1) == [[[1]], [[2]], [[3]]]
    assert profiler.lane_groups(p, 5) == [[[1], [2], [3], [1], [2]]]
    with pytest.raises(ValueError, match="no prompts"):
        profiler.lane_groups([], 2)


@pytest.mark.usefixtures("one_thread")
def test_a_batch_profile_runs_generate_batch_and_its_counts_follow_the_batch_rows():
    """profile_batch at batch 2 (the static driver's generate_batch on the CPU, float64): three
    prompts decode as two full batches (the second topped up with the first prompt), every
    request's tokens are its own AR tokens, a step verifies both lanes' rows and sums τ over the
    requests it decoded. Against batch 1 every per-row FLOP count doubles while the weights are
    read once per step: 2·bytes(1) − bytes(2) is the weight bytes."""
    from specpilot.engine.replay import make_policy

    tgt = random_model(tiny_config("hybrid", vocab=97), seed=2, dtype=torch.float64)
    drafter = FeatureDrafter(random_drafter_net("block_markov", tgt.cfg, seed=4, dtype=torch.float64, block=8), tgt)
    policy, prompts = make_policy("best-first:12"), [PROMPT, [7, 7, 1, 2], [9, 3, 30, 4, 4, 1, 2]]
    two = profiler.profile_batch(tgt, prompts, NEW, 2, drafter, 6, policy, eos=set())
    one = profiler.profile_batch(tgt, prompts, NEW, 1, drafter, 6, policy, eos=set())
    alone = [decode.generate(tgt, p, NEW, eos=set()).tokens for p in prompts + prompts[:1]]
    assert two.batch == 2 and two.tokens == two.ar_tokens == alone
    rows = 2 * 13  # best-first:12: the root and 12 nodes in each lane
    assert two.steps and {s.n for s in two.steps} == {rows} and list(two.by_n) == [rows]
    assert all(1 <= s.requests <= 2 and s.tau >= s.requests for s in two.steps)  # every request commits ≥ 1
    assert any(s.requests == 2 for s in two.steps)
    assert sum(s.tau for s in two.steps) >= sum(len(t) - 1 for t in two.tokens)  # all but the prefill's token
    assert two.t_ar > 0 and two.step_wall == [s.t_step for s in two.steps]
    for s in two.steps:
        assert s.kernels["other"].seconds == pytest.approx(max(s.t_step - s.profiled_seconds, 0.0))
    a, b = one.steps[0].kernels, two.steps[0].kernels
    for c in ("target_linear", "lm_head", "attention", "recurrent"):
        assert b[c].flops == 2 * a[c].flops > 0, c
        assert b[c].seconds > 0, c
    weights = sum(p.numel() * 8 for p in tgt.model.layers.parameters() if p.dim() == 2)
    assert 2 * a["target_linear"].bytes - b["target_linear"].bytes == weights
    assert 2 * a["lm_head"].bytes - b["lm_head"].bytes == tgt.lm_head_weight.numel() * 8
    costmodel = pytest.importorskip("specpilot.services.planner.costmodel")
    c = costmodel.ceiling(costmodel.Profile(**{**two.by_n[rows].as_profile(), "kernels": {
        k: v for k, v in b.items() if k != "other"}}), "cpu", 2.0, 3.0, batch=2)
    assert c.batch == 2 and c.rows == rows and c.rows_needed == 6.0


def test_a_batch_profile_refuses_what_batched_decoding_cannot_run(models):
    with pytest.raises(ValueError, match="batch 0: expected a positive integer"):
        profiler.profile_batch(models["llama"], [PROMPT], 4, 0)
    drafter = FeatureDrafter(random_drafter_net("sequential", models["llama"].cfg, seed=1), models["llama"])
    with pytest.raises(ValueError, match="batch 2: batched decoding cannot run the tree policy"):
        profiler.profile_batch(models["llama"], [PROMPT], 4, 2, drafter, 4, functools.partial(trees.best_first, n=6))
