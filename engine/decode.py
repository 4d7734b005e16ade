"""Greedy decoding: autoregressive, and stock speculative (chain of the drafter's top-1 tokens,
one target pass over [newest token + chain], accept the longest prefix that equals the target's
argmax, then the bonus token). Output is token-for-token what AR produces (up to ties broken
differently by different rounding: see DESIGN.md §3)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .drafters import Drafter
from .model import Model


@dataclass
class Step:
    tau: int  # tokens committed by this target pass, bonus included
    drafted: int
    t_draft: float
    t_verify: float
    t_commit: float


@dataclass
class Result:
    tokens: list[int]
    steps: list[Step] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def tau_mean(self) -> float:
        return sum(s.tau for s in self.steps) / len(self.steps) if self.steps else 0.0


def _clock(device) -> float:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _emit(out: list[int], new: list[int], eos: set[int], limit: int) -> bool:
    """Append tokens as AR would emit them; True once EOS or the token limit ends generation."""
    for t in new:
        out.append(t)
        if t in eos or len(out) >= limit:
            return True
    return False


@torch.no_grad()
def generate(target: Model, prompt: list[int], max_new_tokens: int, drafter: Drafter | None = None,
             draft_len: int = 8, eos: set[int] | None = None) -> Result:
    """AR when drafter is None, else stock chain speculative decoding with `draft_len` positions."""
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    if max_new_tokens <= 0:
        return Result([])
    eos = set(target.cfg.eos_token_id) if eos is None else eos
    dev = target.lm_head_weight.device
    lookahead = draft_len if drafter is not None else 0
    max_len = len(prompt) + max_new_tokens + lookahead + 1
    cache = target.new_cache(max_len)
    feat_layers = drafter.target_layers if drafter is not None else ()
    res = Result([])

    t0 = _clock(dev)
    out = target(torch.tensor([prompt], device=dev), cache, feature_layers=feat_layers)
    cache.commit(len(prompt))
    newest = int(out.logits[0, -1].argmax())
    if drafter is not None:
        drafter.reset(max_len)
        drafter.observe(list(prompt), list(prompt[1:]) + [newest],
                        out.features[0] if out.features is not None else None)
    t1 = _clock(dev)
    res.prefill_s = t1 - t0
    done = _emit(res.tokens, [newest], eos, max_new_tokens)

    while not done:
        ta = _clock(dev)
        room = max_new_tokens - len(res.tokens) - 1  # drafting past the token limit is wasted work
        chain = drafter.propose(min(draft_len, room)).chain() if drafter is not None and room > 0 else []
        tb = _clock(dev)
        out = target(torch.tensor([[newest] + chain], device=dev), cache, feature_layers=feat_layers)
        pred = out.logits[0].argmax(-1).tolist()
        tc = _clock(dev)
        n = 0
        while n < len(chain) and chain[n] == pred[n]:
            n += 1
        cache.commit(n + 1)
        committed, emitted = [newest] + chain[:n], chain[:n] + [pred[n]]
        newest = pred[n]
        done = _emit(res.tokens, emitted, eos, max_new_tokens)
        td = _clock(dev)
        if drafter is not None and not done:
            drafter.observe(committed, emitted, out.features[0, : n + 1] if out.features is not None else None)
        te = _clock(dev)
        res.steps.append(Step(tau=n + 1, drafted=len(chain), t_draft=(tb - ta) + (te - td),
                              t_verify=tc - tb, t_commit=td - tc))
    res.decode_s = _clock(dev) - t1
    return res
