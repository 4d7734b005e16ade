"""A tree per lane built and accepted in the same kernels equals the same done lane by lane:
chains, best-first and top-k trees with and without transitions, missing candidates,
and acceptance over best-first trees with argmaxes that match at random depths."""

import pytest
import torch

from specpilot.engine import treeops
from specpilot.engine.cache import ancestors

B, M, K = 5, 7, 4


def lattice(seed: int, holes: bool):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, 50, (B, M, K), generator=g)
    if holes:  # some lanes draft fewer positions or fewer candidates
        tok[1, 4:] = -1
        tok[3, :, 2:] = -1
        tok[4, 0] = -1
    logp = torch.randn(B, M, K, generator=g, dtype=torch.float64)
    trans = torch.randn(B, M - 1, K, K, generator=g, dtype=torch.float64)
    return tok, logp, trans


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_trans", [False, True])
@pytest.mark.parametrize("policy", [("chain", ()), ("best-first", (12,)), ("best-first", (3,)), ("topk", (3, 10)),
                                    ("topk", (4, 40))])
def test_trees_of_every_lane_at_once_equal_each_lane_alone(seed, with_trans, policy):
    """Built in the same kernels, no lane's tree depends on another's lattice (each lane against a
    batch of one: the trees themselves are checked against trees.py in test_fast_path)."""
    tok, logp, trans = lattice(seed, holes=seed % 2 == 1)
    trans = trans if with_trans else None
    spec = treeops.spec_for(*policy, M)
    roots = torch.arange(100, 100 + B)
    got = treeops.build_lanes(spec, roots, tok, logp, trans)
    for b in range(B):
        one = treeops.build(spec, roots[b : b + 1], tok[b], logp[b], None if trans is None else trans[b])
        for field, lanes in zip(one, got):
            assert torch.equal(lanes[b], field), (b, field, lanes[b])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", [("chain", ()), ("best-first", (12,))])
def test_acceptance_of_every_lane_at_once_equals_each_lane_alone(seed, policy):
    tok, logp, trans = lattice(seed, holes=seed % 3 == 0)
    spec = treeops.spec_for(*policy, M)
    roots = torch.arange(100, 100 + B)
    rows = treeops.build_lanes(spec, roots, tok, logp, trans)
    g = torch.Generator().manual_seed(1000 + seed)
    # argmax at each row: the token of a random child for some rows (so paths get accepted), noise elsewhere
    argmax = torch.randint(0, 50, rows.tokens.shape, generator=g)
    for b in range(B):
        for r in range(1, rows.tokens.shape[1]):
            if torch.rand((), generator=g) < 0.7:
                argmax[b, rows.parents[b, r]] = rows.tokens[b, r]
    anc = ancestors(rows.parents, spec.max_depth)
    path, tau = treeops.accept(rows, argmax, anc, spec.max_depth + 1)
    assert tau.shape == (B,) and path.shape == (B, spec.max_depth + 1)
    assert int(tau.max()) > 1  # some lane accepts a path past the root
    for b in range(B):
        p1, t1 = treeops.accept(treeops.TreeRows(*(f[b] for f in rows)), argmax[b], anc[b], spec.max_depth + 1)
        assert int(tau[b]) == int(t1) and torch.equal(path[b, : int(t1)], p1[: int(t1)])
