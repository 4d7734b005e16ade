"""The target (and draft-LM) transformer: dense attention, sliding-window attention and Gated
DeltaNet layers. Parameter names equal the Hugging Face checkpoint's tensor names, so a
checkpoint's state dict loads as is.

`forward(tokens, cache, positions, tree_mask)` runs T new tokens against the committed cache:
attention rows see every committed position plus the new rows allowed by `tree_mask`
(lower-triangular when absent: a chain); GDN layers run the recurrence from the committed state
and leave per-position state in the cache (see cache.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .cache import Cache, StaticCache, state_dtype
from .config import ModelConfig
from .gdn import (chunked_gated_delta_rule, first_occurrence, gated_delta_rule, gather_paths, pad_paths, root_paths,
                  tree_gated_delta_rule)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, zero_centered: bool = False):
        super().__init__()
        self.eps, self.zero_centered = eps, zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(state_dtype(x.dtype))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.zero_centered:
            return (xf * (1.0 + self.weight.to(xf.dtype))).to(x.dtype)
        return self.weight * xf.to(x.dtype)


class GatedRMSNorm(RMSNorm):
    """RMSNorm(x) * silu(z), the output norm of a Gated DeltaNet layer."""

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        sdt = state_dtype(x.dtype)
        y = super().forward(x).to(sdt) * F.silu(z.to(sdt))
        return y.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the first cos.shape[-1] channels (partial rotary keeps the rest)."""
    d = cos.shape[-1]
    xr, xp = x[..., :d], x[..., d:]
    x1, x2 = xr[..., : d // 2], xr[..., d // 2 :]
    xr = xr * cos + torch.cat((-x2, x1), dim=-1) * sin
    return torch.cat((xr, xp), dim=-1)


def rope_tables(inv_freq: torch.Tensor, pos: torch.Tensor, dtype: torch.dtype):
    """cos, sin [B, 1, T, rotary_dim] for positions [B, T] (computed in float32, float64 for float64)."""
    rdt = torch.float64 if dtype == torch.float64 else torch.float32
    f = pos.to(rdt)[..., None] * inv_freq.to(rdt)
    emb = torch.cat((f, f), dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Dense:
    """A projection y = x·Wᵀ (+ b) that a pass reads in one GEMM: fused Linears (`fuse`). Not a
    module, so the model's state_dict keeps the checkpoint's names; `weights.py` swaps it (and the
    plain Linears) for W12 projections."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight, self.bias = weight, bias
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def fuse(linears: list[nn.Linear]) -> Dense:
    """One weight (and bias) for Linears that read the same input, so that a pass reads them in one
    GEMM; each Linear's parameters become views into it (same values, same names, no extra memory).
    Fuse after the model has its final device and dtype."""
    w = torch.cat([m.weight.detach() for m in linears])
    b = torch.cat([m.bias.detach() for m in linears]) if linears[0].bias is not None else None
    at = 0
    for m in linears:
        m.weight = nn.Parameter(w[at : at + m.out_features], requires_grad=False)
        if b is not None:
            m.bias = nn.Parameter(b[at : at + m.out_features], requires_grad=False)
        at += m.out_features
    return Dense(w, b)


def attend(q, k, v, mask):
    """Attention of q [B, H, n, d] over k, v [B, Hkv, S, d] (a cache's buffers or views of them)
    where mask [n, S] or [B, n, S] allows; query heads grouped onto their key-value head without
    copying the cache."""
    B, H, n, d = q.shape
    g = H // k.shape[1]
    s = (q.reshape(B, k.shape[1], g * n, d) @ k.transpose(-1, -2)).to(state_dtype(q.dtype)) * d ** -0.5
    mask = mask.repeat(g, 1) if mask.dim() == 2 else mask.repeat(1, g, 1)[:, None]
    p = s.masked_fill(~mask, float("-inf")).softmax(-1).to(v.dtype)
    return (p @ v).view(B, H, n, d)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, i, b = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj, self.up_proj = nn.Linear(h, i, bias=b), nn.Linear(h, i, bias=b)
        self.down_proj = nn.Linear(i, h, bias=b)
        self.gate_up = None  # a Dense once fused

    def forward(self, x):
        if self.gate_up is not None:
            g, u = self.gate_up(x).chunk(2, dim=-1)
            return self.down_proj(F.silu(g) * u)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def causal_mask(T: int, device) -> torch.Tensor:
    """[T, T]: row i sees columns 0..i."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        nh, nkv, hd, b = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.attention_bias
        self.window = cfg.sliding_window if cfg.layer_types[layer] == "sliding_attention" else None
        self.q_proj = nn.Linear(cfg.hidden_size, nh * hd * (2 if cfg.attn_output_gate else 1), bias=b)
        self.k_proj = nn.Linear(cfg.hidden_size, nkv * hd, bias=b)
        self.v_proj = nn.Linear(cfg.hidden_size, nkv * hd, bias=b)
        self.o_proj = nn.Linear(nh * hd, cfg.hidden_size, bias=b)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, cfg.zero_centered_norm)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, cfg.zero_centered_norm)
        self.qkv = None  # a Dense once fused

    def project(self, x):
        if self.qkv is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.qkv(x).split([self.q_proj.out_features, self.k_proj.out_features,
                                             self.v_proj.out_features], dim=-1)

    def in_window(self, kpos: torch.Tensor, qpos: torch.Tensor) -> torch.Tensor:
        """[Tq, Tk]: the key lies inside the query's sliding window (everything, without one)."""
        if not self.window:
            return torch.ones(len(qpos), len(kpos), dtype=torch.bool, device=qpos.device)
        return kpos[None, :] > qpos[:, None] - self.window

    def forward(self, x, rope, pos, tree_mask, cache: Cache | None, start: int):
        B, T, _ = x.shape
        hd = self.cfg.head_dim
        q, k, v = self.project(x)
        q = q.view(B, T, -1, hd * (2 if self.cfg.attn_output_gate else 1))
        gate = None
        if self.cfg.attn_output_gate:
            q, gate = q.chunk(2, dim=-1)
            gate = gate.reshape(B, T, -1)
        k = k.view(B, T, -1, hd)
        v = v.view(B, T, -1, hd).transpose(1, 2)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q.transpose(1, 2), *rope), rotate(k.transpose(1, 2), *rope)

        if isinstance(cache, StaticCache):  # fixed shapes: the whole buffer, slots and mask planned
            ctx = cache.ctx  # rows [lanes, n]: each lane's rows go to its own slots
            kb, vb = cache.k[self.layer], cache.v[self.layer]
            kb[ctx.batch, :, ctx.slots] = k.transpose(1, 2)
            vb[ctx.batch, :, ctx.slots] = v.transpose(1, 2)
            o = attend(q, cache.view(kb), cache.view(vb), ctx.window_mask if self.window else ctx.mask)
        elif tree_mask is None and cache is None and not self.window:  # plain causal rows (training):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # no mask to read
        else:  # new rows see each other by tree_mask (causal by default), and every committed slot
            qpos = pos[0]  # positions are shared across the batch
            mask = (causal_mask(T, x.device) if tree_mask is None else tree_mask) & self.in_window(qpos, qpos)
            if cache is not None:
                cache.k[self.layer][:, :, start : start + T] = k
                cache.v[self.layer][:, :, start : start + T] = v
                k = cache.k[self.layer][:, :, : start + T]
                v = cache.v[self.layer][:, :, : start + T]
                mask = torch.cat((self.in_window(torch.arange(start, device=x.device), qpos), mask), dim=1)
            if cache is not None and q.is_cuda:  # SDPA's fallback would copy the cache once per query-head group
                o = attend(q, k, v, mask)
            else:
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        o = o.transpose(1, 2).reshape(B, T, -1)
        if gate is not None:
            o = o * torch.sigmoid(gate)
        return self.o_proj(o)


class GatedDeltaNet(nn.Module):
    """Qwen3-Next's linear-attention layer: short causal conv, then the gated delta rule."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.key_dim, self.value_dim = nk * dk, nv * dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.in_proj_qkvz = nn.Linear(cfg.hidden_size, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(cfg.hidden_size, 2 * nv, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.linear_conv_kernel_dim,
                                groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(nv))
        self.A_log = nn.Parameter(torch.zeros(nv))
        self.norm = GatedRMSNorm(dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, cfg.hidden_size, bias=False)
        self.in_proj = None  # a Dense of in_proj_qkvz and in_proj_ba once fused
        self.chunk = 64  # positions per chunk of the parallel form (any size gives the same outputs)
        self.triton_rule = False  # training passes on a GPU run kernels/gdn_chunk.py instead (float32, TF32 dots)

    def split(self, x):
        """Projections in the checkpoint's per-key-head grouped layout → q, k, v, z, b, a."""
        c = self.cfg
        B, T, _ = x.shape
        nk, r, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads // c.linear_num_key_heads, \
            c.linear_key_head_dim, c.linear_value_head_dim
        if self.in_proj is None:
            qkvz, ba = self.in_proj_qkvz(x), self.in_proj_ba(x)
        else:
            qkvz, ba = self.in_proj(x).split([self.in_proj_qkvz.out_features,
                                                         self.in_proj_ba.out_features], dim=-1)
        q, k, v, z = torch.split(qkvz.view(B, T, nk, 2 * dk + 2 * r * dv), [dk, dk, r * dv, r * dv], dim=-1)
        b, a = torch.split(ba.view(B, T, nk, 2 * r), [r, r], dim=-1)
        return q, k, v.reshape(B, T, -1, dv), z.reshape(B, T, -1, dv), b.reshape(B, T, -1), a.reshape(B, T, -1)

    def rule_inputs(self, conv_out: torch.Tensor, b: torch.Tensor, a: torch.Tensor):
        """Post-conv rows [..., T, C] (and b, a) → q, k, v, g, β of the delta rule, state dtype."""
        c = self.cfg
        sdt = state_dtype(conv_out.dtype)
        r = c.linear_num_value_heads // c.linear_num_key_heads
        q, k, v = torch.split(conv_out, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        lead = q.shape[:-1]
        q = q.reshape(*lead, -1, c.linear_key_head_dim).repeat_interleave(r, dim=-2).to(sdt)
        k = k.reshape(*lead, -1, c.linear_key_head_dim).repeat_interleave(r, dim=-2).to(sdt)
        v = v.reshape(*lead, -1, c.linear_value_head_dim).to(sdt)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * c.linear_key_head_dim ** -0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        beta = torch.sigmoid(b).to(sdt)
        g = -self.A_log.to(sdt).exp() * F.softplus(a.to(sdt) + self.dt_bias.to(sdt))
        return q, k, v, g, beta

    def conv(self, rows: torch.Tensor) -> torch.Tensor:
        """Causal depthwise conv + SiLU over time-major rows [B, K-1+T, C] → [B, T, C]. Under
        torch.compile it is written as K shifted products along the time axis, channels innermost,
        which the compiler fuses with the SiLU into one kernel, forward and backward (CUDA's
        depthwise conv kernels take milliseconds at training shapes, and the weight's gradient, a sum
        over batch and time, reads coalesced only with channels innermost); eager passes call conv1d."""
        w = self.conv1d.weight
        if not torch.compiler.is_compiling():
            return F.silu(F.conv1d(rows.transpose(1, 2), w, groups=self.conv_dim)).transpose(1, 2)
        K = w.shape[-1]
        T = rows.shape[1] - K + 1
        return F.silu(sum(rows[:, a : a + T] * w[:, 0, a] for a in range(K)))

    def forward(self, x, h0: torch.Tensor, conv0: torch.Tensor, snapshots: bool = True):
        """A chain of T positions. Returns (output, states, conv inputs [B, C, K-1+T]); states are
        per position [B, T, H, Dk, Dv] with snapshots, else the final state (parallel form)."""
        B, T, _ = x.shape
        q, k, v, z, b, a = self.split(x)
        mixed = torch.cat((q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)), dim=-1)
        rows = torch.cat((conv0.transpose(1, 2), mixed), dim=1)  # [B, K-1+T, C]
        q, k, v, g, beta = self.rule_inputs(self.conv(rows), b, a)
        if snapshots:
            out, states = gated_delta_rule(q, k, v, g, beta, h0)
        elif self.triton_rule and x.is_cuda and torch.is_grad_enabled():
            from specpilot.kernels import gdn_chunk  # Triton loads only where it is asked for

            out, states = gdn_chunk.chunked_gated_delta_rule(q, k, v, g, beta, h0, self.chunk)
        else:
            out, states = chunked_gated_delta_rule(q, k, v, g, beta, h0, self.chunk)
        out = self.norm(out.to(x.dtype), z)
        return self.out_proj(out.reshape(B, T, -1)), states, rows.transpose(1, 2)

    def forward_tree(self, x, h0: torch.Tensor, conv0: torch.Tensor, parents: list[int]):
        """N tree nodes (batch 1), without a state per node: every root path runs the recurrence
        from the committed state, the paths side by side, each keeping only its current state (one
        state per root path in flight, per layer). Returns (output, stash) where the stash holds
        each node's pre-conv row and delta-rule inputs, for `replay_path` of the accepted path."""
        _, N, _ = x.shape
        q, k, v, z, b, a = self.split(x)
        mixed = torch.cat((q.reshape(N, -1), k.reshape(N, -1), v.reshape(N, -1)), dim=-1)  # [N, C]
        idx = pad_paths(root_paths(parents)).to(x.device)  # [P, D]
        P = idx.shape[0]
        rows = torch.cat((conv0.transpose(1, 2).expand(P, -1, -1), gather_paths(mixed, idx)), dim=1)
        wp, wt = first_occurrence(idx.cpu(), N)
        conv_out = self.conv(rows)[wp, wt]  # [N, C]: a node's conv window is its own root path
        q, k, v, g, beta = self.rule_inputs(conv_out, b[0], a[0])
        out, _ = gated_delta_rule(*(gather_paths(t, idx) for t in (q, k, v, g, beta)), h0.expand(P, -1, -1, -1),
                                  every_state=False)
        out = self.norm(out[wp, wt].to(x.dtype)[None], z)
        return self.out_proj(out.reshape(1, N, -1)), {"mixed": mixed, "rule": (q, k, v, g, beta)}

    def forward_static(self, x, cache: StaticCache, layer: int):
        """The rows [lanes, n] of a planned static pass: a tree (or chain) per lane from its
        committed state in tree form, stashing what `StaticCache.commit` needs; a `commit_all`
        chain (prefill) in chunked form, updating the state in place; its padding rows (past
        `ctx.valid`) get no key, β or decay, so the state leaves them as the real rows left it. No
        state is kept per row."""
        ctx, (B, n) = cache.ctx, x.shape[:2]
        q, k, v, z, b, a = self.split(x)
        mixed = torch.cat((q.reshape(B, n, -1), k.reshape(B, n, -1), v.reshape(B, n, -1)), dim=-1)  # pre-conv
        conv0, h0 = cache.view(cache.conv[layer]), cache.view(cache.h[layer])  # [B, K-1, C] oldest first
        rows = torch.cat((conv0, mixed), 1)  # [B, K-1+n, C]
        if ctx.commit_all:
            q, k, v, g, beta = self.rule_inputs(self.conv(rows), b, a)
            if ctx.valid is not None:
                real = (torch.arange(n, device=x.device) < ctx.valid[:, None])[..., None]  # [B, n, 1]
                k, g, beta = k * real[..., None], g * real, beta * real
                # the conv's state: the K-1 pre-conv rows ending at the last real row
                last = ctx.valid[:, None] + torch.arange(conv0.shape[1], device=x.device)  # [B, K-1]
            out, h = chunked_gated_delta_rule(q, k, v, g, beta, h0)
            cache.put(cache.h[layer], h)
            cache.put(cache.conv[layer], rows[:, n:] if ctx.valid is None else
                      rows.gather(1, last[..., None].expand(-1, -1, rows.shape[-1])))
        else:
            K, C = conv0.shape[1] + 1, rows.shape[-1]
            rows = rows.gather(1, ctx.conv_idx.flatten(1)[..., None].expand(-1, -1, C)).view(B, K, n, C)
            w = self.conv1d.weight[:, 0].flip(-1)  # [C, K]: column a weighs the input a rows back
            conv_out = F.silu(torch.einsum("banc,ca->bnc", rows, w))
            q, k, v, g, beta = self.rule_inputs(conv_out, b, a)
            out, kug = tree_gated_delta_rule(q, k, v, g, beta, h0, ctx.anc)
            cache.stash[layer] = (kug, mixed)
        out = self.norm(out.to(x.dtype), z)
        return self.out_proj(out.reshape(B, n, -1))


def run_layers(cfg: ModelConfig, layers, x, cache: Cache | None, start: int, positions, tree_mask, rope,
               feature_layers: tuple[int, ...] = (), commit_all: bool = False):
    """The residual stream through `layers`; returns it and the concatenated features of feature_layers."""
    B, T, _ = x.shape
    parents = None  # a tree over the new rows (not a chain): GDN layers run its root paths
    static = isinstance(cache, StaticCache)
    dynamic = cache is not None and not static
    if cfg.is_hybrid and dynamic and not torch.equal(tree_mask, causal_mask(T, x.device)):
        if B != 1:
            raise ValueError("tree verification of Gated DeltaNet layers needs batch 1 and a dynamic cache")
        anc = tree_mask.tril(-1).cpu()
        parents = [int(torch.nonzero(anc[i]).max()) if anc[i].any() else -1 for i in range(T)]
        if parents.count(-1) != 1 or parents[0] != -1:
            raise ValueError("a tree mask must have node 0 as its only root")
    feats = {}
    for i, blk in enumerate(layers):
        x = blk(x, rope, positions, tree_mask, cache, start, commit_all, parents)
        if i in feature_layers:
            feats[i] = x
    return x, (torch.cat([feats[i] for i in feature_layers], -1) if feature_layers else None)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.kind, self.layer = cfg.layer_types[layer], layer
        if self.kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg, layer)
        else:
            self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.zero_centered_norm)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.zero_centered_norm)

    def forward(self, x, rope, positions, tree_mask, cache: Cache | StaticCache | None = None, start: int = 0,
                commit_all: bool = False, parents: list[int] | None = None):
        """One layer of the residual stream (run_layers' arguments). Without a cache (training,
        feature passes) it reads nothing per layer but its own weights, so that torch.compile of a
        block compiles each kind of block once (zoo/train.py)."""
        y = self.input_layernorm(x)
        i = self.layer
        if self.kind != "linear_attention":
            y = self.self_attn(y, rope, positions, tree_mask, cache, start)
        elif isinstance(cache, StaticCache):
            y = self.linear_attn.forward_static(y, cache, i)
        elif cache is None:  # from the zero state, keeping only the final one
            gdn, c = self.linear_attn, self.linear_attn.cfg
            h0 = y.new_zeros(x.shape[0], c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim,
                             dtype=state_dtype(y.dtype))
            y = gdn(y, h0, y.new_zeros(x.shape[0], gdn.conv_dim, c.linear_conv_kernel_dim - 1), snapshots=False)[0]
        elif parents is not None:
            y, cache.pending_tree[i] = self.linear_attn.forward_tree(y, cache.h[i], cache.conv[i], parents)
        else:
            snap = not commit_all  # a pass committed whole keeps its final state only
            y, states, conv_in = self.linear_attn(y, cache.h[i], cache.conv[i], snapshots=snap)
            cache.pending_h[i], cache.pending_conv[i] = states if snap else states[:, None], conv_in
        x = x + y
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class Output:
    logits: torch.Tensor | None  # [B, T, V]; None when only the argmax was asked for and the head gives it alone
    features: torch.Tensor | None  # [B, T, len(feature_layers) * hidden] residual stream after those layers
    argmax: torch.Tensor | None = None  # [B, T] the greedy token of each row, when asked for (greedy=True)


class Model(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        # Loading builds the module on the meta device and assigns the checkpoint's tensors: skip the
        # embedding's random init there (normal_ on a meta tensor imports torch._dynamo, seconds of
        # every worker's and command's start)
        meta = torch.get_default_device().type == "meta"
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                               _weight=torch.empty(cfg.vocab_size, cfg.hidden_size) if meta else None)
        self.model.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_hidden_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.zero_centered_norm)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", cfg.inv_freq(), persistent=False)
        # what the final projection runs (weights.py sets them): None is F.linear on lm_head_weight;
        # `head` a projection giving the logits (a W12 one), `greedy_head` an object whose
        # `argmax(h)` gives only the argmax (the certified head). lm_head_weight stays dense for the
        # drafters and scorers that read it.
        self.head: Callable | None = None
        self.greedy_head = None

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def new_cache(self, max_len: int, batch: int = 1) -> Cache:
        p = self.model.embed_tokens.weight
        return Cache(self.cfg, batch, max_len, p.device, p.dtype)

    def static_cache(self, max_len: int, lanes: int = 1) -> StaticCache:
        p = self.model.embed_tokens.weight
        return StaticCache(self.cfg, max_len, p.device, p.dtype, lanes)

    def fuse(self) -> Model:
        """Read each layer's q/k/v, gate/up and GDN input projections in one GEMM each (idempotent;
        after the last .to())."""
        for blk in self.model.layers:
            if blk.kind == "linear_attention":
                gdn = blk.linear_attn
                gdn.in_proj = gdn.in_proj or fuse([gdn.in_proj_qkvz, gdn.in_proj_ba])
            else:
                at = blk.self_attn
                at.qkv = at.qkv or fuse([at.q_proj, at.k_proj, at.v_proj])
            blk.mlp.gate_up = blk.mlp.gate_up or fuse([blk.mlp.gate_proj, blk.mlp.up_proj])
        return self

    def forward(self, tokens: torch.Tensor, cache: Cache | StaticCache | None = None,
                positions: torch.Tensor | None = None, tree_mask: torch.Tensor | None = None,
                feature_layers: tuple[int, ...] = (), logits: bool | str = True, commit_all: bool = False,
                layers=None, greedy: bool = False) -> Output:
        """tokens [B, T]. With a cache, the T tokens follow its committed length and stay pending
        until `cache.commit`. positions default to consecutive ones; tree_mask [T, T] (row sees
        column) defaults to causal. A StaticCache brings its planned pass instead (positions, masks).
        logits: True (every row), "last" (the last row only) or False. commit_all: the caller will
        commit every token (a prefill): Gated DeltaNet layers then run the chunked form and keep
        only the final state, not one per position. layers: callables standing in for the blocks
        (default: the blocks; training passes each block compiled). greedy: also give each row's
        argmax (`Output.argmax`); a head that finds the argmax without every logit (the certified
        head) then gives no logits."""
        B, T = tokens.shape
        start = 0
        if isinstance(cache, StaticCache):
            positions = cache.ctx.positions
        elif cache is not None:
            start = cache.reserve(T)
        if positions is None:
            positions = torch.arange(start, start + T, device=tokens.device).expand(B, T)
        if tree_mask is None and cache is not None and not isinstance(cache, StaticCache):
            tree_mask = causal_mask(T, tokens.device)
        x, features = run_layers(self.cfg, layers or self.model.layers, self.model.embed_tokens(tokens), cache, start, positions,
                                 tree_mask, rope_tables(self.inv_freq, positions, self.dtype), feature_layers,
                                 commit_all)
        if logits == "last":  # a padded static pass: its last real row
            valid = cache.ctx.valid if isinstance(cache, StaticCache) else None
            x = x[:, -1:] if valid is None else x.gather(1, (valid - 1)[:, None, None].expand(-1, 1, x.shape[-1]))
        if not logits:
            return Output(None, features)
        h = self.model.norm(x)
        if greedy and self.greedy_head is not None:
            return Output(None, features, self.greedy_head.argmax(h.reshape(-1, h.shape[-1])).view(h.shape[:-1]))
        out = self.head(h) if self.head is not None else F.linear(h, self.lm_head_weight)
        return Output(out, features, out.argmax(-1) if greedy else None)
