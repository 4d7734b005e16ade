"""The planner's cost model: c, speedup, best budget, byte floors, ceilings, directions, rendering."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.services.planner import costmodel as cm
from specpilot.services.planner.costmodel import (
    DEVICES,
    KERNEL_CLASSES,
    Ceiling,
    DeviceSpec,
    KernelClass,
    NO_ROWS,
    NO_TREE,
    KernelStat,
    Profile,
    aggregate,
    analyze,
    best_budget,
    byte_floor,
    ceiling,
    direction,
    measure_cpu_peaks,
    render_svg,
    render_table,
    speedup,
    step_cost,
)

H200 = DEVICES["h200"]


# --------------------------------------------------------------------------- devices


def test_measure_cpu_peaks_returns_positive_figures():
    d = measure_cpu_peaks(seconds=0.1)
    assert d.name == "cpu" and d.bf16_flops > 0 and d.bandwidth > 0 and d.source


def test_unknown_device_is_refused():
    with pytest.raises(ValueError, match="unknown device"):
        byte_floor(1.0, 1.0, "tpu-v9")


# --------------------------------------------------------------------------- byte floors


def test_byte_floor_memory_bound_gemv_on_h200():
    # Llama o_proj 4096→4096 bf16, one row: read the weight once (activations negligible)
    k = n = 4096
    weight_bytes = k * n * 2
    flops = 2 * k * n
    expected = weight_bytes / (0.9 * 4.28e12)  # ≈ 8.71 µs, the anchors' floor at 90 % bandwidth
    assert byte_floor(flops, weight_bytes, "h200") == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(8.71e-6, rel=1e-3)
    assert flops / (0.6 * 788e12) < expected  # compute side far below


def test_byte_floor_compute_bound_big_gemm_on_h200():
    m = k = n = 8192
    flops = 2 * m * k * n
    moved = (m * k + k * n + m * n) * 2
    expected = flops / (0.6 * 788e12)  # ≈ 2.33 ms
    assert byte_floor(flops, moved, H200) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(2.3256e-3, rel=1e-3)
    assert moved / (0.9 * 4.28e12) < expected


def test_byte_floor_rejects_negative():
    with pytest.raises(ValueError):
        byte_floor(-1.0, 0.0, H200)


# --------------------------------------------------------------------------- c, speedup, best N


def test_cost_and_speedup_arithmetic():
    assert step_cost(12e-3, 8e-3) == pytest.approx(1.5)
    assert speedup(3.0, 12e-3, 8e-3) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        step_cost(0.0, 1.0)


def test_best_budget_picks_the_highest_speedup():
    t_ar = 10e-3
    taus = {1: 1.0, 16: 3.0, 64: 4.0, 256: 4.4}
    times = {1: 10e-3, 16: 12e-3, 64: 14e-3, 256: 22e-3}
    # speedups: 1.0, 2.5, 2.857, 2.0
    n, s = best_budget(taus, times, t_ar)
    assert n == 64 and s == pytest.approx(4.0 / 1.4)


def test_best_budget_tie_goes_to_the_smaller_n():
    t_ar = 1.0
    taus = {64: 4.0, 32: 2.0, 128: 1.0}
    times = {64: 2.0, 32: 1.0, 128: 0.5}  # all speedup 2.0
    assert best_budget(taus, times, t_ar) == (32, 2.0)
    # float noise at the 1e-16 level still ties
    assert best_budget({8: 0.3, 4: 0.1 + 0.2}, {8: 1.0, 4: 1.0}, 1.0)[0] == 4


def test_best_budget_uses_only_budgets_in_both_tables():
    assert best_budget({1: 1.0, 2: 9.0}, {1: 1.0, 3: 1.0}, 1.0) == (1, 1.0)
    with pytest.raises(ValueError, match="no budget"):
        best_budget({2: 1.0}, {3: 1.0}, 1.0)


@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.integers(1, 512),
        st.tuples(st.floats(0.0, 10.0), st.floats(1e-4, 1.0)),
        min_size=1,
        max_size=12,
    ),
    st.floats(1e-4, 1.0),
)
def test_best_budget_is_the_argmax_with_smallest_n(table, t_ar):
    taus = {n: v[0] for n, v in table.items()}
    times = {n: v[1] for n, v in table.items()}
    n, s = best_budget(taus, times, t_ar)
    all_s = {m: taus[m] / (times[m] / t_ar) for m in table}
    assert s == pytest.approx(max(all_s.values()), rel=1e-9)
    assert all(all_s[m] < s or math.isclose(all_s[m], s, rel_tol=1e-12) for m in table)
    assert not any(m < n and math.isclose(all_s[m], s, rel_tol=1e-12) for m in table)


# --------------------------------------------------------------------------- profiles


def test_aggregate_means_per_class_and_step():
    a = Profile(10e-3, {"target_linear": KernelStat(6e-3, 100.0, 10.0), "attention": KernelStat(1e-3, 4.0, 2.0)}, n=16)
    b = Profile(14e-3, {"target_linear": KernelStat(8e-3, 100.0, 10.0)}, n=16)
    m = aggregate([a, b])
    assert m.n == 16
    assert m.t_step == pytest.approx(12e-3)
    tl = m.kernels["target_linear"]
    assert (tl.seconds, tl.bytes, tl.flops) == (pytest.approx(7e-3), 100.0, 10.0)
    assert m.kernels["attention"].seconds == pytest.approx(0.5e-3)  # absent in b counts as 0
    assert m.kernels["attention"].bytes == pytest.approx(2.0)
    assert m.profiled_seconds == pytest.approx(7.5e-3)


def test_aggregate_refuses_mixed_budgets_and_empty():
    with pytest.raises(ValueError, match="different budgets"):
        aggregate([Profile(1.0, {}, n=1), Profile(1.0, {}, n=2)])
    with pytest.raises(ValueError):
        aggregate([])


def test_profile_validates_class_names_and_accepts_plain_tuples():
    p = Profile(1.0, {KernelClass.LM_HEAD: (0.1, 5.0, 1.0)})
    assert p.kernels == {"lm_head": KernelStat(0.1, 5.0, 1.0)}
    with pytest.raises(ValueError, match="unknown kernel class"):
        Profile(1.0, {"softmax": KernelStat(0.1)})


# --------------------------------------------------------------------------- ceilings and directions

# Llama-3.1-8B-like decode step on the H200: bytes and FLOPs per class
WORK = {
    "target_linear": (14.0e9, 2 * 7.0e9 * 16),  # weights read once, 16 rows
    "lm_head": (1.05e9, 2 * 0.525e9 * 16),
    "attention": (2.0e9, 1.0e9),  # KV read
    "drafter": (0.5e9, 1.0e9),
    "sampling_acceptance": (1.0e6, 1.0e6),
}


def _profile(slowdown: dict[str, float], off_profile: float = 1.0) -> Profile:
    """Every class at `slowdown[c]` × its floor on the H200; T_step = off_profile × profiled."""
    kernels = {}
    for c, (b, f) in WORK.items():
        kernels[c] = KernelStat(slowdown.get(c, 1.0) * byte_floor(f, b, H200), b, f)
    profiled = sum(k.seconds for k in kernels.values())
    return Profile(off_profile * profiled, kernels, n=16)


def test_planted_slow_attention_is_named_by_the_kernel_factor():
    # attention at 5× its floor; sampling_acceptance at 50× but tiny: the gap, not the ratio, decides
    p = _profile({"attention": 5.0, "sampling_acceptance": 50.0}, off_profile=1.05)
    c = ceiling(p, "h200", tau_current=3.0, tau_oracle=3.3)
    floors = {r.kernel_class: r.floor for r in c.per_class}
    expected_kernels = (sum(floors.values()) + 4 * floors["attention"] + 49 * floors["sampling_acceptance"]) / sum(
        floors.values()
    )
    assert c.factors["kernels"] == pytest.approx(expected_kernels)
    assert c.factors["tree"] == pytest.approx(1.1)
    assert c.factors["off_profile"] == pytest.approx(1.05)
    assert c.factors["kernels"] > c.factors["tree"] and c.factors["kernels"] > c.factors["off_profile"]
    assert c.largest == "kernels"
    assert direction(c) == "kernel:attention"
    assert c.product == pytest.approx(math.prod(c.factors.values()))
    rows = {r.kernel_class: r for r in c.per_class}
    assert rows["attention"].ratio == pytest.approx(5.0)
    assert rows["sampling_acceptance"].ratio == pytest.approx(50.0)
    assert rows["target_linear"].ratio == pytest.approx(1.0)
    assert [r.kernel_class for r in c.per_class] == [k for k in KERNEL_CLASSES if k in WORK]


def test_direction_tree_when_oracle_gap_is_largest():
    c = ceiling(_profile({"attention": 1.2}, off_profile=1.1), H200, tau_current=2.0, tau_oracle=4.0)
    assert c.largest == "tree" and c.factors["tree"] == pytest.approx(2.0)
    assert direction(c) == "tree"


def test_direction_off_profile_when_unprofiled_time_dominates():
    c = ceiling(_profile({"attention": 1.2}, off_profile=3.0), H200, tau_current=2.0, tau_oracle=2.2)
    assert c.largest == "off_profile" and c.factors["off_profile"] == pytest.approx(3.0)
    assert direction(c) == "off-profile"


def test_ceiling_needs_time_and_floors():
    with pytest.raises(ValueError, match="no kernel time"):
        ceiling(Profile(1.0, {}), H200, 1.0, 1.0)
    with pytest.raises(ValueError, match="no profiled class has bytes"):
        ceiling(Profile(1.0, {"other": KernelStat(0.5)}), H200, 1.0, 1.0)


def test_class_without_work_has_infinite_ratio_and_can_be_named():
    p = Profile(1.0, {"target_linear": KernelStat(0.1, 0.9 * H200.bandwidth * 0.1, 0.0), "tree_build": KernelStat(0.5)})
    c = ceiling(p, H200, 1.0, 1.0)
    rows = {r.kernel_class: r for r in c.per_class}
    assert math.isinf(rows["tree_build"].ratio) and rows["target_linear"].ratio == pytest.approx(1.0)
    assert c.factors["kernels"] == pytest.approx(6.0)
    assert direction(c) == "kernel:tree_build"


# --------------------------------------------------------------------------- rendering


def _slow_attention_ceiling() -> Ceiling:
    return ceiling(_profile({"attention": 5.0}, off_profile=1.05), H200, 3.0, 3.3)


def test_render_table_lists_factors_classes_and_direction():
    text = render_table(_slow_attention_ceiling())
    for word in ("tree", "kernels", "off_profile", "direction: kernel:attention", "<- largest", *WORK):
        assert word in text
    assert "5.00x" in text


def test_render_svg_is_xml_and_names_each_class_and_factor():
    svg = render_svg(_slow_attention_ceiling())
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = " ".join("".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text"))
    for word in ("tree", "kernels", "off_profile", *WORK):
        assert word in texts
    assert "kernel:attention" in texts
    assert len(list(root.iter("{http://www.w3.org/2000/svg}rect"))) >= 3 + 2 * len(WORK)


def test_render_svg_escapes_and_survives_infinite_ratio():
    p = Profile(1.0, {"target_linear": KernelStat(0.1, 1e9, 0.0), "other": KernelStat(0.5)})
    svg = render_svg(ceiling(p, DeviceSpec("a<b&c", 1e12, 1e12, "test"), 1.0, 1.0))
    ET.fromstring(svg)
    assert "inf" in svg


def test_cpu_kind_is_measured_once(monkeypatch):
    calls = []
    fake = DeviceSpec("cpu", 1e11, 1e10, "fake")
    monkeypatch.setattr(cm, "_CPU", None)
    monkeypatch.setattr(cm, "measure_cpu_peaks", lambda seconds=0.5: calls.append(1) or fake)
    assert byte_floor(1e11, 0.0, "cpu") == pytest.approx(1.0 / 0.6)
    assert byte_floor(0.0, 1e10, "cpu") == pytest.approx(1.0 / 0.9)
    assert len(calls) == 1


# --------------------------------------------------------------------------- a system without a drafter

# a Llama-3.1-8B-like AR step on the H200: one row, the weights read once
AR_WORK = {"target_linear": (14.0e9, 2 * 7.0e9), "lm_head": (1.05e9, 2 * 0.525e9), "attention": (0.1e9, 0.05e9),
           "sampling_acceptance": (0.0, 0.0)}


def ar_measurement(slowdown: dict[str, float], off_profile: float = 1.0, **extra) -> dict:
    """The GPU worker's Profile of an AR system (its one "ar" row, no replay): every class at
    `slowdown[c]` × its H200 floor (sampling_acceptance: 5 µs, no bytes), the step `off_profile` × that."""
    kernels = {c: [slowdown.get(c, 1.0) * byte_floor(f, b, H200) if b else 5e-6, b, f] for c, (b, f) in AR_WORK.items()}
    profiled = sum(k[0] for k in kernels.values())
    step = off_profile * profiled
    return {"current": "ar", "draft_len": 0, "t_ar_s": step, "replay": {},
            "budgets": [{"policy": "ar", "rows": 1.0, "tau": 1.0, "t_step_s": step, "profiled_t_step_s": profiled,
                         "kernels": {**kernels, "other": [step - profiled, 0.0, 0.0]}}], **extra}


def test_an_ar_system_has_speedup_one_tree_factor_one_and_its_weight_read_as_direction():
    m = ar_measurement({"target_linear": 3.0}, off_profile=1.2)
    out = analyze(m, "h200")
    assert out["speedup_current"] == 1.0 and out["tau_current"] == 1.0 == out["tau_oracle"]
    assert [(b["policy"], b["c"], b["speedup"]) for b in out["budgets"]] == [("ar", 1.0, 1.0)]
    f = out["ceiling"]["factors"]
    kernels = m["budgets"][0]["kernels"]
    profiled = sum(kernels[c][0] for c in AR_WORK)
    floors = sum(byte_floor(fl, b, H200) for b, fl in AR_WORK.values())
    assert f["tree"] == 1.0 and f["kernels"] == pytest.approx(profiled / floors)
    assert f["off_profile"] == pytest.approx(1.2)
    assert out["direction"] == "kernel:target_linear" and out["ceiling"]["largest"] == "kernels"
    assert out["ceiling"]["notes"] == {"tree": NO_TREE, "rows": NO_ROWS} and f["rows"] == 1.0
    tree_line = next(line for line in out["table"].splitlines() if line.strip().startswith("tree"))
    assert NO_TREE in tree_line
    assert NO_TREE in "".join(ET.fromstring(out["svg"]).itertext())


def test_an_ar_systems_direction_is_never_the_tree_even_when_the_other_factors_are_below_one():
    # the weights read at 95 % of the bandwidth (past the floor's 90 %), the unprofiled step faster than
    # the profiled classes: both factors below 1
    m = ar_measurement({c: 0.9 for c in AR_WORK}, off_profile=0.8)
    out = analyze(m, "h200")
    assert out["ceiling"]["factors"]["kernels"] < 1 and out["ceiling"]["factors"]["off_profile"] < 1
    assert out["ceiling"]["largest"] == "kernels" and out["direction"].startswith("kernel:")
    # the same figures from a speculative system (a drafter, τ 1) would point at the tree on the tie
    spec = analyze({**m, "current": "chain", "budgets": [{**m["budgets"][0], "policy": "chain"}]}, "h200")
    assert spec["direction"] == "tree" and spec["ceiling"]["notes"] == {}


def test_an_ar_systems_off_profile_time_can_be_the_direction_and_a_stray_oracle_is_ignored():
    out = analyze(ar_measurement({"target_linear": 1.1}, off_profile=4.0, replay={"oracle": 3.0}), "h200")
    assert out["direction"] == "off-profile" and out["ceiling"]["factors"]["off_profile"] == pytest.approx(4.0)
    assert out["ceiling"]["factors"]["tree"] == 1.0 and out["tau_oracle"] == 1.0


def test_a_ceiling_without_a_drafter_keeps_the_tree_factor_at_one():
    p = _profile({"attention": 1.2}, off_profile=1.1)
    with_tree = ceiling(p, H200, tau_current=2.0, tau_oracle=4.0)
    without = ceiling(p, H200, tau_current=2.0, tau_oracle=4.0, has_drafter=False)
    assert with_tree.largest == "tree" and with_tree.factors["tree"] == pytest.approx(2.0)
    assert without.factors["tree"] == 1.0 and without.largest != "tree"
    assert without.notes == {"tree": NO_TREE, "rows": NO_ROWS}
    assert {k: v for k, v in without.factors.items() if k != "tree"} == \
        {k: v for k, v in with_tree.factors.items() if k != "tree"}
    assert NO_TREE in render_table(without) and NO_TREE not in render_table(with_tree)


# --------------------------------------------------------------------------- at a batch

# A device whose floors are max(FLOPs, bytes) picoseconds, and a target whose step reads W bytes of
# weights and spends F_ROW FLOPs per verified row: the two terms cross at W / F_ROW = 50 rows.
UNIT = DeviceSpec("unit", 1e12 / 0.6, 1e12 / 0.9, "test: a floor is max(FLOPs, bytes) ps")
W, F_ROW = 1e9, 2e7


def floor_s(rows: float) -> float:
    return max(F_ROW * rows, W) / 1e12


def batch_step(rows: float, slow: float = 1.2, off: float = 1.1) -> Profile:
    """One step of `rows` rows over the batch: the target's linears at `slow` × their floor on
    UNIT, the step `off` × that."""
    return Profile(off * slow * floor_s(rows), {"target_linear": KernelStat(slow * floor_s(rows), W, F_ROW * rows)},
                   n=rows)


@pytest.mark.parametrize("batch, rows_factor, bound, expected", [
    (1, 1.0, "read", "tree"),  # 17 rows: 3.4e8 FLOPs under the 1e9-byte read, and fewer rows cannot cut a read
    (2, 1.0, "read", "tree"),  # 34 rows: still the read
    (4, 1.36e9 / 1e9, "rows", "rows"),  # 68 rows cost 1.36e9; the oracle's 16 rows fall back to the read
    (16, 272 / 64, "rows", "rows"),  # 272 rows against the 64 the oracle needs, both past the read
])
def test_the_direction_turns_from_the_tree_to_the_rows_as_the_batch_grows(batch, rows_factor, bound, expected):
    """17 rows per request, τ 3 now and 4 for the oracle (tree ×4/3), kernels ×1.2, off-profile
    ×1.1: at batch 1 a step is the weight read, at batch 16 every verified row costs compute."""
    c = ceiling(batch_step(17 * batch), UNIT, tau_current=3.0, tau_oracle=4.0, batch=batch)
    assert c.factors["rows"] == pytest.approx(rows_factor)
    assert c.factors["tree"] == pytest.approx(4 / 3) and c.factors["kernels"] == pytest.approx(1.2)
    assert c.factors["off_profile"] == pytest.approx(1.1)
    assert c.product == pytest.approx(4 / 3 * 1.2 * 1.1 * rows_factor)
    assert (c.batch, c.rows, c.rows_needed) == (batch, 17.0 * batch, 4.0 * batch)
    assert [r.bound for r in c.per_class] == [bound]
    assert direction(c) == expected and c.largest == expected
    text = render_table(c)
    assert f"at batch {batch}, {17 * batch} rows per step (17 per request)" in text and f"direction: {expected}" in text
    assert f"at batch {batch}" in "".join(ET.fromstring(render_svg(c)).itertext())


def test_fewer_rows_cut_only_the_flops_of_the_classes_that_work_per_verified_row():
    # batch 16, 272 rows; the drafter's 3e9 FLOPs do not depend on the rows verified
    p = Profile(1.0, {"target_linear": KernelStat(0.1, W, F_ROW * 272), "drafter": KernelStat(0.1, 0.0, 3e9)}, n=272)
    c = ceiling(p, UNIT, tau_current=3.0, tau_oracle=4.0, batch=16)
    assert c.factors["rows"] == pytest.approx((F_ROW * 272 + 3e9) / (F_ROW * 64 + 3e9))
    assert cm.floors_at(p, UNIT, 64) == pytest.approx((F_ROW * 64 + 3e9) / 1e12)
    assert (cm.bound(2.0, 1.0, UNIT), cm.bound(1.0, 2.0, UNIT), cm.bound(0.0, 0.0, UNIT)) == ("rows", "read", "-")


def test_an_ar_system_at_a_batch_has_no_row_to_drop():
    # 8 requests, one row each: at the floor every class, the step 1.3 × that; the rows are all committed
    c = ceiling(batch_step(8, slow=1.0, off=1.3), UNIT, 1.0, 1.0, has_drafter=False, batch=8)
    assert c.factors["rows"] == 1.0 and c.factors["tree"] == 1.0 and c.notes == {"tree": NO_TREE, "rows": NO_ROWS}
    assert direction(c) == "off-profile"


@pytest.mark.parametrize("batch", [0, -2, True, 1.5, "2"])
def test_a_batch_that_is_not_a_positive_integer_is_refused_in_one_line(batch):
    with pytest.raises(ValueError, match=r"^batch .*: expected a positive integer \(requests decoded at once\)$"):
        ceiling(batch_step(17), UNIT, 3.0, 4.0, batch=batch)
    with pytest.raises(ValueError, match="expected a positive integer"):
        analyze({**batch_measurement(1), "batch": batch}, UNIT)


def test_fewer_rows_than_requests_are_refused():
    with pytest.raises(ValueError, match="3 rows verified per step at batch 4: every request verifies at least one"):
        ceiling(batch_step(3), UNIT, 1.0, 1.0, batch=4)


def batch_measurement(batch: int) -> dict:
    """The worker's Profile at `batch` of a chain (17 rows per request, τ 3) and best-first:63 (64
    rows, τ 4.5), every step at its floor (no time off the profile), the oracle at τ 4."""
    def row(policy, per_request, tau):
        t = floor_s(per_request * batch)
        return {"policy": policy, "rows": float(per_request * batch), "tau": tau, "t_step_s": t, "profiled_t_step_s": t,
                "kernels": {"target_linear": [t, W, F_ROW * per_request * batch], "other": [0.0, 0.0, 0.0]}}
    return {"current": "chain", "draft_len": 16, "t_ar_s": floor_s(batch), "replay": {"oracle": 4.0}, "batch": batch,
            "budgets": [row("chain", 17, 3.0), row("best-first:63", 64, 4.5)]}


def test_wide_trees_stop_paying_at_a_large_batch():
    one, sixteen = analyze(batch_measurement(1), UNIT), analyze(batch_measurement(16), UNIT)
    # batch 1: T_AR 1 ms; the chain's 17 rows cost the read (c 1), the tree's 64 cost 1.28e9 (c 1.28)
    assert [b["c"] for b in one["budgets"]] == pytest.approx([1.0, 1.28])
    assert [b["speedup"] for b in one["budgets"]] == pytest.approx([3.0, 4.5 / 1.28])
    assert one["best"] == "best-first:63" and one["direction"] == "tree"
    # batch 16: T_AR is still the read (16 rows, 3.2e8 FLOPs); 272 rows cost 5.44 ×, 1024 rows 20.48 ×
    assert [b["c"] for b in sixteen["budgets"]] == pytest.approx([5.44, 20.48])
    assert [b["speedup"] for b in sixteen["budgets"]] == pytest.approx([3.0 / 5.44, 4.5 / 20.48])
    assert sixteen["best"] == "chain" and sixteen["direction"] == "rows"
    assert [b["rows_per_request"] for b in sixteen["budgets"]] == [17.0, 64.0]
    assert sixteen["batch"] == 16 and sixteen["ceiling"]["batch"] == 16
    assert sixteen["ceiling"]["factors"]["rows"] == pytest.approx(272 / 64)
    assert sixteen["ceiling"]["per_class"][0]["bound"] == "rows" and one["ceiling"]["per_class"][0]["bound"] == "read"
    assert analyze({k: v for k, v in batch_measurement(1).items() if k != "batch"}, UNIT)["batch"] == 1  # absent: 1


def test_the_batch_axis_table_and_chart():
    out = [analyze(batch_measurement(b), UNIT) for b in (16, 1, 4)]
    table = cm.render_batch_table(out)
    lines = table.splitlines()
    batches = [int(line.split()[0]) for line in lines if line.split() and line.split()[0].isdigit()]
    assert batches == [1, 1, 4, 4, 16, 16, 1, 4, 16]  # budgets, then factors, in increasing batch
    best = [line.split()[1] for line in lines if "<- best" in line]
    assert best == ["best-first:63", "chain", "chain"]  # at batch 4: 3 / 1.36 = 2.21 against 4.5 / 5.12 = 0.88
    assert lines[-1].split()[-1] == "rows" and lines[-3].split()[-1] == "tree"
    svg = cm.render_batch_svg(out)
    root = ET.fromstring(svg)
    texts = [("".join(t.itertext())) for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert [t for t in texts if t.startswith("batch ")] == ["batch 1", "batch 4", "batch 16"]
    assert {"tree", "rows", "chain", "best-first:63"} <= set(texts)
    assert len(list(root.iter("{http://www.w3.org/2000/svg}polyline"))) == 2
    assert len(list(root.iter("{http://www.w3.org/2000/svg}circle"))) == 6
    with pytest.raises(ValueError, match="one analysis per batch size"):
        cm.render_batch_table([out[0], out[0]])


# --------------------------------------------------------------------------- two-level verification


def test_a_tlv_cycle_is_two_drafts_two_passes_and_the_glue():
    # the paper's H100 cycle, in ms: 2 × 1.05 + 11.5 + 14.9 + 1.6
    assert cm.tlv_cycle(1.05, 11.5, 14.9, 1.6) == pytest.approx(30.1)
    assert cm.speedup(11.67, 30.1, 10.0) == pytest.approx(11.67 / 3.01)  # τ per exact pass over T_cycle / T_AR
    # one exact pass commits both trees' paths at best: (6 + 6) / (30 / 10)
    assert cm.tlv_ceiling(6.0, 6.0, 30.0, 10.0) == pytest.approx(4.0)
    # a cycle twice as long as the step must commit twice the τ to break even
    assert cm.tlv_break_even(6.0, 15.0, 30.0) == pytest.approx(12.0)
    with pytest.raises(ValueError, match="exact pass positive"):
        cm.tlv_cycle(1.0, 1.0, 0.0)


def test_the_q_pass_share_scales_only_the_weight_read():
    k = {"target_linear": 8.0, "attention": 2.0, "drafter": 1.0}
    assert cm.quick_share(k, 16, 8) == pytest.approx(0.6)  # (2 + 8 · 8/16) / 10
    assert cm.quick_share(k, 12, 8) == pytest.approx((2 + 8 * 8 / 12) / 10)  # over a W12 exact pass
    assert cm.quick_share(k, 16, 16) == pytest.approx(1.0)  # a dense copy: no cheaper than the exact pass
    with pytest.raises(ValueError, match="exact pass"):
        cm.quick_share({"drafter": 1.0}, 16, 8)


def test_tlv_is_worth_proposing_only_where_the_q_pass_is_cheap():
    k = {"target_linear": 8.0, "attention": 2.0, "drafter": 1.0}  # T_step 12: 1 s off the classes (glue)
    cheap = cm.tlv_outlook(k, 12.0, 16, 8)
    assert cheap.best_gain == pytest.approx(24 / (12 + 1 + 6)) and cheap.worth  # ×1.26 ≥ ×1.25
    dense = cm.tlv_outlook(k, 12.0, 16, 16)
    assert dense.best_gain == pytest.approx(24 / 23) and not dense.worth
    assert "1.00 of the exact pass" in dense.why and "under the ×1.25" in dense.why
