"""Row selection at batch > 1, the pure parts: the shared node budget (treeops.build_shared against
its host specification trees.shared_best_first), the per-request draft length rule
(engine/lengths.py), and their options' one-line errors. Decoding under them: test_batch_decode.py."""

import random

import pytest
import torch
from hypothesis import given, settings, strategies as st

from specpilot.engine import lengths, treeops, trees
from specpilot.engine.drafters import TOP_K, Lattice
from specpilot.engine.engine import EngineConfig
from specpilot.engine.replay import make_policy

NEG = float("-inf")


def lattice(g: torch.Generator, m: int, markov: bool, holes: bool) -> Lattice:
    """Distinct tokens per position, continuous scores (no exact ties), some candidates missing."""
    tok = torch.stack([torch.randperm(50, generator=g)[:TOP_K] for _ in range(m)])
    logp = torch.randn(m, TOP_K, generator=g, dtype=torch.float64) * 2
    if holes:
        gone = torch.arange(TOP_K)[None] >= torch.randint(0, TOP_K + 1, (m,), generator=g)[:, None]
        tok, logp = tok.masked_fill(gone, -1), logp.masked_fill(gone, NEG)
    trans = None
    if markov and m > 1:
        trans = (logp[1:, None, :] + torch.randn(m - 1, TOP_K, TOP_K, generator=g, dtype=torch.float64))
        trans = trans.masked_fill(tok[1:, None, :] < 0, NEG)
    return Lattice(tok, logp, trans)


def paths(tree: trees.Tree) -> set[tuple[int, ...]]:
    """Every node's root path of tokens (tokens are distinct per position, so a path names a node)."""
    out = set()
    for i in range(len(tree)):
        p, j = [], i
        while j >= 0:
            p.append(tree.tokens[j])
            j = tree.parents[j]
        out.add(tuple(p[::-1]))
    return out


def shared(lats, roots, active, n, cap):
    spec = treeops.TreeSpec("shared", cap, min(lats[0].positions, trees.MAX_DEPTH), share=n)
    trans = torch.stack([x.trans for x in lats]) if lats[0].trans is not None else None
    return spec, treeops.build_shared(spec, torch.tensor(roots), torch.stack([x.tokens for x in lats]),
                                      torch.stack([x.logp for x in lats]), trans, torch.tensor(active))


case = st.fixed_dictionaries({
    "seed": st.integers(0, 10_000), "lanes": st.integers(1, 4), "m": st.integers(1, 6), "n": st.integers(1, 8),
    "extra": st.integers(0, 14), "markov": st.booleans(), "holes": st.booleans(),
    "active": st.lists(st.booleans(), min_size=4, max_size=4)})


@settings(max_examples=60, deadline=None)
@given(c=case)
def test_the_device_shared_budget_is_its_host_specification(c):
    g, rnd = torch.Generator().manual_seed(c["seed"]), random.Random(c["seed"])
    B, n = c["lanes"], c["n"]
    cap = n + c["extra"]
    lats = [lattice(g, c["m"], c["markov"], c["holes"]) for _ in range(B)]
    roots = [rnd.randrange(50) for _ in range(B)]
    active = [int(a) for a in c["active"][:B]]
    spec, rows = shared(lats, roots, active, n, cap)
    assert rows.tokens.shape == (B, cap + 1)  # every lane plans the largest share
    on = [b for b in range(B) if active[b]]
    host = trees.shared_best_first([roots[b] for b in on], [lats[b] for b in on], len(on) * n, cap)
    for b in range(B):
        mine = treeops.to_tree(treeops.TreeRows(*(f[b] for f in rows)))
        assert paths(mine) == (paths(host[on.index(b)]) if b in on else {(roots[b],)})


@settings(max_examples=60, deadline=None)
@given(c=case)
def test_each_share_is_a_prefix_closed_tree_within_the_budget_and_the_cap(c):
    g = torch.Generator().manual_seed(c["seed"])
    B, n = c["lanes"], c["n"]
    cap = n + c["extra"]
    lats = [lattice(g, c["m"], c["markov"], c["holes"]) for _ in range(B)]
    active = [int(a) for a in c["active"][:B]]
    _, rows = shared(lats, list(range(B)), active, n, cap)
    valid, parents = rows.valid, rows.parents
    assert valid[:, 0].all()
    assert (valid.gather(1, parents) | ~valid).all()  # a valid row's parent is valid
    assert ((rows.depth.gather(1, parents) == rows.depth - 1) | ~valid)[:, 1:].all()
    nodes = valid.sum(1) - 1
    assert (nodes <= cap).all() and int(nodes.sum()) <= sum(active) * n
    assert all(int(nodes[b]) == 0 for b in range(B) if not active[b])  # an idle lane takes nothing
    available = [len(trees.best_first(0, lats[b], cap)) - 1 for b in range(B) if active[b]]
    assert int(nodes.sum()) == min(sum(active) * n, sum(available))  # the budget is spent where it can be


def test_a_confident_lane_takes_the_nodes_an_unsure_one_leaves():
    """Two lanes, 4 nodes each in all: the lane whose drafter is sure gets a deep chain of 6, the
    unsure one the 2 nodes it scores best (its first two candidates' children score too low)."""
    tok = torch.arange(6 * TOP_K).view(6, TOP_K)
    sure = torch.full((6, TOP_K), -12.0, dtype=torch.float64)
    sure[:, 0] = -0.01
    unsure = torch.full((6, TOP_K), -3.0, dtype=torch.float64)
    unsure[0, :2] = -0.7
    _, rows = shared([Lattice(tok, sure), Lattice(tok, unsure)], [1, 2], [1, 1], 4, 6)
    assert (rows.valid.sum(1) - 1).tolist() == [6, 2]
    assert rows.depth[0][rows.valid[0]].tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_share_takes_each_lanes_ranking_prefix_and_breaks_ties_to_the_earlier_lane():
    top = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.5, NEG]], dtype=torch.float64)
    assert treeops.share(top, torch.tensor(3)).tolist() == [[True, False, False], [True, True, False]]
    assert treeops.share(top, torch.tensor(2)).tolist() == [[True, False, False], [True, False, False]]
    assert treeops.share(top, torch.tensor(0)).sum() == 0


def test_one_request_with_a_shared_budget_is_best_first():
    g = torch.Generator().manual_seed(5)
    lat = lattice(g, 5, True, True)
    assert treeops.spec_for("shared", (8, 20), 5, lanes=1) == treeops.spec_for("best-first", (8,), 5)
    assert treeops.spec_for("shared", (8, 20), 5, lanes=3) == treeops.TreeSpec("shared", 20, 5, share=8)
    assert make_policy("shared:8:20")(3, lat) == trees.best_first(3, lat, 8)
    assert trees.shared_best_first([3], [lat], 8, 20)[0] == trees.best_first(3, lat, 8)


# --------------------------------------------------------------------------- per-request draft length

def test_lengths_follow_recent_acceptance_and_the_drafters_confidence():
    options = torch.tensor([2, 4, 6])
    sure = torch.tensor([6, 6, 6, 1])
    recent = torch.tensor([3.0, 1.4, 0.0, 3.0], dtype=torch.float64)
    assert lengths.pick(options, recent, sure).tolist() == [6, 4, 2, 2]  # needs 6 (sure), 3.8, 1, 1 (sure)
    assert lengths.pick(options, lengths.start(options).expand(4), sure).tolist() == [6, 6, 6, 2]
    tau, active = torch.tensor([5, 1, 3, 0]), torch.tensor([1, 1, 1, 0])
    new = lengths.update(recent, tau, active)
    assert new.tolist() == [3.5, 0.7, 1.0, 3.0]  # an idle lane keeps its history


def test_confident_positions_stop_where_the_top1_chain_gets_unlikely():
    tok = torch.zeros(2, 4, TOP_K, dtype=torch.long)
    logp = torch.full((2, 4, TOP_K), -30.0, dtype=torch.float64)
    logp[0, :, 0] = 0.0  # sure at every position
    logp[1, 0, 0] = 0.0  # then four equal candidates a position: the chain's probability 1/4, 1/16, 1/64
    logp[1, 1:, :4] = 0.0
    assert lengths.confident(tok, logp).tolist() == [4, 3]  # P_MIN 0.05
    tok[1, 2] = -1  # a position without candidates stops the chain
    assert lengths.confident(tok, logp).tolist() == [4, 2]


def test_clip_removes_every_position_from_each_lanes_length_on():
    tok = torch.arange(2 * 5 * TOP_K).view(2, 5, TOP_K)
    logp = torch.zeros(2, 5, TOP_K, dtype=torch.float64)
    t, lp = lengths.clip(tok, logp, torch.tensor([2, 5]))
    assert (t[0, :2] >= 0).all() and (t[0, 2:] == -1).all() and (lp[0, 2:] == NEG).all()
    assert torch.equal(t[1], tok[1]) and torch.equal(lp[1], logp[1])


@pytest.mark.parametrize("spec", ["chain", "best-first:6", "topk:2:6", "shared:6:8"])
def test_a_clipped_lattice_gives_every_policy_a_tree_no_deeper_than_the_length(spec):
    lat = lattice(torch.Generator().manual_seed(1), 6, False, False)
    lat.logp[:, 0] += 20  # a sure top-1 chain: every policy's tree runs to its deepest position
    pol = make_policy(spec)
    ts = treeops.spec_for(pol.name, pol.args, 6, lanes=2)

    def deepest(length: int) -> int:
        tok, logp = lengths.clip(lat.tokens[None].expand(2, -1, -1), lat.logp[None].expand(2, -1, -1),
                                 torch.tensor([length, 6]))
        if ts.kind == "shared":  # the second lane idle
            rows = treeops.build_shared(ts, torch.tensor([0, 0]), tok, logp, None, torch.tensor([1, 0]))
            rows = treeops.TreeRows(*(f[0] for f in rows))
        else:
            rows = treeops.build(ts, torch.tensor([0]), tok[0], logp[0])
        return int(rows.depth[rows.valid].max())

    assert deepest(3) == 3 and deepest(6) > 3


# --------------------------------------------------------------------------- options

@pytest.mark.parametrize("spec, words", [("shared:8:4", "cap C (4)"), ("shared:8", "shared:N:C"),
                                         ("shared:0:4", "positive"), ("shared:8:x", "shared:N:C")])
def test_bad_shared_policies_are_one_line_errors(spec, words):
    with pytest.raises(ValueError, match=r"tree policy") as e:
        trees.parse_policy(spec)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_share_past_the_tree_limit_is_refused():
    with pytest.raises(ValueError, match="at most 63 nodes"):
        make_policy("shared:8:64")


@pytest.mark.parametrize("opts, words", [
    ({"draft_lens": "16,12,8"}, "each in 1..draft_len (8)"), ({"draft_lens": "4,x"}, "comma-separated"),
    ({"draft_lens": "0,4"}, "each in 1..draft_len"), ({"draft_lens": ""}, "draft_lens ''"),
    ({"draft_lens": "4,2", "mode": "ar", "drafter": None}, "mode 'ar'"),
    ({"draft_lens": "4,2", "driver": "eager"}, "driver 'eager'"),
    ({"mode": "tree", "tree": "shared:16:8"}, "cap C (8)")])
def test_bad_batch_rule_options_name_their_field_in_one_line(opts, words):
    cfg = EngineConfig(**{"target": "t", "drafter": "ngram", **opts})
    with pytest.raises(ValueError) as e:
        cfg.validate()
    msg = str(e.value)
    assert words in msg and "\n" not in msg
    assert ("draft_lens" in msg) if "draft_lens" in opts else ("tree policy" in msg)


def test_lengths_parse_sorts_and_dedups():
    assert lengths.parse("16,12,8,12", 16) == (8, 12, 16)
    assert EngineConfig(target="t", drafter="ngram", draft_len=16, draft_lens="8,16").validate() is None
