"""The gated delta rule of Gated DeltaNet layers: the reference recurrence (one position at a
time, keeping the state after each), its parallel chunked form, and the replay of tree paths."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gated_delta_rule(q, k, v, g, beta, h, every_state: bool = True):
    """Reference recurrence, one position at a time: h ← h·e^g; h ← h + k ⊗ β(v − hᵀk); o = hᵀq.

    q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; g, beta: [B, T, H]; h: [B, H, Dk, Dv].
    Returns outputs [B, T, H, Dv] and the state after every position [B, T, H, Dk, Dv], or with
    every_state=False the final state [B, H, Dk, Dv] only (one state per batch row in flight).
    """
    outs, states = [], []
    for t in range(q.shape[1]):
        h = h * g[:, t].exp()[..., None, None]
        kt = k[:, t]
        delta = (v[:, t] - torch.einsum("bhkv,bhk->bhv", h, kt)) * beta[:, t, :, None]
        h = h + kt[..., :, None] * delta[..., None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", h, q[:, t]))
        if every_state:
            states.append(h)
    return torch.stack(outs, 1), torch.stack(states, 1) if every_state else h


def chunked_gated_delta_rule(q, k, v, g, beta, h, chunk: int = 64):
    """The same recurrence in parallel form (for training and cache-free passes), chunk by chunk.

    Within a chunk, with G the cumulative log-decay from its start and h0 the state entering it,
    the per-position updates u_i = β_i(v_i − e^{G_i} h0ᵀk_i − Σ_{j<i} e^{G_i−G_j}(k_jᵀk_i) u_j) solve a
    unit lower-triangular system (I + A) u = β(v − e^G k h0). Its solution is affine in h0:
    u = Wv − Wk h0 with [Wv | Wk] = (I + A)⁻¹ β [v | e^G k], so every chunk's triangular solve runs
    at once, before the walk over chunks; the walk only carries the state,
    h ← e^{G_C} h + Σ_j e^{G_C−G_j} k_j u_jᵀ, and then o_i = e^{G_i} h0ᵀq_i + Σ_{j≤i} e^{G_i−G_j}(k_jᵀq_i) u_j
    for all chunks together. Returns (outputs, final state).
    """
    B, T, H, Dk = k.shape
    Dv = v.shape[-1]
    pad = (-T) % chunk
    if pad:  # zero key, β and decay: padded positions leave the state untouched
        q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, 0, 0, pad)) for t in (g, beta))
    n = (T + pad) // chunk
    # [B, H, n, C, D] layout
    q, k, v = (t.transpose(1, 2).reshape(B, H, n, chunk, -1) for t in (q, k, v))
    g, beta = (t.transpose(1, 2).reshape(B, H, n, chunk) for t in (g, beta))
    G = g.cumsum(-1)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(lower, G[..., :, None] - G[..., None, :], float("-inf")).exp()  # e^{G_i−G_j}, j ≤ i
    eg = G.exp()[..., None]  # [B, H, n, C, 1]
    A = (beta[..., None] * decay * (k @ k.transpose(-1, -2))).tril(-1)  # β_i e^{G_i−G_j} k_iᵀk_j, j < i
    # the solve reads only A's strict lower part (unitriangular: the diagonal is taken as 1)
    W = torch.linalg.solve_triangular(A, beta[..., None] * torch.cat((v, eg * k), -1), upper=False,
                                      unitriangular=True)
    Wv, Wk = W.split([Dv, Dk], dim=-1)
    last = G[..., -1:]  # [B, H, n, 1]
    kd = ((last - G).exp()[..., None] * k).transpose(-1, -2)  # e^{G_C−G_j} k_j, [B, H, n, Dk, C]
    entering, us = [], []
    for c in range(n):
        entering.append(h)
        u = Wv[:, :, c] - Wk[:, :, c] @ h
        us.append(u)
        h = last[:, :, c].exp()[..., None] * h + kd[:, :, c] @ u
    h0, u = torch.stack(entering, 2), torch.stack(us, 2)  # [B, H, n, Dk, Dv], [B, H, n, C, Dv]
    o = eg * (q @ h0) + (decay * (q @ k.transpose(-1, -2))) @ u
    o = o.reshape(B, H, n * chunk, -1)[:, :, :T].transpose(1, 2)
    return o, h


def root_paths(parents: list[int]) -> list[list[int]]:
    """Every leaf's path from the root (node 0), as node indices."""
    has_child = set(parents[1:])
    paths = []
    for leaf in (i for i in range(len(parents)) if i not in has_child):
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    return paths


def pad_paths(paths: list[list[int]]) -> torch.Tensor:
    """[P, D] node indices, -1 past a path's end."""
    d = max(len(p) for p in paths)
    return torch.tensor([p + [-1] * (d - len(p)) for p in paths])


def gather_paths(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [N, ...] per node → [P, D, ...] along padded paths (padding rows are zero)."""
    out = x[idx.clamp_min(0)]
    return out * (idx >= 0).view(*idx.shape, *([1] * (x.dim() - 1))).to(out.dtype)


def first_occurrence(idx: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each node, one (path, step) where it appears."""
    P, D = idx.shape
    where_p, where_t = torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    for p in range(P - 1, -1, -1):
        for t in range(D):
            if idx[p, t] >= 0:
                where_p[idx[p, t]], where_t[idx[p, t]] = p, t
    return where_p, where_t


def replay_path(stash: dict, path: list[int], h0: torch.Tensor, conv0: torch.Tensor):
    """The committed (state, conv state) after a tree's accepted path: the same recurrence over the
    same rows that a chain pass over those tokens runs, so it commits what chain verification commits.
    stash: a tree pass's per-node pre-conv rows ("mixed" [N, C]) and delta-rule inputs ("rule")."""
    idx = torch.tensor(path, device=h0.device)
    _, h = gated_delta_rule(*(t[idx][None] for t in stash["rule"]), h0, every_state=False)
    conv_in = torch.cat((conv0, stash["mixed"][idx].T[None]), dim=-1)
    return h, conv_in[:, :, conv_in.shape[2] - conv0.shape[2]:]


# ---- the static-shape path: trees of rows in parallel form -------------------------------------
def tree_gated_delta_rule(q, k, v, g, beta, h0, anc):
    """The recurrence over a tree of n rows, every row from the committed state h0 along its own
    root path, in parallel form and without a state per row or per path.

    It is the chunked form of one chunk with "earlier in the chunk" replaced by "ancestor": with G_i
    the log-decay summed over i's ancestors-or-self, u solves (I + A) u = β(v − e^G h0ᵀk) with
    A_ij = β_i e^{G_i−G_j} k_iᵀk_j for strict ancestors j (lower triangular: parents come first), and
    o_i = e^{G_i} h0ᵀq_i + Σ_{j anc-or-self} e^{G_i−G_j} (k_jᵀq_i) u_j.

    q, k: [..., n, H, Dk]; v: [..., n, H, Dv]; g, beta: [..., n, H]; h0: [..., H, Dk, Dv]; anc:
    [..., n, n] bool, row i marks i and its ancestors (leading dims: independent trees, one per
    request of a batch). Returns o [..., n, H, Dv] and (k, u, G), which is all `tree_state` needs
    to commit any row's state."""
    n = q.shape[-3]
    G = anc.to(g.dtype) @ g  # [..., n, H]
    Gh = G.transpose(-1, -2)  # [..., H, n]
    decay = torch.where(anc[..., None, :, :], Gh[..., :, :, None] - Gh[..., :, None, :], float("-inf")).exp()
    qh, kh, vh = (t.transpose(-3, -2) for t in (q, k, v))  # [..., H, n, D]
    bh = beta.transpose(-1, -2)[..., None]  # [..., H, n, 1]
    eg = Gh.exp()[..., None]
    rhs = bh * (vh - eg * (kh @ h0))
    if n == 1:
        u = rhs
    else:
        eye = torch.eye(n, dtype=torch.bool, device=q.device)
        A = bh * decay.masked_fill(eye, 0.0) * (kh @ kh.transpose(-1, -2))
        u = torch.linalg.solve_triangular(A + torch.eye(n, dtype=A.dtype, device=A.device), rhs, upper=False,
                                          unitriangular=True)
    o = eg * (qh @ h0) + (decay * (qh @ kh.transpose(-1, -2))) @ u
    return o.transpose(-3, -2), (k, u.transpose(-3, -2), G)


def tree_state(h0, kug, anc_row, node):
    """The state after row `node` of a `tree_gated_delta_rule` pass: e^{G_d} h0 + Σ_{j anc-or-self
    of d} e^{G_d−G_j} k_j u_jᵀ. node: index tensor of the leading dims (0-d for one tree);
    anc_row: [..., n] bool, node's ancestors-or-self."""
    k, u, G = kug
    Gd = G.gather(-2, node[..., None, None].expand(*node.shape, 1, G.shape[-1]))  # [..., 1, H]
    w = torch.where(anc_row[..., None], (Gd - G).exp(), 0.0)  # [..., n, H]
    return Gd[..., 0, :].exp()[..., :, None, None] * h0 + torch.einsum("...nhk,...nh,...nhv->...hkv", k, w, u)


def conv_windows(parents, depth, width: int):
    """[..., width, n] row indices into cat(conv state columns (width-1 of them, oldest first), the n
    rows' pre-conv inputs): entry [a, i] is row i's input at distance a back along its root path
    (a ≤ depth: an ancestor's row; further back: a committed conv-state column)."""
    n = parents.shape[-1]
    anc = torch.arange(n, device=parents.device).expand_as(parents)
    out = []
    for a in range(width):
        out.append(torch.where(depth >= a, width - 1 + anc, width - 1 - (a - depth)))
        anc = parents.gather(-1, anc)
    return torch.stack(out, -2)
