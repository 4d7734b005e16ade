"""Two-level verification (TLV): a cheap pass picks the path that one exact pass verifies.

One cycle (docs/METHOD.md §3), on the eager driver (decode.generate with `tlv=`):

    draft ①  the drafter's lattice from the committed tokens → tree ① (best-first: N nodes, at
             most q_depth deep)
    Q pass   the target over tree ①, reading only W12's 8-bit view of each layer weight (the
             dropped low mantissa bits at their midpoint, escapes exact: kernels/w12/format.quick),
             against the committed KV cache and recurrent state; its rows go to the cache's
             scratch slots and are dropped, so nothing committed changes
    chain C  the Q pass's greedy path through tree ① and its bonus token; nothing accepted yet
    draft ②  the drafter as if C were committed (it observes C, with the Q pass's features, then
             proposes and forgets C again: Drafter.mark / rewind) → a subtree of N − |C| nodes
             under C's last token
    exact    one pass of the exact target over C + the subtree, the only pass that commits: the
             longest root path whose every token is the exact argmax at its parent, then the
             exact bonus (decode.generate's acceptance, unchanged)

Lossless whatever the Q pass says: it only chooses which tokens the exact pass verifies, as a
drafter does. τ counts the tokens an exact pass commits; where the Q pass agrees with the exact
one, a cycle commits both trees' paths, up to about twice a one-pass step.

Every Q projection is a view-only W12Linear: with `weights: w12` it shares the exact layer's
records (no second copy); with bf16 weights it packs its own. On the GPU, at the ≤ 64 rows of a
tree, its GEMM reads the first two thirds of each record (kernels/w12/gemm.py, `quick`); elsewhere
it multiplies by the view's decoded weight, restored once (the torch reference). A target whose
weights are not bf16 values has no W12 view and is refused, unless `round_bf16` (the float64
tests) takes the view of the weights rounded to bf16 while the exact pass keeps the true weights.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch
from torch import nn

from . import trees
from .drafters import Drafter, Lattice, rewinds
from .model import Model
from .weights import projections

MAX_NODES = 63  # an exact pass verifies at most 64 rows (decode.MAX_TREE), the root included


def check(nodes: int, q_depth: int) -> None:
    """One-line errors naming the option that is out of range."""
    if not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"tlv_nodes {nodes!r}: expected 1..{MAX_NODES} (an exact pass verifies at most "
                         f"{MAX_NODES + 1} rows, the root included)")
    if not isinstance(q_depth, int) or not 1 <= q_depth <= trees.MAX_DEPTH:
        raise ValueError(f"tlv_q_depth {q_depth!r}: expected 1..{trees.MAX_DEPTH} (the Q pass's tree depth)")


def quick_projection(proj, name: str, round_bf16: bool = False):
    """The Q pass's copy of a layer projection (a Linear, a fused Dense or a W12Linear): a view-only
    W12Linear of its weight (sharing a W12Linear's records; on the GPU its GEMM reads only the
    views), with the same bias; a ValueError names a weight that has no view (values that are not
    bf16 values) unless `round_bf16`."""
    from specpilot.kernels.w12 import format as w12
    from specpilot.kernels.w12.linear import W12Linear, bf16_exact

    if isinstance(proj, W12Linear):
        packed = proj.packed
    else:
        w = proj.weight.detach()
        if not round_bf16 and not bf16_exact(w):
            raise ValueError(f"{name}: the Q pass reads the W12 view of bf16 weights, and this {w.dtype} weight "
                             "holds values that are not bf16 values (use a bf16 checkpoint)")
        packed = w12.pack(w.to(torch.bfloat16))
    return W12Linear(packed, proj.bias, quick=True)


def _skeleton(m: nn.Module) -> nn.Module:
    """A second module tree over the same tensors: every module a shallow copy with tables of its
    own (children, parameters, buffers, hooks), so what is swapped in the copy stays out of the
    original. A target's static decoders stay with it."""
    c = copy.copy(m)
    for k, v in vars(m).items():
        if isinstance(v, (dict, set)):
            c.__dict__[k] = copy.copy(v)
    c.__dict__["_modules"] = {k: None if s is None else _skeleton(s) for k, s in m._modules.items()}
    c.__dict__.pop("_static_decoders", None)
    return c


def quick_model(target: Model, round_bf16: bool = False) -> Model:
    """The target as the Q pass runs it: the same code, embedding, norms, convolutions, gates and
    LM head (shared tensors), every layer projection (weights.projections) read through its W12
    view (`quick_projection`)."""
    target.fuse()
    quick = _skeleton(target)
    for (owner, attr, name), (mine, _, _) in zip(projections(target), projections(quick), strict=True):
        proj = quick_projection(getattr(owner, attr), name, round_bf16)
        setattr(mine, attr, proj)
    return quick


def join(chain: list[int], sub: trees.Tree) -> trees.Tree:
    """The exact pass's tree: the chain's tokens (the root first) as one path, and `sub` (rooted at
    the chain's last token) hung from its last node."""
    if sub.tokens[0] != chain[-1]:
        raise ValueError(f"the subtree's root {sub.tokens[0]} is not the chain's last token {chain[-1]}")
    last = len(chain) - 1
    return trees.Tree(tuple(chain) + sub.tokens[1:], (-1, *range(last), *(p + last for p in sub.parents[1:])))


@torch.no_grad()
def tree_pass(model: Model, cache, tree: trees.Tree, feature_layers: tuple[int, ...] = ()):
    """One pass of `model` over `tree` from the committed state of `cache` (an eager Cache), its rows
    dropped after it (`cache.commit(0)`), so what is committed stays as it was: each node's argmax
    and the features of `feature_layers` ([nodes, F] or None)."""
    dev = model.lm_head_weight.device
    try:
        out = model(torch.tensor([tree.tokens], device=dev), cache,
                    positions=cache.length + torch.tensor([tree.depths], device=dev),
                    tree_mask=None if tree.is_chain() else tree.ancestor_mask(dev),
                    feature_layers=feature_layers, greedy=True)
    finally:
        cache.commit(0)
    return out.argmax[0].tolist(), None if out.features is None else out.features[0]


class Cycle(NamedTuple):
    tree: trees.Tree  # what the exact pass verifies: C, then the subtree under its last node
    chain: int  # C's rows in it, the root included
    t_quick: float  # seconds of the Q pass


class TwoLevel:
    """TLV beside a target: the Q pass's weights (decoded once) and the cycle's shape, `nodes` (N:
    the nodes of tree ① and of each exact pass, the root aside) and `q_depth` (tree ①'s depth).
    `tree` builds one cycle's tree for the exact pass; decode.generate verifies and commits it."""

    def __init__(self, target: Model, nodes: int = 32, q_depth: int = 8, round_bf16: bool = False):
        check(nodes, q_depth)
        self.nodes, self.q_depth = nodes, q_depth
        self.quick = quick_model(target, round_bf16)

    def quick_pass(self, cache, tree: trees.Tree, feature_layers: tuple[int, ...] = ()):
        """The Q pass over `tree` (`tree_pass` of the quick model): each node's argmax and the
        features of `feature_layers` ([nodes, F] or None)."""
        return tree_pass(self.quick, cache, tree, feature_layers)

    def tree(self, cache, root: int, lattice: Lattice, drafter: Drafter, draft_len: int, room: int,
             feature_layers: tuple[int, ...] = ()) -> Cycle:
        """One cycle's tree for the exact pass from draft ①'s lattice: chain C (the Q pass's path
        through tree ① and its bonus) with draft ②'s subtree under C's last token. Nothing past
        `room` tokens after the root is drafted."""
        from .decode import clock

        first = trees.best_first(root, lattice, self.nodes, self.q_depth)
        dev = self.quick.lm_head_weight.device
        t0 = clock(dev)
        argmax, feats = self.quick_pass(cache, first, feature_layers)
        t_quick = clock(dev) - t0
        path = first.accept(argmax)
        chain = ([first.tokens[i] for i in path] + [argmax[path[-1]]])[: min(self.nodes, room) + 1]
        n = len(chain) - 1  # |C|: C's tokens past the root
        sub = trees.Tree((chain[-1],), (-1,))
        if n < self.nodes and n < room:
            mark = drafter.mark()
            try:  # draft ② sees C as if committed: its tokens, the Q pass's features of their rows
                drafter.observe(chain[:-1], chain[1:], None if feats is None else feats[path[:n]])
                second = drafter.propose(min(draft_len, room - n))
            finally:
                drafter.rewind(mark)
            sub = trees.best_first(chain[-1], second, self.nodes - n)
        return Cycle(join(chain, sub), len(chain), t_quick)


def check_drafter(drafter: Drafter | None) -> None:
    if drafter is None:
        raise ValueError("two-level verification needs a drafter")
    if not rewinds(drafter):
        raise ValueError(f"two-level verification drafts from an uncommitted chain; a {drafter.kind} drafter "
                         "cannot forget what it observed (Drafter.mark / rewind)")


@torch.no_grad()
def agreement(target: Model, quick: Model, tokens: list[int]) -> float:
    """The share of positions of `tokens` (one sequence, teacher-forced) where the Q pass's argmax
    equals the exact pass's: the top-1 agreement of the two levels."""
    ids = torch.tensor([tokens], device=target.lm_head_weight.device)
    exact, cheap = target(ids, greedy=True).argmax, quick(ids, greedy=True).argmax
    return float((exact == cheap).double().mean())
