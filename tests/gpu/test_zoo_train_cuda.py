"""Training the zoo's small models on CUDA: a drafter training step queues its work without waiting
for the device (no synchronizing call — a host-to-device copy, boolean indexing, a read — inside the
step, with the rows and anchors `train_drafter` draws for it), and training that replays one
captured CUDA graph per step (`fit(graph=True)`) follows the eager trajectory step for step."""

import warnings

import pytest
import torch

from specpilot.engine.drafters import FeatureDrafterNet
from specpilot.engine.synthetic import random_drafter_net, random_model, randomize, tiny_config
from specpilot.zoo import train

LAYERS = (0, 2, 3)
KINDS = ["sequential", "block", "block_markov"]


def setting():
    tgt = random_model(tiny_config("qwen3", vocab=61), seed=3, device="cuda")
    seqs = torch.randint(1, 61, (16, 24), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.no_grad():
        feats = tgt(seqs, feature_layers=LAYERS, logits=False).features.float()
    return tgt, seqs, feats


@pytest.mark.parametrize("kind", KINDS)
def test_a_drafter_training_step_never_waits_for_the_device(kind):
    tgt, seqs, feats = setting()
    net = random_drafter_net(kind, tgt.cfg, seed=9, block=6, target_layers=list(LAYERS)).cuda().train()
    emb, head = tgt.model.embed_tokens.weight.detach(), tgt.lm_head_weight.detach()
    idx, picks = train.drafter_batches(kind, seqs, 6, 6, 2, 8, 3, seed=5)

    def step(i):
        loss = train.drafter_loss(net, emb, head, seqs[idx[i]], feats[idx[i]], 6, None if picks is None else picks[i])
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


def trained_both_ways(train_once):
    """train_once(graph) → (loss, module); the graph run must capture (a failed capture warns)."""
    loss_eager, eager = train_once(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss_graph, graphed = train_once(True)
    return loss_eager, eager, loss_graph, graphed


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, moved_from: dict) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=1e-3, atol=1e-5, msg=name)
    # the weights did move: agreement is not two untouched copies
    assert any((a.state_dict()[k] - v).abs().max() > 1e-3 for k, v in moved_from.items())


@pytest.mark.parametrize("kind", KINDS)
def test_graph_captured_drafter_training_follows_the_eager_one(kind):
    """12 steps (3 eager, then 9 replays): a replay that read the captured step's rows, anchors or
    learning rate instead of its own would leave the weights lr-sized apart."""
    tgt, seqs, feats = setting()
    body = random_drafter_net("block", tgt.cfg, seed=9, block=6, target_layers=list(LAYERS)).cuda()
    cfg = random_drafter_net(kind, tgt.cfg, block=6, target_layers=list(LAYERS)).cfg
    init = randomize(FeatureDrafterNet(cfg), 1).cuda().state_dict()

    def once(graph):
        net = train.train_drafter(cfg, tgt, seqs, feats, 6, 12, 4, 3e-3, 1, kind, None, anchors=3,
                                  body=body if kind == "block_markov" else None, graph=graph)
        return None, net

    _, eager, _, graphed = trained_both_ways(once)
    moved = {k: v for k, v in init.items() if k.startswith("markov_")} if kind == "block_markov" else init
    assert_same_weights(eager, graphed, moved)


@pytest.mark.parametrize("muon", [False, True])
def test_graph_captured_lm_training_follows_the_eager_one(muon):
    """With `muon`, the blocks' matrices train with train.Muon (its lr a device tensor) beside AdamW."""
    stream = torch.randint(0, 61, (4000,), generator=torch.Generator().manual_seed(0))

    def once(graph):
        m = random_model(tiny_config("llama", vocab=61, hidden=32, layers=2), seed=0, device="cuda")
        loss = train.train_lm(m, stream, steps=12, batch=4, seq=32, lr=3e-3, seed=4, desc="t", log=None,
                              device="cuda", graph=graph, muon=muon)
        return loss, m

    loss_eager, eager, loss_graph, graphed = trained_both_ways(once)
    init = random_model(tiny_config("llama", vocab=61, hidden=32, layers=2), seed=0, device="cuda").state_dict()
    assert abs(loss_eager - loss_graph) < 1e-3 * abs(loss_eager)
    assert_same_weights(eager, graphed, init)


@pytest.mark.parametrize("family", ["qwen3", "sliding", "hybrid"])
def test_batched_greedy_continuations_on_cuda_equal_the_cpu_ones(family):
    """The distillation pass — a batch of prompts through a dynamic cache whose grouped query heads
    read it without copying it per group — writes on CUDA, in float64, the CPU's tokens."""
    cpu = random_model(tiny_config(family, vocab=97), seed=2, dtype=torch.float64)
    gpu = random_model(tiny_config(family, vocab=97), seed=2, dtype=torch.float64, device="cuda")
    assert gpu.cfg.num_attention_heads > gpu.cfg.num_key_value_heads
    prompts = torch.randint(1, 97, (6, 10), generator=torch.Generator().manual_seed(3))
    ref = train.greedy_continuations(cpu, prompts, 24, batch=4)
    got = train.greedy_continuations(gpu, prompts.cuda(), 24, batch=4).cpu()
    assert torch.equal(got, ref)


def test_a_step_that_cannot_be_captured_warns_and_trains_eagerly():
    """A loss that reads the device mid-step cannot be captured: fit warns and trains on eagerly,
    to the weights of an eager run."""
    x = torch.randn(12, 8, generator=torch.Generator().manual_seed(0)).cuda()
    w0 = torch.randn(8, generator=torch.Generator().manual_seed(1)).cuda()

    def run(graph):
        w = torch.nn.Parameter(w0.clone())

        def loss_fn(step):
            loss = ((x[step][0] * w).sum() - 1) ** 2
            float(loss)  # a host read: not allowed while a stream is capturing
            return loss

        train.fit([w], 12, 1e-2, loss_fn, "t", None, progress=False, graph=graph)
        return w.detach()

    ref = run(False)
    with pytest.warns(RuntimeWarning, match="could not be captured"):
        got = run(True)
    torch.testing.assert_close(got, ref)
