"""Decoding state: a KV cache for attention layers, recurrent (GDN) and short-conv state for
Gated DeltaNet layers, with commit / rollback.

A forward pass over T new tokens writes *pending* state: K/V into slots [length, length+T) and,
for GDN layers, the state after every one of the T positions (per-position snapshots, as stock
chain verification keeps them). `commit(n)` keeps the first n of those tokens and drops the rest,
which is the rollback to an accepted length; `commit(n, path)` keeps the tokens at indices `path`
(a root path of a verified tree) and compacts their K/V to contiguous slots.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .config import ModelConfig
from .gdn import conv_windows, replay_path, tree_state as gdn_tree_state


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """Recurrent state and norms run in float32 at least (float64 stays float64)."""
    return torch.promote_types(dtype, torch.float32)


class Cache:
    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, device, dtype: torch.dtype):
        self.cfg, self.max_len, self.length = cfg, max_len, 0
        self.pending = 0  # tokens written by the last forward and not yet committed
        self.k, self.v, self.h, self.conv = {}, {}, {}, {}
        self.pending_h, self.pending_conv = {}, {}  # chain passes: per-position snapshots
        self.pending_tree = {}  # tree passes: per-node rows to replay the accepted path
        sdt = state_dtype(dtype)
        for i, t in enumerate(cfg.layer_types):
            if t == "linear_attention":
                nv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
                conv_dim = 2 * cfg.linear_num_key_heads * dk + nv * dv
                self.h[i] = torch.zeros(batch, nv, dk, dv, device=device, dtype=sdt)
                self.conv[i] = torch.zeros(batch, conv_dim, cfg.linear_conv_kernel_dim - 1, device=device, dtype=dtype)
            else:
                shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
                self.k[i] = torch.zeros(shape, device=device, dtype=dtype)
                self.v[i] = torch.zeros(shape, device=device, dtype=dtype)

    # ---- written by the model's forward --------------------------------------------------
    def reserve(self, t: int) -> int:
        """Start a pass over t new tokens (dropping any uncommitted ones); returns the first slot."""
        if self.length + t > self.max_len:
            raise ValueError(
                f"cache holds {self.max_len} positions; {self.length} used, {t} more asked — "
                "raise max_len (prompt + max_new_tokens + draft length)"
            )
        self.pending = t
        return self.length

    # ---- commit / rollback ---------------------------------------------------------------
    def commit(self, n: int, path: list[int] | None = None) -> None:
        """Keep n of the pending tokens: the first n, or those at indices `path` (len n)."""
        if not 0 <= n <= self.pending:
            raise ValueError(f"commit({n}) with {self.pending} pending tokens")
        path = list(range(n)) if path is None else list(path)
        if len(path) != n:
            raise ValueError("path length must equal n")
        prefix = path == list(range(n))
        if not prefix:  # compact the accepted rows' K/V into consecutive slots
            dst = slice(self.length, self.length + n)
            for i in self.k:
                src = torch.tensor(path, device=self.k[i].device) + self.length
                self.k[i][:, :, dst] = self.k[i].index_select(2, src)
                self.v[i][:, :, dst] = self.v[i].index_select(2, src)
        for i in self.h if n else ():
            if i in self.pending_tree:
                self.h[i], self.conv[i] = replay_path(self.pending_tree[i], path, self.h[i], self.conv[i])
            elif not prefix:
                raise ValueError("a chain pass commits a prefix; only a tree pass commits a path")
            else:
                k1 = self.cfg.linear_conv_kernel_dim - 1
                states = self.pending_h[i]
                if states.shape[1] != self.pending and n != self.pending:
                    raise ValueError("a pass run with commit_all keeps only its final state: commit all its tokens")
                self.h[i] = states[:, n - 1 - (self.pending - states.shape[1])].clone()
                self.conv[i] = self.pending_conv[i][:, :, n : n + k1].clone()
        self.length += n
        self.pending = 0
        self.pending_h.clear()
        self.pending_conv.clear()
        self.pending_tree.clear()

    def truncate(self, length: int) -> None:
        """Forget committed tokens past `length` (attention-only caches: KV slots are positions)."""
        if self.h:
            raise ValueError("a cache with recurrent layers cannot be truncated; commit a prefix instead")
        if not 0 <= length <= self.length:
            raise ValueError(f"truncate({length}) on a cache of length {self.length}")
        self.length, self.pending = length, 0

    def state(self) -> dict[str, torch.Tensor]:
        """The committed state, for comparisons in tests and replays."""
        out = {f"h{i}": t for i, t in self.h.items()}
        out.update({f"conv{i}": t for i, t in self.conv.items()})
        for i in self.k:
            out[f"k{i}"] = self.k[i][:, :, : self.length]
            out[f"v{i}"] = self.v[i][:, :, : self.length]
        return out


class StaticCache:
    """Decoding state at fixed addresses, for the static-shape path (fast.py): every buffer is
    allocated once, the committed lengths are a device tensor, and a pass over n rows is described
    by device tensors too (`plan`), so a whole speculative step can be captured as one CUDA graph.

    The cache holds `lanes` requests side by side (a batch): lane b owns max_len slots, its own
    recurrent and conv state and its committed length `lengths[b]` (`length`: lane 0's, for a
    cache of one lane). A pass plans the same n rows in every lane (rows [lanes, n], each lane its
    own tree), or n rows in some lanes only (`lane=`: a prefill, the other lanes untouched; a device
    tensor of lane numbers, which lets one captured prefill serve every lane). A pass
    may give each lane's count of real rows (`valid=`): the rows after them are padding (a prefill
    padded to a captured length), which writes K/V only past the real rows and leaves the
    recurrent state as the real rows leave it.

    A pass writes a lane's rows' K/V into its slots [length, length + n); rows see every committed
    slot of their lane and their own ancestors-or-self among its new rows (a chain: every earlier
    row). Gated DeltaNet layers run the tree form (gdn.tree_gated_delta_rule) from the committed
    state and keep, per row, only what a commit needs (k, u, G and the pre-conv input);
    `commit(path, tau)` then moves each lane's accepted rows' K/V to consecutive slots and sets its
    recurrent state to the state after its deepest accepted row. A pass planned with `commit_all`
    (prefill, a drafter's context rows) updates the recurrent state in place and the caller
    advances the length itself."""

    def __init__(self, cfg: ModelConfig, max_len: int, device, dtype: torch.dtype, lanes: int = 1):
        self.cfg, self.max_len, self.lanes = cfg, max_len, lanes
        self.lengths = torch.zeros(lanes, dtype=torch.long, device=device)
        self.length = self.lengths[0]  # a view: lane 0's committed length
        self.k, self.v, self.h, self.conv = {}, {}, {}, {}
        self.stash = {}  # GDN layer -> (k, u, G), pre-conv rows, of the last pass
        self.ctx = None
        sdt = state_dtype(dtype)
        attn = [i for i, t in enumerate(cfg.layer_types) if t != "linear_attention"]
        # every attention layer's K and V in one buffer: a commit moves all their rows in one go
        self.kv = torch.zeros(len(attn), 2, lanes, cfg.num_key_value_heads, max_len, cfg.head_dim, device=device,
                              dtype=dtype)
        for j, i in enumerate(attn):
            self.k[i], self.v[i] = self.kv[j, 0], self.kv[j, 1]
        for i, t in enumerate(cfg.layer_types):
            if t == "linear_attention":
                nv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
                conv_dim = 2 * cfg.linear_num_key_heads * dk + nv * dv
                self.h[i] = torch.zeros(lanes, nv, dk, dv, device=device, dtype=sdt)
                self.conv[i] = torch.zeros(lanes, cfg.linear_conv_kernel_dim - 1, conv_dim, device=device,
                                           dtype=dtype)

    def reset(self, lane: torch.Tensor | None = None) -> None:
        """Empty every lane, or the lanes `lane` (a device tensor of lane numbers)."""
        for t in (self.lengths, *self.h.values(), *self.conv.values()):
            t.zero_() if lane is None else t.index_fill_(0, lane, 0)

    def snapshot(self) -> tuple[torch.Tensor, ...]:
        """Copies of what a pass planned with `commit_all` changes below the committed lengths
        (the lengths, the recurrent and conv state); K/V past the lengths is never read."""
        return tuple(t.clone() for t in (self.lengths, *self.h.values(), *self.conv.values()))

    def restore(self, snap: tuple[torch.Tensor, ...]) -> None:
        """Back to a `snapshot`: every pass since it forgotten."""
        for t, v in zip((self.lengths, *self.h.values(), *self.conv.values()), snap, strict=True):
            t.copy_(v)

    def view(self, buf: torch.Tensor) -> torch.Tensor:
        """A per-lane buffer ([lanes, ...]) as the planned pass sees it: every lane, or a copy of its
        lanes (write through `put`)."""
        lane = self.ctx.lane
        return buf if lane is None else buf.index_select(0, lane)

    def put(self, buf: torch.Tensor, value: torch.Tensor) -> None:
        """Write `value` (as `view(buf)` sees the planned pass's lanes) into buf."""
        lane = self.ctx.lane
        buf.copy_(value) if lane is None else buf.index_copy_(0, lane, value)

    def plan(self, n: int, parents: torch.Tensor | None = None, depth: torch.Tensor | None = None,
             max_depth: int = 0, commit_all: bool = False, offset: int = 0, full: bool = False,
             lane: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> None:
        """Describe the next pass: n rows per lane, a tree by `parents` ([lanes, n] or [n] for one
        lane; node 0 the root, its own parent), `depth` and its largest possible depth, or a chain
        when parents is None (`full`: rows that all see each other, as a block drafter's).
        `offset` places the rows that many slots past the committed length, the rows between
        counting as committed (a drafter's own chain). `lane`: the pass runs in those lanes only (a
        device tensor of lane numbers). `valid` [lanes of the pass]: real rows of each lane, the
        rest padding (commit_all passes)."""
        dev = self.lengths.device
        idx = torch.arange(n, device=dev)
        if lane is None:
            L, batch = self.lengths, torch.arange(self.lanes, device=dev)[:, None]
        else:
            L, batch = self.lengths.index_select(0, lane), lane[:, None]
        L = L + offset if offset else L
        B = L.shape[0]
        if parents is None:
            parents, depth = (idx - 1).clamp_min(0).expand(B, n), idx.expand(B, n)
            anc = torch.ones(n, n, dtype=torch.bool, device=dev)
            anc = (anc if full else anc.tril()).expand(B, n, n)
        else:
            parents, depth = parents.view(B, n), depth.view(B, n)
            anc = ancestors(parents, max_depth)
        slots = L[:, None] + idx  # [B, n], within each lane
        positions = L[:, None] + depth
        rel = torch.arange(self.max_len, device=dev)[None, :] - L[:, None]  # [B, S]
        new = (rel >= 0) & (rel < n)
        relc = rel.clamp(0, n - 1)
        seen = (rel < 0)[:, None, :] | (new[:, None, :] & anc.gather(2, relc[:, None, :].expand(B, n, -1)))
        window = self.cfg.sliding_window
        wmask = None
        if window and "sliding_attention" in self.cfg.layer_types:
            kpos = torch.where(new, L[:, None] + depth.gather(1, relc), rel + L[:, None])  # [B, S]
            wmask = seen & (kpos[:, None, :] > positions[:, :, None] - window)
        conv_idx = conv_windows(parents, depth, self.cfg.linear_conv_kernel_dim) if self.h else None
        self.ctx = Pass(n, slots, positions, seen, wmask, anc, parents, depth, conv_idx, commit_all, lane, batch,
                        valid)

    def commit(self, path: torch.Tensor, tau: torch.Tensor, compact: bool = True) -> None:
        """Keep each lane's rows path[b, :tau[b]] of a pass planned over every lane (path: [lanes, D]
        row indices, root first; entries past tau are ignored but must be valid rows; [D] and a
        0-d tau for one lane). A lane with tau 0 keeps its length (an idle lane). compact=False: the
        paths are prefixes (chains), whose K/V already sit in consecutive slots."""
        B = self.lanes
        path, tau = path.view(B, -1), tau.view(B)
        L, D = self.lengths, path.shape[1]
        lane = self.ctx.batch
        if compact and self.k:  # gather first, then write: sources and destinations may overlap
            src, dst = L[:, None] + path, L[:, None] + torch.arange(D, device=path.device)
            self.kv[:, :, lane, :, dst] = self.kv[:, :, lane, :, src]
        deepest = path.gather(1, (tau - 1).clamp_min(0)[:, None])[:, 0]  # [B]
        n = self.ctx.n
        for i in self.h:
            kug, mixed = self.stash[i]
            anc_row = self.ctx.anc.gather(1, deepest[:, None, None].expand(B, 1, n))[:, 0]
            self.h[i].copy_(gdn_tree_state(self.h[i], kug, anc_row, deepest))
            k1, C = self.conv[i].shape[1:]
            seq = torch.cat((self.conv[i], mixed.gather(1, path[..., None].expand(B, D, C))), 1)  # along the path
            keep = tau[:, None] + torch.arange(k1, device=path.device)
            self.conv[i].copy_(seq.gather(1, keep[..., None].expand(B, k1, C)))
        self.lengths += tau


class Pass(NamedTuple):
    n: int
    slots: torch.Tensor  # [B, n] where each lane's rows' K/V go, within the lane
    positions: torch.Tensor  # [B, n]
    mask: torch.Tensor  # [B, n, max_len] bool: slots of its lane each row attends to
    window_mask: torch.Tensor | None  # the same for sliding-window layers
    anc: torch.Tensor  # [B, n, n] bool: ancestors-or-self
    parents: torch.Tensor  # [B, n], the root its own parent
    depth: torch.Tensor  # [B, n]
    conv_idx: torch.Tensor | None  # [B, K, n] (hybrids): each row's conv window, see gdn.conv_windows
    commit_all: bool
    lane: torch.Tensor | None  # the lanes a pass runs in, or None: every lane
    batch: torch.Tensor  # [B, 1]: the pass's lane numbers, for indexing per-lane buffers
    valid: torch.Tensor | None = None  # [B]: real rows of each lane (the rest: padding), or None: all


def ancestors(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[..., n, n] bool: row i marks i and its ancestors (parents [..., n], parents[..., 0] == 0:
    the root is its own parent). By squaring the one-step relation: ⌈log2(max_depth + 1)⌉ small
    matrix products, not a sequential hop per level."""
    n = parents.shape[-1]
    idx = torch.arange(n, device=parents.device)
    step = (idx[:, None] == idx[None, :]) | (parents[..., :, None] == idx[None, :])  # self or parent
    reach, hops = step.float(), 1
    while hops < max_depth:
        reach = ((reach @ reach) > 0).float()  # paths of up to 2·hops steps
        hops *= 2
    return reach > 0
