"""A non-invasive profiler of the engine's decode step by kernel class (docs/METHOD.md §6).

`profile_generate` runs `decode.generate` unchanged under temporary hooks and returns, per decode
step (and the mean per N = rows verified), {class: (seconds, bytes, FLOPs)} for the kernel classes
of the planner's cost model (same names; the engine imports no service, so the output is plain
dataclasses / named tuples that `costmodel.Profile(**step.as_profile())` accepts):

- `target_linear`        every nn.Linear inside the target's layers (forward pre/post hooks);
- `lm_head`              the target's final projection. `Model.forward` calls
                         `F.linear(self.model.norm(x), lm_head_weight)` inline, so a forward
                         post-hook on `model.norm` marks its end, and lm_head is the time from
                         that mark to the return of `Model.forward` (an instance-level wrapper of
                         `target.forward`): the projection plus building the `Output`, nothing
                         else. No separate (re-)computation, no change to the model's code;
- `attention`            Attention modules' own time minus their child Linears;
- `recurrent`            GatedDeltaNet modules' own time minus their child Linears (chain passes
                         through the module hooks; tree passes call `forward_tree` directly, so
                         it is wrapped on the instance too);
- `drafter`              time inside drafter.propose / observe (instance wrappers);
- `tree_build`           the policy call, plus `Tree.ancestor_mask` of the verify pass;
- `sampling_acceptance`  the argmax over the verified rows (generate's verify window minus the
                         target forward and the ancestor mask; the small input-tensor building of
                         the pass rides along) plus `Tree.accept`;
- `other`                the step's wall time minus all of the above (cache commit, emit,
                         norms/MLP activations/embedding/residual adds, hook overhead, ...).

Nested timing is exclusive: a timed region's seconds exclude the timed regions inside it. Every
boundary synchronizes the device first on CUDA (`torch.cuda.synchronize`) and reads
`time.perf_counter`; the profiled run is therefore slower than an unprofiled one (no overlap of
host and device work) — compare `step_wall` with `reference_step_wall` (the same run unprofiled)
for the off-profile factor. T_AR is the mean step of an unprofiled AR run on the same engine.

At a batch (`profile_batch`) the profile is the static driver's, through the decoder that
`Engine.generate_batch` runs: each step's wall time from `generate_batch`, its split by
`class_times` at the batch's shapes (every lane's rows), T_AR the AR step at the same batch.

Step boundaries are generate's own clocks: T_step = t_draft + t_verify + t_commit of its `Step`
records. Events are assigned to steps by the target-forward count: propose / policy / ancestor
mask belong to the next pass, module hooks / accept / observe to the latest one; the prefill pass
(and the observe after it) is dropped.

Temporary patches (all removed in `finally`, even on error): module hooks on the target's layers,
instance attributes `target.forward`, `drafter.propose`, `drafter.observe`,
`GatedDeltaNet.forward_tree` (per instance), and the class attributes `Tree.accept` and
`Tree.ancestor_mask`; the tree policy is wrapped, not patched. The class-level patches make
profiling not thread-safe against concurrent `generate` calls in the same process.

FLOPs and bytes are counted from shapes: Linear 2·rows·in·out FLOPs, weight (+bias) + input +
output bytes; attention 2·2·rows·keys·head_dim·heads FLOPs, K/V cache read + q + out bytes (every
key in the cache prefix counts, sliding windows included: SDPA reads them); recurrent 4·H·Dk·Dv
FLOPs per row and a state read + write per row (state dtype) + q/k/v/out bytes; lm_head like a
Linear. The drafter, tree_build, sampling_acceptance and other classes carry no bytes/FLOPs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from specpilot.kernels.w12.linear import W12Linear

from . import decode, trees
from .cache import StaticCache, state_dtype
from .model import Attention, GatedDeltaNet, Model

KERNEL_CLASSES: tuple[str, ...] = ("target_linear", "lm_head", "attention", "recurrent", "drafter",
                                   "tree_build", "sampling_acceptance", "other")
MEASURED = KERNEL_CLASSES[:-1]
MASK = "_ancestor_mask"  # internal bucket, folded into tree_build


class ClassStat(NamedTuple):
    """seconds, bytes, FLOPs of one kernel class (a tuple: costmodel.KernelStat(*stat) takes it)."""

    seconds: float
    bytes: float = 0.0
    flops: float = 0.0


@dataclass
class StepProfile:
    n: int  # rows verified by this pass (root included; at a batch, every lane's rows)
    tau: int  # tokens committed (accepted path, root included; at a batch, summed over its requests)
    t_step: float  # generate's measured step wall time (profiled run)
    kernels: dict[str, ClassStat]
    requests: int = 1  # requests the pass decoded (τ per request = tau / requests)

    @property
    def profiled_seconds(self) -> float:
        return sum(s.seconds for c, s in self.kernels.items() if c != "other")

    def as_profile(self) -> dict:
        """Keyword arguments of costmodel.Profile."""
        return {"t_step": self.t_step, "kernels": dict(self.kernels), "n": self.n}


@dataclass
class ProfileResult:
    tokens: list[int]  # tokens of the profiled run
    reference_tokens: list[int]  # the same run, unprofiled
    ar_tokens: list[int]
    steps: list[StepProfile]
    step_wall: list[float]  # profiled run, per step
    reference_step_wall: list[float]  # unprofiled run, per step
    t_ar: float  # mean step of the unprofiled AR run (at a batch: the AR step at that batch)
    device: str = "cpu"
    by_n: dict[int, StepProfile] = field(default_factory=dict)  # mean step per N
    batch: int = 1  # requests decoded at once; above 1 the token lists hold one list per request

    @property
    def tokens_match(self) -> bool:
        return self.tokens == self.reference_tokens


def mean_step(steps: list[StepProfile]) -> StepProfile:
    """The mean of steps (all classes present in each; τ and the requests rounded)."""
    k = len(steps)
    kernels = {c: ClassStat(*(sum(s.kernels[c][i] for s in steps) / k for i in range(3))) for c in KERNEL_CLASSES}
    ns = {s.n for s in steps}
    return StepProfile(ns.pop() if len(ns) == 1 else -1, round(sum(s.tau for s in steps) / k),
                       sum(s.t_step for s in steps) / k, kernels, max(1, round(sum(s.requests for s in steps) / k)))


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


class _Profiler:
    def __init__(self, target: Model, drafter=None):
        self.target, self.drafter = target, drafter
        dev = target.lm_head_weight.device
        self.cuda = dev.type == "cuda"
        self.dev = dev
        self.n_forward = 0  # target forward calls started (prefill = 1)
        # bucket (0 = prefill, k = decode step k) -> class -> [seconds, bytes, flops]
        self.acc = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0.0]))
        self.forward_s = defaultdict(float)  # bucket -> target forward wall time
        self.stack: list[list] = []  # open frames: [cls, t0, children seconds, bytes, flops, bucket]
        self.norm_mark: float | None = None
        self.undo: list = []

    # ----------------------------------------------------------------------------- clock, frames
    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.dev)
        return time.perf_counter()

    def bucket(self, pre: bool) -> int:
        return self.n_forward if pre else self.n_forward - 1

    def push(self, cls: str, pre: bool = False, nbytes: float = 0.0, flops: float = 0.0) -> None:
        self.stack.append([cls, self.now(), 0.0, nbytes, flops, self.bucket(pre)])

    def pop(self) -> None:
        t1 = self.now()
        cls, t0, children, nbytes, flops, b = self.stack.pop()
        elapsed = t1 - t0
        a = self.acc[b][cls]
        a[0] += max(elapsed - children, 0.0)
        a[1] += nbytes
        a[2] += flops
        if self.stack:
            self.stack[-1][2] += elapsed

    def add(self, b: int, cls: str, seconds: float, nbytes: float = 0.0, flops: float = 0.0) -> None:
        a = self.acc[b][cls]
        a[0] += seconds
        a[1] += nbytes
        a[2] += flops
        if self.stack:
            self.stack[-1][2] += seconds

    def timed(self, cls: str, fn, pre: bool):
        def wrapper(*args, **kwargs):
            self.push(cls, pre)
            try:
                return fn(*args, **kwargs)
            finally:
                self.pop()
        return wrapper

    # ----------------------------------------------------------------------------- shape counts
    def _linear_pre(self, mod: nn.Linear, args):
        x = args[0]
        rows = x.numel() // mod.in_features
        nbytes = _weight_bytes(mod) + _nbytes(x) + rows * mod.out_features * x.element_size()
        self.push("target_linear", nbytes=nbytes, flops=2.0 * rows * mod.in_features * mod.out_features)

    def _attention_pre(self, mod: Attention, args):
        x, cache, start = args[0], args[4], args[5]
        B, T, _ = x.shape
        c = mod.cfg
        if cache is None:
            keys = T
        elif isinstance(cache, StaticCache):  # every slot up to max_len is read
            keys = cache.k[mod.layer].shape[2]
        else:
            keys = start + T
        nh, nkv, hd, e = c.num_attention_heads, c.num_key_value_heads, c.head_dim, x.element_size()
        flops = 2.0 * 2.0 * B * T * keys * hd * nh
        nbytes = 2 * B * keys * nkv * hd * e + 2 * B * T * nh * hd * e  # K/V read, q in + out
        self.push("attention", nbytes=nbytes, flops=flops)

    def _recurrent_counts(self, mod: GatedDeltaNet, x: torch.Tensor):
        c = mod.cfg
        rows = x.shape[0] * x.shape[1]
        H, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        se = torch.empty((), dtype=state_dtype(x.dtype)).element_size()
        flops = 4.0 * rows * H * dk * dv
        nbytes = rows * (2 * H * dk * dv * se + (2 * H * dk + 2 * H * dv) * se)  # state r+w; q, k, v, out
        return nbytes, flops

    def _recurrent_pre(self, mod: GatedDeltaNet, args):
        nbytes, flops = self._recurrent_counts(mod, args[0])
        self.push("recurrent", nbytes=nbytes, flops=flops)

    def _post(self, mod, args, out):
        self.pop()

    # ----------------------------------------------------------------------------- install
    def _set_attr(self, obj, name: str, value) -> None:
        had = name in vars(obj)
        old = vars(obj).get(name)

        def restore():
            if had:
                setattr(obj, name, old)
            else:
                delattr(obj, name)
        setattr(obj, name, value)
        self.undo.append(restore)

    def _set_class_attr(self, obj, name: str, value) -> None:
        old = getattr(obj, name)
        setattr(obj, name, value)
        self.undo.append(lambda: setattr(obj, name, old))

    def install(self) -> None:
        tgt = self.target
        for mod in tgt.model.layers.modules():
            if isinstance(mod, (nn.Linear, W12Linear)):
                pre = mod.register_forward_pre_hook(self._linear_pre)
            elif isinstance(mod, Attention):
                pre = mod.register_forward_pre_hook(self._attention_pre)
            elif isinstance(mod, GatedDeltaNet):
                pre = mod.register_forward_pre_hook(self._recurrent_pre)
                self._set_attr(mod, "forward_tree", self._wrap_forward_tree(mod, mod.forward_tree))
            else:
                continue
            self.undo.append(pre.remove)
            self.undo.append(mod.register_forward_hook(self._post).remove)
        self.undo.append(tgt.model.norm.register_forward_hook(self._norm_mark).remove)
        self._set_attr(tgt, "forward", self._wrap_forward(tgt.forward))
        if self.drafter is not None:
            self._set_attr(self.drafter, "propose", self.timed("drafter", self.drafter.propose, pre=True))
            self._set_attr(self.drafter, "observe", self.timed("drafter", self.drafter.observe, pre=False))
        self._set_class_attr(trees.Tree, "accept", self._wrap_method("sampling_acceptance", trees.Tree.accept, False))
        self._set_class_attr(trees.Tree, "ancestor_mask", self._wrap_method(MASK, trees.Tree.ancestor_mask, True))

    def _wrap_method(self, cls, fn, pre):
        timed = self.timed(cls, fn, pre)

        def method(tree_self, *args, **kwargs):
            return timed(tree_self, *args, **kwargs)
        return method

    def _wrap_forward_tree(self, mod, fn):
        def forward_tree(x, *args, **kwargs):
            nbytes, flops = self._recurrent_counts(mod, x)
            self.push("recurrent", nbytes=nbytes, flops=flops)
            try:
                return fn(x, *args, **kwargs)
            finally:
                self.pop()
        return forward_tree

    def _norm_mark(self, mod, args, out):
        self.norm_mark = self.now()

    def _wrap_forward(self, fn):
        def forward(*args, **kwargs):
            self.n_forward += 1
            b = self.n_forward - 1
            self.norm_mark = None
            t0 = self.now()
            out = fn(*args, **kwargs)
            t1 = self.now()
            self.forward_s[b] += t1 - t0
            if self.norm_mark is not None and out.logits is not None:
                w = self.target.lm_head_weight
                rows = out.logits.numel() // w.shape[0]
                nbytes = _nbytes(w) + rows * w.shape[1] * out.logits.element_size() + _nbytes(out.logits)
                self.add(b, "lm_head", t1 - self.norm_mark, nbytes, 2.0 * rows * w.shape[0] * w.shape[1])
            return out
        return forward

    def remove(self) -> None:
        while self.undo:
            self.undo.pop()()

    # ----------------------------------------------------------------------------- results
    def steps(self, res: decode.Result) -> list[StepProfile]:
        out = []
        for k, s in enumerate(res.steps, start=1):
            acc = self.acc[k]
            kern = {c: ClassStat(*acc[c]) if c in acc else ClassStat(0.0) for c in MEASURED}
            mask = acc[MASK][0] if MASK in acc else 0.0
            tb = kern["tree_build"]
            kern["tree_build"] = ClassStat(tb.seconds + mask)
            # argmax: generate's verify window minus the target forward and the ancestor mask inside it
            sa = kern["sampling_acceptance"]
            kern["sampling_acceptance"] = ClassStat(sa.seconds + max(s.t_verify - self.forward_s[k] - mask, 0.0))
            t_step = s.t_draft + s.t_verify + s.t_commit
            measured = sum(v.seconds for v in kern.values())
            kern["other"] = ClassStat(max(t_step - measured, 0.0))
            out.append(StepProfile(s.drafted + 1, s.tau, t_step, kern))
        return out


def _step_walls(res: decode.Result) -> list[float]:
    return [s.t_draft + s.t_verify + s.t_commit for s in res.steps]


def profile_generate(target: Model, prompt: list[int], max_new_tokens: int, drafter=None, draft_len: int = 8,
                     policy=None, eos: set[int] | None = None) -> ProfileResult:
    """Profile `decode.generate(target, prompt, max_new_tokens, drafter, draft_len, eos, policy)`;
    see the module docstring. Runs generate three times: AR unprofiled (T_AR), the configuration
    unprofiled (reference tokens and step times; skipped for AR, whose reference is the AR run)
    and the configuration profiled. Where generate takes the static-shape driver (CUDA), the
    profile is `profile_static`'s: device time per kernel class, not host-timed hooks."""
    if decode.pick_driver(target, drafter, policy) == "static":
        return profile_static(target, prompt, max_new_tokens, drafter, draft_len, policy, eos)
    ar = decode.generate(target, prompt, max_new_tokens, eos=eos)
    ar_walls = _step_walls(ar)
    t_ar = sum(ar_walls) / len(ar_walls) if ar_walls else 0.0
    ref = decode.generate(target, prompt, max_new_tokens, drafter, draft_len, eos=eos, policy=policy) \
        if drafter is not None else ar

    prof = _Profiler(target, drafter)
    try:
        prof.install()
        pol = prof.timed("tree_build", policy or trees.chain, pre=True)
        res = decode.generate(target, prompt, max_new_tokens, drafter, draft_len, eos=eos, policy=pol)
    finally:
        prof.remove()
        prof.stack.clear()
    steps = prof.steps(res)
    groups: dict[int, list[StepProfile]] = defaultdict(list)
    for s in steps:
        groups[s.n].append(s)
    return ProfileResult(tokens=res.tokens, reference_tokens=ref.tokens, ar_tokens=ar.tokens, steps=steps,
                         step_wall=_step_walls(res), reference_step_wall=_step_walls(ref), t_ar=t_ar,
                         device=str(prof.dev), by_n={n: mean_step(g) for n, g in sorted(groups.items())})


# ---- the static-shape path (CUDA) --------------------------------------------------------------
@torch.no_grad()
def class_times(dec, reps: int = 30) -> dict[str, ClassStat]:
    """Device time of each kernel class of one step of a FastDecoder, at the step's shapes (every
    lane's rows: B lanes of R rows verify B·R rows): every class's operations captured alone in a
    CUDA graph and timed over `reps` replays with CUDA events (no host in the measurement: the
    kernel factor describes the device). On the CPU (the driver run eagerly, for tests) the same
    operations are timed with perf_counter. Bytes and FLOPs are counted from the same shapes as the
    eager profiler's. The tree is the decoder's own (`_build_tree`: its policy, row selection
    included), timed alone from a lattice the drafter has already proposed (the proposal's time is
    the drafter's class)."""
    from . import treeops
    from .gdn import tree_gated_delta_rule
    from .model import attend

    tgt, cache, R, B = dec.target, dec.cache, dec.spec.rows, dec.lanes
    cfg, dt, dev = tgt.cfg, tgt.dtype, dec.dev
    g = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *s: torch.randn(*s, device=dev, dtype=dt, generator=g)  # noqa: E731
    e = torch.empty((), dtype=dt).element_size()
    out: dict[str, ClassStat] = {}

    projs = [p for blk in tgt.model.layers for p in _projections(blk)]
    xs = {p.in_features: rnd(B * R, p.in_features) for p in projs}
    out["target_linear"] = ClassStat(
        _device_time(lambda: [p(xs[p.in_features]) for p in projs], dev, reps),
        sum(_weight_bytes(p) + B * R * (p.in_features + p.out_features) * e for p in projs),
        sum(2.0 * B * R * p.in_features * p.out_features for p in projs))
    head, hx = tgt.lm_head_weight, rnd(B * R, cfg.hidden_size)
    own = tgt.greedy_head or tgt.head  # the head a step runs, when it is not the dense one
    run_head = tgt.greedy_head.argmax if tgt.greedy_head else tgt.head or (lambda h: torch.nn.functional.linear(h, head))
    out["lm_head"] = ClassStat(_device_time(lambda: run_head(hx), dev, reps),
                               (_weight_bytes(own) if own else _nbytes(head))
                               + B * R * (head.shape[1] + head.shape[0]) * e,
                               2.0 * B * R * head.numel())
    cache.plan(R)  # a chain of R rows past each lane's committed length: the mask a step's pass reads
    attn = [i for i, t in enumerate(cfg.layer_types) if t != "linear_attention"]
    q = rnd(B, cfg.num_attention_heads, R, cfg.head_dim)
    keys = cache.max_len
    out["attention"] = ClassStat(
        _device_time(lambda: [attend(q, cache.k[i], cache.v[i], cache.ctx.mask) for i in attn], dev, reps),
        len(attn) * B * (2 * keys * cfg.num_key_value_heads * cfg.head_dim * e + 2 * R * cfg.num_attention_heads
                         * cfg.head_dim * e),
        len(attn) * 4.0 * B * R * keys * cfg.head_dim * cfg.num_attention_heads)
    gdn = list(cache.h)
    if gdn:
        H, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        sdt = cache.h[gdn[0]].dtype
        srnd = lambda *s: torch.randn(*s, device=dev, dtype=sdt, generator=g)  # noqa: E731
        qk = [torch.nn.functional.normalize(srnd(B, R, H, dk), dim=-1) for _ in range(2)]
        v = srnd(B, R, H, dv)
        gate = -torch.rand(B, R, H, device=dev, dtype=sdt, generator=g)
        beta = torch.rand(B, R, H, device=dev, dtype=sdt, generator=g)
        anc = cache.ctx.anc
        se = torch.empty((), dtype=sdt).element_size()
        out["recurrent"] = ClassStat(
            _device_time(lambda: [tree_gated_delta_rule(*qk, v, gate, beta, cache.h[i], anc) for i in gdn], dev, reps),
            len(gdn) * B * (2 * H * dk * dv * se + R * (2 * dk + 2 * dv) * H * se),
            len(gdn) * 4.0 * B * R * H * dk * dv)
    if dec.device_draft is not None:
        dd, lengths = dec.device_draft, dec.device_draft.cache.lengths.clone()
        out["drafter"] = ClassStat(_device_time(lambda: dd.propose(dec.root), dev, reps))
        dd.cache.lengths.copy_(lengths)
    if dec.drafter is not None:
        active = dec.active.clone()
        dec.active.fill_(1)  # every lane busy, as in a full batch's step (a shared budget spans the busy lanes)
        lengths = dec.device_draft.cache.lengths.clone() if dec.device_draft is not None else None
        transitions = dec._propose()  # the lattice the tree is built from; its own time is the drafter's

        def tree():
            rows = dec._build_tree(transitions)  # every lane's tree, fields [B, R]
            if dec.spec.kind != "chain":
                cache.plan(R, rows.parents, rows.depth, dec.spec.max_depth)
            return rows
        out["tree_build"] = ClassStat(_device_time(tree, dev, reps))
        rows, logits = tree(), rnd(B, R, cfg.vocab_size)
        if lengths is not None:
            dec.device_draft.cache.lengths.copy_(lengths)
        out["sampling_acceptance"] = ClassStat(_device_time(
            lambda: [treeops.accept(treeops.TreeRows(*(f[b] for f in rows)), logits[b].argmax(-1), cache.ctx.anc[b],
                                    dec.path_len) for b in range(B)], dev, reps))
        dec.active.copy_(active)
    return {c: out.get(c, ClassStat(0.0)) for c in MEASURED}


def _projections(blk) -> list:
    """A block's projections as a step runs them (fused where the model fused them): callables with
    in_features and out_features (nn.Linear, the model's Dense, W12Linear)."""
    mods = blk.linear_attn if blk.kind == "linear_attention" else blk.self_attn
    fused = [getattr(mods, "in_proj", None) or getattr(mods, "qkv", None), blk.mlp.gate_up]
    plain = [mods.out_proj if blk.kind == "linear_attention" else mods.o_proj, blk.mlp.down_proj]
    return [f for f in fused if f is not None] + plain


def _weight_bytes(proj) -> int:
    """Bytes of weight (and bias) a projection reads per pass: its own count when it has one (W12,
    the certified head), else its dense tensors'."""
    own = getattr(proj, "nbytes", None)
    return int(own) if own is not None else _nbytes(proj.weight) + _nbytes(getattr(proj, "bias", None))


def _device_time(fn, dev: torch.device, reps: int) -> float:
    """Seconds per call of fn: on CUDA captured in a graph and timed with events over replays."""
    with torch.no_grad():
        if dev.type != "cuda":
            fn()
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - t) / reps
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        for _ in range(3):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps


def profile_static(target: Model, prompt: list[int], max_new_tokens: int, drafter=None, draft_len: int = 8,
                   policy=None, eos: set[int] | None = None, graphs: bool | None = None) -> ProfileResult:
    """`profile_generate` for the static-shape driver: the steps as they run (unprofiled, each
    step's time from generate), their mean split by `class_times`; `other` is what the classes do
    not hold (norms, rotary, residual adds, the commit, launch gaps). Every step of a decoder
    verifies the same rows, so every step shares one split."""
    from . import fast

    need = len(prompt) + max_new_tokens
    dec_ar = fast.decoder(target, None, draft_len, None, None, need) if graphs is None else \
        fast.FastDecoder(target, max_len=need + 128, graphs=graphs)
    ar = dec_ar.generate(prompt, max_new_tokens, eos)
    ar_walls = _step_walls(ar)
    dec = dec_ar if drafter is None else (fast.decoder(target, drafter, draft_len, policy, None, need)
                                          if graphs is None else
                                          fast.FastDecoder(target, drafter, draft_len, policy, need + 128, graphs))
    res = dec.generate(prompt, max_new_tokens, eos) if drafter is not None else ar
    walls = _step_walls(res)
    split = class_times(dec)
    steps = []
    for s, wall in zip(res.steps, walls):
        kern = dict(split)
        kern["other"] = ClassStat(max(wall - sum(v.seconds for v in split.values()), 0.0))
        steps.append(StepProfile(dec.spec.rows, s.tau, wall, kern))
    groups: dict[int, list[StepProfile]] = defaultdict(list)
    for s in steps:
        groups[s.n].append(s)
    return ProfileResult(tokens=res.tokens, reference_tokens=res.tokens, ar_tokens=ar.tokens, steps=steps,
                         step_wall=walls, reference_step_wall=walls, t_ar=sum(ar_walls) / len(ar_walls) if ar_walls
                         else 0.0, device=str(dec.dev), by_n={n: mean_step(g) for n, g in sorted(groups.items())})


# ---- at a batch (the static driver's generate_batch) -----------------------------------------------
def lane_groups(prompts: list[list[int]], batch: int) -> list[list[list[int]]]:
    """The prompts as batches of `batch` requests, every batch full: ceil(len / batch) batches in
    order, the last one topped up from the first prompts."""
    if not prompts:
        raise ValueError("profile: no prompts")
    k = -(-len(prompts) // batch)
    return [[prompts[(j * batch + i) % len(prompts)] for i in range(batch)] for j in range(k)]


def batch_steps(results: list[decode.Result]) -> list[tuple[float, int, int]]:
    """(wall, Σ τ, requests) per step of one `generate_batch` over no more requests than lanes:
    every request is admitted before the first step, so step j of each request that took part is
    the batch's step j, timed as the whole step."""
    out = []
    for j in range(max((len(r.steps) for r in results), default=0)):
        mine = [r.steps[j] for r in results if len(r.steps) > j]
        out.append((mine[0].t_draft + mine[0].t_verify + mine[0].t_commit, sum(s.tau for s in mine), len(mine)))
    return out


def profile_batch(target: Model, prompts: list[list[int]], max_new_tokens: int, batch: int, drafter=None,
                  draft_len: int = 8, policy=None, eos: set[int] | None = None, logit_bias=None,
                  lengths=None) -> ProfileResult:
    """`profile_static` at a batch: the decoder `Engine.generate_batch` runs (`fast.decoder` with
    `batch` lanes, its bias and draft lengths) decodes the prompts `batch` at a time (`lane_groups`),
    after one untimed batch. A step verifies every lane's rows (batch × the tree's rows); its time
    is the batch's step, its τ the sum over the requests it decoded. T_AR is the AR decoder's step
    at the same batch on the same prompts. The split is `class_times` at the batch's shapes."""
    from . import fast

    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch {batch!r}: expected a positive integer (requests decoded at once)")
    why = fast.unsupported(drafter, policy)
    if why:
        raise ValueError(f"batch {batch}: batched decoding cannot run {why}")
    groups = lane_groups(prompts, batch)
    need = max(len(p) for p in prompts) + max_new_tokens
    extra = {"lengths": lengths} if lengths else {}
    dec_ar = fast.decoder(target, None, draft_len, None, None, need, batch)
    dec = fast.decoder(target, drafter, draft_len, policy, logit_bias, need, batch, **extra) \
        if drafter is not None or logit_bias is not None else dec_ar
    limits = [max_new_tokens] * batch
    for d in {id(dec_ar): dec_ar, id(dec): dec}.values():  # warm-up, untimed
        d.generate_batch(groups[0], limits, eos)
    ar_tokens, tokens, ar_steps, raw = [], [], [], []
    for group in groups:
        ar = dec_ar.generate_batch(group, limits, eos)
        res = dec.generate_batch(group, limits, eos) if dec is not dec_ar else ar
        ar_tokens += [r.tokens for r in ar]
        tokens += [r.tokens for r in res]
        ar_steps += batch_steps(ar)
        raw += batch_steps(res)
    split, rows = class_times(dec), batch * dec.spec.rows
    split_s = sum(v.seconds for v in split.values())
    steps = [StepProfile(rows, tau, wall, {**split, "other": ClassStat(max(wall - split_s, 0.0))}, requests)
             for wall, tau, requests in raw]
    walls = [s.t_step for s in steps]
    return ProfileResult(tokens=tokens, reference_tokens=tokens, ar_tokens=ar_tokens, steps=steps, step_wall=walls,
                         reference_step_wall=walls, t_ar=sum(w for w, _, _ in ar_steps) / len(ar_steps) if ar_steps
                         else 0.0, device=str(dec.dev), by_n={rows: mean_step(steps)} if steps else {}, batch=batch)
