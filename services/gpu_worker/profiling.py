"""The worker's Profile call: what the planner's cost model needs of one system, as plain data.

For the system's target and drafter, on the given prompts: T_AR (unprofiled AR steps), and per
budget (a tree policy: chain, best-first:N, ...) the mean τ, the unprofiled step wall time and the
profiled time by kernel class with bytes and FLOPs; then a recording of the system's own policy
and the τ that exact replay gives every policy asked for (the oracle included) on it.

A system without a drafter (mode "ar") has one step to split, the AR step itself: its one row has
policy "ar", one row verified, τ 1 and step wall time T_AR, with the profiled time by kernel class;
tree budgets and replay need a drafter's lattices, so there are none (`replay` is empty), and its
`draft_len` is 0 (the wire format's unset value).

At a batch of B requests (`batch` > 1) every row is measured where users run that batch: the
static driver's `generate_batch` (`profiler.profile_batch`), the prompts B at a time. A row's
`rows` is then the step's over the batch (B × the tree's rows), its τ the tokens per request per
step, its step time the batch's step, and T_AR the AR step at the same batch. Replay prices τ on a
recording at batch 1: a request's tokens and lattices do not depend on what shares its steps.
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


def _profiles(engine, prompts: list[list[int]], new_tokens: int, policy, batch: int, progress) -> list:
    """The profiled runs of one budget: one per prompt, or (batch > 1) one over the batches."""
    if batch > 1:
        try:
            from specpilot.engine.profiler import profile_batch
        except ImportError:  # a system built on an engine revision from before batched profiles
            raise ValueError(f"profile: batch {batch}: this engine revision profiles one request at a time") from None
        res = profile_batch(engine.target, prompts, new_tokens, batch, engine.drafter, engine.cfg.draft_len, policy,
                            logit_bias=engine.bias, lengths=getattr(engine, "lengths", None))
        if progress:
            progress(len(prompts))
        return [res]
    out = []
    for p in prompts:
        out.append(profile_generate(engine.target, p, new_tokens, engine.drafter, engine.cfg.draft_len, policy=policy))
        if progress:
            progress(1)
    return out


def _row(engine, prompts: list[list[int]], new_tokens: int, spec: str, policy, progress,
         batch: int = 1) -> tuple[dict, list[float]]:
    """One budget's row (rows per step, τ per request, unprofiled step wall, profiled split) and the
    T_AR of each profiled run."""
    steps, walls, t_ars = [], [], []
    for res in _profiles(engine, prompts, new_tokens, policy, batch, progress):
        steps += res.steps
        walls += res.reference_step_wall
        t_ars.append(res.t_ar)
    if not steps:
        raise ValueError("profile: no decode step ran (prompts empty or new_tokens too small)")
    m = mean_step(steps)
    requests = sum(getattr(s, "requests", 1) for s in steps)
    return {"policy": spec, "rows": _mean(s.n for s in steps), "tau": sum(s.tau for s in steps) / requests,
            "t_step_s": _mean(walls), "profiled_t_step_s": m.t_step,
            "kernels": {c: list(v) for c, v in m.kernels.items()}}, t_ars


def measure(engine, prompts: list[list[int]], new_tokens: int, budgets: list[str], replays: list[str],
            progress=None, batch: int = 1) -> dict:
    """`engine`: a loaded `Engine`; `batch`: the requests it decodes at once. An AR engine (no
    drafter) gets its one "ar" row and no replay; `budgets` and `replays` are then not used (they
    need a drafter)."""
    if not prompts:
        raise ValueError("profile: no prompts")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"profile: batch {batch!r}: expected a positive integer (requests decoded at once)")
    if batch > 1 and engine.cfg.driver == "eager":
        raise ValueError(f"profile: batch {batch}: driver 'eager' decodes one request at a time; batched decoding "
                         "runs the static driver (use driver 'auto' or 'static')")
    current = system_policy(engine.cfg)
    if engine.drafter is None:
        if batch == 1:
            generate(engine.target, prompts[0], new_tokens)  # warm-up, untimed (profile_batch warms its own)
        row, t_ars = _row(engine, prompts, new_tokens, AR, None, progress, batch)
        t_ar = _mean(t_ars)
        row["t_step_s"] = t_ar  # the AR step is the step: c = 1
        return {"current": AR, "draft_len": 0, "t_ar_s": t_ar, "budgets": [row], "replay": {},  # 0: no drafter
                "batch": batch}
    budgets = list(dict.fromkeys([current, *budgets]))
    if batch == 1:  # warm-up, untimed: the first passes pay for lazy loads, allocator growth and caches
        generate(engine.target, prompts[0], new_tokens, engine.drafter, engine.cfg.draft_len, policy=engine.policy)
        generate(engine.target, prompts[0], new_tokens)
    t_ars, rows = [], []
    for spec in budgets:
        row, ts = _row(engine, prompts, new_tokens, spec,
                       engine.policy if spec == current and engine.policy else make_policy(spec), progress, batch)
        rows.append(row)
        t_ars += ts
    record = []
    for p in prompts:
        generate(engine.target, p, new_tokens, engine.drafter, engine.cfg.draft_len,
                 policy=engine.policy, record=record)
    replayed = {spec: _mean(replay(record, spec)) for spec in dict.fromkeys([*replays, "oracle"])}
    return {"current": current, "draft_len": engine.cfg.draft_len, "t_ar_s": _mean(t_ars), "budgets": rows,
            "replay": replayed, "batch": batch}
