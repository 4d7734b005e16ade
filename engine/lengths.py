"""Per-request draft length (`EngineConfig.draft_lens`, e.g. "16,12,8"): every step, each lane of the
static driver picks how many of the drafted positions its tree may use, on the device, from its
recent acceptance and its drafter's confidence; the lattice's later positions are masked before the
tree is built, so the tree's depth is capped to match and nothing past the lane's length can be
accepted (masked candidates are invalid rows, never accepted).

The rule, in three pure functions the captured step calls:
- `update`: a lane's recent acceptance, drafted tokens accepted (τ − 1) averaged with weight KEEP on
  its history; a request starts at the longest length's worth (it drafts long until measured);
- `pick`: the smallest length at least min(HEADROOM · recent + 1, confident positions), else the
  longest; a lane's confident positions are those along which its lattice's top-1 chain keeps a
  probability of at least P_MIN;
- `clip`: the lattice with positions at or past each lane's length removed.

The drafter still drafts every position and every lane still plans the decoder's rows (static
shapes): what a shorter length frees is tree nodes, which a shared budget (`shared:N:C`) gives to
other lanes. Lossless whatever the lengths: the rule only removes candidates.
"""

from __future__ import annotations

import math

import torch

KEEP = 0.5  # weight of a lane's history in its recent acceptance
HEADROOM = 2.0  # a lane drafts about twice what it accepted lately
P_MIN = 0.05  # the top-1 chain's probability below which the drafter is not confident


def parse(spec: str, draft_len: int) -> tuple[int, ...]:
    """'16,12,8' → (8, 12, 16): distinct lengths, each in 1..draft_len."""
    try:
        out = tuple(sorted({int(x) for x in spec.split(",")}))
    except (AttributeError, ValueError):
        out = ()
    if not out or out[0] < 1 or out[-1] > draft_len:
        raise ValueError(f"draft_lens {spec!r}: expected comma-separated lengths, each in 1..draft_len "
                         f"({draft_len}), e.g. '16,12,8'")
    return out


def start(options: torch.Tensor) -> torch.Tensor:
    """A new request's recent acceptance: enough that `pick` gives it the longest length."""
    return options[-1].double() / HEADROOM


def update(recent: torch.Tensor, tau: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """Every active lane's recent acceptance after a step that committed τ [B] (idle lanes: kept)."""
    return torch.where(active.bool(), KEEP * recent + (1 - KEEP) * (tau - 1).clamp_min(0), recent)


def confident(tokens: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """[B] the leading positions of each lattice (tokens, logp [B, m, k]) along which the top-1
    chain's probability, normalized over each position's candidates, stays at least P_MIN."""
    miss = tokens < 0
    node = torch.log_softmax(logp.double().masked_fill(miss, float("-inf")), -1).amax(-1)
    node = torch.nan_to_num(node, nan=float("-inf"))  # a position without candidates
    return (node.cumsum(-1) >= math.log(P_MIN)).sum(-1)


def pick(options: torch.Tensor, recent: torch.Tensor, sure: torch.Tensor) -> torch.Tensor:
    """Each lane's length [B]: the smallest of `options` (ascending, [L]) at least its need."""
    need = torch.minimum(HEADROOM * recent + 1, sure.double())
    fits = options[None, :] >= need[:, None]  # [B, L]
    first = torch.where(fits.any(1), fits.long().argmax(1), options.shape[0] - 1)
    return options[first]


def clip(tokens: torch.Tensor, logp: torch.Tensor, lengths: torch.Tensor):
    """The lattices [B, m, k] without the positions at or past each lane's length [B]."""
    past = torch.arange(tokens.shape[1], device=tokens.device)[None, :] >= lengths[:, None]  # [B, m]
    return tokens.masked_fill(past[..., None], -1), logp.masked_fill(past[..., None], float("-inf"))
