"""The static-shape driver: greedy AR and speculative decoding with every buffer allocated once and
no host round trip inside a step, so that on CUDA a whole step replays as one captured graph and
the host reads the device exactly once per step (the accepted length and tokens).

One step, all on the device: the drafter proposes a lattice (feature drafters and draft LMs run
here; the n-gram drafter and other host drafters fill the lattice buffers before the step) → the
policy's tree with a static node budget (treeops) → one target pass over its rows (StaticCache
plans slots, positions and the ancestor mask) → greedy acceptance → K/V compaction and recurrent
state commit → the drafter reads the accepted rows → [τ, valid rows, usable positions, path
tokens, bonus] into one buffer. A prefill pads its prompts to a power-of-two bucket and runs as
one pass for every prompt that finds a free lane at once (split into passes of 2^k prompts;
`_admit`; on CUDA one captured graph per bucket and prompt count, any lanes, every count captured
at the bucket's first use: the padding rows write K/V past the real ones and leave
recurrent state alone, StaticCache `valid`). `decode.generate` takes
this path (driver "auto") whenever the target is on a CUDA device and `unsupported` names nothing;
on the CPU the eager driver (decode.py) runs unless driver "static" is asked for, and tests run
this one eagerly there (no graphs, no compile), in float64, against it.

At batch > 1 (lanes) three row-selection rules are options of a decoder: a shared node budget (the
tree policy `shared:N:C`, treeops.build_shared: one best-first selection over every lane's
lattice), a per-request draft length (`lengths`, engine/lengths.py: each lane caps the positions
its tree may use, from its recent acceptance), and prompt admission (`admit_steps`: a waiting
prompt that fits that many steps rides a busy batch's steps in its lane's rows, `_feeding`,
instead of a prefill pass). Every lane still plans the same rows (static
shapes), so a step's record says what the pass verified (`Step.rows`: every lane's rows, padding
and idle lanes included) beside what each request drafted (`Step.drafted`, `Step.positions`).

The model code is shared: the same modules run both drivers; a StaticCache selects the static
attention and Gated DeltaNet forms (model.py). torch.compile (on by default with graphs; set
SPECPILOT_COMPILE=0 to skip it) fuses the step's small kernels before the graph is captured.

A decoder works on its target's device: everything it allocates, records or captures happens
under `on_device(dev)`, so a target on cuda:1 runs there whatever the current device is. The
decoders `decoder` builds live on the target object itself (`_static_decoders`) and die with it.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
import warnings

import torch
import torch.nn.functional as F

from . import lengths as draft_lengths, treeops, trees
from .cache import StaticCache
from .decode import Result, Step, StepRecord, clock, emit
from .drafters import (TOP_K, DraftLM, Drafter, FeatureDrafter, Lattice, block_transitions, pointer,
                       pointer_copies, with_copies)
from .model import Model, rope_tables, run_layers


def _lattice(logits: torch.Tensor):
    """Top-k tokens and log-probabilities of [m, V] logits (as Lattice.from_logits, which works in
    float64; here float32 unless the model runs in float64: a top-k over the vocabulary in float64
    costs more than the drafter's pass on a GPU). Scores for the trees: float64."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    top, tok = x.topk(TOP_K, dim=-1)
    return tok, (top - x.logsumexp(-1, keepdim=True)).double()


class _FeatureDraft:
    """A feature drafter (sequential / block / block + Markov) on static buffers, one lane per
    request of the decoder (its cache, last hidden row, next logits and pointer keys per lane)."""

    def __init__(self, d: FeatureDrafter, m: int, max_len: int, lanes: int = 1):
        self.net, self.kind, self.emb, self.head, self.m = d.net, d.kind, d.emb, d.head, m
        self.transitions = d.transitions
        self.body = d.net.cfg.body()
        dev, dt = self.head.device, self.head.dtype
        self.cache = StaticCache(self.body, max_len, dev, dt, lanes)
        self.hidden = torch.zeros(lanes, 1, self.body.hidden_size, device=dev, dtype=dt)
        self.logits = torch.zeros(lanes, d.net.cfg.vocab_size, device=dev, dtype=dt)  # target ids, whatever the head
        self.copy = d.net.cfg.copy_head
        if self.copy:  # every context row's pointer key and every position's token, by position
            self.keys = torch.zeros(lanes, max_len, d.net.cfg.head_dim, device=dev, dtype=dt)
            self.tokens = torch.zeros(lanes, max_len + 2, dtype=torch.long, device=dev)

    def _layers(self, x):
        pos = self.cache.ctx.positions
        h, _ = run_layers(self.body, self.net.layers, x, self.cache, 0, pos, None,
                          rope_tables(self.net.inv_freq, pos, x.dtype))
        return h  # pre-norm hidden [lanes, n, H]

    def _read(self, nxt, feats, lane: torch.Tensor | None = None, valid: torch.Tensor | None = None):
        """Context rows for the next committed positions of every lane (or of the lanes `lane`, with
        `valid` real rows each): their next tokens [B, n] and target features [B, n, F]."""
        n = nxt.shape[1]
        self.cache.plan(n, commit_all=True, lane=lane, valid=valid)
        h = self._layers(self.net.rows(nxt, self.net.fc_feat(feats.to(self.head.dtype)), self.emb))
        if self.copy:  # padding rows write past the real ones: read only below the committed length
            ids = self.cache.ctx.batch  # [B, 1]
            at = self.cache.lengths[ids] + torch.arange(n, device=h.device)  # [B, n]
            self.keys[ids, at] = self.net.copy_key(h)
            self.tokens[ids, at + 1] = nxt
        return h

    def _keep(self, last, lane: torch.Tensor | None = None):
        """The last context row [B, H] of every lane (or of the lanes `lane`) and its next logits."""
        for buf, val in ((self.hidden, last[:, None]), (self.logits, self.net.logits(last, self.head))):
            buf.copy_(val) if lane is None else buf.index_copy_(0, lane, val)

    def prefill(self, prompt_ids, first, feats, lane: torch.Tensor, valid: torch.Tensor):
        """The context of prompts prefilled into the lanes `lane` [A]: prompt_ids [A, n] (the first
        `valid` [A] of each real, the rest padding), the target's first tokens [A] and features
        [A, n, F]."""
        self.cache.reset(lane)
        n = prompt_ids.shape[1]
        last = (valid - 1)[:, None]
        nxt = torch.where(torch.arange(n, device=first.device) == last, first[:, None], prompt_ids.roll(-1, 1))
        if self.copy:
            self.tokens[lane, :1] = prompt_ids[:, :1]
        h = self._read(nxt, feats, lane, valid)
        self._keep(h.gather(1, last[..., None].expand(-1, 1, h.shape[-1]))[:, 0], lane)
        self.cache.lengths.index_copy_(0, lane, valid)

    def observe(self, path_tokens, nxt, feats, tau):
        """Every lane's accepted path: next tokens [B, D], features [B, D, F], τ [B] (0: idle)."""
        h = self._read(nxt, feats)
        last = (tau - 1).clamp_min(0)[:, None, None].expand(-1, 1, h.shape[-1])
        self._keep(h.gather(1, last)[:, 0])
        self.cache.lengths += tau

    def mark(self) -> tuple:
        """What `rewind` restores: the cache's lengths and state, the last rows (pointer keys and
        tokens past the lengths are never read)."""
        return self.cache.snapshot(), self.hidden.clone(), self.logits.clone()

    def rewind(self, mark: tuple) -> None:
        """Forget every `observe` since `mark()` (two-level verification drafts from an uncommitted chain)."""
        self.cache.restore(mark[0])
        self.hidden.copy_(mark[1]), self.logits.copy_(mark[2])

    def propose(self, root):
        """Every lane's lattice from its roots [B]: tokens and scores [B, m, k], transitions or None."""
        net, m = self.net, self.m
        if self.kind == "sequential":
            rows, hidden = [self.logits], self.hidden
            for i in range(m - 1):
                self.cache.plan(1, offset=i)
                hidden = self._layers(net.rows(rows[-1].argmax(-1)[:, None], hidden, self.emb))
                rows.append(net.logits(hidden[:, -1], self.head))
            return (*_lattice(torch.stack(rows, 1)), None)
        first, ptrs = self.logits, None
        if self.kind == "block_markov":
            first = net.markov_logits(first, root, self.emb)
        logits = first[:, None]
        if m > 1:
            self.cache.plan(m - 1, full=True)
            lead = first.argmax(-1)
            h = self._layers(net.block_rows(lead, m - 1, self.emb))
            rest = mask_logits = F.linear(net.norm(h), self.head)
            if self.copy:  # positions 2..m as log-probabilities with the copies mixed in, every lane at once
                ptrs = pointer(net, self.keys, self.tokens, self.hidden[:, 0], h, lead[:, None], self.cache.lengths - 1)
                rest = with_copies(rest, pointer_copies(net, ptrs))
            logits = torch.cat((logits.to(rest.dtype), rest), 1)
        tok, logp = _lattice(logits)
        if not self.transitions or m == 1:
            return tok, logp, None
        return tok, logp, block_transitions(net, mask_logits, tok[:, : m - 1], tok[:, 1:m], self.emb, ptrs)


class _DraftLMDraft:
    """A standalone draft LM on static buffers: greedy, one row per drafted position, one cache
    lane per request of the decoder."""

    def __init__(self, d: DraftLM, m: int, max_len: int, lanes: int = 1):
        self.model, self.m = d.model.fuse(), m
        self.cache = self.model.static_cache(max_len, lanes)

    def prefill(self, prompt_ids, first, feats, lane: torch.Tensor, valid: torch.Tensor):
        self.cache.reset(lane)
        self.cache.plan(prompt_ids.shape[1], commit_all=True, lane=lane, valid=valid)
        self.model(prompt_ids, self.cache, logits=False)
        self.cache.lengths.index_copy_(0, lane, valid)

    def observe(self, path_tokens, nxt, feats, tau):
        self.cache.plan(path_tokens.shape[1], commit_all=True)
        self.model(path_tokens, self.cache, logits=False)
        self.cache.lengths += tau

    def mark(self):
        return self.cache.snapshot()

    def rewind(self, mark) -> None:
        self.cache.restore(mark)

    def propose(self, root):
        tok, rows = root[:, None], []
        for i in range(self.m):
            self.cache.plan(1, offset=i)
            lg = self.model(tok, self.cache).logits[:, -1]
            rows.append(lg)
            tok = lg.argmax(-1)[:, None]
        return (*_lattice(torch.stack(rows, 1)), None)


def unsupported(drafter: Drafter | None, policy, tlv=None) -> str | None:
    """Why the static driver cannot run this drafter and policy, or two-level verification `tlv`
    (None: it can): a host drafter that reads target features (the static step keeps them on the
    device), a policy without a static form (treeops.spec_for), or TLV with a host drafter (its
    second draft starts from a chain that only the device holds)."""
    if tlv is not None and not isinstance(drafter, (FeatureDrafter, DraftLM)):
        return f"two-level verification with a {getattr(drafter, 'kind', None)} drafter (it drafts on the host)"
    if drafter is not None and not isinstance(drafter, (FeatureDrafter, DraftLM)) and drafter.target_layers:
        return f"a {drafter.kind} drafter that reads target features on the host"
    if not (policy is None or policy is trees.chain or isinstance(policy, trees.TreePolicy)):
        return f"the tree policy {getattr(policy, '__name__', type(policy).__name__)} (no static form)"
    return None


def plan(drafter: Drafter | None, draft_len: int, policy, lanes: int = 1, tlv=None) -> tuple[int, treeops.TreeSpec]:
    """(drafted positions per step, the static tree) of a decoder of `lanes` requests for this
    drafter, draft length and policy, or two-level verification `tlv` (the exact pass's tree): a
    block drafter drafts at most its block."""
    if drafter is None:
        return 0, treeops.TreeSpec("chain", 0, 0)
    block = getattr(drafter, "block_size", None)
    m = min(draft_len, block) if block and drafter.kind != "sequential" else draft_len
    if tlv is not None:
        return m, treeops.tlv_specs(tlv.nodes, tlv.q_depth, m)[2]
    name, args, shape = ("chain", (), None) if policy is None or policy is trees.chain else \
        (policy.name, policy.args, policy.shape)
    return m, treeops.spec_for(name, args, m, shape, lanes)


def capacity(spec: treeops.TreeSpec, max_len: int) -> int:
    """The longest request (prompt + max_new_tokens) a decoder of `max_len` cache slots serves.
    With R = spec.rows verified rows and D = spec.max_depth + 1 accepted-path rows, a step from
    committed length L writes slots up to L + max(R, D) (the pass's K/V, the compaction's path);
    it accepts τ ≤ min(R, D). Steps start at L ≤ n - 2 for a request of n tokens (the newest token
    is not yet in the cache), and the pipelined driver launches one step past the last one, from
    L ≤ n - 2 + min(R, D): so n ≤ max_len - R - D + 2. (Drafters' own caches hold max_len + m + 2.)"""
    return max_len - spec.rows - (spec.max_depth + 1) + 2


def size_for(spec: treeops.TreeSpec, need: int, base: int = 1024) -> int:
    """The cache slots of a decoder built for requests of `need` tokens: `base` (room for most
    prompts at once: a larger decoder is another capture and compile), doubled until it serves them."""
    size = base
    while capacity(spec, size) < need:
        size *= 2
    return size


ADMIT_ROWS = 4096  # rows of one prefill pass admitting several prompts (its attention scores grow with them)


def bucket(n: int, max_len: int, least: int = 16) -> int:
    """The rows a prefill of n tokens runs: the next power of two from `least`, at most max_len
    (one captured graph per bucket, so few of them)."""
    return min(max(least, 1 << (n - 1).bit_length()), max_len)


def pow2_runs(n: int) -> list[tuple[int, int]]:
    """[start, end) runs of 0..n whose lengths are n's binary digits, largest first (13: 8, 4, 1)."""
    runs, at = [], 0
    for k in reversed(range(n.bit_length())):
        if n >> k & 1:
            runs.append((at, at + (1 << k)))
            at += 1 << k
    return runs


def admit_counts(n: int, lanes: int) -> list[int]:
    """The prompt counts a prefill of bucket n may run (generate_batch admits passes of 2^k prompts,
    at most ADMIT_ROWS rows unless alone): 1, 2, 4, … up to the lanes."""
    return [1 << k for k in range(lanes.bit_length()) if k == 0 or n << k <= ADMIT_ROWS]


def check_admit_steps(k) -> None:
    """Refuse a prompt-admission count that is not a whole number of verify steps ≥ 0."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"admit_steps {k!r}: expected a count of verify steps ≥ 0 (0: no admission)")


def on_device(dev: torch.device):
    """The context a decoder on `dev` runs in: its CUDA device made current (events, streams,
    graph capture and synchronize use the current device), nothing on the CPU."""
    return torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()


class FastDecoder:
    """Static buffers, a step function and (on CUDA) its captured graph for one target, drafter,
    draft length and policy, over `lanes` requests at once. `generate` decodes one request of
    prompt + max_new_tokens ≤ capacity (lanes == 1); `generate_batch` decodes many, `lanes` at a
    time, a waiting request taking the first lane that frees (continuous batching). `lengths`: the
    draft lengths a request may pick each step (engine/lengths.py; None: every drafted position)."""

    def __init__(self, target: Model, drafter: Drafter | None = None, draft_len: int = 8, policy=None,
                 max_len: int = 1024, graphs: bool | None = None, compile: bool | None = None,
                 logit_bias: torch.Tensor | None = None, lanes: int = 1, lengths: tuple[int, ...] | None = None,
                 admit_steps: int = 0, tlv=None):
        if lanes < 1:
            raise ValueError(f"lanes {lanes}: a decoder runs at least one request")
        if lengths is not None and (drafter is None or not lengths or min(lengths) < 1):
            raise ValueError(f"lengths {lengths!r}: positive draft lengths, for a decoder with a drafter")
        check_admit_steps(admit_steps)
        if tlv is not None:
            why = unsupported(drafter, policy, tlv)
            if why or lengths is not None or admit_steps:
                raise ValueError(f"the static driver cannot run {why}" if why else "two-level verification runs "
                                 "with neither per-request draft lengths nor prompt admission")
        with on_device(target.lm_head_weight.device):
            self._build(target, drafter, draft_len, policy, max_len, graphs, compile, logit_bias, lanes, lengths,
                        admit_steps, tlv)

    def _build(self, target, drafter, draft_len, policy, max_len, graphs, compile, logit_bias, lanes,
               lengths=None, admit_steps=0, tlv=None) -> None:
        dev = target.lm_head_weight.device
        self.target, self.dev, self.drafter, self.lanes = target.fuse(), dev, drafter, lanes
        self.graphs = dev.type == "cuda" if graphs is None else graphs
        self.compile = (self.graphs and os.environ.get("SPECPILOT_COMPILE", "1") != "0") if compile is None else compile
        self.cache = target.static_cache(max_len, lanes)
        self.bias_source = logit_bias  # kept: `decoder` tells biases apart by identity
        self.bias = logit_bias.to(dev, target.dtype) if logit_bias is not None else None
        self.layers, self.device_draft, self.hosts, self.tables = (), None, [], None
        self.m, self.spec = plan(drafter, draft_len, policy, lanes, tlv)
        self.tlv = tlv  # two-level verification (tlv.TwoLevel): its quick model and trees ① and ②
        self.tlv_specs = None if tlv is None else treeops.tlv_specs(tlv.nodes, tlv.q_depth, self.m)[:2]
        if drafter is not None:
            self.tables = treeops.sequoia_tables(self.spec, dev) if self.spec.kind == "sequoia" else None
            self.lat = (torch.full((lanes, self.m, TOP_K), -1, dtype=torch.long, device=dev),
                        torch.full((lanes, self.m, TOP_K), float("-inf"), dtype=torch.float64, device=dev),
                        torch.zeros(lanes, max(self.m - 1, 0), TOP_K, TOP_K, dtype=torch.float64, device=dev))
            side = max_len + self.m + 2
            if isinstance(drafter, FeatureDrafter):
                self.device_draft, self.layers = _FeatureDraft(drafter, self.m, side, lanes), drafter.target_layers
            elif isinstance(drafter, DraftLM):
                self.device_draft = _DraftLMDraft(drafter, self.m, side, lanes)
            else:  # a host drafter per lane: its state is one request's
                self.hosts = [drafter] + [copy.deepcopy(drafter) for _ in range(lanes - 1)]
        self.host = self.hosts[0] if self.hosts else None
        self.path_len = self.spec.max_depth + 1
        self.capacity = capacity(self.spec, max_len)
        self.root = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.active = torch.zeros(lanes, dtype=torch.long, device=dev)  # 1: the lane holds a request
        # per-request draft length: the options (ascending, at most m), each lane's recent
        # acceptance and the positions its tree may use this step
        self.options = None if lengths is None else \
            torch.tensor(sorted({min(x, self.m) for x in lengths}), dtype=torch.long, device=dev)
        self.recent = torch.zeros(lanes, dtype=torch.float64, device=dev)
        self.positions = torch.full((lanes,), self.m, dtype=torch.long, device=dev)
        # a step's result per lane: [τ, drafted nodes, usable positions, accepted path rows..., bonus]
        self.out = torch.zeros(lanes, 4 + self.path_len, dtype=torch.long, device=dev)
        # prompt admission: a prompt whose prefill fits `admit_steps` verify steps rides in a busy
        # batch's steps, `feed` rows a step in its lane's rows (its tokens, its length, the tokens
        # already in the cache); 0: every prompt gets a prefill pass
        self.admit_steps, self.feed = admit_steps, min(self.spec.rows, self.path_len)
        if admit_steps:
            self.feed_tok = torch.zeros(lanes, max_len + 1, dtype=torch.long, device=dev)
            self.feed_len = torch.zeros(lanes, dtype=torch.long, device=dev)
            self.fed = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.rec = None  # (tree rows, argmax) of the last step, for records
        self.staging = None  # pinned host copies of the lattice buffers (host drafters)
        # a prefill of A prompts: its inputs [A lanes, A real lengths, A × n tokens (the prompts
        # padded to their bucket n)] and first tokens [A]; on CUDA one captured graph per (n, A)
        self.admit_in = torch.zeros(lanes * (2 + max_len), dtype=torch.long, device=dev)
        self.admit_first = torch.zeros(lanes, dtype=torch.long, device=dev)
        self.admit_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.admit_buckets: set[int] = set()  # buckets whose prompt counts have all run once
        self.admit_pool = torch.cuda.graph_pool_handle() if self.graphs else None
        # two host copies of a step's result (pinned on CUDA): one is read while the next step runs
        self.host_out = [torch.empty_like(self.out, device="cpu") for _ in range(2)]
        if self.graphs:
            self.host_out = [t.pin_memory() for t in self.host_out]
            self.events = [torch.cuda.Event() for _ in range(2)]
        if self.compile:  # every decoder compiles its own step: allow as many as a process builds
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
            torch._dynamo.config.accumulated_cache_size_limit = max(
                torch._dynamo.config.accumulated_cache_size_limit, 4096)
        self.fn = torch.compile(self._step, fullgraph=True, dynamic=False) if self.compile else self._step
        self.graph = None
        if self.graphs:
            self._capture()

    # ---- the step (captured) ----------------------------------------------------------------
    def _tree(self) -> treeops.TreeRows:
        """Every lane's tree, fields [lanes, R]."""
        if self.drafter is None:
            z = torch.zeros(self.lanes, 1, dtype=torch.long, device=self.dev)
            return treeops.TreeRows(self.root[:, None], z, z, torch.ones_like(z, dtype=torch.bool))
        return self._build_tree(self._propose()) if self.tlv is None else self._two_level(self._propose())

    def _propose(self) -> bool:
        """The drafter's lattice of every lane into `lat` (a host drafter's is there already);
        whether it carries transitions."""
        if self.device_draft is None:  # a host drafter without transitions: a chain takes each position's top-1
            return self.host.transitions
        tok, logp, trans = self.device_draft.propose(self.root)
        self.lat[0].copy_(tok), self.lat[1].copy_(logp)
        if trans is not None:
            self.lat[2].copy_(trans)
        return trans is not None

    def _build_tree(self, transitions: bool) -> treeops.TreeRows:
        """Every lane's tree from the lattice in `lat`: the policy's rows (row selection included)."""
        tok, logp = self.lat[0], self.lat[1]
        if self.options is not None:  # each lane's draft length: later positions are no candidates
            sure = draft_lengths.confident(tok, logp)
            self.positions.copy_(draft_lengths.pick(self.options, self.recent, sure))
            tok, logp = draft_lengths.clip(tok, logp, self.positions)
        trans = self.lat[2] if transitions else None
        if self.spec.kind == "shared":  # a lane feeding a prompt (its rows the prompt's) gives its share away
            drafting = self.active * (self.feed_len <= self.fed) if self.admit_steps else None
            return treeops.build_shared(self.spec, self.root, tok, logp, trans, self.active, drafting)
        return treeops.build_lanes(self.spec, self.root, tok, logp, trans, self.tables)

    def _two_level(self, transitions: bool) -> treeops.TreeRows:
        """Two-level verification's tree for the exact pass, every lane in the same kernels (tlv.py's
        cycle): tree ① from the lattice's first q_depth positions; the Q pass over it (its rows
        land where the exact pass's will, and nothing is committed); chain C, its greedy path and
        bonus; draft ② from C's end (the drafter observes C with the Q pass's features, proposes,
        and forgets C); C, then draft ②'s best N − |C| nodes under its end."""
        first_spec, sub_spec = self.tlv_specs
        d = first_spec.max_depth
        tok, logp, trans = self.lat
        first = treeops.build_lanes(first_spec, self.root, tok[:, :d], logp[:, :d],
                                    trans[:, : d - 1] if transitions else None)
        self.cache.plan(first_spec.rows, first.parents, first.depth, d)
        out = self.tlv.quick(first.tokens, self.cache, feature_layers=self.layers, greedy=self.bias is None)
        argmax = out.argmax if self.bias is None else (out.logits + self.bias).argmax(-1)
        path, tau = treeops.accept(first, argmax, self.cache.ctx.anc, d + 1)
        chain = torch.cat((first.tokens.gather(1, path), torch.zeros_like(tau)[:, None]), 1)  # [B, d + 2]
        chain.scatter_(1, tau[:, None], argmax.gather(1, path.gather(1, (tau - 1)[:, None])))  # the path, its bonus
        n = tau.clamp(max=first_spec.nodes)  # C's tokens past the root
        end = chain.gather(1, n[:, None])[:, 0]
        feats = None if out.features is None else \
            out.features.gather(1, path[..., None].expand(-1, -1, out.features.shape[-1]))
        mark = self.device_draft.mark()
        self.device_draft.observe(chain[:, :-1], chain[:, 1:], feats, n * self.active)
        tok2, logp2, trans2 = self.device_draft.propose(end)
        self.device_draft.rewind(mark)
        sub = treeops.build_budget(sub_spec, end, tok2, logp2, trans2, first_spec.nodes - n)
        return treeops.join(chain, n, sub)

    def _feeding(self, tree: treeops.TreeRows):
        """Every lane's rows with the prompt rows of the lanes still feeding a prompt: their next
        ≤ `feed` prompt tokens as a chain (the rows past them: padding children of the root).
        Returns the rows, which lanes feed [B] and how many prompt tokens each feeds [B]."""
        idx = torch.arange(tree.tokens.shape[1], device=self.dev)
        count = (self.feed_len - self.fed).clamp(0, self.feed)  # [B]
        feeding = count > 0
        tok = self.feed_tok.gather(1, (self.fed[:, None] + idx).clamp(max=self.feed_tok.shape[1] - 1))
        chain = idx < self.feed
        f = feeding[:, None]
        rows = treeops.TreeRows(torch.where(f, tok, tree.tokens),
                                torch.where(f, torch.where(chain, (idx - 1).clamp_min(0), 0), tree.parents),
                                torch.where(f, torch.where(chain, idx, 1), tree.depth),
                                torch.where(f, idx < count[:, None], tree.valid))
        return rows, feeding, count

    def _step(self):
        tree = self._tree()
        if self.admit_steps:
            tree, feeding, count = self._feeding(tree)
        R = self.spec.rows
        if self.spec.kind == "chain":  # a chain's ancestors are every earlier row
            self.cache.plan(R)
        else:
            self.cache.plan(R, tree.parents, tree.depth, self.spec.max_depth)
        out = self.target(tree.tokens, self.cache, feature_layers=self.layers, greedy=self.bias is None)
        argmax = out.argmax if self.bias is None else (out.logits + self.bias).argmax(-1)  # [lanes, R]
        anc = self.cache.ctx.anc
        path, tau = treeops.accept(tree, argmax, anc, self.path_len)  # [lanes, D], [lanes]
        if self.admit_steps:  # a feeding lane keeps its prompt rows
            path = torch.where(feeding[:, None], torch.arange(self.path_len, device=self.dev), path)
            tau = torch.where(feeding, count, tau)
        tau = tau * self.active  # an idle lane commits nothing
        bonus = argmax.gather(1, path.gather(1, (tau - 1).clamp_min(0)[:, None]))  # [lanes, 1]
        self.cache.commit(path, tau, compact=self.spec.kind != "chain")
        if self.options is not None:
            drafting = self.active if not self.admit_steps else self.active * ~feeding
            self.recent.copy_(draft_lengths.update(self.recent, tau, drafting))
        path_tokens = tree.tokens.gather(1, path)
        if self.device_draft is not None:  # each lane's next tokens: its path's, the bonus at τ
            D = torch.arange(self.path_len, device=self.dev)
            nxt = torch.cat((path_tokens[:, 1:], bonus), 1)
            nxt = torch.where(D == tau[:, None] - 1, bonus, nxt)
            if self.admit_steps:  # a feeding lane's: the prompt's, the bonus after its last token
                at = self.fed[:, None] + 1 + D
                after = torch.where(at < self.feed_len[:, None],
                                    self.feed_tok.gather(1, at.clamp(max=self.feed_tok.shape[1] - 1)), bonus)
                nxt = torch.where(feeding[:, None], after, nxt)
            feats = None if out.features is None else \
                out.features.gather(1, path[..., None].expand(-1, -1, out.features.shape[-1]))
            self.device_draft.observe(path_tokens, nxt, feats, tau)
        self.root.copy_(bonus[:, 0])
        if self.admit_steps:
            self.fed += count
        self.out.copy_(torch.cat((tau[:, None], tree.valid.sum(1, keepdim=True) - 1, self.positions[:, None],
                                  path_tokens, bonus), 1))
        self.rec = (tree, argmax)

    @torch.no_grad()
    def _capture(self):
        self._prefill([[0]], [0])
        side = torch.cuda.Stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side), torch.no_grad():
            try:
                self.fn()  # compiles
            except Exception as e:  # noqa: BLE001 — a compiler failure costs speed, never the decode
                if not self.compile:
                    raise
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                warnings.warn(f"torch.compile failed for this step ({type(e).__name__}: {first[:200]}); "
                              "the step runs uncompiled in its CUDA graph", RuntimeWarning, stacklevel=2)
                self.compile, self.fn = False, self._step
                self._prefill([[0]], [0])
            for _ in range(2):  # warms up kernels and the allocator
                self.fn()
        torch.cuda.current_stream(self.dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.fn()
        self.active.zero_()

    def _admit(self, n: int, A: int) -> None:
        """The prefill of `admit_in`'s A prompts (padded to n rows) into their lanes, the other
        lanes untouched; the lanes become active and `admit_first[:A]` holds their first tokens.
        Idempotent (the lanes are emptied first), so a graph's capture can follow its warm-up run."""
        lane, valid, ids = self.admit_in[:A], self.admit_in[A : 2 * A], self.admit_in[2 * A : 2 * A + A * n].view(A, n)
        self.cache.reset(lane)
        self.cache.plan(n, commit_all=True, lane=lane, valid=valid)
        out = self.target(ids, self.cache, feature_layers=self.layers, logits="last", greedy=self.bias is None)
        self.cache.lengths.index_copy_(0, lane, valid)
        first = out.argmax[:, -1] if self.bias is None else (out.logits[:, -1] + self.bias).argmax(-1)  # [A]
        self.admit_first[:A].copy_(first)
        self.root.index_copy_(0, lane, first)
        self.active.index_fill_(0, lane, 1)
        if self.options is not None:
            self.recent.index_copy_(0, lane, draft_lengths.start(self.options).expand(A))
        if self.device_draft is not None:
            self.device_draft.prefill(ids, first, out.features, lane, valid)

    # ---- the host side ------------------------------------------------------------------------
    def _feed_steps(self, prompt: list[int]) -> int:
        """The verify steps that feed this prompt, `feed` tokens a step."""
        return -(-len(prompt) // self.feed)

    def _feed_start(self, lane: int, prompt: list[int]) -> int:
        """Lane `lane` emptied for `prompt`, which the next verify steps feed (`_feeding`): queued
        behind the steps already launched. Returns the steps it takes, the last one's bonus its
        first token."""
        at = torch.tensor([lane], device=self.dev)
        self.cache.reset(at)
        if self.device_draft is not None:  # `observe` then reads the prompt's rows as it reads accepted paths
            self.device_draft.cache.reset(at)
        self.feed_tok[lane, : len(prompt)] = torch.tensor(prompt, device=self.dev)
        self.feed_len[lane], self.fed[lane], self.active[lane] = len(prompt), 0, 1
        if self.options is not None:
            self.recent[lane] = draft_lengths.start(self.options)
        return self._feed_steps(prompt)

    def _prefill(self, prompts: list[list[int]], lanes: list[int]) -> torch.Tensor:
        """Prompts into their lanes (the other lanes untouched) in one pass, each padded to the
        bucket of the longest. A bucket's first use first runs every prompt count `admit_counts`
        allows it (on CUDA: captures their graphs, so that no capture stalls a later admission
        mid-decode) on these same lanes and prompts, repeated: those runs write only what the real
        pass then writes again. Returns the first tokens [A], on the device."""
        A, n = len(prompts), bucket(max(map(len, prompts)), self.cache.max_len)
        if n not in self.admit_buckets:
            self.admit_buckets.add(n)
            for a in admit_counts(n, self.lanes):
                if a != A:
                    self._admit_run([prompts[j % A] for j in range(a)], [lanes[j % A] for j in range(a)], n)
        self._admit_run(prompts, lanes, n)
        return self.admit_first[:A]

    def _admit_run(self, prompts: list[list[int]], lanes: list[int], n: int) -> None:
        """One prefill pass of these prompts padded to n rows: on CUDA the (n, count) graph, captured
        on its first use."""
        A = len(prompts)
        rows = [p + [0] * (n - len(p)) for p in prompts]
        self.admit_in[: A * (2 + n)].copy_(torch.tensor([*lanes, *map(len, prompts), *(t for r in rows for t in r)]))
        if not self.graphs:
            return self._admit(n, A)
        if (n, A) not in self.admit_graphs:
            side = torch.cuda.Stream(self.dev)
            side.wait_stream(torch.cuda.current_stream(self.dev))
            with torch.cuda.stream(side):
                self._admit(n, A)  # warms up
            torch.cuda.current_stream(self.dev).wait_stream(side)
            self.admit_graphs[n, A] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.admit_graphs[n, A], pool=self.admit_pool):
                self._admit(n, A)
        self.admit_graphs[n, A].replay()

    def _load(self, lat: Lattice, lane: int = 0) -> None:
        """A host drafter's lattice into lane `lane` of the (padded) pinned staging buffers;
        `_upload` then queues their copies to the device behind the host, without stalling it."""
        m, k = min(lat.positions, self.m), lat.tokens.shape[1]
        if k > TOP_K:
            raise ValueError(f"a lattice of {k} candidates per position; the static driver holds {TOP_K}")
        if self.staging is None:
            pin = self.dev.type == "cuda"
            self.staging = tuple(torch.empty(b.shape, dtype=b.dtype, pin_memory=pin).copy_(b) for b in self.lat)
        if lat.trans is not None and not self.host.transitions:
            raise ValueError(f"a {self.host.kind} drafter's lattice carries transitions, but the drafter does not "
                             "declare them (set its `transitions` to True)")
        tok, logp, trans = (t[lane] for t in self.staging)
        tok.fill_(-1), logp.fill_(float("-inf"))
        tok[:m, :k], logp[:m, :k] = lat.tokens[:m], lat.logp[:m]
        if self.host.transitions:  # a missing transition: the child's own score
            trans.copy_(logp[1:, None, :].expand(-1, TOP_K, -1))
            if lat.trans is not None and m > 1:
                trans[: m - 1, :k, :k] = lat.trans[: m - 1]

    def _upload(self) -> None:
        for buf, t in zip(self.lat, self.staging):
            buf.copy_(t, non_blocking=True)

    def generate(self, prompt: list[int], max_new_tokens: int, eos: set[int] | None = None,
                 record: list | None = None) -> Result:
        with on_device(self.dev):
            return self._generate(prompt, max_new_tokens, eos, record)

    def _check(self, prompt: list[int], max_new_tokens: int) -> None:
        if not prompt:
            raise ValueError("prompt must hold at least one token")
        if len(prompt) + max_new_tokens > self.capacity:
            raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceed this decoder's "
                             f"capacity ({self.capacity})")

    @torch.no_grad()
    def _generate(self, prompt, max_new_tokens, eos, record) -> Result:
        if self.lanes != 1:
            raise ValueError(f"generate decodes one request; a decoder of {self.lanes} lanes runs generate_batch")
        if record is not None and self.tlv is not None:
            raise ValueError("records of two-level cycles are kept by the eager driver (use driver 'eager')")
        self._check(prompt, max_new_tokens)
        res = Result([], driver="static")
        if max_new_tokens <= 0:
            return res
        eos = set(self.target.cfg.eos_token_id) if eos is None else eos
        t0 = clock(self.dev)  # the device's earlier work is not this request's
        newest = int(self._prefill([prompt], [0])[0])  # the prefill's one read (and the clocks need no other sync)
        if self.host is not None:
            self.host.reset(len(prompt) + max_new_tokens + self.spec.rows + 1)
            self.host.observe(list(prompt), list(prompt[1:]) + [newest], None)
        t1 = time.perf_counter()
        res.prefill_s = t1 - t0
        done = emit(res.tokens, [newest], eos, max_new_tokens)
        # Device drafters (and AR) need nothing from the host between steps: the next step is
        # launched before this one's result is read, so the device never waits for the host.
        # The step launched past the end is waited for, and counts in this request's time.
        ahead, k = self.graph is not None and self.host is None and record is None, 0
        if ahead and not done:
            self._launch(0)
        while not done:
            ta = time.perf_counter()
            room = max_new_tokens - len(res.tokens) - 1
            lattice = self.host.propose(self.m) if self.host is not None else None
            if lattice is not None:
                self._load(lattice)
                self._upload()
            if ahead:  # the next step runs while this one is read
                self._launch(1 - k)
                vals, k = self._read(k)[0], 1 - k  # the step's one read
            else:
                self._launch(k)
                vals = self._read(k)[0]
            tau, drafted, positions, committed, bonus = vals[0], vals[1], vals[2], vals[3 : 3 + vals[0]], vals[-1]
            emitted = committed[1:] + [bonus]
            if record is not None:
                record.append(self._record(lattice, room, tau, emitted))
            done = emit(res.tokens, emitted, eos, max_new_tokens)
            if self.host is not None and not done:
                self.host.observe(committed, emitted, None)
            res.steps.append(Step(tau=tau, drafted=drafted, t_draft=0.0, t_verify=time.perf_counter() - ta,
                                  t_commit=0.0, rows=self.spec.rows, positions=positions))
        if ahead and res.steps:
            self._read(k)
        res.decode_s = time.perf_counter() - t1
        return res

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: list[int], eos: set[int] | None = None,
                       progress=None) -> list[Result]:
        """Greedy outputs of many requests, `lanes` decoding at once: each step verifies every
        active lane's tree in one target pass and reads the device once for the whole batch; a
        request that ends frees its lane for the next waiting one (prefilled into it, the other
        lanes' state untouched). `progress(1)` after each request ends. Each result's steps are
        the steps it took part in, each timed as the whole step."""
        for p, n in zip(prompts, max_new_tokens, strict=True):
            self._check(p, n)
        with on_device(self.dev), torch.no_grad():
            return self._generate_batch(prompts, max_new_tokens, eos, progress)

    def _generate_batch(self, prompts, limits, eos, progress) -> list[Result]:
        eos = set(self.target.cfg.eos_token_id) if eos is None else eos
        results = [Result([], driver="static") for _ in prompts]
        waiting = [i for i, n in enumerate(limits) if n > 0][::-1]  # popped from the end: in order
        held: list[int | None] = [None] * self.lanes  # the request each lane decodes
        started = [0.0] * len(prompts)
        first_at: dict[int, tuple[int, float]] = {}  # a lane feeding a prompt: (the step that ends it, admitted at)
        self.active.zero_()

        def finish(lane: int, i: int) -> None:
            held[lane] = None
            self.active[lane] = 0
            results[i].decode_s = time.perf_counter() - started[i]
            if progress is not None:
                progress(1)

        def first(lane: int, i: int, newest: int) -> None:  # a request's first token: its decoding starts
            started[i] = time.perf_counter()
            if emit(results[i].tokens, [newest], eos, limits[i]):
                finish(lane, i)
            elif self.hosts:
                h = self.hosts[lane]
                h.reset(len(prompts[i]) + limits[i] + self.spec.rows + 1)
                h.observe(list(prompts[i]), list(prompts[i][1:]) + [newest], None)

        def admit() -> None:
            free = [x for x, i in enumerate(held) if i is None]
            if self.admit_steps and len(free) < self.lanes:  # a pass would stall the busy lanes: ride their steps
                while free and waiting and self._feed_steps(prompts[waiting[-1]]) <= self.admit_steps:
                    lane, i = free.pop(0), waiting.pop()
                    k = self._feed_start(lane, prompts[i])
                    held[lane], since[lane], results[i].prefill_steps = i, launched + k, k
                    first_at[lane] = (launched + k - 1, time.perf_counter())
            while waiting and None in held:  # waiting prompts into free lanes, a pass per ≤ ADMIT_ROWS rows
                group, widest = [], 0  # (lane, request) pairs; the longest prompt among them
                for lane in (x for x, i in enumerate(held) if i is None):
                    widest = max(widest, len(prompts[waiting[-1]]))
                    if group and (len(group) + 1) * bucket(widest, self.cache.max_len) > ADMIT_ROWS:
                        break
                    group.append((lane, waiting.pop()))
                    if not waiting:
                        break
                t0 = clock(self.dev)
                firsts = []  # passes of 2^k prompts (largest first): few graphs, however lanes free up
                for a, b in pow2_runs(len(group)):
                    firsts += self._prefill([prompts[i] for _, i in group[a:b]], [x for x, _ in group[a:b]]).tolist()
                t1 = time.perf_counter()
                for (lane, i), newest in zip(group, firsts):
                    results[i].prefill_s, results[i].prefill_with = t1 - t0, len(group)
                    held[lane], since[lane] = i, launched
                    first(lane, i, newest)

        # Device drafters and AR: the next step is launched before this one's result is read (as in
        # generate), so a step's rows of a lane whose request ended in the step before, or that was
        # admitted after its launch, belong to no request: `since` is each lane's first step (after
        # the steps that feed its prompt, when it rides them).
        ahead, launched, k = not self.hosts, 0, 0
        since = [0] * self.lanes
        admit()
        if ahead and any(i is not None for i in held):
            self._launch(0)
            launched = 1
        while any(i is not None for i in held):
            ta = time.perf_counter()
            if self.hosts:  # (launched is the step about to run) a lane feeding a prompt drafts nothing
                for lane, i in enumerate(held):
                    if i is not None and since[lane] <= launched:
                        self._load(self.hosts[lane].propose(self.m), lane)
                self._upload()
            if ahead:  # launch step `launched`, read step `launched - 1`
                self._launch(1 - k)
                rows, k, step = self._read(k), 1 - k, launched - 1  # the step's one read, for every lane
            else:
                self._launch(k)
                rows, step = self._read(k), launched
            launched += 1
            wall = time.perf_counter() - ta
            mine = [(lane, i) for lane, i in enumerate(held) if i is not None and since[lane] <= step]
            for lane, i in mine:
                tau, drafted, positions, bonus = rows[lane][:3] + rows[lane][-1:]
                committed = rows[lane][3 : 3 + tau]
                emitted = committed[1:] + [bonus]
                results[i].steps.append(Step(tau=tau, drafted=drafted, t_draft=0.0, t_verify=wall, t_commit=0.0,
                                             rows=self.lanes * self.spec.rows, lanes=len(mine), positions=positions))
                if emit(results[i].tokens, emitted, eos, limits[i]):
                    finish(lane, i)
                elif self.hosts:
                    self.hosts[lane].observe(committed, emitted, None)
            for lane in [x for x, (end, _) in first_at.items() if end == step]:  # prompts fed: their first tokens
                results[held[lane]].prefill_s = time.perf_counter() - first_at.pop(lane)[1]
                first(lane, held[lane], rows[lane][-1])
            admit()
        if ahead and launched:
            self._read(k)  # the step launched past the end: waited for, in the batch's time
        return results

    def _launch(self, i: int) -> None:
        """Replay the step (run it, without graphs) and queue its output's copy into host buffer i."""
        self.graph.replay() if self.graph is not None else self.fn()
        self.host_out[i].copy_(self.out, non_blocking=self.graph is not None)
        if self.graph is not None:
            self.events[i].record()

    def _read(self, i: int) -> list[list[int]]:
        """Host buffer i's step result, once its copy has landed."""
        if self.graph is not None:
            self.events[i].synchronize()
        return self.host_out[i].tolist()

    def _record(self, lat: Lattice | None, room: int, tau: int, emitted: list[int]) -> StepRecord:
        """What the step saw, read back (records only: more reads than a plain step). The step's
        tree and argmax tensors stay valid after a graph replay: they live in the graph's pool."""
        tree_rows, argmax = self.rec
        tree_rows = treeops.TreeRows(*(f[0] for f in tree_rows))
        if self.device_draft is not None:
            tok, logp, trans = (t[0].detach().cpu().clone() for t in self.lat)
            kept = getattr(self.device_draft, "transitions", False) and self.m > 1
            lat = Lattice(tok, logp, trans if kept else None)
        tree = treeops.to_tree(tree_rows)
        keep = [i for i, v in enumerate(tree_rows.valid.tolist()) if v]
        am = argmax[0].tolist()
        return StepRecord(lat, room, tau, tree.tokens, [am[i] for i in keep], emitted)


class _Decoders(dict):
    """A target's decoders (on the target object: they die with it). A copy of the target starts
    with none: buffers and graphs belong to the model they were built for."""

    def __deepcopy__(self, memo):
        return _Decoders()

    def __copy__(self):
        return _Decoders()

    def __reduce__(self):
        return _Decoders, ()


def decoder(target: Model, drafter: Drafter | None, draft_len: int, policy, logit_bias, need: int,
            lanes: int = 1, lengths: tuple[int, ...] | None = None, admit_steps: int = 0, tlv=None) -> FastDecoder:
    """The target's decoder for this drafter / draft length / policy / bias / lanes / draft lengths /
    prompt admission / two-level verification, built (and captured) once, and rebuilt larger
    (`size_for`) when a request needs more than its capacity.
    Decoders hold their target, so they are kept on it (`_static_decoders`): the cycle dies with
    the target."""
    key = (id(drafter), draft_len, policy if isinstance(policy, trees.TreePolicy) else None,
           None if logit_bias is None else id(logit_bias), target.lm_head_weight.device, target.dtype, lanes, lengths,
           admit_steps, None if tlv is None else id(tlv))
    mine = target.__dict__.setdefault("_static_decoders", _Decoders())
    dec = mine.get(key)
    if dec is None or dec.capacity < need:
        mine.pop(key, None)
        size = size_for(plan(drafter, draft_len, policy, lanes, tlv)[1], need)
        dec = mine[key] = FastDecoder(target, drafter, draft_len, policy, size, logit_bias=logit_bias, lanes=lanes,
                                      lengths=lengths, admit_steps=admit_steps, tlv=tlv)
    return dec
