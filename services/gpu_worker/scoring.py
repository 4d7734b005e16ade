"""Teacher-forced scoring for token forcing (the GPU worker's side of `GpuWorker.Score`).

The scorer is the stock engine's target with its LM head applied in float32 (float64 when the
model itself runs in float64). A system's output is fed after its prompt in one cache-free pass;
for each output token the scorer reports its own argmax at that position, log p(token) and
log p(argmax). The controller turns these into mismatches and margins
(`specpilot.services.controller.forcing`); this module only computes them.

`Scores` mirrors the proto's `ScoredSequence` field names, so either can be handed to the
controller's pure logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specpilot.engine.checkpoint import load_model
from specpilot.engine.model import Model


@dataclass
class Scores:
    """One entry per output token (in order)."""

    argmax_token_ids: list[int] = field(default_factory=list)  # the scorer's argmax at that position
    token_logprob: list[float] = field(default_factory=list)  # log p(token)
    argmax_logprob: list[float] = field(default_factory=list)  # log p(argmax) >= log p(token)


def load_scorer(folder, device="cpu") -> Model:
    """The scorer: the target checkpoint in float32 (its LM head is then float32 too)."""
    return load_model(folder, torch.float32, device)


def head_dtype(model: Model) -> torch.dtype:
    """float32 for the LM head and log-softmax, float64 when the model already runs in float64."""
    return torch.float64 if model.dtype == torch.float64 else torch.float32


@torch.inference_mode()
def score(model: Model, prompt_ids: list[int], output_ids: list[int]) -> Scores:
    """Teacher-force prompt + output through `model` (no cache) and score every output token."""
    if not prompt_ids:
        raise ValueError("scoring needs a prompt of at least one token")
    n = len(output_ids)
    if n == 0:
        return Scores()
    vocab = model.cfg.vocab_size
    ids = list(prompt_ids) + list(output_ids)
    if min(ids) < 0 or max(ids) >= vocab:
        raise ValueError(f"token ids must lie in [0, {vocab}); got min {min(ids)}, max {max(ids)}")
    dev = model.lm_head_weight.device
    # The last output token predicts nothing we score: feed everything before it.
    tokens = torch.tensor([ids[:-1]], device=dev)
    last = model.cfg.num_hidden_layers - 1
    # The residual stream after the last layer is exactly what Model.forward feeds to the final
    # norm; take it as a feature instead of the model-dtype logits.
    hidden = model(tokens, feature_layers=(last,), logits=False).features[0, len(prompt_ids) - 1:]  # [n, H]
    hd = head_dtype(model)
    logits = F.linear(model.model.norm(hidden).to(hd), model.lm_head_weight.to(hd))  # [n, V]
    logp = torch.log_softmax(logits, dim=-1)
    best = logp.argmax(dim=-1)  # argmax of the log-probs themselves: log p(argmax) is their max
    target = torch.tensor(output_ids, device=dev)
    return Scores(
        argmax_token_ids=best.tolist(),
        token_logprob=logp.gather(1, target[:, None])[:, 0].double().tolist(),
        argmax_logprob=logp.gather(1, best[:, None])[:, 0].double().tolist(),
    )


def memo_scorer(model: Model):
    """`(prompt_ids, tokens) -> Scores` for the controller's forcing logic; each distinct output is
    scored once (stock's outputs are scored for Phase 0 and again for the report)."""
    memo: dict = {}

    def scorer(prompt_ids, tokens) -> Scores:
        key = (tuple(prompt_ids), tuple(tokens))
        if key not in memo:
            memo[key] = score(model, list(prompt_ids), list(tokens))
        return memo[key]

    return scorer
