"""The static-shape driver: greedy AR and speculative decoding with every buffer allocated once and
no host round trip inside a step, so that on CUDA a whole step replays as one captured graph and
the host reads the device exactly once per step (the accepted length and tokens).

One step, all on the device: the drafter proposes a lattice (feature drafters and draft LMs run
here; the n-gram drafter and other host drafters fill the lattice buffers before the step) → the
policy's tree with a static node budget (treeops) → one target pass over its rows (StaticCache
plans slots, positions and the ancestor mask) → greedy acceptance → K/V compaction and recurrent
state commit → the drafter reads the accepted rows → [τ, valid rows, path tokens, bonus] into one
buffer. Prefill runs eagerly (its length varies). `decode.generate` takes this path whenever the
target is on a CUDA device; on the CPU the eager driver (decode.py) runs, and tests run this one
eagerly there too (`graphs=False`), in float64, against it.

The model code is shared: the same modules run both drivers; a StaticCache selects the static
attention and Gated DeltaNet forms (model.py). torch.compile (on by default with graphs; set
SPECPILOT_COMPILE=0 to skip it) fuses the step's small kernels before the graph is captured.
"""

from __future__ import annotations

import os
import time
import warnings
import weakref

import torch
import torch.nn.functional as F

from . import treeops, trees
from .cache import StaticCache
from .decode import MAX_TREE, Result, Step, StepRecord, clock, emit
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
    """A feature drafter (sequential / block / block + Markov) on static buffers."""

    def __init__(self, d: FeatureDrafter, m: int, max_len: int):
        self.net, self.kind, self.emb, self.head, self.m = d.net, d.kind, d.emb, d.head, m
        self.transitions = d.transitions
        self.body = d.net.cfg.body()
        dev, dt = self.head.device, self.head.dtype
        self.cache = StaticCache(self.body, max_len, dev, dt)
        self.hidden = torch.zeros(1, 1, self.body.hidden_size, device=dev, dtype=dt)
        self.logits = torch.zeros(self.head.shape[0], device=dev, dtype=dt)
        self.copy = d.net.cfg.copy_head
        if self.copy:  # every context row's pointer key and every position's token, by position
            self.keys = torch.zeros(max_len, d.net.cfg.head_dim, device=dev, dtype=dt)
            self.tokens = torch.zeros(max_len + 2, dtype=torch.long, device=dev)

    def _layers(self, x):
        pos = self.cache.ctx.positions
        h, _ = run_layers(self.body, self.net.layers, x, self.cache, 0, pos, None,
                          rope_tables(self.net.inv_freq, pos, x.dtype))
        return h[0]  # pre-norm hidden [n, H]

    def _read(self, nxt, feats, n: int):
        """Context rows for n committed positions (from `length`): their next tokens and target features."""
        self.cache.plan(n, commit_all=True)
        h = self._layers(self.net.rows(nxt[None], self.net.fc_feat(feats.to(self.head.dtype))[None], self.emb))
        if self.copy:
            at = self.cache.length + torch.arange(n, device=h.device)
            self.keys.index_copy_(0, at, self.net.copy_key(h))
            self.tokens.index_copy_(0, at + 1, nxt)
        return h

    def _keep(self, last):
        self.hidden.copy_(last.view(1, 1, -1))
        self.logits.copy_(F.linear(self.net.norm(last.view(1, -1)), self.head)[0])

    def prefill(self, prompt_ids, first, feats):
        self.cache.reset()
        nxt = torch.cat((prompt_ids[1:], first.view(1)))
        if self.copy:
            self.tokens[0] = prompt_ids[0]
        self._keep(self._read(nxt, feats, len(nxt))[-1])
        self.cache.length.fill_(len(nxt))

    def observe(self, path_tokens, nxt, feats, tau):
        h = self._read(nxt, feats, nxt.shape[0])
        self._keep(h.index_select(0, tau.view(1) - 1))
        self.cache.length += tau

    def propose(self, root):
        net, m = self.net, self.m
        if self.kind == "sequential":
            rows, hidden = [self.logits], self.hidden
            for i in range(m - 1):
                self.cache.plan(1, offset=i)
                h = self._layers(net.rows(rows[-1].argmax().view(1, 1), hidden, self.emb))
                hidden = h.view(1, 1, -1)
                rows.append(F.linear(net.norm(h[-1]), self.head))
            return (*_lattice(torch.stack(rows)), None)
        first, ptr = self.logits, None
        if self.kind == "block_markov":
            first = net.markov_logits(first, root, self.emb)[0]
        logits = first[None]
        if m > 1:
            self.cache.plan(m - 1, full=True)
            lead = first.argmax().view(1)
            h = self._layers(net.block_rows(lead, m - 1, self.emb))
            rest = mask_logits = F.linear(net.norm(h), self.head)
            if self.copy:  # positions 2..m as log-probabilities with the copies mixed in
                ptr = pointer(net, self.keys, self.tokens, self.hidden[0, 0], h, lead, self.cache.length - 1)
                rest = with_copies(rest, pointer_copies(net, ptr))
            logits = torch.cat((logits.to(rest.dtype), rest))
        tok, logp = _lattice(logits)
        if not self.transitions or m == 1:
            return tok, logp, None
        return tok, logp, block_transitions(net, mask_logits, tok[: m - 1], tok[1:m], self.emb, ptr)


class _DraftLMDraft:
    """A standalone draft LM on static buffers: greedy, one row per drafted position."""

    def __init__(self, d: DraftLM, m: int, max_len: int):
        self.model, self.m = d.model.fuse(), m
        self.cache = self.model.static_cache(max_len)

    def prefill(self, prompt_ids, first, feats):
        self.cache.reset()
        self.cache.plan(len(prompt_ids), commit_all=True)
        self.model(prompt_ids[None], self.cache, logits=False)
        self.cache.length.fill_(len(prompt_ids))

    def observe(self, path_tokens, nxt, feats, tau):
        self.cache.plan(path_tokens.shape[0], commit_all=True)
        self.model(path_tokens[None], self.cache, logits=False)
        self.cache.length += tau

    def propose(self, root):
        tok, rows = root.view(1, 1), []
        for i in range(self.m):
            self.cache.plan(1, offset=i)
            lg = self.model(tok, self.cache).logits[0, -1]
            rows.append(lg)
            tok = lg.argmax().view(1, 1)
        return (*_lattice(torch.stack(rows)), None)


def supports(drafter: Drafter | None, policy) -> bool:
    """Whether the static driver runs this drafter and policy (else decode.py's eager one does)."""
    host_ok = drafter is None or isinstance(drafter, (FeatureDrafter, DraftLM)) or not drafter.target_layers
    return host_ok and (policy is None or policy is trees.chain or isinstance(policy, trees.TreePolicy))


class FastDecoder:
    """Static buffers, a step function and (on CUDA) its captured graph for one target, drafter,
    draft length and policy. `generate` decodes requests of prompt + max_new_tokens ≤ capacity."""

    def __init__(self, target: Model, drafter: Drafter | None = None, draft_len: int = 8, policy=None,
                 max_len: int = 1024, graphs: bool | None = None, compile: bool | None = None,
                 logit_bias: torch.Tensor | None = None):
        dev = target.lm_head_weight.device
        self.target, self.dev, self.drafter = target.fuse(), dev, drafter
        self.graphs = dev.type == "cuda" if graphs is None else graphs
        self.compile = (self.graphs and os.environ.get("SPECPILOT_COMPILE", "1") != "0") if compile is None else compile
        self.cache = target.static_cache(max_len)
        self.bias = logit_bias.to(dev, target.dtype) if logit_bias is not None else None
        self.layers, self.device_draft, self.host, self.m, self.tables = (), None, None, 0, None
        if drafter is None:
            self.spec = treeops.TreeSpec("chain", 0, 0)
        else:
            block = getattr(drafter, "block_size", None)
            self.m = min(draft_len, block) if block and drafter.kind != "sequential" else draft_len
            name, args, shape = ("chain", (), None) if policy is None or policy is trees.chain else \
                (policy.name, policy.args, policy.shape)
            self.spec = treeops.spec_for(name, args, self.m, shape)
            self.tables = treeops.sequoia_tables(self.spec, dev) if self.spec.kind == "sequoia" else None
            self.lat = (torch.full((self.m, TOP_K), -1, dtype=torch.long, device=dev),
                        torch.full((self.m, TOP_K), float("-inf"), dtype=torch.float64, device=dev),
                        torch.zeros(max(self.m - 1, 0), TOP_K, TOP_K, dtype=torch.float64, device=dev))
            side = max_len + self.m + 2
            if isinstance(drafter, FeatureDrafter):
                self.device_draft, self.layers = _FeatureDraft(drafter, self.m, side), drafter.target_layers
            elif isinstance(drafter, DraftLM):
                self.device_draft = _DraftLMDraft(drafter, self.m, side)
            else:
                self.host = drafter
        self.path_len = self.spec.max_depth + 1
        self.capacity = max_len - self.spec.rows - self.path_len - 1
        self.root = torch.zeros(1, dtype=torch.long, device=dev)
        self.out = torch.zeros(3 + self.path_len, dtype=torch.long, device=dev)
        self.rec = None  # (tree rows, argmax) of the last step, for records
        self.staging = None  # pinned host copies of the lattice buffers (host drafters)
        if self.graphs:  # two pinned output buffers: a step's result is read while the next one runs
            self.host_out = [torch.empty_like(self.out, device="cpu").pin_memory() for _ in range(2)]
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
        if self.drafter is None:
            z = torch.zeros(1, dtype=torch.long, device=self.dev)
            return treeops.TreeRows(self.root, z, z, torch.ones(1, dtype=torch.bool, device=self.dev))
        if self.device_draft is not None:
            tok, logp, trans = self.device_draft.propose(self.root)
            self.lat[0].copy_(tok), self.lat[1].copy_(logp)
            if trans is not None:
                self.lat[2].copy_(trans)
        else:  # a host drafter without transitions: a chain takes each position's top-1, no walk
            trans = self.lat[2] if self.host.transitions else None
        return treeops.build(self.spec, self.root, self.lat[0], self.lat[1], trans, self.tables)

    def _step(self):
        tree = self._tree()
        R = self.spec.rows
        if self.spec.kind == "chain":  # a chain's ancestors are every earlier row
            self.cache.plan(R)
        else:
            self.cache.plan(R, tree.parents, tree.depth, self.spec.max_depth)
        out = self.target(tree.tokens[None], self.cache, feature_layers=self.layers)
        logits = out.logits[0] if self.bias is None else out.logits[0] + self.bias
        argmax = logits.argmax(-1)
        path, tau = treeops.accept(tree, argmax, self.cache.ctx.anc, self.path_len)
        bonus = argmax.index_select(0, path.index_select(0, tau.view(1) - 1))
        self.cache.commit(path, tau, compact=self.spec.kind != "chain")
        path_tokens = tree.tokens.index_select(0, path)
        if self.device_draft is not None:
            nxt = torch.cat((path_tokens[1:], bonus))
            nxt = torch.where(torch.arange(self.path_len, device=self.dev) == tau - 1, bonus, nxt)
            feats = out.features[0].index_select(0, path) if out.features is not None else None
            self.device_draft.observe(path_tokens, nxt, feats, tau)
        self.root.copy_(bonus)
        self.out.copy_(torch.cat((tau.view(1), tree.valid.sum().view(1) - 1, path_tokens, bonus)))
        self.rec = (tree, argmax)

    @torch.no_grad()
    def _capture(self):
        self._prefill([0])
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
                self._prefill([0])
            for _ in range(2):  # warms up kernels and the allocator
                self.fn()
        torch.cuda.current_stream(self.dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.fn()

    # ---- the host side ------------------------------------------------------------------------
    def _prefill(self, prompt: list[int]) -> torch.Tensor:
        ids = torch.tensor(prompt)
        ids = ids.pin_memory().to(self.dev, non_blocking=True) if self.dev.type == "cuda" else ids
        self.cache.reset()
        self.cache.plan(len(prompt), commit_all=True)
        out = self.target(ids[None], self.cache, feature_layers=self.layers, logits="last")
        self.cache.length.fill_(len(prompt))
        logits = out.logits[0, -1] if self.bias is None else out.logits[0, -1] + self.bias
        first = logits.argmax().view(1)
        self.root.copy_(first)
        if self.device_draft is not None:
            self.device_draft.prefill(ids, first, out.features[0] if out.features is not None else None)
        return first

    def _load(self, lat: Lattice) -> None:
        """A host drafter's lattice into the (padded) lattice buffers, through pinned staging
        buffers so that the copies queue behind the host without stalling it."""
        m, k = min(lat.positions, self.m), lat.tokens.shape[1]
        if k > TOP_K:
            raise ValueError(f"a lattice of {k} candidates per position; the static driver holds {TOP_K}")
        if self.staging is None:
            pin = self.dev.type == "cuda"
            self.staging = tuple(torch.empty(b.shape, dtype=b.dtype, pin_memory=pin) for b in self.lat)
        if lat.trans is not None and not self.host.transitions:
            raise ValueError(f"a {self.host.kind} drafter's lattice carries transitions, but the drafter does not "
                             "declare them (set its `transitions` to True)")
        tok, logp, trans = self.staging
        tok.fill_(-1), logp.fill_(float("-inf"))
        tok[:m, :k], logp[:m, :k] = lat.tokens[:m], lat.logp[:m]
        if self.host.transitions:  # a missing transition: the child's own score
            trans.copy_(logp[1:, None, :].expand(-1, TOP_K, -1))
            if lat.trans is not None and m > 1:
                trans[: m - 1, :k, :k] = lat.trans[: m - 1]
        for buf, t in zip(self.lat, self.staging):
            buf.copy_(t, non_blocking=True)

    @torch.no_grad()
    def generate(self, prompt: list[int], max_new_tokens: int, eos: set[int] | None = None,
                 record: list | None = None) -> Result:
        if not prompt:
            raise ValueError("prompt must hold at least one token")
        if len(prompt) + max_new_tokens > self.capacity:
            raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceed this decoder's "
                             f"capacity ({self.capacity})")
        res = Result([])
        if max_new_tokens <= 0:
            return res
        eos = set(self.target.cfg.eos_token_id) if eos is None else eos
        t0 = clock(self.dev)  # the device's earlier work is not this request's
        newest = int(self._prefill(prompt))  # the prefill's one read (and the clocks need no other sync)
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
            if ahead:
                self._launch(1 - k)
                self.events[k].synchronize()
                vals, k = self.host_out[k].tolist(), 1 - k  # the step's one read (queued by _launch)
            else:
                self.graph.replay() if self.graph is not None else self.fn()
                vals = self.out.tolist()  # the step's one read
            tau, drafted, committed, bonus = vals[0], vals[1], vals[2 : 2 + vals[0]], vals[-1]
            emitted = committed[1:] + [bonus]
            if record is not None:
                record.append(self._record(lattice, room, tau, emitted))
            done = emit(res.tokens, emitted, eos, max_new_tokens)
            if self.host is not None and not done:
                self.host.observe(committed, emitted, None)
            res.steps.append(Step(tau=tau, drafted=drafted, t_draft=0.0, t_verify=time.perf_counter() - ta,
                                  t_commit=0.0))
        if ahead and res.steps:
            self.events[k].synchronize()
        res.decode_s = time.perf_counter() - t1
        return res

    def _launch(self, i: int) -> None:
        """Replay the step and queue its output's copy into pinned host buffer i."""
        self.graph.replay()
        self.host_out[i].copy_(self.out, non_blocking=True)
        self.events[i].record()

    def _record(self, lat: Lattice | None, room: int, tau: int, emitted: list[int]) -> StepRecord:
        """What the step saw, read back (records only: more reads than a plain step). The step's
        tree and argmax tensors stay valid after a graph replay: they live in the graph's pool."""
        tree_rows, argmax = self.rec
        if self.device_draft is not None:
            tok, logp, trans = (t.detach().cpu().clone() for t in self.lat)
            kept = getattr(self.device_draft, "transitions", False) and self.m > 1
            lat = Lattice(tok, logp, trans if kept else None)
        tree = treeops.to_tree(tree_rows)
        keep = [i for i, v in enumerate(tree_rows.valid.tolist()) if v]
        am = argmax.tolist()
        return StepRecord(lat, room, tau, tree.tokens, [am[i] for i in keep], emitted)


_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def decoder(target: Model, drafter: Drafter | None, draft_len: int, policy, logit_bias, need: int) -> FastDecoder:
    """The target's decoder for this drafter / draft length / policy / bias, built (and captured)
    once and rebuilt larger when a request needs more than its capacity."""
    key = (id(drafter), draft_len, policy if isinstance(policy, trees.TreePolicy) else None,
           None if logit_bias is None else id(logit_bias))
    mine = _DECODERS.setdefault(target, {})
    dec = mine.get(key)
    if dec is None or dec.capacity < need:
        size = 1024  # room for most prompts at once: a larger decoder means a new capture (and compile)
        while size - max(draft_len + 1, MAX_TREE) - trees.MAX_DEPTH - 2 < need:  # rows + path + root
            size *= 2
        mine.pop(key, None)
        dec = mine[key] = FastDecoder(target, drafter, draft_len, policy, size, logit_bias=logit_bias)
    return dec
