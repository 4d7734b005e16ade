"""The engine on CUDA: the same logits as on the CPU, lossless speculative decoding, and the
CUDA-graph decode path emitting what the eager path emits."""

import pytest
import torch

from specpilot.engine.decode import generate
from specpilot.engine.drafters import DraftLM, FeatureDrafter
from specpilot.engine.graphs import StaticDecoder
from specpilot.engine.synthetic import FAMILIES, perturbed, random_drafter_net, random_model, tiny_config


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_logits_match_cpu(family):
    cpu = random_model(tiny_config(family, vocab=211), seed=1)
    gpu = random_model(tiny_config(family, vocab=211), seed=1, device="cuda")
    x = torch.randint(0, 211, (2, 37), generator=torch.Generator().manual_seed(0))
    ref = cpu(x).logits
    got = gpu(x.cuda()).logits.cpu()
    assert ((got - ref).abs().max() / ref.abs().max()) < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["block_markov", "sequential", "draft_lm"])
def test_cuda_speculative_equals_ar_float64(family, kind):
    tgt = random_model(tiny_config(family, vocab=97), seed=2, dtype=torch.float64, device="cuda")
    if kind == "draft_lm":
        base = tgt if not tgt.cfg.is_hybrid else random_model(tiny_config("llama", vocab=97), 2, torch.float64, "cuda")
        d = DraftLM(perturbed(base, 3, 0.2))
    else:
        d = FeatureDrafter(random_drafter_net(kind, tgt.cfg, seed=4, dtype=torch.float64).cuda(), tgt)
    for prompt in ([1, 2, 3, 1, 2, 3], list(range(20, 50))):
        assert generate(tgt, prompt, 48, d, draft_len=6).tokens == generate(tgt, prompt, 48).tokens


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("compile", [False, True])
def test_cuda_graph_decoder_equals_eager(family, compile):
    if compile and family != "llama":
        pytest.skip("compiling every family is slow; llama covers the compiled graph path")
    m = random_model(tiny_config(family, vocab=97), seed=5, dtype=torch.float64, device="cuda")
    dec = StaticDecoder(m, 128, graph=True, compile=compile)
    for prompt in ([4, 5, 6], list(range(30, 60))):
        assert dec.generate(prompt, 40, eos=set()).tokens == generate(m, prompt, 40, eos=set()).tokens


@pytest.mark.parametrize("family", ["llama", "hybrid"])
def test_cuda_tree_verification_is_lossless(family):
    from specpilot.engine.replay import make_policy

    tgt = random_model(tiny_config(family, vocab=53), seed=6, dtype=torch.float64, device="cuda")
    d = FeatureDrafter(random_drafter_net("block_markov", tgt.cfg, seed=8, dtype=torch.float64, block=8).cuda(), tgt)
    for prompt in ([1, 2, 3, 1, 2, 3], list(range(10, 40))):
        spec = generate(tgt, prompt, 48, d, draft_len=8, policy=make_policy("best-first:24"))
        assert spec.tokens == generate(tgt, prompt, 48).tokens
