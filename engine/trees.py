"""Draft trees built from a `Lattice`, and greedy acceptance along them.

A tree's node 0 is the root (the newest token, not yet in the target's cache); every other node
is a lattice candidate (position = depth − 1, candidate index) with a parent. Trees are
prefix-closed: a node's parent is always in the tree and comes before it. Policies:

- `chain`         the top-1 candidate of each position, or where the lattice has Markov
                  transitions the best child of the previous pick (stock; Lattice.chain_candidates);
- `best-first:N`  the N nodes of highest path score Σ log p(child | parent), scores normalized by
                  a log-softmax over each position's top-k (parent-conditioned where the lattice
                  has Markov transitions), at most 15 deep;
- `topk:K:N`      EAGLE-2: expand the K best nodes of each depth by their K best children, then
                  keep the N best of everything by path score;
- `sequoia:N`     a static shape of N rank paths maximizing the expected accepted length under a
                  measured per-depth rank-acceptance profile (docs/METHOD.md §3);
- `shared:N:C`    batches (the static driver's lanes): one best-first selection over all the step's
                  requests' lattices, N nodes per request in all, at most C for one request (its
                  tree then verifies C + 1 rows: every lane plans the largest share, the rows a
                  lane does not get are masked); one request alone gets best-first:N.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from .drafters import Lattice

MAX_DEPTH = 15


@dataclass(frozen=True)
class Tree:
    tokens: tuple[int, ...]  # node 0 = root
    parents: tuple[int, ...]  # parents[0] = -1
    cands: tuple[tuple[int, int], ...] = ()  # (position, candidate index) of nodes 1..; for replays

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> list[int]:
        d = [0] * len(self.tokens)
        for i in range(1, len(self.tokens)):
            d[i] = d[self.parents[i]] + 1
        return d

    def ancestor_mask(self, device=None) -> torch.Tensor:
        """[N, N]: row i sees column j when j is i or one of its ancestors."""
        n = len(self.tokens)
        rows = [[False] * n for _ in range(n)]
        for i in range(n):
            if i:
                rows[i][:i] = rows[self.parents[i]][:i]  # a parent comes before its child
            rows[i][i] = True
        return torch.tensor(rows, dtype=torch.bool, device=device)

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def accept(self, argmax: list[int]) -> list[int]:
        """Greedy acceptance: from the root, follow the child whose token equals the target's argmax
        at its parent. Returns the accepted path of node indices (root included)."""
        children: dict[int, list[int]] = {}
        for i in range(1, len(self.tokens)):
            children.setdefault(self.parents[i], []).append(i)
        path = [0]
        while True:
            nxt = [c for c in children.get(path[-1], ()) if self.tokens[c] == argmax[path[-1]]]
            if not nxt:
                return path
            path.append(nxt[0])


def _scores(lat: Lattice) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-position scores log-softmax-normalized over the top-k (missing candidates: -inf, and
    left out of the normalization)."""
    node = torch.log_softmax(lat.logp.double().masked_fill(lat.tokens < 0, float("-inf")), dim=-1)
    trans = None
    if lat.trans is not None:
        missing = lat.tokens[1 : 1 + lat.trans.shape[0], None, :] < 0
        trans = torch.log_softmax(lat.trans.double().masked_fill(missing, float("-inf")), dim=-1)
    return node, trans


def _tree(root: int, lat: Lattice, nodes: list[tuple[int, int, int]]) -> Tree:
    """nodes: (position, candidate, parent node index) in an order where parents come first."""
    toks = lat.tokens.tolist()
    return Tree(tuple([root] + [toks[pos][cand] for pos, cand, _ in nodes]),
                tuple([-1] + [parent for _, _, parent in nodes]),
                tuple((pos, cand) for pos, cand, _ in nodes))


def chain(root: int, lat: Lattice, limit: int | None = None) -> Tree:
    cands = lat.chain_candidates()[:limit]
    return _tree(root, lat, [(i, c, i) for i, c in enumerate(cands)])


def best_first(root: int, lat: Lattice, n: int, max_depth: int = MAX_DEPTH) -> Tree:
    """The n highest path scores; ties go to the shallower node, then the lower candidate index."""
    return shared_best_first([root], [lat], n, n, max_depth)[0]


def shared_best_first(roots: list[int], lats: list[Lattice], total: int, cap: int,
                      max_depth: int = MAX_DEPTH) -> list[Tree]:
    """One best-first selection over several requests' lattices: the `total` nodes of highest path
    score among all of them, at most `cap` of one request's (each request's share is its own
    best-first tree: prefix-closed). Ties go to the shallower node, then the earlier request, then
    the lower candidate index. The host specification of treeops.build_shared."""
    heap, valid, node, trans, depth = [], [], [], [], []
    for b, lat in enumerate(lats):
        node_t, trans_t = _scores(lat)
        toks = lat.tokens.tolist()  # plain lists: this loop runs every step
        node.append(node_t.tolist())
        trans.append(trans_t.tolist() if trans_t is not None else None)
        depth.append(min(len(toks), max_depth))
        valid.append([[c for c, t in enumerate(row) if t >= 0] for row in toks])
        heap += [(-node[b][0][c], 1, b, 0, c, 0) for c in valid[b][0]] if valid[b] else []  # no positions: the root
    heapq.heapify(heap)
    picked: list[list[tuple[int, int, int]]] = [[] for _ in lats]
    taken = 0
    while heap and taken < total:
        neg, d, b, pos, cand, parent = heapq.heappop(heap)
        if len(picked[b]) == cap:  # this request's share is full: its other nodes go unpicked
            continue
        picked[b].append((pos, cand, parent))
        taken += 1
        me = len(picked[b])  # this node's index in its tree (root is 0)
        if pos + 1 < depth[b]:
            scores = trans[b][pos][cand] if trans[b] is not None else node[b][pos + 1]
            for c in valid[b][pos + 1]:
                heapq.heappush(heap, (neg - scores[c], d + 1, b, pos + 1, c, me))
    return [_tree(r, lat, p) for r, lat, p in zip(roots, lats, picked)]


def topk(root: int, lat: Lattice, k: int, n: int, max_depth: int = MAX_DEPTH) -> Tree:
    """EAGLE-2: a beam of the k best nodes per depth, each expanded by its k best children; then
    the n best candidates of all depths by path score."""
    node_t, trans_t = _scores(lat)
    toks, node = lat.tokens.tolist(), node_t.tolist()  # plain lists, as in best_first
    trans = trans_t.tolist() if trans_t is not None else None
    m, kk = len(toks), len(toks[0]) if toks else 0
    # candidate pool entries: (score, depth, order, pos, cand, parent pool index)
    pool: list[tuple[float, int, int, int, int, int]] = []
    first = sorted(((node[0][c], c) for c in range(kk) if toks[0][c] >= 0), key=lambda t: -t[0])
    beam = []
    for s, c in first[:k]:
        pool.append((s, 1, len(pool), 0, c, -1))
        beam.append(len(pool) - 1)
    for pos in range(1, min(m, max_depth)):
        grown = []
        for b in beam:
            s0, _, _, _, pc, _ = pool[b]
            scores = trans[pos - 1][pc] if trans is not None else node[pos]
            kids = [(s0 + scores[c], c) for c in range(kk) if toks[pos][c] >= 0]
            for s, c in sorted(kids, key=lambda t: -t[0])[:k]:
                pool.append((s, pos + 1, len(pool), pos, c, b))
                grown.append(len(pool) - 1)
        beam = sorted(grown, key=lambda i: (-pool[i][0], pool[i][1], i))[:k]
    keep = sorted(range(len(pool)), key=lambda i: (-pool[i][0], pool[i][1], i))[:n]
    keep_set = set(keep)
    keep = [i for i in keep if _closed(pool, i, keep_set)]
    keep.sort(key=lambda i: (pool[i][1], i))  # parents before children
    index = {p: j + 1 for j, p in enumerate(keep)}
    return _tree(root, lat, [(pool[i][3], pool[i][4], index.get(pool[i][5], 0)) for i in keep])


def _closed(pool, i, keep) -> bool:
    p = pool[i][5]
    while p >= 0:
        if p not in keep:
            return False
        p = pool[p][5]
    return True


def fit_sequoia(profile: torch.Tensor, n: int, max_depth: int = MAX_DEPTH) -> list[tuple[int, ...]]:
    """Static shape: the n rank paths (r1, …, rd) of highest Π profile[i, r_i], where profile[i, r]
    is the measured probability that the target's token at depth i+1 is the drafter's rank-r
    candidate. Under independence across depths this set maximizes the expected accepted length."""
    depth, k = profile.shape
    heap = [(-float(profile[0, r]), 1, (r,)) for r in range(k) if profile[0, r] > 0]
    heapq.heapify(heap)
    shape = []
    while heap and len(shape) < n:
        neg, d, path = heapq.heappop(heap)
        shape.append(path)
        if d < min(depth, max_depth):
            for r in range(k):
                if profile[d, r] > 0:
                    heapq.heappush(heap, (neg * float(profile[d, r]), d + 1, path + (r,)))
    return shape


def sequoia(root: int, lat: Lattice, shape: list[tuple[int, ...]]) -> Tree:
    """Place a static rank-path shape on a lattice (candidates a lattice lacks are dropped)."""
    index: dict[tuple[int, ...], int] = {(): 0}
    nodes = []
    for path in sorted(shape, key=lambda p: (len(p), p)):
        pos, cand = len(path) - 1, path[-1]
        if path[:-1] in index and pos < lat.tokens.shape[0] and lat.tokens[pos, cand] >= 0:
            nodes.append((pos, cand, index[path[:-1]]))
            index[path] = len(nodes)
    return _tree(root, lat, nodes)


@dataclass(frozen=True)
class TreePolicy:
    """A named policy with its arguments: called as `(root, lattice) -> Tree` by the eager driver,
    read by the static one (treeops.spec_for)."""

    name: str
    args: tuple[int, ...] = ()
    shape: tuple[tuple[int, ...], ...] | None = None  # sequoia: the fitted rank paths

    def __call__(self, root: int, lat: Lattice) -> Tree:
        if self.name in ("best-first", "shared"):  # shared: one request alone gets its N nodes
            return best_first(root, lat, self.args[0])
        if self.name == "topk":
            return topk(root, lat, *self.args)
        if self.name == "sequoia":
            return sequoia(root, lat, list(self.shape))
        return chain(root, lat)


def parse_policy(spec: str) -> tuple[str, tuple[int, ...]]:
    """'chain' | 'best-first:N' | 'topk:K:N' | 'sequoia:N' | 'shared:N:C' | 'oracle' → (name, integer args)."""
    name, *args = spec.split(":")
    want = {"chain": 0, "oracle": 0, "best-first": 1, "sequoia": 1, "topk": 2, "shared": 2}
    if name not in want or len(args) != want[name] or not all(a.isdigit() and int(a) > 0 for a in args):
        raise ValueError(f"tree policy {spec!r}: expected chain, oracle, best-first:N, topk:K:N, sequoia:N or "
                         "shared:N:C (N, K, C positive integers)")
    out = tuple(int(a) for a in args)
    if name == "shared" and out[1] < out[0]:
        raise ValueError(f"tree policy {spec!r}: the cap C ({out[1]}) of one request's share must be at least "
                         f"N ({out[0]}), the nodes per request")
    return name, out
