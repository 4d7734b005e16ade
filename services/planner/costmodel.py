"""The planner's cost model and ceilings (docs/METHOD.md §6), as plain functions and dataclasses.

    speedup(N) = τ(N) / c(N),   c(N) = T_step(N) / T_AR

N is the number of rows verified per step, T_step(N) the measured wall time of one speculative
step (drafting included), T_AR one AR step on the same engine.

Each profiled kernel class has a byte floor

    floor = max(FLOPs / (0.6 × peak dense FLOP/s), bytes / (0.9 × peak bandwidth))

and the ceiling over the current system is the product of three factors:

- tree        = τ_oracle(N) / τ_current  (τ_oracle from exact replay with an oracle: an input here)
- kernels     = profiled (summed) kernel time / Σ byte floors of the classes
- off_profile = measured step time / profiled (summed) kernel time

The direction of the next round is the largest factor; for kernels it names the class that wastes
the most time (time − floor). A system without a drafter (plain AR decoding) has no tree to grow:
its tree factor is 1, it is never the direction, and the table says why; its step is the AR step,
so its speedup is 1 and the direction is the kernels (at one request, the weight read) or the
time off the profile. Server-free: no engine import, no other service.
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


FACTORS = ("tree", "kernels", "off_profile")  # also the tie-break order of `largest`
AR = "ar"  # the policy of an AR system's one measured row (the GPU worker's Profile)


@dataclass(frozen=True)
class ClassRow:
    kernel_class: str
    seconds: float
    floor: float
    ratio: float  # seconds / floor (inf when the floor is 0 and time was spent)

    @property
    def gap(self) -> float:
        return self.seconds - self.floor


NO_TREE = "no drafter: no tree can help"  # why an AR system's tree factor is 1


@dataclass(frozen=True)
class Ceiling:
    factors: dict[str, float]
    product: float
    largest: str
    per_class: tuple[ClassRow, ...]
    device: str = ""
    notes: Mapping[str, str] = field(default_factory=dict)  # factor -> why it is what it is


def ceiling(profile: Profile, device_: str | DeviceSpec, tau_current: float, tau_oracle: float,
            has_drafter: bool = True) -> Ceiling:
    """The three factors over the current system (see the module docstring). Without a drafter
    the tree factor is 1 whatever the τ given, and the largest factor is one of the other two."""
    if not (tau_current > 0 and tau_oracle > 0):
        raise ValueError(f"τ must be positive, got current={tau_current}, oracle={tau_oracle}")
    d = device(device_)
    rows = []
    for name in KERNEL_CLASSES:
        if name not in profile.kernels:
            continue
        s = profile.kernels[name]
        floor = byte_floor(s.flops, s.bytes, d)
        ratio = s.seconds / floor if floor > 0 else (math.inf if s.seconds > 0 else 1.0)
        rows.append(ClassRow(name, s.seconds, floor, ratio))
    profiled = profile.profiled_seconds
    floors = sum(r.floor for r in rows)
    if profiled <= 0:
        raise ValueError("the profile holds no kernel time: cannot split the step")
    if floors <= 0:
        raise ValueError("no profiled class has bytes or FLOPs: the kernel factor has no floor")
    factors = {
        "tree": tau_oracle / tau_current if has_drafter else 1.0,
        "kernels": profiled / floors,
        "off_profile": profile.t_step / profiled,
    }
    open_factors = FACTORS if has_drafter else tuple(f for f in FACTORS if f != "tree")
    largest = max(open_factors, key=lambda f: (factors[f], -FACTORS.index(f)))
    notes = {} if has_drafter else {"tree": NO_TREE}
    return Ceiling(factors, math.prod(factors.values()), largest, tuple(rows), d.name, notes)


def direction(c: Ceiling) -> str:
    """"tree", "kernel:<class wasting the most time>" or "off-profile"."""
    if c.largest == "tree":
        return "tree"
    if c.largest == "off_profile":
        return "off-profile"
    # max gap; ties go to the earlier class in KERNEL_CLASSES order (rows are in that order)
    worst = max(c.per_class, key=lambda r: (r.gap, -KERNEL_CLASSES.index(r.kernel_class)))
    return f"kernel:{worst.kernel_class}"


# --------------------------------------------------------------------------- rendering


def _fmt_s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"


def render_table(c: Ceiling) -> str:
    lines = [f"ceiling over the current system{' on ' + c.device if c.device else ''}: {c.product:.3f}x"]
    for f in FACTORS:
        mark = "  <- largest" if f == c.largest else f"  ({c.notes[f]})" if f in c.notes else ""
        lines.append(f"  {f:<12} {c.factors[f]:8.3f}x{mark}")
    lines.append(f"direction: {direction(c)}")
    lines.append("")
    header = f"{'class':<20} {'time':>12} {'floor':>12} {'time/floor':>11} {'time-floor':>12}"
    lines += [header, "-" * len(header)]
    for r in c.per_class:
        ratio = "inf" if math.isinf(r.ratio) else f"{r.ratio:.2f}x"
        lines.append(f"{r.kernel_class:<20} {_fmt_s(r.seconds):>12} {_fmt_s(r.floor):>12} {ratio:>11} {_fmt_s(r.gap):>12}")
    return "\n".join(lines) + "\n"


def render_svg(c: Ceiling) -> str:
    """Two bar charts: the three factors, and per class time against its floor."""
    width, left, bar_w, row_h = 760, 170, 400, 22
    parts: list[str] = []
    y = 30
    parts.append(f'<text x="10" y="{y}" font-size="15" font-weight="bold">'
                 f"{escape(f'Ceiling {c.product:.2f}x — direction: {direction(c)}')}</text>")
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
                     f"{escape(f'{_fmt_s(r.seconds)} / {_fmt_s(r.floor)} ({ratio})')}</text>")
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
    `t_ar_s`, `current` policy, `budgets` rows with τ, step wall time and kernel stats, `replay` τ
    per policy incl. the oracle): c(N) and speedup per budget, the best budget, the ceiling over
    the *current* system (its own profile and τ, the oracle's τ on its own recording), the
    direction, and the table / SVG renderings. An AR system's measurement (`current` "ar": one
    row, the AR step, no replay) gives speedup 1, tree factor 1 (no drafter) and a direction of
    kernels or off-profile."""
    t_ar = float(measurement["t_ar_s"])
    budgets = []
    for b in measurement["budgets"]:
        budgets.append({"policy": b["policy"], "rows": b["rows"], "tau": b["tau"], "t_step_s": b["t_step_s"],
                        "c": step_cost(b["t_step_s"], t_ar), "speedup": speedup(b["tau"], b["t_step_s"], t_ar)})
    best = max(budgets, key=lambda r: (r["speedup"], -budgets.index(r)))
    cur = next(b for b in measurement["budgets"] if b["policy"] == measurement["current"])
    measured = {k: v for k, v in cur["kernels"].items() if k != "other"}  # "other" is the off-profile remainder
    replayed = dict(measurement.get("replay", {}))
    has_drafter = measurement["current"] != AR
    tau_oracle = max(replayed.get("oracle", cur["tau"]), cur["tau"]) if has_drafter else cur["tau"]
    ceil = ceiling(Profile(t_step=cur["t_step_s"], kernels=measured), device_,
                   cur["tau"], tau_oracle, has_drafter)
    return {
        "t_ar_s": t_ar, "budgets": budgets, "best": best["policy"], "current": cur["policy"],
        "tau_current": cur["tau"], "tau_oracle": tau_oracle, "replay": replayed,
        "speedup_current": speedup(cur["tau"], cur["t_step_s"], t_ar),
        "ceiling": {"factors": dict(ceil.factors), "product": ceil.product, "largest": ceil.largest,
                    "device": ceil.device, "notes": dict(ceil.notes),
                    "per_class": [{"class": r.kernel_class, "seconds": r.seconds, "floor_s": r.floor, "ratio": r.ratio}
                                  for r in ceil.per_class]},
        "direction": direction(ceil), "table": render_table(ceil), "svg": render_svg(ceil),
    }
