"""Porting memory entries to a new deployment: limits, skipped reasons, reuse marking, determinism."""

from __future__ import annotations

import json
import random

import pytest

from specpilot.services.memory_api.entries import Entry, Requirement
from specpilot.services.memory_api.porting import PortError, limits_refuse, port

QWEN_H200 = {"family": "qwen3", "device": "h200", "batch": 8}


def E(ident, version=1, *requires, limits=None, variants=None):
    reqs = tuple(Requirement(r) if isinstance(r, str) else Requirement(*r) for r in requires)
    return Entry(ident, version, ident, requires=reqs, limits=limits or {}, variants=variants or {})


def catalog_of(*entries):
    cat = {}
    for e in entries:
        cat.setdefault(e.id, []).append(e)
    return cat


def test_limits_refuse():
    assert limits_refuse({}, QWEN_H200) is None
    assert limits_refuse({"families": ["qwen3"], "devices": ["h200", "h100"], "batch_max": 8}, QWEN_H200) is None
    assert limits_refuse({"families": ["qwen3_next"]}, QWEN_H200) == "family 'qwen3' not in ['qwen3_next']"
    assert limits_refuse({"devices": ["h100"]}, QWEN_H200) == "device 'h200' not in ['h100']"
    assert limits_refuse({"batch_max": 4}, QWEN_H200) == "batch 8 > batch_max 4"
    assert limits_refuse({"batch_min": 16}, QWEN_H200) == "batch 8 < batch_min 16"
    assert limits_refuse({"batch_min": 2, "batch_max": 8}, QWEN_H200) is None


@pytest.mark.parametrize("limits, words", [({"batch_min": 0}, "limits.batch_min': expected an integer >= 1"),
                                           ({"batch_min": 9, "batch_max": 4}, "9 exceeds batch_max 4")])
def test_bad_batch_limits_name_their_field(limits, words):
    from specpilot.services.memory_api.entries import EntryError

    with pytest.raises(EntryError, match=words):
        E("rows", limits=limits)


def test_limits_filter_picks_latest_allowed_version():
    cat = catalog_of(
        E("tree", 1),
        E("tree", 2, limits={"devices": ["h200"]}),
        E("tree", 3, limits={"devices": ["h100"]}),  # latest, but not for h200
        E("gdn", 1, limits={"families": ["qwen3_next"]}),
    )
    plan = port(QWEN_H200, cat)
    assert plan.starting_system["entries"] == ["tree@2"]
    assert [s.to_dict() for s in plan.skipped] == [
        {"id": "gdn", "reason": "limits: gdn@1: family 'qwen3' not in ['qwen3_next']"}
    ]
    plan_next = port({"family": "qwen3_next", "device": "h100", "batch": 1}, cat)
    assert plan_next.starting_system["entries"] == ["gdn@1", "tree@3"]


def test_requirement_excluded_by_limits_skips_the_dependent_with_reason():
    cat = catalog_of(E("fused", 1, "gdn"), E("gdn", 1, limits={"batch_max": 4}), E("plain", 1))
    plan = port(QWEN_H200, cat)
    assert plan.starting_system["entries"] == ["plain@1"]
    reasons = {s.id: s.reason for s in plan.skipped}
    assert reasons["gdn"] == "limits: gdn@1: batch 8 > batch_max 4"
    assert reasons["fused"] == (
        "requirements: fused@1 → gdn: no entry 'gdn' (excluded here by limits: gdn@1: batch 8 > batch_max 4)"
    )


def test_conflicting_entry_is_skipped_and_the_rest_kept():
    cat = catalog_of(E("a", 1, ("c", ">=2")), E("b", 1, ("c", "<=1")), E("c", 1), E("c", 2))
    plan = port(QWEN_H200, cat)
    assert plan.starting_system["entries"] == ["c@2", "a@1"]
    (skip,) = plan.skipped
    assert skip.id == "b" and skip.reason.startswith("requirements: ")
    assert "'<=1' (from b@1)" in skip.reason and "'>=2' (from a@1)" in skip.reason


def test_apply_order_variants_and_reuse_marking():
    cat = catalog_of(
        E("top", 1, "mid", variants={"wide": {"tree_width": 8}, "narrow": {"tree_width": 2}}),
        E("mid", 1, "base"),
        E("mid", 2, "base", variants={"only": {"k": 1}}),
        E("base", 1),
    )
    plan = port(QWEN_H200, cat)
    assert plan.starting_system == {
        "stock": True,
        "entries": ["base@1", "mid@2", "top@1"],
        "variants": {"mid": "only", "top": "wide"},
    }
    assert [e.reuse_of for e in plan.order] == ["base@1", "mid@2", "top@1"]
    assert all(e.reuse_of == e.key for e in plan.order)
    # the catalog itself is untouched
    assert all(e.reuse_of is None for v in cat.values() for e in v)
    json.dumps(plan.to_dict())


def test_deterministic_whatever_the_catalog_order():
    entries = [
        E("a", 1, "b"),
        E("a", 2, ("b", "<=1"), limits={"devices": ["h200"]}),
        E("b", 1),
        E("b", 2, limits={"batch_max": 2}),
        E("c", 1, "a", "b"),
        E("d", 1, "zzz"),
        E("e", 3, limits={"families": ["qwen3"], "devices": ["h200"], "batch_max": 64}, variants={"v": {}}),
    ]
    first = port(QWEN_H200, catalog_of(*entries)).to_dict()
    rng = random.Random(7)
    for _ in range(20):
        shuffled = entries[:]
        rng.shuffle(shuffled)
        assert port(QWEN_H200, catalog_of(*shuffled)).to_dict() == first
    assert first["starting_system"]["entries"] == ["b@1", "a@2", "c@1", "e@3"]
    assert [s["id"] for s in first["skipped"]] == ["d"]


def test_empty_catalog():
    plan = port(QWEN_H200, {})
    assert plan.starting_system == {"stock": True, "entries": [], "variants": {}}
    assert plan.order == () and plan.skipped == ()


@pytest.mark.parametrize(
    "deployment, field",
    [
        ({"device": "h200", "batch": 1}, "family"),
        ({"family": "qwen3", "device": "", "batch": 1}, "device"),
        ({"family": "qwen3", "device": "cpu", "batch": 0}, "batch"),
        ({"family": "qwen3", "device": "cpu", "batch": True}, "batch"),
    ],
)
def test_bad_deployment(deployment, field):
    with pytest.raises(PortError, match=f"field '{field}'"):
        port(deployment, {})
