"""The worker's Profile call: what the planner's cost model needs of one system, as plain data.

For the system's target and drafter, on the given prompts: T_AR (unprofiled AR steps), and per
budget (a tree policy: chain, best-first:N, ...) the mean τ, the unprofiled step wall time and the
profiled time by kernel class with bytes and FLOPs; then a recording of the system's own policy
and the τ that exact replay gives every policy asked for (the oracle included) on it.
"""

from __future__ import annotations

from specpilot.engine.decode import generate
from specpilot.engine.profiler import mean_step, profile_generate
from specpilot.engine.replay import make_policy, replay


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def system_policy(cfg) -> str:
    return cfg.tree if cfg.mode == "tree" else "chain"


def measure(engine, prompts: list[list[int]], new_tokens: int, budgets: list[str], replays: list[str],
            progress=None) -> dict:
    """`engine`: a loaded `Engine` (not AR: the cost model splits a speculative system's step)."""
    if engine.drafter is None:
        raise ValueError("profile: the system decodes AR (mode 'ar'); the cost model needs a drafter")
    current = system_policy(engine.cfg)
    budgets = list(dict.fromkeys([current, *budgets]))
    if not prompts:
        raise ValueError("profile: no prompts")
    # warm-up, untimed: the first passes pay for lazy loads, allocator growth and caches
    generate(engine.target, prompts[0], new_tokens, engine.drafter, engine.cfg.draft_len, policy=engine.policy)
    generate(engine.target, prompts[0], new_tokens)
    t_ars, rows = [], []
    for spec in budgets:
        steps, walls = [], []
        for p in prompts:
            res = profile_generate(engine.target, p, new_tokens, engine.drafter, engine.cfg.draft_len,
                                   policy=engine.policy if spec == current and engine.policy else make_policy(spec))
            steps += res.steps
            walls += res.reference_step_wall
            t_ars.append(res.t_ar)
            if progress:
                progress(1)
        if not steps:
            raise ValueError("profile: no decode step ran (prompts empty or new_tokens too small)")
        m = mean_step(steps)
        rows.append({"policy": spec, "rows": _mean(s.n for s in steps), "tau": _mean(s.tau for s in steps), "t_step_s": _mean(walls),
                     "profiled_t_step_s": m.t_step,
                     "kernels": {c: list(v) for c, v in m.kernels.items()}})
    record = []
    for p in prompts:
        generate(engine.target, p, new_tokens, engine.drafter, engine.cfg.draft_len,
                 policy=engine.policy, record=record)
    replayed = {spec: _mean(replay(record, spec)) for spec in dict.fromkeys([*replays, "oracle"])}
    return {"current": current, "draft_len": engine.cfg.draft_len, "t_ar_s": _mean(t_ars), "budgets": rows,
            "replay": replayed}
