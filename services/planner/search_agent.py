"""The built-in search agent (no LLM): candidates from the memory's variant registries.

Every variant of every ported entry is a candidate system: the incumbent's configuration with the
variant's options on top (a drafter named by kind, `kind:block_markov`, is mapped through the
deployment's `drafters`). A variant attacks the factor its options act on — the engine's
configuration options (mode, tree policy, draft length, drafter) all move τ, so they attack the
tree factor; the weight formats (`weights`, `lm_head`: W12, the certified head) and the driver
shrink the step's time at its bytes, so they attack the kernels factor — the weight read, which is
most of a step at one request; no option attacks the time off the profile (that takes code: the
command agent). The agent takes the round's direction first; when no variant attacks it, the
next-largest factor that has some.

A server incumbent (`specpilot.systemspec`: SGLang, vLLM, `specpilot serve engine`) takes only the
variants that carry `server_args` for its program (`server_program`): its speculative settings,
which attack the "server" factor; no replay or cost model predicts them (the server runs its steps
inside), so timing alone ranks them. Engine settings do not apply to it, nor server flags to our
engine.

A deployment without a drafter decodes AR: its incumbent has no drafter and no draft length. A
speculation variant is then a system only where it brings its drafter (`kind:X`, mapped through
`drafters`): a chain or tree variant that leaves the system without one is skipped with the reason.

A variant of those options that verifies fewer rows per request than the incumbent attacks the
rows factor instead: at a batch where every verified row costs compute (the cost model's "rows"
direction), fewer, better rows are what pays; where a step is the weight read it gives τ away for
nothing, and the cost model prunes it.

Pruning: where the variant keeps the incumbent's drafter and draft length, exact replay on the
incumbent's recording gives the variant's τ without running it, and the cost model's measured
step cost c(N) (interpolated in the rows verified, at the cost model's batch: N = batch × the
rows per request) its speedup. A variant whose replayed τ is no higher than the incumbent's while
it verifies no fewer rows, or whose predicted speedup falls short of the incumbent's by more than
`margin`, is pruned with the reason. The rest are ranked: predictions on a measured step cost
(the policy is one of the cost model's budgets) first, then those on an interpolated one (a policy
that builds its tree differently may cost more than its row count says), then variants with no
prediction; each group by predicted speedup. The best `max_candidates` are proposed.

Two-level verification (`mode: tlv`) attacks the tree factor past its one-pass ceiling: more τ
per exact pass, for a second draft and a Q pass a cycle. No replay predicts it; the cost model's
outlook (`costmodel.tlv_outlook`, from the incumbent's profile by kernel class) prunes it, with
the reason, unless a cycle that doubled τ per exact pass would gain `TLV_MIN_GAIN` — that is,
unless the Q pass is cheap relative to the exact pass. The engine's Q pass runs the view-only W12
GEMM (8 bits a weight): faster than the full one in CUDA graphs, but the Q pass TLV runs today is
eager and took ×1.70 the exact pass at the 8B shape (BENCHMARKS.md), so by default (`quick_bits`
None) the outlook prices it at the target's width, as dear as the exact pass, and refuses it;
`quick_bits=8` prices the 8 bits.

The batch's row selection (a shared node budget, `shared:N:C`; per-request draft lengths,
`draft_lens`; prompt admission, `admit_steps`, which AR batches take too) acts only where requests
share a step: its variants are skipped at batch 1 (the round ports them only from batch 2 on, by their `batch_min` limit), never predicted (replay and the
profile run one request at a time, which says nothing of how a batch shares its rows), and at
batch > 1 the best of them takes one of the `max_candidates` places when the others would fill
them all.
"""

from __future__ import annotations

import json

from specpilot.systemspec import is_server, server_program, with_options

from .agents import Candidate, Context
from .costmodel import tlv_outlook

# what a step verifies (the batch rules among them: what rows a busy batch's steps carry)
TREE_OPTIONS = frozenset({"mode", "tree", "draft_len", "draft_lens", "admit_steps", "drafter"})
KERNEL_OPTIONS = frozenset({"weights", "lm_head", "driver"})
DTYPE_BITS = {"bfloat16": 16, "float32": 32, "float64": 64}  # bits a dense weight of the dtype is read at
FACTOR_OF_DIRECTION = {"tree": "tree", "rows": "rows", "off-profile": "off_profile",
                       "server": "server"}  # "kernel:<class>" -> "kernels"


def direction_factor(direction: str) -> str:
    return "kernels" if direction.startswith("kernel:") else FACTOR_OF_DIRECTION[direction]


def rows_of(options: dict) -> int:
    """Rows a system verifies per step and request: the root plus its drafted nodes (AR: the root)."""
    if options.get("mode") == "ar":
        return 1
    if options.get("mode") == "tlv":  # each exact pass: C and the subtree, N nodes and the root
        return int(options.get("tlv_nodes", 32)) + 1
    if options.get("mode") == "tree":
        name, *args = options["tree"].split(":")
        if name in ("best-first", "topk", "sequoia", "shared"):  # shared: every lane plans the cap's rows
            return int(args[-1]) + 1
    return int(options.get("draft_len", 8)) + 1


def step_cost_at(rows: int, budgets: list[dict]) -> float:
    """c at `rows`, linear in the rows between measured budgets (beyond them: the nearest two)."""
    pts = sorted({b["rows"]: b["c"] for b in budgets if b["rows"] > 0}.items())
    if not pts:
        raise ValueError("the cost model has no budget with a known row count")
    if len(pts) == 1:
        return pts[0][1]
    i = next((j for j in range(1, len(pts)) if rows <= pts[j][0]), len(pts) - 1)
    (r0, c0), (r1, c1) = pts[i - 1], pts[i]
    return max(c0 + (c1 - c0) * (rows - r0) / (r1 - r0), 1e-9)


def server_mismatch(incumbent: dict, opts: dict) -> str | None:
    """Why a variant does not apply to the incumbent (None: it does): a server's flags on our
    engine, an engine setting on a server, or flags of another serving program."""
    if "server_args" not in opts:
        return "an engine setting; the incumbent is a server system" if is_server(incumbent) else None
    if not is_server(incumbent):
        return "a server's flags; the incumbent is our engine"
    want, have = opts.get("server_program"), server_program(incumbent)
    if want and want != have:
        return f"flags of {want}; the incumbent server runs {have or 'a program this cannot tell'}"
    return None


def policy_of(options: dict) -> str:
    return options["tree"] if options.get("mode") == "tree" else "chain"


def batch_rule(options: dict) -> bool:
    """A variant of the batch's row selection: a shared node budget, per-request draft lengths or
    prompt admission."""
    return "admit_steps" in options or drafting_rule(options)


def drafting_rule(options: dict) -> bool:
    """A batch rule that selects drafted rows (a shared budget, per-request draft lengths): AR has none."""
    return "draft_lens" in options or (options.get("mode") == "tree" and options.get("tree", "").startswith("shared:"))


class SearchAgent:
    name = "search"

    def __init__(self, max_candidates: int = 3, margin: float = 0.97, quick_bits: int | None = None):
        # quick_bits: the bits a weight the Q pass of two-level verification reads; None: priced at
        # the target's width (the eager Q pass is not yet cheaper than the exact pass)
        self.max_candidates, self.margin, self.quick_bits = max_candidates, margin, quick_bits
        self.last_log: dict = {}

    def _tlv_outlook(self, ctx: Context) -> str | None:
        """Why two-level verification cannot pay on the incumbent (None: it may): the cost model's
        outlook from the incumbent's profile by kernel class (costmodel.tlv_outlook)."""
        cm, inc = ctx.costmodel, ctx.incumbent
        per_class = cm.get("ceiling", {}).get("per_class")
        step = next((b.get("t_step_s") for b in cm.get("budgets", ()) if b["policy"] == cm.get("current")), None)
        if not per_class or not step:
            return "no profile by kernel class of the incumbent's step: the Q pass's cost cannot be predicted"
        dense = DTYPE_BITS.get(inc.get("dtype", "float32"), 32)
        weight_bits = 12 if inc.get("weights") == "w12" else dense
        try:
            out = tlv_outlook({r["class"]: r["seconds"] for r in per_class}, step, weight_bits,
                              self.quick_bits or dense)
        except ValueError as e:
            return f"the incumbent's profile has no exact pass to compare the Q pass with ({e})"
        return None if out.worth else f"cost model: {out.why}"

    def _instantiate(self, ctx: Context) -> tuple[list[tuple[str, Candidate]], list[dict]]:
        """(factor, candidate) per usable variant; skipped variants with their reason."""
        out, skipped = [], []
        drafters = ctx.deployment.get("drafters", {})
        batch = ctx.deployment.get("batch", 1)
        for entry in sorted(ctx.memory, key=lambda e: e["id"]):
            key = f"{entry['id']}@{entry['version']}"
            for variant, opts in sorted(entry.get("variants", {}).items()):
                name = f"{entry['id']}/{variant}"
                opts = dict(opts)
                why = server_mismatch(ctx.incumbent, opts)
                if why:
                    skipped.append({"name": name, "reason": why})
                    continue
                if is_server(ctx.incumbent):
                    system = with_options(ctx.incumbent, opts)
                    if system == ctx.incumbent:
                        skipped.append({"name": name, "reason": "the incumbent already runs it"})
                        continue
                    out.append(("server", Candidate(name=name, agent=self.name, options=opts, entry=key,
                                                    variant=variant, rationale=entry.get("title", ""))))
                    continue
                if str(opts.get("drafter", "")).startswith("kind:"):
                    kind = opts["drafter"][len("kind:"):]
                    if kind not in drafters:
                        skipped.append({"name": name, "reason": f"the deployment has no {kind} drafter "
                                                                f"(deployment.drafters has {sorted(drafters)})"})
                        continue
                    opts["drafter"] = drafters[kind]
                system = {**ctx.incumbent, **opts}
                if system.get("mode", "chain") != "ar" and not system.get("drafter"):
                    skipped.append({"name": name, "reason": f"mode {system.get('mode', 'chain')} needs a drafter; "
                                                            "the deployment has none (it decodes AR) and the "
                                                            "variant names none"})
                    continue
                if opts.get("tree", "").startswith("sequoia") and opts.get("mode") == "tree" \
                        and "profile" not in opts and not ctx.incumbent.get("profile"):
                    skipped.append({"name": name, "reason": "sequoia needs an acceptance profile file"})
                    continue
                if batch_rule(opts) and batch == 1:
                    skipped.append({"name": name, "reason": "a batch's row selection; the deployment decodes one "
                                                            "request at a time"})
                    continue
                if drafting_rule(opts) and system.get("mode", "chain") == "ar":
                    skipped.append({"name": name, "reason": "per-request draft lengths need speculation; the "
                                                            "system decodes AR"})
                    continue
                if system == ctx.incumbent:
                    skipped.append({"name": name, "reason": "the incumbent already runs it"})
                    continue
                if opts.get("mode") == "tlv" and batch > 1 and system.get("drafter") == "ngram":
                    skipped.append({"name": name, "reason": "two-level verification at a batch runs on the static "
                                                            "driver, which drafts on the device; the system's n-gram "
                                                            "drafter drafts on the host"})
                    continue
                factor = "tree" if set(opts) <= TREE_OPTIONS else "kernels" if set(opts) <= KERNEL_OPTIONS else "unknown"
                if opts.get("mode") == "tlv":  # more τ per exact pass, past the one-pass ceiling of the tree factor
                    factor = "tree"
                elif factor == "tree" and rows_of(system) < rows_of(ctx.incumbent):
                    factor = "rows"
                out.append((factor, Candidate(name=name, agent=self.name, options=opts, entry=key, variant=variant,
                                              rationale=entry.get("title", ""))))
        return out, skipped

    def _predict(self, cand: Candidate, ctx: Context) -> dict | None:
        cm, inc = ctx.costmodel, ctx.incumbent
        system = {**inc, **cand.options}
        if batch_rule(system) or system.get("mode") == "tlv":  # replay knows neither a batch nor a Q pass
            return None
        same_lattice = (system.get("drafter") == inc.get("drafter")
                        and system.get("draft_len") == cm.get("draft_len", inc.get("draft_len")))
        tau = cm.get("replay", {}).get(policy_of(system)) if same_lattice else None
        if tau is None:
            return None
        measured = next((b["c"] for b in cm["budgets"] if b["policy"] == policy_of(system)), None)
        c = measured if measured is not None else step_cost_at(rows_of(system) * cm.get("batch", 1), cm["budgets"])
        return {"tau": tau, "speedup": tau / c, "cost": "measured" if measured is not None else "interpolated"}

    def propose(self, ctx: Context) -> list[Candidate]:
        cands, skipped = self._instantiate(ctx)
        seen: dict[str, str] = {}  # one candidate per distinct system: the one with the fewest options
        for factor, c in sorted(cands, key=lambda fc: (len(fc[1].options), fc[1].name)):
            key = json.dumps(with_options(ctx.incumbent, c.options), sort_keys=True)
            if key in seen:
                skipped.append({"name": c.name, "reason": f"the same system as {seen[key]}"})
            else:
                seen[key] = c.name
        dup = {s["name"] for s in skipped}
        for _, c in cands:  # after the duplicates: a variant equal to a tried one is skipped as its duplicate
            if c.name in ctx.tried and c.name not in dup:
                skipped.append({"name": c.name, "reason": "evaluated in an earlier round"})
        cands = [(f, c) for f, c in cands if c.name not in dup and c.name not in ctx.tried]
        factors = ctx.costmodel["ceiling"]["factors"]
        first = direction_factor(ctx.direction)
        order = [first] + sorted((f for f in factors if f != first), key=lambda f: -factors[f])
        tau_now, speed_now = ctx.costmodel["tau_current"], ctx.costmodel["speedup_current"]
        pruned, kept = [], []
        tlv_why = self._tlv_outlook(ctx) if any(c.options.get("mode") == "tlv" for _, c in cands) else None
        for factor, c in cands:  # a kernel variant keeps τ and changes c: replay cannot predict it, timing will
            pred = self._predict(c, ctx) if factor in ("tree", "rows") else None
            c = Candidate(**{**c.to_dict(), "predicted": pred})
            if c.options.get("mode") == "tlv" and tlv_why:
                pruned.append((factor, c, f"two-level verification: {tlv_why}"))
            elif pred is not None and pred["tau"] <= tau_now + 1e-9 and factor == "tree":  # fewer rows may still pay
                pruned.append((factor, c, f"exact replay: τ {pred['tau']:.2f} is no higher than the incumbent's "
                                          f"{tau_now:.2f}"))
            elif pred is not None and pred["speedup"] < self.margin * speed_now:
                pruned.append((factor, c, f"cost model: predicted ×{pred['speedup']:.2f} over AR against the "
                                          f"incumbent's ×{speed_now:.2f}"))
            else:
                kept.append((factor, c))
        chosen, notes = [], []
        for factor in order:
            mine = [c for f, c in kept if f == factor]
            if not mine:
                notes.append(f"no untried memory variant attacks the {factor} factor (×{factors[factor]:.2f})")
                continue
            mine.sort(key=lambda c: (c.predicted is None, (c.predicted or {}).get("cost") != "measured",
                                     -(c.predicted or {}).get("speedup", 0.0), c.name))
            chosen = mine[: self.max_candidates]
            rules = [c for c in mine if batch_rule(c.options)]
            if rules and not any(batch_rule(c.options) for c in chosen):  # (only at batch > 1: skipped at 1)
                chosen = chosen[: self.max_candidates - 1] + rules[:1]
                notes.append(f"{rules[0].name}: the batch's row selection takes one of the {self.max_candidates} "
                             "places (replay cannot rank it)")
            notes.append(f"attacking the {factor} factor (×{factors[factor]:.2f}) with {len(chosen)} of "
                         f"{len(mine)} variants")
            break
        self.last_log = {"factor_order": order, "notes": notes, "skipped": skipped,
                         "pruned": [{**c.to_dict(), "pruned": why} for _, c, why in pruned]}
        return chosen
