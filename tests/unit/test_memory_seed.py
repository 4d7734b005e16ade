"""The memory's seed entries: valid, JSON round trip, resolvable, and naming real engine options."""

from __future__ import annotations

import dataclasses
import json

import pytest

from specpilot.engine.engine import MODES, EngineConfig
from specpilot.engine.replay import make_policy
from specpilot.engine.trees import parse_policy
from specpilot.services.memory_api.entries import Entry, Requirement
from specpilot.services.memory_api.graph import resolve
from specpilot.services.memory_api.porting import port
from specpilot.services.memory_api.seed import seed_catalog, seed_entries
from specpilot.systemspec import parse_system, server_program, with_options

SEED = seed_entries()
FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}


def test_expected_ids_unique_and_requirements_first():
    ids = [e.id for e in SEED]
    assert len(ids) == len(set(ids))
    for i, e in enumerate(SEED):  # a store adds an entry only after what it requires
        assert {r.id for r in e.requires} <= set(ids[:i]), e.id
    assert ids.index("tlv") > ids.index("weights-w12") > ids.index("driver-static")
    assert {"tree-best-first", "tree-topk", "tree-sequoia", "draft-length", "drafter-block-markov"} <= set(ids)


@pytest.mark.parametrize("entry", SEED, ids=lambda e: e.key)
def test_entry_is_a_valid_empty_delta_switch(entry: Entry):
    assert entry.version == 1 and entry.delta == ""
    assert entry.contract.rule == "token_forcing" and entry.contract.output_may_differ is False
    assert entry.variants and entry.unverified
    assert entry.evidence is None and entry.reuse_of is None
    back = Entry.from_dict(json.loads(json.dumps(entry.to_dict())))
    assert back == entry and back.content_hash() == entry.content_hash()


@pytest.mark.parametrize("entry", SEED, ids=lambda e: e.key)
def test_entry_resolves_alone(entry: Entry):
    keys = [e.key for e in resolve([Requirement(entry.id)], seed_catalog())]
    closure, todo = set(), list(entry.requires)  # its requirements and theirs, each before what needs it
    while todo:
        r = todo.pop()
        closure.add(r.id + "@1")
        todo += next(e for e in SEED if e.id == r.id).requires
    assert keys[-1] == entry.key and set(keys[:-1]) == closure


def test_whole_seed_resolves_and_ports():
    order = resolve([Requirement(e.id) for e in SEED], seed_catalog())
    assert sorted(e.key for e in order) == sorted(e.key for e in SEED)
    plan = port({"family": "dense", "device": "h200", "batch": 4}, seed_catalog())  # TLV runs at a batch too
    assert plan.skipped == () and len(plan.order) == len(SEED)
    alone = port({"family": "dense", "device": "h200", "batch": 1}, seed_catalog())  # the batch's rules stay out
    assert {s.id: s.reason for s in alone.skipped} == {i: f"limits: {i}@1: batch 1 < batch_min 2"
                                                       for i in ("batch-draft-length", "batch-prompt-admission", "batch-shared-budget")}
    assert "tlv@1" in [e.key for e in alone.order]
    on_cpu = port({"family": "dense", "device": "cpu", "batch": 2}, seed_catalog())  # the GPU mechanisms stay out
    assert sorted(s.id for s in on_cpu.skipped) == sorted(e.id for e in SEED if e.limits.get("devices"))
    assert {s.id for s in on_cpu.skipped} == {"driver-static", "lm-head-certified", "tlv", "weights-w12"}


def test_no_invented_requirements():
    # documented choice (seed.py docstring): the speculation mechanisms are independent switches;
    # W12 requires the static driver its GEMM is written for, TLV the W12 views and best-first trees
    assert {e.id: [r.id for r in e.requires] for e in SEED if e.requires} == {
        "weights-w12": ["driver-static"], "tlv": ["weights-w12", "tree-best-first"]}
    assert all(v.get("driver") == "static" for v in next(e for e in SEED if e.id == "weights-w12").variants.values())


ENGINE_SEED = [e for e in SEED if not e.id.startswith("server-")]


@pytest.mark.parametrize("entry", [e for e in SEED if e.id.startswith("server-")], ids=lambda e: e.key)
def test_server_variants_are_flags_of_their_program(entry: Entry):
    program = entry.id.split("-")[1]
    incumbent = {"server": {"url": "http://127.0.0.1:{port}", "launch": [program, "serve"], "args": {}}}
    assert program == server_program(incumbent)
    for name, opts in entry.variants.items():
        assert set(opts) == {"server_program", "server_args"} and opts["server_program"] == program, name
        assert opts["server_args"] and all(f.startswith("--") for f in opts["server_args"]), name
        parse_system(with_options(incumbent, opts))  # a valid server system


@pytest.mark.parametrize("entry", ENGINE_SEED, ids=lambda e: e.key)
def test_variants_are_engine_config_options(entry: Entry):
    for name, opts in entry.variants.items():
        unknown = set(opts) - FIELDS
        assert not unknown, f"{entry.key} variant {name}: not EngineConfig fields: {unknown}"
        assert "target" not in opts  # a variant never fixes the deployment's model
        assert opts.get("mode", "chain") in MODES and opts.get("mode") != "ar"  # a weight format keeps the mode
        if "draft_len" in opts:
            assert isinstance(opts["draft_len"], int) and opts["draft_len"] >= 1
        if opts.get("mode") == "tree":
            pname, _ = parse_policy(opts["tree"])
            assert pname in ("best-first", "topk", "sequoia", "shared")
            if pname != "sequoia":
                make_policy(opts["tree"])  # within the engine's tree-size limit
        # the variant plus a deployment's target/drafter(/profile) is a valid EngineConfig
        if opts.get("drafter", "").startswith("kind:"):  # a drafter named by kind: the deployment maps it
            assert opts["drafter"][len("kind:"):] in ("sequential", "block", "block_markov")
        cfg = EngineConfig(**{"target": "t", "drafter": "ngram", "profile": "p.json", **opts})
        cfg.validate()


def test_sequoia_says_it_needs_a_profile_and_markov_says_it_needs_a_checkpoint():
    by_id = {e.id: e for e in SEED}
    assert any("profile" in u for u in by_id["tree-sequoia"].unverified)
    assert any("block_markov" in u and "checkpoint" in u for u in by_id["drafter-block-markov"].unverified)
    assert all(v["drafter"] == "kind:block_markov" for v in by_id["drafter-block-markov"].variants.values())
    with pytest.raises(ValueError, match="profile"):
        EngineConfig(target="t", drafter="ngram", **by_id["tree-sequoia"].variants["n16"]).validate()


def test_the_batch_rules_are_options_of_the_engine_limited_to_batches():
    by_id = {e.id: e for e in SEED}
    for ident in ("batch-shared-budget", "batch-draft-length", "batch-prompt-admission"):
        assert by_id[ident].limits == {"batch_min": 2} and not by_id[ident].requires
        assert any("rows" in u for u in by_id[ident].unverified)  # what a step verifies is said
    assert all(parse_policy(v["tree"])[0] == "shared" for v in by_id["batch-shared-budget"].variants.values())
    assert all("draft_lens" in v for v in by_id["batch-draft-length"].variants.values())
    assert all(v["admit_steps"] > 0 for v in by_id["batch-prompt-admission"].variants.values())
