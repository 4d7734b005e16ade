"""Drafters. Each proposes a `Lattice` for the positions after the newest token (the one not yet in
the target's cache):

- `sequential`   EAGLE-3-like head: fused target features + token embedding, one token per step.
- `block`        DFlash-like: all positions in one pass; mask rows (a learned embedding per drafted
                 position) attend to the context rows and, bidirectionally, to each other. With
                 `lead_token` the first mask row also reads the token drafted at position 1 (known
                 before the pass: the last context row's top-1), so position 2 is one token ahead
                 of a known token instead of two. With `copy_head` a pointer head mixes copies
                 from the context into positions 2..m (`offset_copy`): the last context row points
                 at earlier rows like itself that agree with the drafted position-1 token, and
                 position j+1 reads the token j places after each — a span copied in one pass;
                 its transitions keep, under each parent candidate, the sources that also agree
                 with that parent.
- `block_markov` DSpark-like: `block` plus a Markov head giving score(child | parent).
- `ngram`        prompt lookup, no weights.
- `draft_lm`     a standalone small LM (any target-format checkpoint), greedy, one token per step.

Feature drafters keep one *context row* per committed target position t: the target's features at
t together with the embedding of the token at t+1. Their checkpoints are folders with config.json
(`"architectures": ["SpecPilotDrafter"]`) and model.safetensors, like a target's; a sequential
drafter may also be an EAGLE-3 folder (SGLang / vLLM or `speculators` layout, `eagle3.py`), which
runs as the `layer0_input = "eagle3"` variant of the same network.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .cache import Cache
from .checkpoint import CheckpointError, load_into, load_model, read_config, read_tensors, write_checkpoint
from .config import ConfigError, ModelConfig, checked_field
from .model import Block, Model, RMSNorm, causal_mask, rope_tables, run_layers

TOP_K = 16
DRAFTER_ARCH = "SpecPilotDrafter"
FEATURE_KINDS = ("sequential", "block", "block_markov")
LAYER0_INPUTS = ("fc_in", "eagle3")
# DraftConfig fields added after the first checkpoints: config.json holds them only when they differ
_LATER_FIELDS = {"layer0_input": "fc_in", "norm_before_residual": False, "draft_vocab_size": None,
                 "own_embedding": False, "rope_scaling": None}


@dataclass
class Lattice:
    """Candidates for m drafted positions: tokens[i] are the top-k tokens at position i+1 after the
    newest token, logp their drafter log-probabilities (-inf / token -1 where fewer exist).
    trans[i, a, b] = log p(tokens[i+1, b] | tokens[i, a]) + c(i, a) where the drafter conditions on
    parents: the constant c(i, a) is free because trees normalize over the candidates of a parent."""

    tokens: torch.Tensor  # [m, k] long
    logp: torch.Tensor  # [m, k] float
    trans: torch.Tensor | None = None  # [m-1, k, k]

    @property
    def positions(self) -> int:
        return self.tokens.shape[0]

    def chain_candidates(self) -> list[int]:
        """The stock chain as candidate indices: the top-1 of position 1, then at each later
        position the best child of the previous pick under `trans` (the top-1 without it), up to
        the first position without a candidate. A Markov drafter's chain follows its Markov head."""
        toks = self.tokens.tolist()
        trans = self.trans.tolist() if self.trans is not None else None
        out, c = [], 0
        for i, row in enumerate(toks):
            if row[c] < 0:
                break
            out.append(c)
            if trans is not None and i < len(trans) and i + 1 < len(toks):
                nxt = [s if t >= 0 else -math.inf for s, t in zip(trans[i][c], toks[i + 1])]
                c = max(range(len(nxt)), key=lambda j: (nxt[j], -j))  # ties: the lower index, as argmax
            else:
                c = 0
        return out

    def chain(self) -> list[int]:
        """The stock chain's tokens (chain_candidates)."""
        return [self.tokens[i, c].item() for i, c in enumerate(self.chain_candidates())]

    @staticmethod
    def empty() -> Lattice:
        return Lattice(torch.empty(0, TOP_K, dtype=torch.long), torch.empty(0, TOP_K, dtype=torch.float64))

    @staticmethod
    def from_logits(logits: torch.Tensor, k: int = TOP_K) -> Lattice:
        """Top-k of each row of [m, V] logits."""
        logp = F.log_softmax(logits.double(), dim=-1)
        v, i = logp.topk(min(k, logits.shape[-1]), dim=-1)
        return Lattice(i, v)


@dataclass
class DraftConfig:
    kind: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_hidden_size: int
    target_layers: list[int]
    block_size: int = 16  # drafted positions per pass (block kinds) or steps (sequential)
    markov_rank: int = 32
    lead_token: bool = False  # block kinds: the first mask row reads the drafted position-1 token
    # an RMSNorm on each half of an input row (token embedding, hidden) before fc_in, as EAGLE-3 has:
    # without it a trained target's features, many times the embedding's size, drown it out
    input_norm: bool = False
    # block kinds: a pointer head (`offset_copy`) mixes copies from the context into drafted positions 2..m
    copy_head: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    # sequential kind: how the first layer reads a row. "fc_in" mixes the row's two halves (token
    # embedding, hidden) into one H-wide row that enters standard layers; "eagle3" is EAGLE-3's first
    # layer (`Eagle3Block`): its q/k/v read the 2H-wide [input_layernorm(embedding) ‖ hidden_norm(hidden)]
    # and its residual is the hidden half (hidden_norm(hidden) with norm_before_residual)
    layer0_input: str = "fc_in"
    norm_before_residual: bool = False
    # an own LM head of this many rows (a draft vocabulary, mapped to target ids by the net's
    # `draft_ids`); None: the target's head
    draft_vocab_size: int | None = None
    own_embedding: bool = False  # an own token embedding [vocab_size, hidden_size]; else the target's
    rope_scaling: dict | None = None  # as a target's config (llama3 frequency scaling)
    extra: dict = field(default_factory=dict)  # training record etc., kept verbatim

    def body(self) -> ModelConfig:
        """The drafter's decoder layers are Llama layers of this shape."""
        return ModelConfig(
            family="llama", vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim, layer_types=["full_attention"] * self.num_hidden_layers,
            rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
            max_position_embeddings=self.max_position_embeddings)

    def to_hf(self) -> dict:
        d = asdict(self)
        extra = d.pop("extra")
        for k, default in _LATER_FIELDS.items():  # written only when set: other drafters' files stay as they were
            if d[k] == default:
                d.pop(k)
        return {"architectures": [DRAFTER_ARCH], "drafter_kind": d.pop("kind"), **d, **extra}

    @classmethod
    def from_hf(cls, d: dict, source: str) -> DraftConfig:
        d = dict(d)
        d.pop("architectures", None)
        kind = d.pop("drafter_kind", None)
        if kind not in FEATURE_KINDS:
            raise CheckpointError(f"{source}: field 'drafter_kind' = {kind!r}; expected one of {FEATURE_KINDS}")
        names = set(cls.__dataclass_fields__) - {"kind", "extra"}
        try:  # every field checked for its type and range, the file and field named
            for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "head_dim", "target_hidden_size"):
                checked_field(d, k, source, "int", low=1)
            for k in ("block_size", "markov_rank", "max_position_embeddings"):
                checked_field(d, k, source, "int", 1, low=1)
            checked_field(d, "lead_token", source, "bool", False)
            checked_field(d, "input_norm", source, "bool", False)
            checked_field(d, "copy_head", source, "bool", False)
            checked_field(d, "rms_norm_eps", source, "float", 1e-6, low=0.0)
            checked_field(d, "rope_theta", source, "float", 1e4, low=1e-9)
            checked_field(d, "norm_before_residual", source, "bool", False)
            checked_field(d, "own_embedding", source, "bool", False)
            checked_field(d, "draft_vocab_size", source, "int", None, low=1, high=d["vocab_size"])
        except ConfigError as e:
            raise CheckpointError(str(e)) from None
        if d.get("layer0_input", "fc_in") not in LAYER0_INPUTS:
            raise CheckpointError(f"{source}: field 'layer0_input' = {d.get('layer0_input')!r}; expected one of "
                                  f"{LAYER0_INPUTS}")
        if d.get("layer0_input") == "eagle3" and (kind != "sequential" or d.get("input_norm")):
            raise CheckpointError(f"{source}: field 'layer0_input' = 'eagle3' is for a sequential drafter without "
                                  "input_norm (its first layer has its own norms)")
        if d.get("draft_vocab_size") is not None and kind != "sequential":
            raise CheckpointError(f"{source}: field 'draft_vocab_size' is for a sequential drafter, not {kind}")
        if d.get("draft_vocab_size") not in (None, d["vocab_size"]):
            raise CheckpointError(f"{source}: field 'draft_vocab_size' = {d['draft_vocab_size']}: a head over fewer "
                                  f"ids than vocab_size ({d['vocab_size']}) needs a vocabulary map, which only EAGLE-3 "
                                  "folders carry (engine/eagle3.py)")
        scaling = d.get("rope_scaling")
        if scaling is not None:
            try:
                if not isinstance(scaling, dict):
                    raise TypeError("not an object")
                ModelConfig(family="llama", vocab_size=1, hidden_size=1, intermediate_size=1, num_hidden_layers=1,
                            num_attention_heads=1, num_key_value_heads=1, head_dim=d["head_dim"], layer_types=[],
                            rope_scaling=scaling).inv_freq()
            except (ConfigError, KeyError, TypeError, ZeroDivisionError) as e:
                raise CheckpointError(f"{source}: field 'rope_scaling' = {scaling!r}: {e}") from None
        layers = d.get("target_layers")
        if not isinstance(layers, list) or not layers or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers):
            raise CheckpointError(f"{source}: field 'target_layers' = {layers!r}: expected a non-empty list of "
                                  "target layer indices")
        if d["num_attention_heads"] % d["num_key_value_heads"]:
            raise CheckpointError(f"{source}: num_attention_heads ({d['num_attention_heads']}) must be a multiple of "
                                  f"num_key_value_heads ({d['num_key_value_heads']})")
        if d.get("copy_head") and kind == "sequential":
            raise CheckpointError(f"{source}: field 'copy_head' = true is for the block kinds, not a sequential drafter")
        known = {k: d.pop(k) for k in list(d) if k in names}
        return cls(kind=kind, **known, extra=d)


class Eagle3Block(Block):
    """EAGLE-3's first drafter layer. Its input row is [embedding ‖ hidden], 2H wide (`rows`): q, k
    and v read [input_layernorm(embedding) ‖ hidden_norm(hidden)]; the residual stream starts from
    the hidden half (from hidden_norm(hidden) with `norm_before_residual`); then attention output,
    post-attention norm and MLP as in any Llama layer. Later layers are plain `Block`s."""

    def __init__(self, cfg: ModelConfig, norm_before_residual: bool):
        super().__init__(cfg, 0)
        at, H = self.self_attn, cfg.hidden_size
        at.q_proj = nn.Linear(2 * H, at.q_proj.out_features, bias=False)
        at.k_proj = nn.Linear(2 * H, at.k_proj.out_features, bias=False)
        at.v_proj = nn.Linear(2 * H, at.v_proj.out_features, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, x, rope, positions, tree_mask, cache=None, start: int = 0, commit_all: bool = False,
                parents=None):
        e, h = x.chunk(2, dim=-1)
        normed = self.hidden_norm(h)
        q_in = torch.cat((self.input_layernorm(e), normed), dim=-1)
        residual = normed if self.norm_before_residual else h
        x = residual + self.self_attn(q_in, rope, positions, tree_mask, cache, start)
        return x + self.mlp(self.post_attention_layernorm(x))


class FeatureDrafterNet(nn.Module):
    """The weights of the sequential / block / block+Markov drafters. Like EAGLE and DFlash heads
    they read tokens through the target's embedding and score them with the target's LM head
    (`emb`, `head` arguments), so a checkpoint holds only the drafter's own layers — unless the
    config gives it its own embedding (`own_embedding`) or head (`draft_vocab_size`), as EAGLE-3
    checkpoints have."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg, body = cfg, cfg.body()
        H = cfg.hidden_size
        eagle3 = cfg.layer0_input == "eagle3"
        self.fc_feat = nn.Linear(len(cfg.target_layers) * cfg.target_hidden_size, H, bias=False)
        if not eagle3:
            self.fc_in = nn.Linear(2 * H, H, bias=False)
        if cfg.input_norm:
            self.emb_norm, self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps), RMSNorm(H, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(Eagle3Block(body, cfg.norm_before_residual) if eagle3 and i == 0 else Block(body, i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        if cfg.own_embedding:  # a bare parameter: no random init (a module built on the meta device is assigned)
            self.embed_tokens = nn.Module()
            self.embed_tokens.weight = nn.Parameter(torch.empty(cfg.vocab_size, H))
        if cfg.draft_vocab_size is not None:
            self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        # the target id of each row of an own head over a draft vocabulary (None: row i is target id i)
        self.register_buffer("draft_ids", None, persistent=False)
        if cfg.kind in ("block", "block_markov"):
            self.mask_embedding = nn.Parameter(torch.zeros(cfg.block_size - 1, H))  # one per drafted position 2..m
        if cfg.kind == "block_markov":
            self.markov_in = nn.Linear(H, cfg.markov_rank, bias=False)
            self.markov_out = nn.Linear(cfg.markov_rank, cfg.vocab_size, bias=False)
        if cfg.copy_head:
            self.copy_q = nn.Linear(H, cfg.head_dim, bias=False)
            self.copy_k = nn.Linear(H, cfg.head_dim, bias=False)
            self.copy_gate = nn.Linear(H, 1)
            self.copy_match = nn.Parameter(torch.zeros(1))
        self.register_buffer("inv_freq", body.inv_freq(), persistent=False)

    def rows(self, next_tokens: torch.Tensor, hidden: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """Input rows from (token at t+1, H-wide hidden at t); 2H wide [embedding ‖ hidden] for the
        eagle3 first layer, which mixes them itself."""
        e = F.embedding(next_tokens, emb)
        if self.cfg.layer0_input == "eagle3":
            return torch.cat((e, hidden), dim=-1)
        if self.cfg.input_norm:
            e, hidden = self.emb_norm(e), self.hidden_norm(hidden)
        return self.fc_in(torch.cat((e, hidden), dim=-1))

    def forward(self, x: torch.Tensor, head: torch.Tensor, cache: Cache | None = None,
                positions: torch.Tensor | None = None, tree_mask: torch.Tensor | None = None,
                logits_from: int = 0):
        """x [B, T, H] input rows → (pre-norm hidden, logits of rows logits_from..T-1)."""
        B, T, _ = x.shape
        start = cache.reserve(T) if cache is not None else 0
        if positions is None:
            positions = torch.arange(start, start + T, device=x.device).expand(B, T)
        if tree_mask is None and cache is not None:  # without a cache, attention runs plain causal
            tree_mask = causal_mask(T, x.device)
        rope = rope_tables(self.inv_freq, positions, x.dtype)
        h, _ = run_layers(self.cfg.body(), self.layers, x, cache, start, positions, tree_mask, rope)
        return h, self.logits(h[:, logits_from:], head)

    def logits(self, h: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary of pre-norm hidden rows [..., H]. A head over a draft
        vocabulary scores only its rows' target ids (`draft_ids`); every other id gets -inf, so the
        lattice (top-k, log-softmax) and the next drafted token are the draft vocabulary's, in
        target ids, and nothing downstream needs to know about the map."""
        out = F.linear(self.norm(h), head)
        if self.draft_ids is None:
            return out
        full = out.new_full((*out.shape[:-1], self.cfg.vocab_size), float("-inf"))
        return full.index_copy(out.dim() - 1, self.draft_ids, out)

    def block_rows(self, lead: torch.Tensor, n: int, emb: torch.Tensor) -> torch.Tensor:
        """The n mask rows of one block, [B, n, H], after the drafted position-1 token lead [B]."""
        rows = self.mask_embedding[:n].expand(len(lead), -1, -1)
        if not self.cfg.lead_token:
            return rows
        first = self.rows(lead[:, None], rows[:, :1], emb)
        return torch.cat((first, rows[:, 1:]), 1)

    def copy_query(self, h: torch.Tensor) -> torch.Tensor:
        """Pointer queries [..., d] of pre-norm hidden rows [..., H], scaled for a dot product."""
        return self.copy_q(self.norm(h)) / math.sqrt(self.cfg.head_dim)

    def copy_key(self, h: torch.Tensor) -> torch.Tensor:
        """Pointer keys [..., d] of pre-norm hidden rows [..., H]."""
        return self.copy_k(self.norm(h))

    def copy_gate_logit(self, h: torch.Tensor, match: torch.Tensor) -> torch.Tensor:
        """[..., H] pre-norm hidden rows and the pointer's match [...] (`offset_copy`) → [...]: the logit
        of the share a row gives its copies."""
        return self.copy_gate(self.norm(h))[..., 0] + self.copy_match * match

    def markov_logits(self, base: torch.Tensor, parents: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """Logits of a position given each parent token: base [..., V] + a low-rank parent term."""
        return base + self.markov_out(self.markov_in(F.embedding(parents, emb)))


def _wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32 at least (float64 stays float64): what the pointer head mixes in."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def offset_copy(scores: torch.Tensor, p: torch.Tensor, offsets: torch.Tensor,
                allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pointer weights of one query row at position p over source rows s = 0..S-1 (scores [..., S],
    p [...]) for each offset j (drafted position j+1, `offsets` [J]) → ([..., J, S], [..., J]): a
    softmax over the sources s ≤ p-1-j, those whose token s+j+2 (what row s is j places short of) is
    known, and `allowed` (bool, broadcastable to [..., J, S]); zero for the others, and
    all zero where none is; and the match, the log of the summed exp(score) over those sources, at
    least -10 (-10 where there is none): how strongly the query found anything to copy."""
    s = torch.arange(scores.shape[-1], device=scores.device)
    valid = (s <= (p[..., None, None] - 1 - offsets[:, None])) & allowed
    x = _wide(scores)
    x = torch.where(valid, x[..., None, :], torch.finfo(x.dtype).min)
    return x.softmax(-1) * valid, x.logsumexp(-1).clamp_min(-10.0)


def mix_copy(logp: torch.Tensor, gate_logit: torch.Tensor, p_copy: torch.Tensor) -> torch.Tensor:
    """log((1 - g) p + g p_copy), g = sigmoid(gate_logit): log-probabilities logp, copy probabilities
    p_copy and gate logits of broadcastable shapes."""
    g = _wide(gate_logit)
    return torch.logaddexp(F.logsigmoid(-g) + logp, F.logsigmoid(g) + p_copy.clamp_min(1e-30).log())


class Pointer(NamedTuple):
    """The pointer head's view of the context for one block at drafted positions 2..n+1 (fixed
    shapes: a CUDA graph can hold it): scores [S] of the last context row p's query against every
    context row's key; p (a 0-d tensor); offsets j = 1..n; lead [S], whether a source's token s+2 is
    the drafted position-1 token; copy / before [n, S], a source's token s+j+2 (what it gives drafted
    position j+1) and s+j+1 (what it says comes right before it); hidden [n, H], the mask rows.
    Every field but offsets may carry a leading lane dimension (a batch's blocks: [B, S], p [B], ...)."""
    scores: torch.Tensor
    p: torch.Tensor
    offsets: torch.Tensor
    lead: torch.Tensor
    copy: torch.Tensor
    before: torch.Tensor
    hidden: torch.Tensor


def pointer(net: FeatureDrafterNet, keys: torch.Tensor, tokens: torch.Tensor, query: torch.Tensor,
            hidden: torch.Tensor, lead: torch.Tensor, p: torch.Tensor) -> Pointer:
    """keys [S, d]: the context rows' pointer keys by position (rows ≥ p unused); tokens [≥ S+2]: the
    token at each position; query [H]: the last context row p; hidden [n, H]: the mask rows; lead
    [1]: the drafted position-1 token, which every source must agree with. Or each with a leading
    lane dimension (keys [B, S, d], tokens [B, ≥ S+2], query [B, H], hidden [B, n, H], lead [B, 1],
    p [B])."""
    S, dev = keys.shape[-2], keys.device
    j = torch.arange(1, hidden.shape[-2] + 1, device=dev)
    at = torch.arange(S, device=dev) + j[:, None] + 1
    scores = torch.einsum("...sd,...d->...s", keys, net.copy_query(query))
    return Pointer(scores, p, j, tokens[..., 2 : S + 2] == lead,
                   tokens[..., (at + 1).clamp(max=S + 1)], tokens[..., at.clamp(max=S + 1)], hidden)


def pointer_copies(net: FeatureDrafterNet, ptr: Pointer) -> tuple[torch.Tensor, torch.Tensor]:
    """The copies of drafted positions 2..n+1 given only the lead: (gate logits [n, 1], copy
    probabilities [n, V]; a lane dimension first if the pointer has one). What the lattice's own
    scores of those positions mix in."""
    w, match = offset_copy(ptr.scores, ptr.p, ptr.offsets, ptr.lead[..., None, :])
    p_copy = w.new_zeros(*w.shape[:-1], net.cfg.vocab_size).scatter_add_(-1, ptr.copy, w)
    return net.copy_gate_logit(ptr.hidden, match)[..., None], p_copy


def with_copies(logits: torch.Tensor, copies: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """[n, V] mask-row logits → log-probabilities with the pointer head's copies mixed in."""
    return mix_copy(_wide(logits).log_softmax(-1), *copies)


def block_transitions(net: FeatureDrafterNet, logits: torch.Tensor, parents: torch.Tensor, children: torch.Tensor,
                      emb: torch.Tensor, ptr: Pointer | None) -> torch.Tensor:
    """A block drafter's transitions [n, k, k] from its mask rows' logits [n, V] (drafted positions
    2..n+1; parents / children [n, k]: the candidates at positions i and i+1): with a pointer head
    `copy_transitions` (over the Markov head's distributions, if any); with the Markov head alone the
    child's logit plus the low-rank parent term (trees normalize over a parent's candidates). Every
    argument may carry a leading lane dimension (logits [B, n, V], ...; the result [B, n, k, k])."""
    markov = net.cfg.kind == "block_markov"
    if ptr is not None:
        own = logits[..., None, :]
        return copy_transitions(net, net.markov_logits(own, parents, emb) if markov else own, parents, children, ptr)
    parent = net.markov_in(F.embedding(parents, emb))  # [n, k, rank]
    child = F.embedding(children, net.markov_out.weight)  # [n, k, rank]
    return (logits.gather(-1, children)[..., None, :] + parent @ child.transpose(-1, -2)).double()


def copy_transitions(net: FeatureDrafterNet, own: torch.Tensor, parents: torch.Tensor, children: torch.Tensor,
                     ptr: Pointer) -> torch.Tensor:
    """The transitions of a block drafter with a pointer head, [n, k, k]: at each child candidate,
    the log of the position's own distribution (logits `own` [n, 1, V], or [n, k, V] per parent for
    a Markov drafter) mixed with the copies of the sources that agree with the lead and with the
    parent candidate (their token s+j+1). parents / children [n, k]: the candidates at positions
    i and i+1. A leading lane dimension throughout, if the pointer has one."""
    agree = ptr.lead[..., None, None, :] & (ptr.before[..., None, :] == parents[..., None])  # [n, k, S]
    w, match = offset_copy(ptr.scores[..., None, :], ptr.p[..., None], ptr.offsets,
                           agree.transpose(-3, -2))  # [k, n, S], [k, n]
    hits = (ptr.copy[..., None, :] == children[..., None]).to(w.dtype)  # [n, child, S]
    p_copy = torch.einsum("...ans,...ncs->...nac", w, hits)
    gate = net.copy_gate_logit(ptr.hidden[..., None, :], match.transpose(-1, -2))  # [n, k]
    logp = _wide(own).log_softmax(-1)
    own_at = logp.gather(-1, children[..., None, :].expand(*logp.shape[:-1], -1))
    return mix_copy(own_at, gate[..., None], p_copy).double()


class Drafter:
    """Interface: `observe` the tokens that entered the target cache, then `propose` a lattice."""

    kind: str
    target_layers: tuple[int, ...] = ()
    transitions: bool = False  # whether its lattices may carry parent → child scores (Lattice.trans)

    def reset(self, max_len: int) -> None: ...

    def observe(self, committed: list[int], next_tokens: list[int], feats: torch.Tensor | None) -> None:
        """committed: tokens that entered the target cache this step; next_tokens: the token after
        each (the last is the newest, not yet in the cache); feats: target features [T, F] of the
        committed positions (feature drafters only)."""

    def propose(self, m: int, known: list[int] | None = None) -> Lattice:
        """A lattice of m drafted positions. known: the tokens that do follow (a replay against a
        known continuation, for a chain): a drafter that drafts position by position may stop after
        the first position whose top-1 token differs, since a chain accepts nothing past it."""

    def mark(self):
        """What `rewind` needs to forget every `observe` after this call: two-level verification
        (tlv.py) drafts from the end of a chain that is not committed yet."""
        raise NotImplementedError(f"a {self.kind} drafter cannot forget what it observed (no mark / rewind)")

    def rewind(self, mark) -> None:
        """Forget the observes since `mark()` returned `mark`."""
        raise NotImplementedError(f"a {self.kind} drafter cannot forget what it observed (no mark / rewind)")


def rewinds(drafter: Drafter) -> bool:
    """Whether the drafter can forget observed tokens (`Drafter.mark` / `rewind`)."""
    return type(drafter).mark is not Drafter.mark and type(drafter).rewind is not Drafter.rewind


def missed(known: list[int] | None, i: int, token: int) -> bool:
    """Whether a chain replayed against `known` (Drafter.propose) stops at drafted position i,
    whose top-1 token is `token`: nothing past it can be accepted."""
    return known is not None and (i >= len(known) or token != known[i])


def misfit(c: DraftConfig, t, target: str = "this target") -> str | None:
    """Why a feature drafter cannot run on a target (it shares the target's embedding and LM head, unless
    it has its own, and reads its hidden features at target_layers), or None when it fits."""
    own = c.own_embedding and c.draft_vocab_size is not None  # then its width may differ from the target's
    if (c.vocab_size, c.target_hidden_size) == (t.vocab_size, t.hidden_size) \
            and (own or c.hidden_size == t.hidden_size) and max(c.target_layers) < t.num_hidden_layers:
        return None
    return (f"this {c.kind} drafter (vocab_size {c.vocab_size}, hidden_size {c.hidden_size}, target_hidden_size "
            f"{c.target_hidden_size}, target_layers {c.target_layers}) does not fit {target} (vocab_size "
            f"{t.vocab_size}, hidden_size {t.hidden_size}, {t.num_hidden_layers} layers); use the drafter trained "
            "for this target")


class FeatureDrafter(Drafter):
    def __init__(self, net: FeatureDrafterNet, target: Model):
        c = net.cfg
        if why := misfit(c, target.cfg):
            raise CheckpointError(why)
        # transitions: the Markov head's, or the pointer head's copies given each parent candidate
        self.net, self.kind = net, c.kind
        self.transitions = c.kind == "block_markov" or c.copy_head  # copy_head: block kinds only
        self.emb = net.embed_tokens.weight if c.own_embedding else target.model.embed_tokens.weight
        self.head = net.lm_head.weight if c.draft_vocab_size is not None else target.lm_head_weight
        self.target_layers = tuple(c.target_layers)
        self.block_size = c.block_size
        self.cache: Cache | None = None

    def reset(self, max_len: int) -> None:
        n = max_len + self.block_size + 2
        self.cache = Cache(self.net.cfg.body(), 1, n, self.head.device, self.head.dtype)
        self.last_hidden = self.last_logits = None
        self.newest = None
        if self.net.cfg.copy_head:  # every context row's pointer key and every position's token
            self.keys = torch.zeros(n, self.net.cfg.head_dim, device=self.head.device, dtype=self.head.dtype)
            self.tokens = torch.zeros(n + 2, dtype=torch.long, device=self.head.device)

    @torch.no_grad()
    def observe(self, committed, next_tokens, feats):
        nxt = torch.tensor([next_tokens], device=feats.device)
        x = self.net.rows(nxt, self.net.fc_feat(feats.to(self.head.dtype))[None], self.emb)
        start = self.cache.length
        h, logits = self.net(x, self.head, self.cache, logits_from=x.shape[1] - 1)  # only the newest row's are used
        self.cache.commit(len(next_tokens))
        self.last_hidden, self.last_logits = h[:, -1:], logits[0, -1]
        self.newest = next_tokens[-1]
        if self.net.cfg.copy_head:
            self.keys[start : start + len(next_tokens)] = self.net.copy_key(h[0])
            self.tokens[start + 1 : start + 1 + len(next_tokens)] = nxt[0]
            self.tokens[start] = committed[0]

    def mark(self):
        return self.cache.length, self.last_hidden, self.last_logits, self.newest

    def rewind(self, mark) -> None:  # pointer keys and tokens past the length are never read
        length, self.last_hidden, self.last_logits, self.newest = mark
        self.cache.truncate(length)

    @torch.no_grad()
    def propose(self, m: int, known: list[int] | None = None) -> Lattice:
        if m <= 0:
            return Lattice.empty()
        if self.kind == "sequential":
            return self._propose_sequential(m, known)
        return self._propose_block(min(m, self.block_size))

    def _propose_sequential(self, m: int, known: list[int] | None) -> Lattice:
        base = self.cache.length
        logits, hidden = [self.last_logits], self.last_hidden
        for i in range(m - 1):
            tok = logits[-1].argmax().view(1, 1)
            if missed(known, i, int(tok)):
                break
            hidden, lg = self.net(self.net.rows(tok, hidden, self.emb), self.head, self.cache)
            self.cache.commit(1)
            logits.append(lg[0, -1])
        self.cache.truncate(base)
        return Lattice.from_logits(torch.stack(logits))

    def _propose_block(self, m: int) -> Lattice:
        # the last context row predicts position 1 (for block_markov conditioned on the newest
        # token through the Markov head); m-1 mask rows predict positions 2..m
        net, base, ptr = self.net, self.cache.length, None
        first = self.last_logits
        if self.kind == "block_markov":
            first = net.markov_logits(first, torch.tensor([self.newest], device=first.device), self.emb)[0]
        logits = first[None]
        if m > 1:
            lead = first.argmax().view(1)
            x = net.block_rows(lead, m - 1, self.emb)
            full = torch.ones(m - 1, m - 1, dtype=torch.bool, device=x.device)
            h, lg = net(x, self.head, self.cache, tree_mask=full)
            self.cache.truncate(base)
            rest = lg[0]
            if net.cfg.copy_head:  # positions 2..m as log-probabilities with the copies mixed in
                ptr = pointer(net, self.keys, self.tokens, self.last_hidden[0, 0], h[0], lead,
                              torch.tensor(self.cache.length - 1, device=h.device))
                rest = with_copies(rest, pointer_copies(net, ptr))
            logits = torch.cat((logits.to(rest.dtype), rest))
        lat = Lattice.from_logits(logits)
        if not self.transitions or m == 1:
            return lat
        # later positions keep the marginal top-k as candidates and score each candidate under each
        # parent candidate (Markov head, pointer head or both), all positions at once
        lat.trans = block_transitions(net, lg[0], lat.tokens[: m - 1], lat.tokens[1:m], self.emb, ptr)
        return lat


class NgramDrafter(Drafter):
    """Prompt lookup: the continuation of the most recent earlier occurrence of the longest suffix
    (n = max_n .. min_n) of the token history."""

    kind = "ngram"

    def __init__(self, max_n: int = 4, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n
        self.history: list[int] = []

    def reset(self, max_len: int) -> None:
        self.history = []

    def observe(self, committed, next_tokens, feats=None):
        self.history.extend(committed)
        self.newest = next_tokens[-1]

    def mark(self):
        return len(self.history), getattr(self, "newest", None)

    def rewind(self, mark) -> None:
        length, self.newest = mark
        del self.history[length:]

    def propose(self, m: int, known: list[int] | None = None) -> Lattice:
        seq = self.history + [self.newest]
        proposal: list[int] = []
        for n in range(min(self.max_n, len(seq) - 1), self.min_n - 1, -1):
            suffix = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start : start + n] == suffix:
                    proposal = seq[start + n : start + n + m]
                    break
            if proposal:
                break
        tokens = torch.full((len(proposal), TOP_K), -1, dtype=torch.long)
        logp = torch.full((len(proposal), TOP_K), float("-inf"), dtype=torch.float64)
        if proposal:
            tokens[:, 0] = torch.tensor(proposal)
            logp[:, 0] = 0.0
        return Lattice(tokens, logp)


class DraftLM(Drafter):
    """A classic standalone draft model: greedy, one forward per drafted token, own KV cache."""

    kind = "draft_lm"

    def __init__(self, model: Model):
        if model.cfg.is_hybrid:
            raise CheckpointError("a standalone draft LM must be attention-only (its cache is rolled back)")
        self.model = model

    def reset(self, max_len: int) -> None:
        self.cache = self.model.new_cache(max_len)  # committed tokens + the drafted ones fit the target's

    @torch.no_grad()
    def observe(self, committed, next_tokens, feats=None):
        dev = self.model.lm_head_weight.device
        self.model(torch.tensor([committed], device=dev), self.cache, logits=False)
        self.cache.commit(len(committed))
        self.newest = next_tokens[-1]

    def mark(self):
        return self.cache.length, self.newest

    def rewind(self, mark) -> None:
        length, self.newest = mark
        self.cache.truncate(length)

    @torch.no_grad()
    def propose(self, m: int, known: list[int] | None = None) -> Lattice:
        base, tok, rows = self.cache.length, self.newest, []
        dev = self.model.lm_head_weight.device
        for i in range(m):
            lg = self.model(torch.tensor([[tok]], device=dev), self.cache).logits[0, -1]
            self.cache.commit(1)
            rows.append(lg)
            tok = int(lg.argmax())
            if missed(known, i, tok):
                break
        self.cache.truncate(base)
        return Lattice.from_logits(torch.stack(rows)) if rows else Lattice.empty()


def load_drafter(spec: str, dtype: torch.dtype = torch.float32, device="cpu",
                 target: Model | None = None) -> Drafter:
    """`ngram`, `ngram:N`, or a checkpoint folder: a feature drafter (needs its target) or a
    standalone draft LM."""
    if spec == "ngram" or spec.startswith("ngram:"):
        return NgramDrafter(max_n=int(spec.split(":")[1]) if ":" in spec else 4)
    folder = Path(spec)
    d = read_config(folder)
    from .eagle3 import is_eagle3, load_eagle3

    if is_eagle3(d):  # an EAGLE-3 folder (SGLang / vLLM or speculators layout): a sequential drafter
        if target is None:
            raise CheckpointError(f"{folder}: an EAGLE-3 drafter runs on its target's features; load it together "
                                  "with the target")
        return FeatureDrafter(load_eagle3(folder, target.cfg, dtype, device), target)
    if DRAFTER_ARCH not in (d.get("architectures") or []):
        return DraftLM(load_model(folder, dtype, device))
    if target is None:
        raise CheckpointError(f"{folder}: a {d.get('drafter_kind')} drafter runs on its target's features; "
                              "load it together with the target")
    cfg = DraftConfig.from_hf(d, str(folder / "config.json"))
    with torch.device("meta"):
        net = FeatureDrafterNet(cfg)
    tensors = read_tensors(folder, device)
    mask = tensors.get("mask_embedding")
    if mask is not None and mask.dim() == 1:  # older checkpoints: one mask embedding shared by every position
        tensors["mask_embedding"] = mask.expand(cfg.block_size - 1, -1).contiguous()
    load_into(net, tensors, folder, dtype)
    net.inv_freq = cfg.body().inv_freq().to(device)
    return FeatureDrafter(net.eval(), target)


def save_drafter(net: FeatureDrafterNet, folder, dtype: torch.dtype | None = None) -> None:
    ids = net.draft_ids
    if ids is not None and not torch.equal(ids.cpu(), torch.arange(net.cfg.vocab_size)):
        raise ValueError("this drafter's head covers a draft vocabulary (draft_ids); the SpecPilotDrafter format "
                         "holds no vocabulary map — write it with engine.eagle3.export_eagle3")
    sd = {k: (v.to(dtype) if dtype else v) for k, v in net.state_dict().items()}
    write_checkpoint(folder, net.cfg.to_hf(), sd)
