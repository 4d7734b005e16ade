"""A drafter training step on CUDA queues its work without waiting for the device: no
synchronizing call (a host-to-device copy, boolean indexing, a read) inside the step, with the
rows and anchors `train_drafter` draws for it, so the host runs ahead of the device as it does
for the targets."""

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
    idx, picks = train.drafter_batches(kind, seqs, 6, 6, 2, 8, 3, seed=5)

    def step(i):
        loss = train.drafter_loss(net, emb, head, seqs[idx[i]], feats[idx[i]], 6, picks[i] if picks else None)
        loss.backward()
        return loss.detach()

    step(0)  # warm-up: kernels, the mask cache
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = step(1)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(loss).item()
