"""Greedy decoding: autoregressive, and speculative: one target pass over [newest token + a draft
tree] (stock: the drafter's chain, Lattice.chain) under an ancestor mask, accept the deepest
root path whose every token equals the target's argmax at its parent, then the bonus token.
Output is token-for-token what AR produces (up to ties broken differently by different rounding).

With `tlv` (tlv.py, two-level verification) the tree comes from a cycle instead: a Q pass over
the drafter's tree picks a chain, a second draft from the chain's end grows it, and the one exact
pass verifies and commits it as it does any tree (the eager driver here; the static driver runs
the same cycle on the device, fast.FastDecoder._two_level, for drafters that draft there).

Two drivers share the model code: this module's eager one (the CPU, tests, the demo) and the
static-shape one in fast.py. `generate(driver=...)` picks one (`pick_driver`): "auto" takes the
static driver on a CUDA device when it runs the drafter and policy, else the eager one; "static"
and "eager" force one (the eager driver on a GPU, for diagnosis)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from . import trees
from .drafters import Drafter, Lattice
from .model import Model

MAX_TREE = 64  # verified rows of a tree pass at most (root included)
DRIVERS = ("auto", "static", "eager")
Policy = Callable[[int, Lattice], "trees.Tree"]


@dataclass
class StepRecord:
    """What one target pass saw: the lattice, the token room left, the accepted path length
    (root included, = τ), the verified tree's tokens and the target's argmax at each of its nodes,
    and the tokens the pass emitted (accepted + bonus)."""

    lattice: Lattice | None
    room: int
    tau: int
    tree_tokens: tuple[int, ...]
    argmax: list[int]
    emitted: list[int]


@dataclass
class Step:
    tau: int  # tokens committed by this target pass, bonus included
    drafted: int  # this request's draft nodes the pass verified (its share of a shared budget)
    t_draft: float
    t_verify: float
    t_commit: float
    rows: int = 0  # rows the pass verified: every lane's, padding and idle lanes included (0: not told)
    lanes: int = 1  # requests the pass decoded
    positions: int = 0  # drafted positions this request's tree could use (its draft length; 0: none drafted)
    t_quick: float = 0.0  # two-level verification: the Q pass before this exact pass (not in t_draft)
    chain: int = 0  # two-level verification: the rows of the Q pass's chain C the pass verified, root included


@dataclass
class Result:
    tokens: list[int]
    steps: list[Step] = field(default_factory=list)
    prefill_s: float = 0.0  # the prefill pass this request waited for
    prefill_with: int = 1  # requests admitted with it, between the same two steps (prefill_s is theirs together)
    prefill_steps: int = 0  # verify steps its prompt rode in (prompt admission; prefill_s: until its first token)
    decode_s: float = 0.0
    driver: str = "eager"  # the driver that decoded it: eager | static

    @property
    def tau_mean(self) -> float:
        return sum(s.tau for s in self.steps) / len(self.steps) if self.steps else 0.0


def clock(device) -> float:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def emit(out: list[int], new: list[int], eos: set[int], limit: int) -> bool:
    """Append tokens as AR would emit them; True once EOS or the token limit ends generation."""
    for t in new:
        out.append(t)
        if t in eos or len(out) >= limit:
            return True
    return False


def pick_driver(target: Model, drafter: Drafter | None, policy, driver: str = "auto", tlv=None) -> str:
    """The driver `generate` runs, "static" or "eager", for a choice in DRIVERS: "auto" is the
    static driver on a CUDA device where it runs this drafter and policy, or two-level
    verification `tlv` (fast.unsupported), else the eager one; "static" where it cannot run them
    is refused with the reason."""
    if driver not in DRIVERS:
        raise ValueError(f"driver {driver!r}: expected one of {DRIVERS}")
    if driver == "eager":
        return driver
    from . import fast

    why = fast.unsupported(drafter, policy, tlv)
    if driver == "static" and why:
        raise ValueError(f"driver 'static' cannot run {why}; use driver 'auto' or 'eager'")
    return "static" if driver == "static" or (target.lm_head_weight.device.type == "cuda" and not why) else "eager"


@torch.no_grad()
def generate(target: Model, prompt: list[int], max_new_tokens: int, drafter: Drafter | None = None,
             draft_len: int = 8, eos: set[int] | None = None, policy: Policy | None = None,
             record: list | None = None, logit_bias: torch.Tensor | None = None, driver: str = "auto",
             tlv=None) -> Result:
    """AR when drafter is None; else speculative decoding with `draft_len` drafted positions,
    verifying the tree that `policy` builds from each lattice (stock chain by default), or with
    `tlv` (a tlv.TwoLevel) the tree of a two-level cycle: the Q pass's chain and a second draft.
    `record`, when given, receives one `StepRecord` per target pass (see replay.py).
    `logit_bias` [V] is a planted defect for the controller's self-tests (added to the target's
    logits before every argmax); never set it otherwise. `driver`: auto | static | eager (see
    `pick_driver`); the result says which one ran."""
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    if tlv is not None:
        from .tlv import check_drafter

        check_drafter(drafter)
    driver = pick_driver(target, drafter, policy, driver, tlv)
    if max_new_tokens <= 0:
        return Result([], driver=driver)
    eos = set(target.cfg.eos_token_id) if eos is None else eos
    if driver == "static":  # the static-shape driver and, on CUDA, its graphs (fast.py)
        from . import fast

        dec = fast.decoder(target, drafter, draft_len, policy, logit_bias, len(prompt) + max_new_tokens, tlv=tlv)
        return dec.generate(prompt, max_new_tokens, eos, record)
    policy = policy or trees.chain
    dev = target.lm_head_weight.device
    lookahead = max(draft_len, MAX_TREE) if drafter is not None else 0  # a pass verifies ≤ this many rows
    max_len = len(prompt) + max_new_tokens + lookahead + 1
    cache = target.new_cache(max_len)
    feat_layers = drafter.target_layers if drafter is not None else ()
    res = Result([])

    t0 = clock(dev)
    greedy = logit_bias is None  # the defect's bias needs every logit; the certified head gives only the argmax
    out = target(torch.tensor([prompt], device=dev), cache, feature_layers=feat_layers, commit_all=True,
                 greedy=greedy)
    cache.commit(len(prompt))
    argmax_of = (lambda o: o.argmax[0]) if greedy else (lambda o: (o.logits[0] + logit_bias.to(o.logits)).argmax(-1))
    newest = int(argmax_of(out)[-1])
    if drafter is not None:
        drafter.reset(max_len)
        drafter.observe(list(prompt), list(prompt[1:]) + [newest],
                        out.features[0] if out.features is not None else None)
    t1 = clock(dev)
    res.prefill_s = t1 - t0
    done = emit(res.tokens, [newest], eos, max_new_tokens)

    while not done:
        ta = clock(dev)
        room = max_new_tokens - len(res.tokens) - 1  # drafting past the token limit is wasted work
        lattice = drafter.propose(min(draft_len, room)) if drafter is not None and room > 0 else None
        chain_rows, t_quick = 0, 0.0
        if lattice is None:
            tree = trees.Tree((newest,), (-1,))
        elif tlv is not None:  # the Q pass picks a chain and a second draft grows it (tlv.py)
            tree, chain_rows, t_quick = tlv.tree(cache, newest, lattice, drafter, draft_len, room, feat_layers)
        else:
            tree = policy(newest, lattice)
        tb = clock(dev)
        chain = tree.is_chain()
        positions = cache.length + torch.tensor([tree.depths], device=dev)
        out = target(torch.tensor([tree.tokens], device=dev), cache, positions=positions,
                     tree_mask=None if chain else tree.ancestor_mask(dev), feature_layers=feat_layers, greedy=greedy)
        argmax = argmax_of(out).tolist()
        tc = clock(dev)
        path = tree.accept(argmax)
        cache.commit(len(path), None if chain else path)
        committed = [tree.tokens[i] for i in path]
        emitted = committed[1:] + [argmax[path[-1]]]
        if record is not None:
            record.append(StepRecord(lattice, room, len(path), tree.tokens, [argmax[i] for i in range(len(tree))],
                                     emitted))
        newest = emitted[-1]
        done = emit(res.tokens, emitted, eos, max_new_tokens)
        td = clock(dev)
        if drafter is not None and not done:
            drafter.observe(committed, emitted, out.features[0, path] if out.features is not None else None)
        te = clock(dev)
        res.steps.append(Step(tau=len(path), drafted=len(tree) - 1, t_draft=(tb - ta) - t_quick + (te - td),
                              t_verify=tc - tb, t_commit=td - tc, rows=len(tree),
                              positions=lattice.positions if lattice is not None else 0, t_quick=t_quick,
                              chain=chain_rows))
    res.decode_s = clock(dev) - t1
    return res
