"""The worker's Profile call: what the planner's cost model needs of one system, as plain data.

For the system's target and drafter, on the given prompts: T_AR (unprofiled AR steps), and per
budget (a tree policy: chain, best-first:N, ...) the mean τ, the unprofiled step wall time and the
profiled time by kernel class with bytes and FLOPs; then a recording of the system's own policy
and the τ that exact replay gives every policy asked for (the oracle included) on it.

A system without a drafter (mode "ar") has one step to split, the AR step itself: its one row has
policy "ar", one row verified, τ 1 and step wall time T_AR, with the profiled time by kernel class;
tree budgets and replay need a drafter's lattices, so there are none (`replay` is empty), and its
`draft_len` is 0 (the wire format's unset value).
"""

from __future__ import annotations

from specpilot.engine.decode import generate
from specpilot.engine.profiler import mean_step, profile_generate
from specpilot.engine.replay import make_policy, replay

AR = "ar"  # the policy name of an AR system's one row


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def system_policy(cfg) -> str:
    return AR if cfg.mode == "ar" else cfg.tree if cfg.mode == "tree" else "chain"


def _row(engine, prompts: list[list[int]], new_tokens: int, spec: str, policy, progress) -> tuple[dict, list[float]]:
    """One budget's row (mean τ, unprofiled step wall, profiled split) and the T_AR of each prompt."""
    steps, walls, t_ars = [], [], []
    for p in prompts:
        res = profile_generate(engine.target, p, new_tokens, engine.drafter, engine.cfg.draft_len, policy=policy)
        steps += res.steps
        walls += res.reference_step_wall
        t_ars.append(res.t_ar)
        if progress:
            progress(1)
    if not steps:
        raise ValueError("profile: no decode step ran (prompts empty or new_tokens too small)")
    m = mean_step(steps)
    return {"policy": spec, "rows": _mean(s.n for s in steps), "tau": _mean(s.tau for s in steps),
            "t_step_s": _mean(walls), "profiled_t_step_s": m.t_step,
            "kernels": {c: list(v) for c, v in m.kernels.items()}}, t_ars


def measure(engine, prompts: list[list[int]], new_tokens: int, budgets: list[str], replays: list[str],
            progress=None) -> dict:
    """`engine`: a loaded `Engine`. An AR engine (no drafter) gets its one "ar" row and no replay;
    `budgets` and `replays` are then not used (they need a drafter)."""
    if not prompts:
        raise ValueError("profile: no prompts")
    current = system_policy(engine.cfg)
    if engine.drafter is None:
        generate(engine.target, prompts[0], new_tokens)  # warm-up, untimed
        row, t_ars = _row(engine, prompts, new_tokens, AR, None, progress)
        t_ar = _mean(t_ars)
        row["t_step_s"] = t_ar  # the AR step is the step: c = 1
        return {"current": AR, "draft_len": 0, "t_ar_s": t_ar, "budgets": [row], "replay": {}}  # 0: no drafter
    budgets = list(dict.fromkeys([current, *budgets]))
    # warm-up, untimed: the first passes pay for lazy loads, allocator growth and caches
    generate(engine.target, prompts[0], new_tokens, engine.drafter, engine.cfg.draft_len, policy=engine.policy)
    generate(engine.target, prompts[0], new_tokens)
    t_ars, rows = [], []
    for spec in budgets:
        row, ts = _row(engine, prompts, new_tokens, spec,
                       engine.policy if spec == current and engine.policy else make_policy(spec), progress)
        rows.append(row)
        t_ars += ts
    record = []
    for p in prompts:
        generate(engine.target, p, new_tokens, engine.drafter, engine.cfg.draft_len,
                 policy=engine.policy, record=record)
    replayed = {spec: _mean(replay(record, spec)) for spec in dict.fromkeys([*replays, "oracle"])}
    return {"current": current, "draft_len": engine.cfg.draft_len, "t_ar_s": _mean(t_ars), "budgets": rows,
            "replay": replayed}
