"""Decoding state: a KV cache for attention layers, recurrent (GDN) and short-conv state for
Gated DeltaNet layers, with commit / rollback.

A forward pass over T new tokens writes *pending* state: K/V into slots [length, length+T) and,
for GDN layers, the state after every one of the T positions (per-position snapshots, as stock
chain verification keeps them). `commit(n)` keeps the first n of those tokens and drops the rest,
which is the rollback to an accepted length; `commit(n, path)` keeps the tokens at indices `path`
(a root path of a verified tree) and compacts their K/V to contiguous slots.
"""

from __future__ import annotations

import torch

from .config import ModelConfig
from .gdn import replay_path


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """Recurrent state and norms run in float32 at least (float64 stays float64)."""
    return torch.promote_types(dtype, torch.float32)


class Cache:
    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, device, dtype: torch.dtype,
                 static: bool = False):
        self.cfg, self.max_len, self.length = cfg, max_len, 0
        # static: fixed addresses for CUDA graphs; slots = positions, every token commits in place
        self.static = static
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
                self.h[i] = self.pending_h[i][:, n - 1].clone()
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
