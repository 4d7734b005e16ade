"""The planner's cost model and ceilings (docs/METHOD.md §6), as plain functions and dataclasses.

    speedup(N) = τ(N) / c(N),   c(N) = T_step(N) / T_AR

N is the number of rows verified per step, T_step(N) the measured wall time of one speculative
step (drafting included), T_AR one AR step on the same engine. At a batch of B requests decoded at
once, N is the rows of the whole step (Σ of the nodes of the batch's requests), T_AR the AR step at
the same batch (B rows), and τ the tokens per request per step: τ / c is then the batch's
throughput over AR's at that batch.

Each profiled kernel class has a byte floor

    floor = max(FLOPs / (0.6 × peak dense FLOP/s), bytes / (0.9 × peak bandwidth))

and the ceiling over the current system is the product of four factors:

- tree        = τ_oracle(N) / τ_current  (τ_oracle from exact replay with an oracle: an input here)
- kernels     = profiled (summed) kernel time / Σ byte floors of the classes
- off_profile = measured step time / profiled (summed) kernel time
- rows        = Σ floors at N rows / Σ floors at the rows the oracle's τ needs (B × τ_oracle: the
                root and the accepted nodes of every request). Fewer rows cut the FLOPs of the
                classes that work per verified row and none of the bytes (the weights and the
                cache are read whatever the rows), so where the floors are the read (one request:
                a step is the weight read) the factor is 1, and where every verified row costs
                compute (a large batch) it nears N / (B × τ_oracle): wide trees stop paying.

The direction of the next round is the largest factor; for kernels it names the class that wastes
the most time (time − floor), for rows it is "rows" (verify fewer, better rows per request). A
system without a drafter (plain AR decoding) has no tree to grow and no row to drop: its tree and
rows factors are 1, they are never the direction, and the table says why; its step is the AR step,
so its speedup is 1 and the direction is the kernels or the time off the profile.

Two-level verification (TLV) breaks the ceiling's assumption of one exact pass per draft: a cycle
of two drafts, a Q pass (the target reading the 8-bit W12 view of its weights) and one exact pass,

    T_cycle = 2·T_draft + T_Q + T_exact + T_glue,   speedup = τ / (T_cycle / T_AR)

with τ the tokens per exact pass, at most τ_first + τ_second (both trees' one-pass τ: a Q pass
that agrees with the exact pass everywhere) — `tlv_ceiling`. `tlv_outlook` predicts T_Q / T_exact
from a one-pass profile and says whether a cycle could pay at all. Server-free: no engine import,
no other service.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Mapping
from xml.sax.saxutils import escape

import numpy as np

FLOP_EFFICIENCY = 0.6  # share of peak dense FLOP/s a floor assumes
BANDWIDTH_EFFICIENCY = 0.9  # share of peak bandwidth a floor assumes


# --------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    bf16_flops: float  # dense bf16 FLOP/s (for "cpu": float32 numpy matmul, measured)
    bandwidth: float  # memory bandwidth, bytes/s (read + written, as the anchors count it)
    source: str  # where the figures come from

    def __post_init__(self) -> None:
        if not (self.bf16_flops > 0 and self.bandwidth > 0):
            raise ValueError(f"device {self.name!r}: peaks must be positive, got {self.bf16_flops}, {self.bandwidth}")


DEVICES: dict[str, DeviceSpec] = {
    "h100-sxm": DeviceSpec(
        "h100-sxm", 989e12, 3.35e12, "datasheet: NVIDIA H100 SXM5, 989 TFLOP/s dense bf16, 3.35 TB/s HBM3"
    ),
    "h200": DeviceSpec(
        "h200",
        788e12,
        4.28e12,
        "measured on a lent H200: 8192³ bf16 matmul through PyTorch at 788 TFLOP/s on random data (datasheet "
        "989), device-to-device copy 4.28 TB/s read + written (datasheet 4.8); bench/results/gpu_fastpath.json measured 4.21 TB/s",
    ),
    "rtx-pro-6000": DeviceSpec(
        "rtx-pro-6000",
        0.5e15,
        1.79e12,
        "datasheet lead, unverified: RTX PRO 6000 Blackwell, ~0.5 PFLOP/s dense bf16, 1.79 TB/s GDDR7",
    ),
    # "cpu" is measured at start: measure_cpu_peaks()
}


def measure_cpu_peaks(seconds: float = 0.5) -> DeviceSpec:
    """Time a numpy matmul (float32: numpy has no bf16) and a large array copy, each for about
    seconds / 2, and return the best rates seen as the "cpu" device."""
    half = max(seconds, 1e-3) / 2

    n = 512
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    np.matmul(a, b, out=out)  # warm-up
    best_flops, deadline = 0.0, time.perf_counter() + half
    while True:
        t0 = time.perf_counter()
        np.matmul(a, b, out=out)
        dt = time.perf_counter() - t0
        if dt > 0:
            best_flops = max(best_flops, 2.0 * n**3 / dt)
        if time.perf_counter() >= deadline and best_flops > 0:
            break

    src = np.ones(8 * 2**20, dtype=np.float32)  # 32 MiB, past most last-level caches
    dst = np.empty_like(src)
    np.copyto(dst, src)  # warm-up (page faults)
    best_bw, deadline = 0.0, time.perf_counter() + half
    while True:
        t0 = time.perf_counter()
        np.copyto(dst, src)
        dt = time.perf_counter() - t0
        if dt > 0:
            best_bw = max(best_bw, 2.0 * src.nbytes / dt)  # bytes read + written
        if time.perf_counter() >= deadline and best_bw > 0:
            break

    return DeviceSpec(
        "cpu", best_flops, best_bw, f"measured at start: numpy float32 {n}x{n} matmul, 32 MiB copy (read + written)"
    )


_CPU: DeviceSpec | None = None


def device(kind: str | DeviceSpec) -> DeviceSpec:
    """A device kind's peaks; "cpu" is measured on first use (then kept for the process)."""
    if isinstance(kind, DeviceSpec):
        return kind
    if kind == "cpu":
        global _CPU
        if _CPU is None:
            _CPU = measure_cpu_peaks()  # once per process
        return _CPU
    try:
        return DEVICES[kind]
    except KeyError:
        raise ValueError(f"unknown device kind {kind!r}; known: {sorted(DEVICES) + ['cpu']}") from None


# --------------------------------------------------------------------------- kernel classes, floors


class KernelClass(str, Enum):
    TARGET_LINEAR = "target_linear"
    LM_HEAD = "lm_head"
    ATTENTION = "attention"
    RECURRENT = "recurrent"
    DRAFTER = "drafter"
    TREE_BUILD = "tree_build"
    SAMPLING_ACCEPTANCE = "sampling_acceptance"
    OTHER = "other"


KERNEL_CLASSES: tuple[str, ...] = tuple(k.value for k in KernelClass)


def _class_name(k: str | KernelClass) -> str:
    name = k.value if isinstance(k, KernelClass) else str(k)
    if name not in KERNEL_CLASSES:
        raise ValueError(f"unknown kernel class {name!r}; known: {list(KERNEL_CLASSES)}")
    return name


def byte_floor(flops: float, bytes_moved: float, device_: str | DeviceSpec) -> float:
    """Seconds a kernel cannot beat: max(FLOPs / (0.6 × peak), bytes / (0.9 × bandwidth))."""
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"flops and bytes must be non-negative, got {flops}, {bytes_moved}")
    d = device(device_)
    return max(flops / (FLOP_EFFICIENCY * d.bf16_flops), bytes_moved / (BANDWIDTH_EFFICIENCY * d.bandwidth))


# --------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class KernelStat:
    seconds: float
    bytes: float = 0.0
    flops: float = 0.0

    def __post_init__(self) -> None:
        if self.seconds < 0 or self.bytes < 0 or self.flops < 0:
            raise ValueError(f"kernel stats must be non-negative: {self}")


@dataclass(frozen=True)
class Profile:
    """One step (or the mean of several): per kernel class the measured seconds, bytes and FLOPs,
    and the step's measured wall time T_step."""

    t_step: float
    kernels: Mapping[str, KernelStat] = field(default_factory=dict)
    n: int | None = None  # rows verified, when known

    def __post_init__(self) -> None:
        if not self.t_step > 0:
            raise ValueError(f"t_step must be positive, got {self.t_step}")
        normalized = {}
        for k, v in self.kernels.items():
            if not isinstance(v, KernelStat):
                v = KernelStat(*v) if isinstance(v, (tuple, list)) else KernelStat(**v)
            normalized[_class_name(k)] = v
        object.__setattr__(self, "kernels", normalized)

    @property
    def profiled_seconds(self) -> float:
        return sum(s.seconds for s in self.kernels.values())


def aggregate(profiles: Iterable[Profile]) -> Profile:
    """The mean step: per class mean seconds, bytes and FLOPs (a class absent from a step counts
    as zero there), and mean T_step. All profiles must share N (or leave it unset)."""
    profiles = list(profiles)
    if not profiles:
        raise ValueError("aggregate needs at least one profile")
    ns = {p.n for p in profiles}
    if len(ns) > 1:
        raise ValueError(f"profiles of different budgets cannot be aggregated: N in {sorted(ns, key=str)}")
    count = len(profiles)
    names = [c for c in KERNEL_CLASSES if any(c in p.kernels for p in profiles)]
    zero = KernelStat(0.0)
    kernels = {
        c: KernelStat(
            sum(p.kernels.get(c, zero).seconds for p in profiles) / count,
            sum(p.kernels.get(c, zero).bytes for p in profiles) / count,
            sum(p.kernels.get(c, zero).flops for p in profiles) / count,
        )
        for c in names
    }
    return Profile(sum(p.t_step for p in profiles) / count, kernels, ns.pop())


# --------------------------------------------------------------------------- cost model


def step_cost(t_step: float, t_ar: float) -> float:
    """c(N) = T_step(N) / T_AR."""
    if not (t_step > 0 and t_ar > 0):
        raise ValueError(f"times must be positive, got T_step={t_step}, T_AR={t_ar}")
    return t_step / t_ar


def speedup(tau: float, t_step: float, t_ar: float) -> float:
    """speedup(N) = τ(N) / c(N)."""
    if tau < 0:
        raise ValueError(f"tau must be non-negative, got {tau}")
    return tau / step_cost(t_step, t_ar)


def best_budget(taus: Mapping[int, float], step_times: Mapping[int, float], t_ar: float) -> tuple[int, float]:
    """The budget N with the highest speedup over the budgets present in both tables; a tie (equal
    to 1e-12 relative) goes to the smaller N."""
    budgets = sorted(set(taus) & set(step_times))
    if not budgets:
        raise ValueError(f"no budget has both τ and a step time: τ for {sorted(taus)}, times for {sorted(step_times)}")
    best_n, best = budgets[0], speedup(taus[budgets[0]], step_times[budgets[0]], t_ar)
    for n in budgets[1:]:
        s = speedup(taus[n], step_times[n], t_ar)
        if s > best and not math.isclose(s, best, rel_tol=1e-12, abs_tol=0.0):
            best_n, best = n, s
    return best_n, best


# --------------------------------------------------------------------------- ceilings


FACTORS = ("tree", "kernels", "off_profile", "rows")  # also the tie-break order of `largest`
AR = "ar"  # the policy of an AR system's one measured row (the GPU worker's Profile)
ROW_CLASSES = ("target_linear", "lm_head", "attention", "recurrent", "sampling_acceptance")  # work per verified row


def check_batch(batch) -> int:
    """The batch size (requests decoded at once), or a one-line error."""
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch {batch!r}: expected a positive integer (requests decoded at once)")
    return batch


def bound(flops: float, bytes_moved: float, device_: str | DeviceSpec) -> str:
    """Which term sets a class's floor: "rows" (its FLOPs: every verified row costs compute),
    "read" (its bytes: the weights and the cache it reads) or "-" (no work counted: no floor)."""
    d = device(device_)
    compute, read = flops / (FLOP_EFFICIENCY * d.bf16_flops), bytes_moved / (BANDWIDTH_EFFICIENCY * d.bandwidth)
    return "-" if compute == read == 0 else "rows" if compute > read else "read"


def floors_at(profile: Profile, device_: str | DeviceSpec, rows: float) -> float:
    """Σ of the class floors were the step `rows` rows instead of its N (profile.n): the FLOPs of
    the classes that work per verified row (ROW_CLASSES) scale with the rows, the bytes stay."""
    if not profile.n:
        raise ValueError("the profile does not say how many rows it verified")
    d, scale = device(device_), rows / profile.n
    return sum(byte_floor(s.flops * (scale if c in ROW_CLASSES else 1.0), s.bytes, d)
               for c, s in profile.kernels.items())


@dataclass(frozen=True)
class ClassRow:
    kernel_class: str
    seconds: float
    floor: float
    ratio: float  # seconds / floor (inf when the floor is 0 and time was spent)
    bound: str = "read"  # which term sets the floor: "read" (bytes), "rows" (FLOPs) or "-" (none)

    @property
    def gap(self) -> float:
        return self.seconds - self.floor


NO_TREE = "no drafter: no tree can help"  # why an AR system's tree factor is 1
NO_ROWS = "no drafter: one row per request, always committed"  # why an AR system's rows factor is 1
NO_N = "rows verified not measured"  # why a profile without N has a rows factor of 1


@dataclass(frozen=True)
class Ceiling:
    factors: dict[str, float]
    product: float
    largest: str
    per_class: tuple[ClassRow, ...]
    device: str = ""
    notes: Mapping[str, str] = field(default_factory=dict)  # factor -> why it is what it is
    batch: int = 1  # requests decoded at once
    rows: float | None = None  # N: rows verified per step, over the batch
    rows_needed: float | None = None  # the rows the oracle's τ needs: batch × τ_oracle (≤ N)


def ceiling(profile: Profile, device_: str | DeviceSpec, tau_current: float, tau_oracle: float,
            has_drafter: bool = True, batch: int = 1) -> Ceiling:
    """The four factors over the current system (see the module docstring), the profile being one
    step at `batch` requests (profile.n: its rows over the batch). Without a drafter the tree and
    rows factors are 1 whatever the τ given, and the largest factor is one of the other two; a
    profile without N has a rows factor of 1 that is never the largest."""
    check_batch(batch)
    if not (tau_current > 0 and tau_oracle > 0):
        raise ValueError(f"τ must be positive, got current={tau_current}, oracle={tau_oracle}")
    if profile.n is not None and profile.n < batch:
        raise ValueError(f"{profile.n} rows verified per step at batch {batch}: every request verifies at least one")
    d = device(device_)
    rows = []
    for name in KERNEL_CLASSES:
        if name not in profile.kernels:
            continue
        s = profile.kernels[name]
        floor = byte_floor(s.flops, s.bytes, d)
        ratio = s.seconds / floor if floor > 0 else (math.inf if s.seconds > 0 else 1.0)
        rows.append(ClassRow(name, s.seconds, floor, ratio, bound(s.flops, s.bytes, d)))
    profiled = profile.profiled_seconds
    floors = sum(r.floor for r in rows)
    if profiled <= 0:
        raise ValueError("the profile holds no kernel time: cannot split the step")
    if floors <= 0:
        raise ValueError("no profiled class has bytes or FLOPs: the kernel factor has no floor")
    notes = {}
    needed = None
    if not has_drafter:
        notes = {"tree": NO_TREE, "rows": NO_ROWS}
    elif profile.n is None:
        notes = {"rows": NO_N}
    else:
        needed = min(float(profile.n), batch * tau_oracle)
    factors = {
        "tree": tau_oracle / tau_current if has_drafter else 1.0,
        "kernels": profiled / floors,
        "off_profile": profile.t_step / profiled,
        "rows": floors / floors_at(profile, d, needed) if needed is not None else 1.0,
    }
    open_factors = tuple(f for f in FACTORS if f not in notes)
    largest = max(open_factors, key=lambda f: (factors[f], -FACTORS.index(f)))
    return Ceiling(factors, math.prod(factors.values()), largest, tuple(rows), d.name, notes, batch,
                   None if profile.n is None else float(profile.n), needed)


def direction(c: Ceiling) -> str:
    """"tree", "rows", "kernel:<class wasting the most time>" or "off-profile"."""
    if c.largest in ("tree", "rows"):
        return c.largest
    if c.largest == "off_profile":
        return "off-profile"
    # max gap; ties go to the earlier class in KERNEL_CLASSES order (rows are in that order)
    worst = max(c.per_class, key=lambda r: (r.gap, -KERNEL_CLASSES.index(r.kernel_class)))
    return f"kernel:{worst.kernel_class}"


# --------------------------------------------------------------------------- two-level verification


PASS_CLASSES = ("target_linear", "lm_head", "attention", "recurrent")  # what a target pass spends
DRAFT_CLASSES = ("drafter", "tree_build")  # what a draft spends
TLV_MIN_GAIN = 1.25  # the least gain a TLV cycle must promise, at its best, to be worth proposing


def tlv_cycle(t_draft: float, t_quick: float, t_exact: float, t_glue: float = 0.0) -> float:
    """T_cycle = 2·T_draft + T_Q + T_exact + T_glue: two drafts, the Q pass, the exact pass and the
    time between them."""
    if min(t_draft, t_quick, t_exact, t_glue) < 0 or not t_exact > 0:
        raise ValueError(f"times must be non-negative (the exact pass positive), got draft={t_draft}, "
                         f"Q={t_quick}, exact={t_exact}, glue={t_glue}")
    return 2 * t_draft + t_quick + t_exact + t_glue


def tlv_ceiling(tau_first: float, tau_second: float, t_cycle: float, t_ar: float) -> float:
    """The speedup no cycle beats, without the one-pass ceiling's assumption of one exact pass per
    draft: where the Q pass agrees with the exact pass, one exact pass commits the chain (tree ①'s
    one-pass τ, bonus included) and the subtree's path (its one-pass τ, bonus included), so
    τ ≤ τ_first + τ_second per exact pass."""
    return speedup(tau_first + tau_second, t_cycle, t_ar)  # one exact pass a cycle


def tlv_break_even(tau_now: float, t_step: float, t_cycle: float) -> float:
    """The τ per exact pass at which a cycle of T_cycle matches a one-pass step of T_step at τ_now."""
    return tau_now * step_cost(t_cycle, t_step)  # T_cycle / T_step, both checked positive


def quick_share(kernels: Mapping[str, float], weight_bits: float, quick_bits: float) -> float:
    """T_Q / T_exact predicted from an exact pass's seconds by class: the Q pass reads quick_bits of
    each layer weight where the exact pass reads weight_bits (target_linear scaled by their ratio,
    a read-bound pass), the rest of the pass (LM head, attention, recurrence) as it is."""
    exact = sum(kernels.get(c, 0.0) for c in PASS_CLASSES)
    if not exact > 0 or not (weight_bits > 0 and quick_bits > 0):
        raise ValueError(f"an exact pass with time and positive bit widths needed, got {exact} s, "
                         f"{weight_bits} / {quick_bits} bits")
    return (exact + kernels.get("target_linear", 0.0) * (quick_bits / weight_bits - 1)) / exact


@dataclass(frozen=True)
class TlvOutlook:
    quick_share: float  # T_Q / T_exact
    best_gain: float  # a cycle over the current step, were τ per exact pass doubled
    worth: bool  # best_gain ≥ min_gain
    why: str


def tlv_outlook(kernels: Mapping[str, float], t_step: float, weight_bits: float, quick_bits: float,
                min_gain: float = TLV_MIN_GAIN) -> TlvOutlook:
    """Whether TLV can pay on a one-pass system whose step (T_step) splits into `kernels` seconds by
    class: its cycle adds a draft and a Q pass to the step (glue as now), and commits at best twice
    the step's τ (two drafts' paths, a Q pass always right), so its best gain is
    2·T_step / (T_step + T_draft + share·T_exact). Worth proposing only from `min_gain` on."""
    share = quick_share(kernels, weight_bits, quick_bits)
    exact = sum(kernels.get(c, 0.0) for c in PASS_CLASSES)
    draft = sum(kernels.get(c, 0.0) for c in DRAFT_CLASSES)
    gain = 2 * t_step / (t_step + draft + share * exact)
    worth = gain >= min_gain
    why = (f"the Q pass would cost {share:.2f} of the exact pass ({quick_bits:g} of {weight_bits:g} bits a weight): "
           f"a cycle that doubled τ per exact pass would gain ×{gain:.2f}, "
           + ("enough" if worth else f"under the ×{min_gain:.2f} worth proposing"))
    return TlvOutlook(share, gain, worth, why)


# --------------------------------------------------------------------------- rendering


def _fmt_s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def _where(c: Ceiling) -> str:
    """"at batch B, N rows per step (N/B per request)", as far as the ceiling knows."""
    rows = "" if c.rows is None else f", {c.rows:g} rows per step ({c.rows / c.batch:g} per request)"
    return f"at batch {c.batch}{rows}"


def render_table(c: Ceiling) -> str:
    lines = [f"ceiling over the current system{' on ' + c.device if c.device else ''} {_where(c)}: {c.product:.3f}x"]
    for f in FACTORS:
        mark = "  <- largest" if f == c.largest else f"  ({c.notes[f]})" if f in c.notes else ""
        lines.append(f"  {f:<12} {c.factors[f]:8.3f}x{mark}")
    if c.rows_needed is not None:
        lines.append(f"rows: {c.rows:g} verified per step, {c.rows_needed:.3g} needed by the oracle's τ")
    lines.append(f"direction: {direction(c)}")
    lines.append("")
    header = f"{'class':<20} {'time':>12} {'floor':>12} {'time/floor':>11} {'time-floor':>12} {'bound':>6}"
    lines += [header, "-" * len(header)]
    for r in c.per_class:
        ratio = "inf" if math.isinf(r.ratio) else f"{r.ratio:.2f}x"
        lines.append(f"{r.kernel_class:<20} {_fmt_s(r.seconds):>12} {_fmt_s(r.floor):>12} {ratio:>11} "
                     f"{_fmt_s(r.gap):>12} {r.bound:>6}")
    return "\n".join(lines) + "\n"


def render_svg(c: Ceiling) -> str:
    """Two bar charts: the four factors, and per class time against its floor (and its bound)."""
    width, left, bar_w, row_h = 760, 170, 400, 22
    parts: list[str] = []
    y = 30
    parts.append(f'<text x="10" y="{y}" font-size="15" font-weight="bold">'
                 f"{escape(f'Ceiling {c.product:.2f}x {_where(c)} — direction: {direction(c)}')}</text>")
    y += 20
    fmax = max([v for v in c.factors.values() if math.isfinite(v)] + [1.0])
    for f in FACTORS:
        v = c.factors[f]
        w = bar_w if not math.isfinite(v) else max(1.0, bar_w * v / fmax)
        fill = "#d9534f" if f == c.largest else "#5b8def"
        parts.append(f'<text x="10" y="{y + 15}" font-size="12">{escape(f)}</text>')
        parts.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{row_h - 6}" fill="{fill}"/>')
        note = f" ({c.notes[f]})" if f in c.notes else ""
        parts.append(f'<text x="{left + w + 5:.1f}" y="{y + 15}" font-size="12">{escape(f"{v:.2f}x{note}")}</text>')
        y += row_h
    y += 20
    parts.append(f'<text x="10" y="{y}" font-size="13" font-weight="bold">time per class vs byte floor</text>')
    y += 10
    tmax = max([max(r.seconds, r.floor) for r in c.per_class] + [1e-30])
    for r in c.per_class:
        wt = max(1.0, bar_w * r.seconds / tmax)
        wf = max(1.0, bar_w * r.floor / tmax)
        parts.append(f'<text x="10" y="{y + 15}" font-size="12">{escape(r.kernel_class)}</text>')
        parts.append(f'<rect x="{left}" y="{y}" width="{wt:.1f}" height="9" fill="#f0ad4e"><title>time</title></rect>')
        parts.append(f'<rect x="{left}" y="{y + 9}" width="{wf:.1f}" height="9" fill="#5cb85c"><title>floor</title></rect>')
        ratio = "inf" if math.isinf(r.ratio) else f"{r.ratio:.2f}x"
        parts.append(f'<text x="{left + max(wt, wf) + 5:.1f}" y="{y + 15}" font-size="12">'
                     f"{escape(f'{_fmt_s(r.seconds)} / {_fmt_s(r.floor)} ({ratio}, {r.bound})')}</text>")
        y += row_h
    y += 10
    parts.append(f'<rect x="10" y="{y}" width="12" height="10" fill="#f0ad4e"/>'
                 f'<text x="26" y="{y + 9}" font-size="11">measured time</text>'
                 f'<rect x="130" y="{y}" width="12" height="10" fill="#5cb85c"/>'
                 f'<text x="146" y="{y + 9}" font-size="11">byte floor</text>')
    height = y + 25
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif">\n'
        + "\n".join(parts)
        + "\n</svg>\n"
    )


# --------------------------------------------------------------------------- one measured system


def analyze(measurement: Mapping, device_: str | DeviceSpec) -> dict:
    """The cost model of one system from the GPU worker's Profile measurement (plain data:
    `batch` (1 when absent), `t_ar_s` (the AR step at that batch), `current` policy, `budgets` rows
    with the rows of a step over the batch, τ per request, step wall time and kernel stats, `replay`
    τ per policy incl. the oracle): c(N) and speedup per budget, the best budget, the ceiling over
    the *current* system (its own profile and τ, the oracle's τ on its own recording), the
    direction, and the table / SVG renderings. An AR system's measurement (`current` "ar": one
    row, the AR step, no replay) gives speedup 1, tree and rows factors 1 (no drafter) and a
    direction of kernels or off-profile."""
    batch = check_batch(measurement.get("batch", 1))
    t_ar = float(measurement["t_ar_s"])
    budgets = []
    for b in measurement["budgets"]:
        budgets.append({"policy": b["policy"], "rows": b["rows"], "rows_per_request": b["rows"] / batch,
                        "tau": b["tau"], "t_step_s": b["t_step_s"], "c": step_cost(b["t_step_s"], t_ar),
                        "speedup": speedup(b["tau"], b["t_step_s"], t_ar)})
    best = max(budgets, key=lambda r: (r["speedup"], -budgets.index(r)))
    cur = next(b for b in measurement["budgets"] if b["policy"] == measurement["current"])
    measured = {k: v for k, v in cur["kernels"].items() if k != "other"}  # "other" is the off-profile remainder
    replayed = dict(measurement.get("replay", {}))
    has_drafter = measurement["current"] != AR
    tau_oracle = max(replayed.get("oracle", cur["tau"]), cur["tau"]) if has_drafter else cur["tau"]
    ceil = ceiling(Profile(t_step=cur["t_step_s"], kernels=measured, n=cur["rows"] or None), device_,
                   cur["tau"], tau_oracle, has_drafter, batch)
    return {
        "batch": batch, "t_ar_s": t_ar, "budgets": budgets, "best": best["policy"], "current": cur["policy"],
        "tau_current": cur["tau"], "tau_oracle": tau_oracle, "replay": replayed,
        "speedup_current": speedup(cur["tau"], cur["t_step_s"], t_ar),
        "ceiling": {"factors": dict(ceil.factors), "product": ceil.product, "largest": ceil.largest,
                    "device": ceil.device, "notes": dict(ceil.notes), "batch": batch, "rows": ceil.rows,
                    "rows_needed": ceil.rows_needed,
                    "per_class": [{"class": r.kernel_class, "seconds": r.seconds, "floor_s": r.floor, "ratio": r.ratio,
                                   "bound": r.bound} for r in ceil.per_class]},
        "direction": direction(ceil), "table": render_table(ceil), "svg": render_svg(ceil),
    }


# --------------------------------------------------------------------------- the batch axis


def by_batch(analyses: Iterable[Mapping]) -> list[Mapping]:
    """`analyze` outputs of one system at several batch sizes, in increasing batch order (one each)."""
    out = sorted(analyses, key=lambda a: a.get("batch", 1))
    sizes = [a.get("batch", 1) for a in out]
    if not out or len(set(sizes)) != len(sizes):
        raise ValueError(f"the batch axis needs one analysis per batch size, got batch sizes {sizes}")
    return out


def render_batch_table(analyses: Iterable[Mapping]) -> str:
    """Per batch size: τ, rows, c and speedup of every budget, then the factors and the direction."""
    out = by_batch(analyses)
    header = f"{'batch':>5} {'policy':<16} {'rows':>7} {'per req':>7} {'τ':>6} {'c':>7} {'speedup':>8}"
    lines = [header, "-" * len(header)]
    for a in out:
        for b in a["budgets"]:
            mark = "  <- best" if b["policy"] == a["best"] else ""
            lines.append(f"{a.get('batch', 1):>5} {b['policy']:<16} {b['rows']:>7.1f} {b['rows'] / a.get('batch', 1):>7.1f} "
                         f"{b['tau']:>6.2f} {b['c']:>7.2f} {b['speedup']:>7.2f}x{mark}")
    header = f"{'batch':>5} " + " ".join(f"{f:>11}" for f in FACTORS) + "  direction"
    lines += ["", header, "-" * len(header)]
    for a in out:
        f = a["ceiling"]["factors"]
        lines.append(f"{a.get('batch', 1):>5} " + " ".join(f"{f[k]:>10.2f}x" for k in FACTORS) + f"  {a['direction']}")
    return "\n".join(lines) + "\n"


def render_batch_svg(analyses: Iterable[Mapping]) -> str:
    """Speedup over AR (τ / c) of every budget against the batch size (the best budget ringed), with
    the direction written under each batch size."""
    out = by_batch(analyses)
    sizes = [a.get("batch", 1) for a in out]
    policies = list(dict.fromkeys(b["policy"] for a in out for b in a["budgets"]))
    left, top, pw, ph = 60, 40, 520, 240
    xs = [left + pw * (i + 0.5) / len(out) for i in range(len(out))]
    smax = 1.1 * max([b["speedup"] for a in out for b in a["budgets"] if math.isfinite(b["speedup"])] + [1.0])

    def y_of(v: float) -> float:
        return top + ph - ph * min(v, smax) / smax

    colours = ("#5b8def", "#d9534f", "#5cb85c", "#f0ad4e", "#8e6bbf", "#6c757d")
    parts = ['<text x="10" y="24" font-size="15" font-weight="bold">speedup over AR by batch size</text>',
             f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#333"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#333"/>',
             f'<line x1="{left}" y1="{y_of(1.0):.1f}" x2="{left + pw}" y2="{y_of(1.0):.1f}" stroke="#999" '
             'stroke-dasharray="4 3"/>',
             f'<text x="{left - 6}" y="{y_of(1.0) + 4:.1f}" font-size="11" text-anchor="end">1x</text>',
             f'<text x="{left - 6}" y="{top + 4}" font-size="11" text-anchor="end">{smax:.2f}x</text>']
    for x, size, a in zip(xs, sizes, out):
        parts.append(f'<text x="{x:.1f}" y="{top + ph + 16}" font-size="12" text-anchor="middle">batch {size}</text>')
        parts.append(f'<text x="{x:.1f}" y="{top + ph + 32}" font-size="11" text-anchor="middle">'
                     f"{escape(a['direction'])}</text>")
    for k, p in enumerate(policies):
        colour = colours[k % len(colours)]
        pts = [(x, size, b, a["best"] == p) for x, size, a in zip(xs, sizes, out) for b in a["budgets"]
               if b["policy"] == p]
        if len(pts) > 1:
            line = " ".join(f"{x:.1f},{y_of(b['speedup']):.1f}" for x, _, b, _ in pts)
            parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, size, b, best in pts:
            ring = ' stroke="#000" stroke-width="2"' if best else ""
            label = escape(f"{p} at batch {size}: {b['speedup']:.2f}x")
            parts.append(f'<circle cx="{x:.1f}" cy="{y_of(b["speedup"]):.1f}" r="4" fill="{colour}"{ring}>'
                         f"<title>{label}</title></circle>")
        parts.append(f'<rect x="{left + pw + 20}" y="{top + 18 * k}" width="12" height="10" fill="{colour}"/>'
                     f'<text x="{left + pw + 36}" y="{top + 18 * k + 9}" font-size="11">{escape(p)}</text>')
    width, height = left + pw + 170, top + ph + 48
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif">\n' + "\n".join(parts) + "\n</svg>\n")
