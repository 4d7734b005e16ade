"""The dispatch table: a system per batch-size range, from the final systems measured at each size."""

import pytest

from specpilot.services.controller.round import dispatch_for, dispatch_table, lane

CHAIN = {"target": "T", "drafter": "D", "mode": "chain", "draft_len": 16, "device": "cpu"}
TREE = {**CHAIN, "mode": "tree", "tree": "best-first:32"}


def final(label, config, gain, over_ar=1.5, ar_lower=0.5):
    return {"label": label, "config": config, "speedup_over_stock": {"gain": gain, "lower_bound": gain - 0.01},
            "speedup_over_ar": {"gain": over_ar, "lower_bound": over_ar - 0.02, "ar_lower_bound": ar_lower}}


def test_each_entry_covers_its_batch_size_up_to_the_next_and_the_first_starts_at_one():
    t = dispatch_table([(2, final("tree-n32", TREE, 1.3)), (8, final("stock", CHAIN, 1.0)),
                        (32, final("chain-d8", {**CHAIN, "draft_len": 8}, 1.1))])
    spans = [(e["min_batch"], e["max_batch"], e["measured_at"]) for e in t["entries"]]
    assert spans == [(1, 7, 2), (8, 31, 8), (32, None, 32)]
    assert [e["label"] for e in t["entries"]] == ["tree-n32", "stock", "chain-d8"]
    assert t["note"] is None
    assert [dispatch_for(t, b)["measured_at"] for b in (1, 2, 7, 8, 31, 32, 500)] == [2, 2, 2, 8, 8, 32, 32]


def test_a_range_where_ar_beats_the_final_system_with_confidence_runs_without_speculation():
    t = dispatch_table([(1, final("tree-n32", TREE, 1.3)),
                        (16, final("stock", CHAIN, 1.0, over_ar=0.9, ar_lower=1.04))])
    low, high = t["entries"]
    assert low["config"] == TREE and low["label"] == "tree-n32"
    assert high["label"] == "ar (no speculation)" and high["config"] == {"target": "T", "mode": "ar", "device": "cpu"}
    # AR faster on average but not with confidence: the measured system stays
    t = dispatch_table([(1, final("tree-n32", TREE, 1.3)), (16, final("stock", CHAIN, 1.0, over_ar=0.99,
                                                                          ar_lower=0.97))])
    assert t["entries"][1]["config"] == CHAIN


def test_one_system_winning_everywhere_is_said_with_its_figures():
    t = dispatch_table([(1, final("tree-n32", TREE, 1.31)), (16, final("tree-n32", TREE, 1.07))])
    assert t["note"].startswith("one system wins at every batch size measured: tree-n32")
    assert "×1.310 over stock at batch 1" in t["note"] and "×1.070 over stock at batch 16" in t["note"]


def test_a_table_with_a_gap_below_its_first_size_still_serves_batch_one_and_nothing_is_uncovered():
    t = dispatch_table([(4, final("stock", CHAIN, 1.0))])
    assert dispatch_for(t, 1)["measured_at"] == 4 and t["entries"][0]["max_batch"] is None
    with pytest.raises(ValueError, match="no entry"):
        dispatch_for({"entries": []}, 3)


def test_a_lane_is_the_deployment_at_one_batch_size_under_its_own_name():
    dep = {"name": "d", "batch": [1, 16], "prompts": 16}
    assert lane(dep, 16) == {"name": "d-b16", "batch": 16, "prompts": 16} and dep["batch"] == [1, 16]
