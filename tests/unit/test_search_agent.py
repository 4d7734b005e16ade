"""The built-in search agent: variants from the memory, pruned by exact replay and the cost model."""

import dataclasses
import math

import pytest

from specpilot.services.memory_api.seed import seed_entries
from specpilot.services.planner.agents import Context
from specpilot.services.planner.search_agent import SearchAgent, rows_of, step_cost_at

INCUMBENT = {"target": "T", "drafter": "D", "mode": "chain", "draft_len": 16, "max_new_tokens": 48, "device": "cpu"}
BUDGETS = [  # measured: c(N) grows with the rows verified
    {"policy": "chain", "rows": 17.0, "tau": 1.7, "c": 1.5},
    {"policy": "best-first:16", "rows": 17.0, "tau": 2.2, "c": 1.6},
    {"policy": "best-first:32", "rows": 33.0, "tau": 2.9, "c": 1.7},
    {"policy": "best-first:63", "rows": 64.0, "tau": 2.95, "c": 2.6},
]


def costmodel(replay, factors=None):
    return {"budgets": BUDGETS, "draft_len": 16, "tau_current": 1.7, "speedup_current": 1.7 / 1.5,
            "replay": replay, "ceiling": {"factors": factors or {"tree": 2.0, "kernels": 1.5, "off_profile": 1.1}}}


def ctx(replay, direction="tree", factors=None, deployment=None, incumbent=INCUMBENT, tried=(), memory=None):
    return Context(round=1, deployment=deployment or {"drafters": {}}, incumbent=incumbent, incumbent_patch="",
                   costmodel=costmodel(replay, factors), direction=direction,
                   memory=[e.to_dict() for e in memory or seed_entries()], tried=tried)


SPECULATION = [e for e in seed_entries() if not e.limits]  # the entries a CPU deployment ports


REPLAY = {"best-first:16": 2.2, "best-first:32": 2.9, "best-first:63": 2.95, "topk:4:16": 1.6, "topk:8:32": 2.5,
          "chain": 1.7, "oracle": 3.6}


def test_the_planted_best_variant_comes_first_and_replay_prunes_what_cannot_gain():
    agent = SearchAgent(max_candidates=2)
    got = agent.propose(ctx(REPLAY))
    assert [c.name for c in got] == ["tree-best-first/n32", "tree-best-first/n16"]
    assert got[0].options == {"mode": "tree", "tree": "best-first:32", "draft_len": 16}
    assert got[0].entry == "tree-best-first@1" and got[0].variant == "n32"
    assert math.isclose(got[0].predicted["speedup"], 2.9 / 1.7)
    pruned = {p["name"]: p["pruned"] for p in agent.last_log["pruned"]}
    assert "exact replay" in pruned["tree-topk/k4n16"]  # τ 1.6 ≤ the incumbent's 1.7
    # best-first:63: τ 2.95 at c 2.6 → ×1.13, not below 0.97 × ×1.13: kept, ranked below n16 (×1.375)
    assert "tree-best-first/n63" not in pruned


def test_the_cost_model_prunes_a_variant_whose_rows_cost_more_than_its_tau_gains():
    replay = {**REPLAY, "best-first:63": 2.0}  # ×0.77 predicted against ×1.13 now
    agent = SearchAgent(max_candidates=5)
    names = [c.name for c in agent.propose(ctx(replay))]
    pruned = {p["name"]: p["pruned"] for p in agent.last_log["pruned"]}
    assert "tree-best-first/n63" not in names and "cost model" in pruned["tree-best-first/n63"]


def test_a_direction_no_variant_attacks_falls_to_the_next_factor_and_says_so():
    agent = SearchAgent()
    got = agent.propose(ctx(REPLAY, direction="kernel:target_linear",
                            factors={"tree": 2.0, "kernels": 9.0, "off_profile": 1.2}, memory=SPECULATION))
    assert got and all(c.options.get("mode") in ("tree", "chain") for c in got)
    assert agent.last_log["factor_order"] == ["kernels", "tree", "off_profile"]
    assert "kernels" in agent.last_log["notes"][0] and "tree" in agent.last_log["notes"][1]


def test_a_drafter_named_by_kind_needs_the_deployment_to_have_it():
    agent = SearchAgent(max_candidates=20)
    names = [c.name for c in agent.propose(ctx(REPLAY))]
    assert not any(n.startswith("drafter-block-markov") for n in names)
    assert any("block_markov" in s["reason"] for s in agent.last_log["skipped"])
    got = agent.propose(ctx(REPLAY, deployment={"drafters": {"block_markov": "/m"}}))
    markov = [c for c in got if c.name.startswith("drafter-block-markov")]
    assert markov and all(c.options["drafter"] == "/m" and c.predicted is None for c in markov)
    assert [c.predicted is None for c in got] == sorted(c.predicted is None for c in got)  # predicted first


def test_what_the_incumbent_runs_or_an_earlier_round_tried_is_not_proposed_again():
    inc = {**INCUMBENT, "mode": "tree", "tree": "best-first:32"}
    agent = SearchAgent(max_candidates=20)
    names = [c.name for c in agent.propose(ctx(REPLAY, incumbent=inc, tried=("tree-best-first/n16",)))]
    assert "tree-best-first/n32" not in names and "tree-best-first/n16" not in names
    reasons = {s["name"]: s["reason"] for s in agent.last_log["skipped"]}
    assert "already runs" in reasons["tree-best-first/n32"] and "earlier round" in reasons["tree-best-first/n16"]


def test_step_cost_interpolates_in_the_rows_and_rows_follow_the_policy():
    assert rows_of({"mode": "tree", "tree": "topk:8:32"}) == 33
    assert rows_of({"mode": "chain", "draft_len": 8}) == 9
    pts = [{"rows": 10.0, "c": 1.0}, {"rows": 20.0, "c": 2.0}, {"rows": 40.0, "c": 3.0}]
    assert step_cost_at(15, pts) == pytest.approx(1.5)
    assert step_cost_at(30, pts) == pytest.approx(2.5)
    assert step_cost_at(50, pts) == pytest.approx(3.5)  # beyond: the last two points' line
    with pytest.raises(ValueError, match="row count"):
        step_cost_at(5, [])


def test_two_variants_that_make_the_same_system_are_one_candidate():
    dep = {"drafters": {"block_markov": "D"}}  # the incumbent already runs the block_markov drafter
    agent = SearchAgent(max_candidates=20)
    names = [c.name for c in agent.propose(ctx(REPLAY, deployment=dep))]
    assert "tree-best-first/n32" in names and "drafter-block-markov/best-first-n32" not in names
    reasons = {s["name"]: s["reason"] for s in agent.last_log["skipped"]}
    assert reasons["drafter-block-markov/best-first-n32"] == "the same system as tree-best-first/n32"


def test_a_variant_equal_to_one_tried_before_is_not_proposed_again_under_another_name():
    dep = {"drafters": {"block_markov": "D"}}
    agent = SearchAgent(max_candidates=20)
    names = [c.name for c in agent.propose(ctx(REPLAY, deployment=dep, tried=("tree-best-first/n32",)))]
    assert "tree-best-first/n32" not in names and "drafter-block-markov/best-first-n32" not in names
    reasons = {s["name"]: s["reason"] for s in agent.last_log["skipped"]}
    assert reasons["tree-best-first/n32"] == "evaluated in an earlier round"
    assert reasons["drafter-block-markov/best-first-n32"] == "the same system as tree-best-first/n32"


def test_the_weight_read_direction_proposes_the_weight_formats_unpruned():
    agent = SearchAgent(max_candidates=5)
    got = agent.propose(ctx(REPLAY, direction="kernel:target_linear",
                            factors={"tree": 1.3, "kernels": 1.6, "off_profile": 1.1}))
    assert {c.name for c in got} == {"weights-w12/layers", "weights-w12/layers-and-head", "lm-head-certified/int8",
                                     "driver-static/static"}
    assert all(c.predicted is None for c in got)  # τ stays, c changes: replay cannot tell, timing will
    assert not agent.last_log["pruned"] or all(not p["name"].startswith(("weights", "lm-head"))
                                               for p in agent.last_log["pruned"])
    tree_first = agent.propose(ctx(REPLAY, factors={"tree": 2.0, "kernels": 1.6, "off_profile": 1.1}))
    assert tree_first and not any({"weights", "lm_head"} & set(c.options) for c in tree_first)


# --------------------------------------------------------------------------- a deployment without a drafter

AR_INCUMBENT = {"target": "T", "mode": "ar", "max_new_tokens": 48, "device": "cpu"}  # stock_config without a drafter


def ar_ctx(direction="kernel:target_linear", factors=None, deployment=None, memory=None):
    """An AR incumbent's round: the cost model of its one "ar" row (c 1, τ 1), no replay."""
    cm = {"budgets": [{"policy": "ar", "rows": 1.0, "tau": 1.0, "t_step_s": 0.01, "c": 1.0, "speedup": 1.0}],
          "tau_current": 1.0, "speedup_current": 1.0, "replay": {},
          "ceiling": {"factors": factors or {"tree": 1.0, "kernels": 9.0, "off_profile": 1.2}}}
    return Context(round=1, deployment=deployment or {"drafters": {}}, incumbent=AR_INCUMBENT, incumbent_patch="",
                   costmodel=cm, direction=direction, memory=[e.to_dict() for e in memory or seed_entries()], tried=())


def test_an_ar_incumbent_gets_the_weight_formats_and_speculation_without_a_drafter_is_skipped():
    agent = SearchAgent(max_candidates=5)
    got = agent.propose(ar_ctx())
    assert {c.name for c in got} == {"weights-w12/layers", "weights-w12/layers-and-head", "lm-head-certified/int8",
                                     "driver-static/static"}
    assert all(c.predicted is None and "drafter" not in c.options for c in got)
    reasons = {s["name"]: s["reason"] for s in agent.last_log["skipped"]}
    speculation = [f"{e.id}/{v}" for e in seed_entries() for v, o in e.variants.items() if "mode" in o]
    assert speculation and set(speculation) <= set(reasons)
    for name in speculation:
        if name.startswith("drafter-block-markov"):
            assert "no block_markov drafter" in reasons[name]
        else:
            assert "needs a drafter" in reasons[name] and "decodes AR" in reasons[name]
    assert agent.last_log["pruned"] == []


def test_an_ar_incumbent_may_switch_to_a_drafter_the_deployment_names_by_kind():
    agent = SearchAgent(max_candidates=5)
    dep = {"drafters": {"block_markov": "/m"}}
    got = agent.propose(ar_ctx(deployment=dep, memory=SPECULATION))  # no weight format: the tree factor is next
    assert got and {c.name for c in got} == {"drafter-block-markov/chain-d8", "drafter-block-markov/best-first-n32"}
    for c in got:  # a whole speculative system on top of the AR incumbent; nothing to replay it on
        assert c.options["drafter"] == "/m" and c.options["mode"] in ("chain", "tree") and c.predicted is None
    assert agent.last_log["factor_order"][0] == "kernels" and "kernels" in agent.last_log["notes"][0]
    reasons = {s["name"]: s["reason"] for s in agent.last_log["skipped"]}
    assert "needs a drafter" in reasons["tree-best-first/n32"] and "needs a drafter" in reasons["draft-length/d8"]


# --------------------------------------------------------------------------- at a batch

# measured at batch 4: the rows are the step's (4 × per request), and every row costs
BATCH4 = [
    {"policy": "chain", "rows": 68.0, "tau": 1.7, "c": 2.0},
    {"policy": "best-first:16", "rows": 68.0, "tau": 2.2, "c": 2.0},
    {"policy": "best-first:32", "rows": 132.0, "tau": 2.9, "c": 3.6},
    {"policy": "best-first:63", "rows": 256.0, "tau": 2.95, "c": 6.4},
]


def test_at_a_large_batch_the_rows_direction_proposes_fewer_rows_priced_at_the_batch():
    """The incumbent verifies best-first:32 (33 rows per request, ×2.9 / 3.6 = ×0.806 over AR at
    batch 4). Fewer rows attack the rows factor: best-first:16 replays to τ 2.2, below the
    incumbent's, yet at c 2.0 it predicts ×1.1 and is proposed first, not pruned by its τ; the
    chain (τ 1.7, c 2.0: ×0.85) next. topk:4:16 is priced at 4 × 17 = 68 rows (c 2.0: ×0.8)."""
    inc = {**INCUMBENT, "mode": "tree", "tree": "best-first:32"}
    cm = {"batch": 4, "budgets": BATCH4, "draft_len": 16, "tau_current": 2.9, "speedup_current": 2.9 / 3.6,
          "replay": REPLAY, "ceiling": {"factors": {"tree": 1.24, "kernels": 1.1, "off_profile": 1.05, "rows": 3.0}}}
    context = Context(round=1, deployment={"drafters": {}}, incumbent=inc, incumbent_patch="", costmodel=cm,
                      direction="rows", memory=[e.to_dict() for e in SPECULATION], tried=())
    agent = SearchAgent(max_candidates=3)
    got = agent.propose(context)
    assert [c.name for c in got] == ["tree-best-first/n16", "draft-length/d16", "tree-topk/k4n16"]
    assert [c.predicted["speedup"] for c in got] == pytest.approx([2.2 / 2.0, 1.7 / 2.0, 1.6 / 2.0])
    assert [c.predicted["cost"] for c in got] == ["measured", "measured", "interpolated"]
    assert agent.last_log["factor_order"][0] == "rows"
    pruned = {p["name"]: p["pruned"] for p in agent.last_log["pruned"]}
    assert "cost model" in pruned["tree-best-first/n63"]  # wider: ×2.95 / 6.4 = ×0.46 at its 256 rows
    assert not any(n.startswith(("tree-best-first/n16", "draft-length")) for n in pruned)
    assert rows_of({"mode": "ar"}) == 1


# --------------------------------------------------------------------------- the batch's row selection

BATCH_RULES = [e for e in seed_entries() if e.id.startswith("batch-")]


def test_the_batch_rules_are_skipped_at_batch_1_and_proposed_unpredicted_at_batch_n():
    agent = SearchAgent(max_candidates=3)
    alone = agent.propose(ctx(REPLAY))
    assert not any(c.name.startswith("batch-") for c in alone)
    reasons = {s["name"]: s["reason"] for s in agent.last_log["skipped"]}
    assert all("one request at a time" in reasons[f"{e.id}/{v}"] for e in BATCH_RULES for v in e.variants)
    replay = {**REPLAY, "shared:16:32": 2.2}  # replayed one request at a time: best-first:16's τ, no batch in it
    got = agent.propose(ctx(replay, deployment={"drafters": {}, "batch": 8}))
    names = [c.name for c in got]
    assert names[:2] == ["tree-best-first/n32", "tree-best-first/n16"] and names[2].startswith("batch-")
    assert got[2].predicted is None and "batch's row selection" in " ".join(agent.last_log["notes"])
    assert not any(p["name"].startswith("batch-") for p in agent.last_log["pruned"])
    wide = SearchAgent(max_candidates=20).propose(ctx(replay, deployment={"drafters": {}, "batch": 8}))
    assert {c.name for c in wide} >= {f"{e.id}/{v}" for e in BATCH_RULES for v in e.variants}
    assert rows_of({"mode": "tree", "tree": "shared:16:48"}) == 49  # every lane plans the cap's rows


def test_per_request_draft_lengths_are_not_proposed_to_an_ar_system():
    agent = SearchAgent(max_candidates=20)
    agent.propose(ar_ctx(deployment={"drafters": {}, "batch": 4}))
    reasons = {s["name"]: s["reason"] for s in agent.last_log["skipped"]}
    assert "decodes AR" in reasons["batch-draft-length/16-12-8"]
    assert "needs a drafter" in reasons["batch-shared-budget/n16-c32"]
    assert not any(n.startswith("batch-prompt-admission") for n in reasons)  # AR batches admit prompts too


# --------------------------------------------------------------------------- two-level verification

TLV = [e for e in seed_entries() if e.id == "tlv"]
# a one-pass step of 12 ms: the weight read 8 ms of a 10 ms exact pass, the draft 0.6 ms
PER_CLASS = [{"class": "target_linear", "seconds": 8e-3}, {"class": "attention", "seconds": 1e-3},
             {"class": "lm_head", "seconds": 1e-3}, {"class": "drafter", "seconds": 0.5e-3},
             {"class": "tree_build", "seconds": 0.1e-3}]


def tlv_ctx(per_class=PER_CLASS):
    cm = {**costmodel(REPLAY), "current": "chain",
          "budgets": [{**BUDGETS[0], "t_step_s": 12e-3}, *BUDGETS[1:]],
          "ceiling": {"factors": {"tree": 2.0, "kernels": 1.5, "off_profile": 1.1}, "per_class": per_class}}
    return Context(round=1, deployment={"drafters": {}}, incumbent={**INCUMBENT, "dtype": "bfloat16"},
                   incumbent_patch="", costmodel=cm, direction="tree", memory=[e.to_dict() for e in TLV], tried=())


def test_tlv_is_proposed_only_where_its_q_pass_is_cheap_and_pruned_with_the_reason_elsewhere():
    views = SearchAgent(max_candidates=5, quick_bits=8)  # a Q pass reading 8 of 16 bits: 0.6 of the exact pass
    got = views.propose(tlv_ctx())
    assert {c.name for c in got} == {f"tlv/{v}" for v in TLV[0].variants}  # ×24 / (12 + 0.6 + 6) = ×1.29 at best
    assert all(c.predicted is None and c.options["mode"] == "tlv" for c in got)
    dense = SearchAgent(max_candidates=5)  # the engine's Q pass: a dense copy, as dear as the exact pass
    assert dense.propose(tlv_ctx()) == []
    why = {p["name"]: p["pruned"] for p in dense.last_log["pruned"]}
    assert set(why) == {f"tlv/{v}" for v in TLV[0].variants}
    assert all("1.00 of the exact pass" in w and "×1.06" in w for w in why.values())
    blind = SearchAgent(max_candidates=5, quick_bits=8)
    assert blind.propose(tlv_ctx(per_class=[])) == []
    assert all("no profile by kernel class" in p["pruned"] for p in blind.last_log["pruned"])
    assert rows_of(TLV[0].variants["n32-q8"]) == 33


def test_tlv_at_a_batch_is_proposed_with_a_device_drafter_and_skipped_with_the_host_one():
    views = SearchAgent(max_candidates=5, quick_bits=8)
    ctx = tlv_ctx()
    at_batch = dataclasses.replace(ctx, deployment={**ctx.deployment, "batch": 16})
    assert {c.name for c in views.propose(at_batch)} == {f"tlv/{v}" for v in TLV[0].variants}
    host = dataclasses.replace(at_batch, incumbent={**at_batch.incumbent, "drafter": "ngram"})
    assert views.propose(host) == []
    why = {s["name"]: s["reason"] for s in views.last_log["skipped"]}
    assert all("n-gram drafter drafts on the host" in why[f"tlv/{v}"] for v in TLV[0].variants)
