"""A drafter training step on CUDA queues its work without waiting for the device: no
synchronizing call (a host-to-device copy, boolean indexing, a read) inside the step, so the host
runs ahead of the device as it does for the targets."""

import pytest
import torch

from specpilot.engine.synthetic import random_drafter_net, random_model, tiny_config
from specpilot.zoo import train

LAYERS = (0, 2, 3)


@pytest.mark.parametrize("kind", ["sequential", "block", "block_markov"])
def test_a_drafter_training_step_never_waits_for_the_device(kind):
    tgt = random_model(tiny_config("qwen3", vocab=61), seed=3, device="cuda")
    net = random_drafter_net(kind, tgt.cfg, seed=9, block=6, target_layers=list(LAYERS)).cuda().train()
    seqs = torch.randint(1, 61, (16, 24), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        feats = tgt(seqs, feature_layers=LAYERS, logits=False).features.float()
    emb, head = tgt.model.embed_tokens.weight.detach(), tgt.lm_head_weight.detach()
    rows = torch.arange(0, 16, 2, device="cuda")
    picks = None if kind == "sequential" else [4, 9, 13]
    lo, hi = train.anchor_range(seqs.shape[1], 6, 6)
    assert picks is None or all(lo <= p <= hi for p in picks)

    def step():
        loss = train.drafter_loss(net, emb, head, seqs[rows], feats[rows], 6, picks)
        loss.backward()
        return loss.detach()

    step()  # warm-up: kernels, the mask cache
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(loss).item()
