"""Draft trees as tensors, for the static-shape path (fast.py): the policies of trees.py (chain,
best-first, EAGLE-2 top-k, Sequoia shapes) built on the device from a lattice with a static node
budget, and greedy acceptance, with no host round trip.

A tree of R rows is `TreeRows(tokens, parents, depth, valid)`, each [R]: row 0 is the root (the
newest token; its own parent), parents come before their children. A lattice with fewer
candidates than the budget leaves rows invalid: never accepted, never an ancestor of a valid row.

Scores are those of trees.py: log-softmax over each position's top-k, parent-conditioned where the
lattice has Markov transitions. The device selects by `torch.topk` on score − ε·depth, which keeps
the selection prefix-closed (a child never outranks its parent) without a sequential heap; trees
equal trees.py's wherever no two candidates tie exactly.

A batch's shared budget (`shared:N:C`, `build_shared`) is one such selection over every active
lane's lattice: each lane's C best nodes (its largest possible share, the rows every lane plans),
then the B·N best of those across lanes; a lane's rows outside its share are invalid.

Two-level verification's exact tree (`join`) is a chain, the quick pass's greedy path, with a
second draft's best-first subtree of the remaining budget (`build_budget`) hung from its end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import trees

EPS = 1e-9  # per depth: a child (score ≤ its parent's) always ranks below its parent
NEG = float("-inf")


@dataclass(frozen=True)
class TreeSpec:
    """A policy's static description: `nodes` rows besides the root, at most `max_depth` deep."""

    kind: str  # chain | best-first | topk | sequoia | shared | tlv (two-level verification's exact tree)
    nodes: int
    max_depth: int
    beam: int = 0  # topk: K
    shape: tuple[tuple[int, int, int], ...] = ()  # sequoia: (position, candidate rank, parent row)
    share: int = 0  # shared: nodes per active request in all (`nodes` is one request's cap)

    @property
    def rows(self) -> int:
        return self.nodes + 1


def spec_for(name: str, args: tuple[int, ...], positions: int, profile_shape=None, lanes: int = 1) -> TreeSpec:
    """The static tree of policy (name, args) over a lattice of `positions` drafted positions, for
    a decoder of `lanes` requests (a shared budget over one lane is best-first:N)."""
    depth = min(positions, trees.MAX_DEPTH)
    if name == "chain":
        return TreeSpec("chain", positions, positions)
    if name == "best-first" or (name == "shared" and lanes == 1):
        return TreeSpec("best-first", args[0], depth)
    if name == "shared":
        return TreeSpec("shared", args[1], depth, share=args[0])
    if name == "topk":
        return TreeSpec("topk", args[1], depth, beam=args[0])
    if name == "sequoia":
        index, nodes = {(): 0}, []
        for path in sorted(profile_shape, key=lambda p: (len(p), p)):
            if path[:-1] in index:
                nodes.append((len(path) - 1, path[-1], index[path[:-1]]))
                index[path] = len(nodes)
        return TreeSpec("sequoia", len(nodes), max((p for p, _, _ in nodes), default=-1) + 1, shape=tuple(nodes))
    raise ValueError(f"tree policy {name!r} has no static form")


def tlv_specs(nodes: int, q_depth: int, positions: int) -> tuple[TreeSpec, TreeSpec, TreeSpec]:
    """Two-level verification's trees over lattices of `positions` drafted positions (tlv.py):
    tree ① (best-first, N nodes, at most q_depth deep), draft ②'s subtree (best-first, up to N
    nodes) and the exact pass's (N nodes: chain C, at most min(q_depth + 1, N) tokens past the
    root, then the subtree under C's end)."""
    depth = min(positions, trees.MAX_DEPTH)
    first, sub = TreeSpec("best-first", nodes, min(q_depth, depth)), TreeSpec("best-first", nodes, depth)
    chain = min(first.max_depth + 1, nodes)
    return first, sub, TreeSpec("tlv", nodes, min(chain + depth, nodes))


class TreeRows(NamedTuple):
    tokens: torch.Tensor  # [R] long (root token at 0)
    parents: torch.Tensor  # [R] long, parents[0] == 0
    depth: torch.Tensor  # [R] long
    valid: torch.Tensor  # [R] bool


def scores(tokens: torch.Tensor, logp: torch.Tensor, trans: torch.Tensor | None):
    """trees.py's normalized scores in float64, missing candidates (token < 0) at -inf; lattices
    [m, k] or [B, m, k] (trans [..., m-1, k, k])."""
    miss = tokens < 0  # (a position with no candidate at all normalizes to NaN: masked again after)
    node = torch.log_softmax(logp.double().masked_fill(miss, NEG), dim=-1).masked_fill(miss, NEG)
    if trans is None:
        return node, None
    cmiss = miss[..., 1:, None, :].expand_as(trans)
    tr = torch.log_softmax(trans.double().masked_fill(cmiss, NEG), dim=-1).masked_fill(cmiss, NEG)
    return node, tr


def sequoia_tables(spec: TreeSpec, device) -> tuple[torch.Tensor, ...]:
    """(position, rank, parent row) of a Sequoia spec's nodes as device tensors, made once (a
    captured step may not copy from the host)."""
    return tuple(torch.tensor([s[i] for s in spec.shape], dtype=torch.long, device=device) for i in range(3))


def build(spec: TreeSpec, root: torch.Tensor, tokens: torch.Tensor, logp: torch.Tensor,
          trans: torch.Tensor | None = None, tables: tuple[torch.Tensor, ...] | None = None) -> TreeRows:
    """The spec's tree over a lattice (tokens, logp [m, k], trans [m-1, k, k] or None); root: [1];
    tables: `sequoia_tables(spec)` for Sequoia specs."""
    if spec.kind in LANES:
        rows = build_lanes(spec, root.view(1), tokens[None], logp[None], None if trans is None else trans[None])
        return TreeRows(*(f[0] for f in rows))
    return _sequoia(spec, root, tokens, tables or sequoia_tables(spec, tokens.device))


LANES = ("chain", "best-first", "topk")  # kinds whose every lane's tree is built in the same kernels


def build_lanes(spec: TreeSpec, roots: torch.Tensor, tokens: torch.Tensor, logp: torch.Tensor,
                trans: torch.Tensor | None = None, tables: tuple[torch.Tensor, ...] | None = None) -> TreeRows:
    """`build` for a tree per lane: roots [B], lattices [B, m, k] (trans [B, m-1, k, k] or None);
    fields [B, R]. Chains, best-first and top-k trees are built for every lane in the same kernels;
    Sequoia shapes lane by lane."""
    if spec.kind == "chain":
        return _chain(spec, roots, tokens, trans)
    if spec.kind == "best-first":
        pool, _, sel = _ranked(spec, tokens, logp, trans)
        return _pick(roots, tokens, pool, sel, torch.ones_like(sel, dtype=torch.bool))
    if spec.kind == "topk":
        return _topk(spec, roots, tokens, *scores(tokens, logp, trans))
    rows = [build(spec, roots[b : b + 1], tokens[b], logp[b], None if trans is None else trans[b], tables)
            for b in range(tokens.shape[0])]
    return TreeRows(*(torch.stack(f) for f in zip(*rows)))


def _chain(spec, roots, tokens, trans):
    """Lattice.chain_candidates on the device for every lane [B]: each pick is the previous pick's
    best child under `trans` (a fixed loop over the positions: no host round trip)."""
    B, m, K = tokens.shape[0], spec.nodes, tokens.shape[2]
    dev = tokens.device
    cand = torch.zeros(B, m, dtype=torch.long, device=dev)
    if trans is not None and m > 1:
        picks = [cand[:, 0]]
        for i in range(m - 1):
            row = trans[:, i].gather(1, picks[-1][:, None, None].expand(B, 1, K))[:, 0]  # [B, K]
            picks.append(row.masked_fill(tokens[:, i + 1] < 0, NEG).argmax(-1))
        cand = torch.stack(picks, 1)
    tok = tokens[:, :m].gather(2, cand[..., None])[..., 0]  # [B, m]
    valid = (tok >= 0).long().cumprod(1).bool()
    idx = torch.arange(m + 1, device=dev).expand(B, m + 1)
    zero = torch.zeros(B, 1, dtype=torch.long, device=dev)
    return TreeRows(torch.cat((roots.view(B, 1), tok.clamp_min(0)), 1), torch.cat((zero, idx[:, :m]), 1), idx,
                    torch.cat((torch.ones(B, 1, dtype=torch.bool, device=dev), valid), 1))


def _rows(roots, tokens, pos, cand, parents, depth, valid) -> TreeRows:
    """Assemble R rows of every lane from per-node (pos, cand, parent row, depth, valid) [B, N],
    node i → row i+1; roots [B], tokens [B, m, k]."""
    B, dev = tokens.shape[0], tokens.device
    lane = torch.arange(B, device=dev)[:, None]
    tok = tokens[lane, pos.clamp(0, tokens.shape[1] - 1), cand].clamp_min(0)
    zero = torch.zeros(B, 1, dtype=torch.long, device=dev)
    return TreeRows(torch.cat((roots.view(B, 1), tok), 1), torch.cat((zero, parents), 1), torch.cat((zero, depth), 1),
                    torch.cat((torch.ones(B, 1, dtype=torch.bool, device=dev), valid), 1))


def _one(*fields) -> tuple:
    """One tree's per-node fields as a lane of one (for `_rows`)."""
    return tuple(f[None] for f in fields)


def _sequoia(spec, root, tokens, tables):
    dev, m = tokens.device, tokens.shape[0]
    pos, cand, par = tables
    ok = (pos < m) & (tokens[pos.clamp(max=m - 1), cand] >= 0)
    valid = torch.cat((torch.ones(1, dtype=torch.bool, device=dev), ok))
    for _ in range(spec.max_depth):  # a node needs its whole root path
        valid = valid & valid[torch.cat((torch.zeros(1, dtype=torch.long, device=dev), par))]
    return TreeRows(*(f[0] for f in _rows(root, *_one(tokens, pos, cand, par, pos + 1, valid[1:]))))


def _pool(W, D, tokens, node, tr):
    """Every lane's beam of the W best nodes per depth (the best W of all depths are among them,
    since a node's parent outranks it): (path scores, candidates, parent within the previous
    depth's beam, depth), each [B, D·W], depth-major; tokens, node [B, m, K], tr [B, m-1, K, K]."""
    B, K, dev = tokens.shape[0], tokens.shape[2], tokens.device
    s = node[:, 0]
    if K < W:
        s = torch.cat((s, s.new_full((B, W - K), NEG)), 1)
    fs, order = s.topk(W, dim=-1)
    fc, fp = order.clamp(max=K - 1), torch.zeros(B, W, dtype=torch.long, device=dev)
    pool_s, pool_c, pool_p = [fs], [fc], [fp]
    for d in range(1, D):  # [B, W, K]: each beam node's children
        step = tr[:, d - 1].gather(1, fc[..., None].expand(B, W, K)) if tr is not None else \
            node[:, d, None, :].expand(B, W, K)
        fs, order = (fs[..., None] + step).flatten(1).topk(W, dim=-1)
        fc, fp = order % K, order // K
        pool_s.append(fs), pool_c.append(fc), pool_p.append(fp)
    depth = (torch.arange(D, device=dev).repeat_interleave(W) + 1).expand(B, D * W)
    return torch.cat(pool_s, 1), torch.cat(pool_c, 1), torch.cat(pool_p, 1), depth


def _pick(roots, tokens, pool, sel, keep) -> TreeRows:
    """Every lane's rows of pool entries `sel` [B, W] (a prefix-closed set; W the pool's beam
    width), ordered depth-major (parents first); `keep` [B, W] marks those of them that are valid
    (a prefix-closed subset)."""
    flat, cand, par, depth = pool
    B, W = sel.shape
    sel, order = sel.sort(dim=-1)
    keep = keep.gather(1, order)
    d_sel = depth.gather(1, sel)
    row_of = torch.zeros_like(flat, dtype=torch.long).scatter_(
        1, sel, torch.arange(1, W + 1, device=tokens.device).expand(B, W))
    parent_flat = (d_sel - 2).clamp_min(0) * W + par.gather(1, sel)
    parents = torch.where(d_sel == 1, 0, row_of.gather(1, parent_flat))
    return _rows(roots, tokens, d_sel - 1, cand.gather(1, sel), parents, d_sel, keep & (flat.gather(1, sel) > NEG))


def _ranked(spec: TreeSpec, tokens, logp, trans):
    """Every lane's pool (`_pool`, beam spec.nodes) and its spec.nodes best nodes, best first:
    their ranking keys [B, N] and pool indices [B, N]. Any prefix of a lane's ranking is a
    prefix-closed tree (a child ranks below its parent), the best-first tree of that many nodes."""
    pool = _pool(spec.nodes, spec.max_depth, tokens, *scores(tokens, logp, trans))
    top, sel = (pool[0] - EPS * pool[3]).topk(spec.nodes, dim=-1)
    return pool, top, sel


def build_budget(spec: TreeSpec, roots: torch.Tensor, tokens: torch.Tensor, logp: torch.Tensor,
                 trans: torch.Tensor | None, budget: torch.Tensor) -> TreeRows:
    """Best-first trees of a node budget per lane, budget [B] ≤ spec.nodes: lane b's budget[b]
    best nodes, as spec.rows rows (the others invalid)."""
    pool, top, sel = _ranked(spec, tokens, logp, trans)
    kept = (torch.arange(spec.nodes, device=tokens.device) < budget[:, None]) & (top > NEG)
    return _pick(roots, tokens, pool, sel, kept)


def join(chain: torch.Tensor, n: torch.Tensor, sub: TreeRows) -> TreeRows:
    """Two-level verification's exact tree of every lane (tlv.join on the device): the chain's
    first n + 1 tokens (chain [B, ≥ n + 1], the root first) as one path, then `sub`'s valid
    nodes (sub [B, R], rooted at chain[n]) hung from its last row, in sub's order; R rows in all
    (n + the valid nodes ≤ R − 1), the rest invalid."""
    B, R = sub.tokens.shape
    dev = sub.tokens.device
    r = torch.arange(R, device=dev).expand(B, R)
    ok = sub.valid[:, 1:]  # [B, R - 1]: sub's nodes (row j + 1)
    idx = torch.arange(R - 1, device=dev)
    order = torch.where(ok, idx, idx + R).sort(dim=1).indices  # the valid nodes first, in order
    rank = ok.long().cumsum(1) - 1  # a valid node's place among them
    n = n[:, None]
    c = r - n - 1  # row r > n holds the valid node of place c
    real = (c >= 0) & (c < ok.sum(1, keepdim=True))
    s = order.gather(1, c.clamp(0, R - 2)) + 1  # its row in sub
    sp = sub.parents.gather(1, s)
    parents = torch.where(sp == 0, n, n + 1 + rank.gather(1, (sp - 1).clamp_min(0)))
    on_chain = r <= n
    return TreeRows(torch.where(on_chain, chain.gather(1, r.clamp(max=chain.shape[1] - 1)), sub.tokens.gather(1, s)),
                    torch.where(on_chain, (r - 1).clamp_min(0), torch.where(real, parents, 0)),
                    torch.where(on_chain, r, torch.where(real, n + sub.depth.gather(1, s), 1)),
                    on_chain | real)


def share(top: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """Which of every lane's best nodes a shared budget takes: top [B, C], each lane's ranking keys
    best first (-inf: none); the `budget` (0-d) best of all lanes, ties to the earlier lane and
    the earlier node. [B, C] bool; each lane's taken nodes are a prefix of its ranking."""
    B, C = top.shape
    order = top.flatten().argsort(descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(B * C, device=top.device)
    return (rank < budget).view(B, C)


def build_shared(spec: TreeSpec, roots: torch.Tensor, tokens: torch.Tensor, logp: torch.Tensor,
                 trans: torch.Tensor | None, active: torch.Tensor, drafting: torch.Tensor | None = None) -> TreeRows:
    """A shared node budget over a batch's lattices (tokens, logp [B, m, k], trans [B, m-1, k, k]
    or None; roots, active [B]): the spec.share · (active lanes) nodes of highest path score over
    the lattices of the lanes `drafting` [B] (default: the active ones), at most spec.nodes of one
    lane (trees.shared_best_first). Every lane gets spec.rows rows; those outside its share (and
    the rows of a lane that drafts nothing) are invalid."""
    pool, top, sel = _ranked(spec, tokens, logp, trans)
    drafting = active if drafting is None else drafting
    top = top.masked_fill(drafting[:, None] == 0, NEG)  # an idle lane (or one feeding a prompt) takes no share
    taken = share(top, active.sum() * spec.share) & (top > NEG)
    return _pick(roots, tokens, pool, sel, taken)


def _topk(spec, roots, tokens, node, tr):
    """EAGLE-2 for every lane: a beam of K per depth, each expanded by its K best children; the N
    best of the pool; only nodes whose whole root path was kept. tokens, node [B, m, k]."""
    Kb, D, N, (B, _, K), dev = spec.beam, spec.max_depth, spec.nodes, tokens.shape, tokens.device
    kk = min(Kb, K)
    bs, bc = node[:, 0].topk(kk, dim=-1)  # [B, kk]
    pool_s, pool_c = [bs], [bc]
    pool_d, pool_p = [torch.ones(kk, dtype=torch.long, device=dev)], [torch.full((kk,), -1, dtype=torch.long, device=dev)]
    beam, size = torch.arange(kk, device=dev).expand(B, kk), kk
    for pos in range(1, D):
        step = tr[:, pos - 1].gather(1, bc[..., None].expand(B, kk, K)) if tr is not None else \
            node[:, pos, None, :].expand(B, kk, K)
        cs, cc = (bs[..., None] + step).topk(kk, dim=-1)  # [B, kk, kk]: each beam node's best children
        cs, cc = cs.flatten(1), cc.flatten(1)
        pool_s.append(cs), pool_c.append(cc)
        pool_d.append(torch.full((kk * kk,), pos + 1, dtype=torch.long, device=dev))
        pool_p.append(beam.repeat_interleave(kk, dim=1))  # each child's parent: its beam node's place in the pool
        top = cs.topk(kk, dim=-1).indices
        beam, bs, bc = size + top, cs.gather(1, top), cc.gather(1, top)
        size += kk * kk
    s, c = torch.cat(pool_s, 1), torch.cat(pool_c, 1)
    d = torch.cat(pool_d).expand(B, size)
    p = torch.cat([pool_p[0].expand(B, kk)] + pool_p[1:], 1)
    n = min(N, size)
    keep = torch.zeros(B, size, dtype=torch.bool, device=dev).scatter_(1, (s - EPS * d).topk(n, dim=-1).indices, True)
    ok = keep & (s > NEG)
    for _ in range(D):  # a node is kept only with its whole root path
        ok = ok & torch.where(p >= 0, ok.gather(1, p.clamp_min(0)), True)
    idx = torch.arange(size, device=dev)
    sel = torch.where(ok, idx, idx + size).topk(n, dim=-1, largest=False).indices.sort(dim=-1).values
    row_of = torch.zeros(B, size, dtype=torch.long, device=dev).scatter_(
        1, sel, torch.arange(1, n + 1, device=dev).expand(B, n))
    par = p.gather(1, sel)
    parents = torch.where(par >= 0, row_of.gather(1, par.clamp_min(0)), 0)
    ds = d.gather(1, sel)
    rows = _rows(roots, tokens, ds - 1, c.gather(1, sel), parents, ds, ok.gather(1, sel))
    if n < N:  # a pool smaller than the budget: pad with invalid rows
        z = torch.zeros(B, N - n, dtype=torch.long, device=dev)
        rows = TreeRows(torch.cat((rows.tokens, z), 1), torch.cat((rows.parents, z), 1),
                        torch.cat((rows.depth, z + 1), 1), torch.cat((rows.valid, z.bool()), 1))
    return rows


def accept(tree: TreeRows, argmax: torch.Tensor, anc: torch.Tensor, path_len: int):
    """Greedy acceptance on the device: a row is accepted when it and every ancestor below the
    root hold the target's argmax at their parent (of matching siblings, the first). Fields [R]
    (one tree) or [B, R] (a tree per lane, all in the same kernels), anc [..., R, R]. Returns the
    accepted rows by depth, [..., path_len] (past τ: the root, a harmless index), and τ [...]."""
    R, dev = tree.tokens.shape[-1], tree.tokens.device
    idx = torch.arange(R, device=dev)
    match = tree.valid & (tree.tokens == argmax.gather(-1, tree.parents)) & (idx > 0)
    earlier = (tree.parents[..., :, None] == tree.parents[..., None, :]) & (idx[None, :] < idx[:, None]) \
        & match[..., None, :]
    match = (match & ~earlier.any(-1)) | (idx == 0)
    acc = ~(anc & ~match[..., None, :]).any(-1)
    path = torch.zeros(*acc.shape[:-1], path_len + 1, dtype=torch.long, device=dev)
    path.scatter_(-1, torch.where(acc, tree.depth.clamp(max=path_len - 1), path_len), idx.expand_as(acc))
    return path[..., :path_len], acc.sum(-1)


def to_tree(rows: TreeRows) -> trees.Tree:
    """The valid rows as a trees.Tree (host; for records)."""
    tok, par, val = rows.tokens.tolist(), rows.parents.tolist(), rows.valid.tolist()
    keep = [i for i in range(len(tok)) if val[i]]
    at = {r: j for j, r in enumerate(keep)}
    return trees.Tree(tuple(tok[r] for r in keep), tuple(-1 if r == 0 else at[par[r]] for r in keep))
