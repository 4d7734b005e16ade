"""The engine on CUDA: the same logits as on the CPU; the static-shape driver (engine/fast.py) in
CUDA graphs emitting what it emits without them and what AR emits, for every family, drafter kind
and tree policy; one device→host read per step."""

import gc
import warnings
import weakref

import pytest
import torch

from specpilot.engine import fast
from specpilot.engine.decode import generate
from specpilot.engine.drafters import DraftLM, FeatureDrafter, NgramDrafter
from specpilot.engine.fast import FastDecoder
from specpilot.engine.replay import make_policy
from specpilot.engine.synthetic import FAMILIES, perturbed, random_drafter_net, random_model, tiny_config

PROMPTS = ([1, 2, 3, 1, 2, 3], list(range(20, 50)))


def drafter(kind, tgt, seed=4):
    if kind == "draft_lm":
        base = tgt if not tgt.cfg.is_hybrid else random_model(tiny_config("llama", vocab=tgt.cfg.vocab_size), 2,
                                                              tgt.dtype, "cuda")
        return DraftLM(perturbed(base, 3, 0.05))
    if kind == "ngram":
        return NgramDrafter()
    return FeatureDrafter(random_drafter_net(kind, tgt.cfg, seed=seed, dtype=tgt.dtype, block=8).cuda(), tgt)


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_logits_match_cpu(family):
    cpu = random_model(tiny_config(family, vocab=211), seed=1)
    gpu = random_model(tiny_config(family, vocab=211), seed=1, device="cuda")
    x = torch.randint(0, 211, (2, 37), generator=torch.Generator().manual_seed(0))
    ref = cpu(x).logits
    got = gpu(x.cuda()).logits.cpu()
    assert ((got - ref).abs().max() / ref.abs().max()) < 1e-4


def cpu_ar(family, seed, vocab, prompt, n, eos=None):
    """AR tokens of the eager driver on the CPU twin of a CUDA test model (float64)."""
    return generate(random_model(tiny_config(family, vocab=vocab), seed=seed, dtype=torch.float64), prompt, n,
                    eos=eos).tokens


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["block_markov", "sequential", "draft_lm", "ngram"])
def test_graphs_equal_ar_float64(family, kind, monkeypatch):
    """generate on CUDA = the static driver in graphs (not compiled here: see below)."""
    monkeypatch.setenv("SPECPILOT_COMPILE", "0")
    tgt = random_model(tiny_config(family, vocab=97), seed=2, dtype=torch.float64, device="cuda")
    d = drafter(kind, tgt)
    for prompt in PROMPTS:
        ar = cpu_ar(family, 2, 97, prompt, 48)
        assert generate(tgt, prompt, 48).tokens == ar
        for policy in (None, make_policy("best-first:24"), make_policy("topk:4:16")):
            assert generate(tgt, prompt, 48, d, draft_len=8, policy=policy).tokens == ar


def test_cuda_takes_the_static_driver(monkeypatch):
    """driver auto on CUDA: the static driver (the result says so); eager forced: the same tokens."""
    monkeypatch.setenv("SPECPILOT_COMPILE", "0")
    tgt = random_model(tiny_config("llama", vocab=97), seed=2, dtype=torch.float64, device="cuda")
    d = drafter("block_markov", tgt)
    auto = generate(tgt, PROMPTS[0], 32, d, 8, policy=make_policy("best-first:24"))
    eager = generate(tgt, PROMPTS[0], 32, d, 8, policy=make_policy("best-first:24"), driver="eager")
    assert (auto.driver, eager.driver) == ("static", "eager")
    assert auto.tokens == eager.tokens == cpu_ar("llama", 2, 97, PROMPTS[0], 32)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("compile", [False, True])
def test_a_target_on_the_second_gpu_runs_there(compile):
    """A target on cuda:1 while cuda:0 is current: the decoder allocates, captures and
    synchronizes on cuda:1 (nothing lands on cuda:0) and emits AR's tokens."""
    torch.cuda.set_device(0)
    tgt = random_model(tiny_config("hybrid", vocab=97), seed=2, dtype=torch.float64, device="cuda:1")
    d = FeatureDrafter(random_drafter_net("block_markov", tgt.cfg, seed=4, dtype=tgt.dtype, block=8).to("cuda:1"),
                       tgt)
    torch.cuda.synchronize(0)
    before = torch.cuda.memory_allocated(0)
    for policy in (None, make_policy("best-first:24")):
        dec = FastDecoder(tgt, d, 8, policy, max_len=256, graphs=True, compile=compile)
        for prompt in PROMPTS:
            assert dec.generate(prompt, 48, eos=set()).tokens == cpu_ar("hybrid", 2, 97, prompt, 48, eos=set())
    assert torch.cuda.current_device() == 0
    assert torch.cuda.memory_allocated(0) == before


@pytest.mark.parametrize("compile", [False, True])
def test_cuda_decoders_die_with_their_target(compile, monkeypatch):
    """The decoders `generate` keeps for a target (buffers, CUDA graph and its pool) are freed
    with the target."""
    monkeypatch.setenv("SPECPILOT_COMPILE", "1" if compile else "0")
    tgt = random_model(tiny_config("llama", vocab=97), seed=2, device="cuda")
    d = drafter("block_markov", tgt)
    dec = fast.decoder(tgt, d, 8, make_policy("best-first:16"), None, 128)
    assert dec.graph is not None and dec.compile == compile
    dec.generate(PROMPTS[0], 16)
    gone = weakref.ref(dec)
    del dec, tgt, d
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("family", ["llama", "hybrid"])  # compiling is slow: one dense, one hybrid family
def test_compiled_graphs_equal_eager_float32(family):
    """torch.compile + graphs against the same driver run eagerly, float32: the same tokens."""
    tgt = random_model(tiny_config(family, vocab=97), seed=5, device="cuda")
    d = drafter("block_markov", tgt)
    for policy in (make_policy("best-first:24"),):
        fast = FastDecoder(tgt, d, 8, policy, max_len=256, graphs=True, compile=True)
        slow = FastDecoder(tgt, d, 8, policy, max_len=256, graphs=False, compile=False)
        for prompt in PROMPTS:
            a, b = fast.generate(prompt, 48, eos=set()), slow.generate(prompt, 48, eos=set())
            assert a.tokens == b.tokens
            assert [s.tau for s in a.steps] == [s.tau for s in b.steps]


@pytest.mark.parametrize("family", ["llama", "hybrid"])
def test_compiled_tree_verification_is_lossless_float64(family):
    tgt = random_model(tiny_config(family, vocab=53), seed=6, dtype=torch.float64, device="cuda")
    d = drafter("block_markov", tgt, seed=8)
    fast = FastDecoder(tgt, d, 8, make_policy("best-first:24"), max_len=256, graphs=True, compile=True)
    for prompt in PROMPTS:
        assert fast.generate(prompt, 48).tokens == cpu_ar(family, 6, 53, prompt, 48)


@pytest.mark.parametrize("kind", ["block_markov", "ngram", None])
def test_one_host_read_per_step(kind, monkeypatch):
    """Device → host copies during a request, as CUPTI records them: the prefill's first token,
    then one per step (device drafters and AR read each step's result while the next one runs)."""
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setenv("SPECPILOT_COMPILE", "0")
    tgt = random_model(tiny_config("llama", vocab=97), seed=2, device="cuda")
    d = drafter(kind, tgt) if kind else None
    dec = FastDecoder(tgt, d, 8, make_policy("best-first:16") if d else None, max_len=256)
    dec.generate(PROMPTS[1], 8)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        res = dec.generate(PROMPTS[1], 40, eos=set())
        torch.cuda.synchronize()
    d2h = [e for e in prof.events() if "DtoH" in e.name or "Device -> Host" in e.name]
    pipelined = 1 if kind != "ngram" else 0  # the step launched past the end copies its result too
    assert len(d2h) == 1 + len(res.steps) + pipelined, sorted({e.name for e in prof.events()})[:40]


def test_compiler_failure_falls_back_to_the_uncompiled_step(monkeypatch):
    """A torch.compile that fails at the first call (as inductor did for one hybrid shape) costs
    the speed of compiling, not the decode: one warning, then the same tokens as AR."""
    def broken(fn, **_):
        def call(*a, **k):
            raise RuntimeError("inductor: The argument '-1 + ((0))' is not comparable")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    tgt = random_model(tiny_config("hybrid", vocab=53), seed=6, dtype=torch.float64, device="cuda")
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        dec = FastDecoder(tgt, drafter("block_markov", tgt, seed=8), 8, make_policy("best-first:24"), max_len=256,
                          graphs=True, compile=True)
    for prompt in PROMPTS:
        assert dec.generate(prompt, 48).tokens == cpu_ar("hybrid", 6, 53, prompt, 48)


@pytest.mark.parametrize("family", ["llama", "hybrid"])
def test_compiled_training_matches_eager(family):
    """zoo training with compile=True (the small recipe's `compile_target`) takes the same steps as
    eager training: same final loss and parameters up to float32 reordering."""
    from specpilot.zoo import train

    def once(compile):
        m = random_model(tiny_config(family, vocab=97, hidden=64, layers=4), seed=0, device="cuda")
        stream = torch.randint(0, 97, (4000,), generator=torch.Generator().manual_seed(0)).cuda()
        loss = train.train_lm(m, stream, steps=6, batch=4, seq=32, lr=1e-3, seed=4, desc="t", log=None,
                              device="cuda", compile=compile)
        return loss, torch.cat([p.detach().flatten() for p in m.parameters()])
    init = torch.cat([p.detach().flatten() for p in random_model(
        tiny_config(family, vocab=97, hidden=64, layers=4), seed=0, device="cuda").parameters()])
    l_eager, p_eager = once(False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        l_comp, p_comp = once(True)
    assert not [w for w in caught if "torch.compile failed" in str(w.message)]  # it did compile
    assert abs(l_eager - l_comp) < 1e-2 * abs(l_eager)
    # bf16 autocast rounds differently in fused kernels and AdamW turns the tiniest gradients into
    # full-size steps either way: the runs agree well within how far they moved (seen on an H200:
    # 3 % dense, 7 % hybrid; a wrong gradient would be of the order of the movement itself)
    assert (p_eager - p_comp).abs().mean() < 0.2 * (p_eager - init).abs().mean()


def test_compiled_training_failure_trains_eagerly(monkeypatch):
    from specpilot.zoo import train

    def broken(fn, **_):
        def call(*a, **k):
            raise RuntimeError("inductor failed")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    def once(compile):
        m = random_model(tiny_config("llama", vocab=97), seed=0, device="cuda")
        stream = torch.randint(0, 97, (2000,), generator=torch.Generator().manual_seed(0)).cuda()
        return train.train_lm(m, stream, steps=3, batch=2, seq=16, lr=1e-3, seed=4, desc="t", log=None,
                              device="cuda", compile=compile)
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        fell_back = once(True)
    eager = once(False)  # the same steps as training eagerly from the start (up to CUDA's atomics)
    assert abs(fell_back - eager) < 1e-3 * abs(eager)


def test_triton_delta_rule_matches_the_torch_form_at_the_training_shape():
    """kernels/gdn_chunk.py on the GPU (TF32 dots) against engine/gdn.py's chunked rule in float32:
    outputs, final state and every input's gradient, at the small recipe's head shape."""
    from specpilot.engine.gdn import chunked_gated_delta_rule as reference
    from specpilot.kernels.gdn_chunk import chunked_gated_delta_rule as fused

    g0 = torch.Generator(device="cuda").manual_seed(0)
    B, T, H, K = 4, 500, 8, 64
    q = torch.randn(B, T, H, K, device="cuda", generator=g0)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device="cuda", generator=g0), dim=-1)
    v = torch.randn(B, T, H, K, device="cuda", generator=g0)
    g = -torch.rand(B, T, H, device="cuda", generator=g0) * 0.7
    beta = torch.rand(B, T, H, device="cuda", generator=g0)
    h = torch.randn(B, H, K, K, device="cuda", generator=g0) * 0.3
    a = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h)]
    b = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h)]
    (o1, h1), (o2, h2) = fused(*a), reference(*b)
    wo, wh = torch.randn_like(o1), torch.randn_like(h1)
    ((o1 * wo).sum() + (h1 * wh).sum()).backward()
    ((o2 * wo).sum() + (h2 * wh).sum()).backward()
    rel = lambda x, y: float((x - y).abs().max() / y.abs().max())
    assert rel(o1, o2) < 1e-2 and rel(h1, h2) < 1e-2
    for x, y in zip(a, b):
        assert rel(x.grad, y.grad) < 2e-2


def test_compiled_hybrid_training_with_the_triton_rule_matches_the_torch_rule():
    """The recipe's `triton_gdn` path (the kernels as custom ops inside per-block compiled graphs)
    takes the same steps as the torch rule, as compiled and eager training agree above (heads of
    16: Triton's dots need 16 rows and columns at least)."""
    from specpilot.zoo import train

    def once(triton_rule):
        m = random_model(tiny_config("hybrid", vocab=97, hidden=128, layers=4), seed=0, device="cuda")
        for blk in m.model.layers:
            if hasattr(blk, "linear_attn"):
                blk.linear_attn.triton_rule = triton_rule
        stream = torch.randint(0, 97, (4000,), generator=torch.Generator().manual_seed(0)).cuda()
        loss = train.train_lm(m, stream, steps=6, batch=4, seq=64, lr=1e-3, seed=4, desc="t", log=None,
                              device="cuda", compile=True)
        return loss, torch.cat([p.detach().flatten() for p in m.parameters()])
    init = torch.cat([p.detach().flatten() for p in random_model(
        tiny_config("hybrid", vocab=97, hidden=128, layers=4), seed=0, device="cuda").parameters()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        l_torch, p_torch = once(False)
        l_triton, p_triton = once(True)
    assert not [w for w in caught if "torch.compile failed" in str(w.message)]
    assert abs(l_torch - l_triton) < 1e-2 * abs(l_torch)
    assert (p_torch - p_triton).abs().mean() < 0.2 * (p_torch - init).abs().mean()


@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("family", ["llama", "hybrid"])
def test_captured_two_level_cycles_equal_ar_float64_with_one_read_per_step(family, compile):
    """Two-level verification in the static driver's captured step (its Q pass through the W12
    views of the weights rounded to bf16): AR's tokens, alone and at batch, one read per step."""
    from torch.profiler import ProfilerActivity, profile

    from specpilot.engine.tlv import TwoLevel

    tgt = random_model(tiny_config(family, vocab=97), seed=2, dtype=torch.float64, device="cuda")
    tl = TwoLevel(tgt, 16, 4, round_bf16=True)
    dec = FastDecoder(tgt, drafter("block_markov", tgt), 8, None, max_len=256, graphs=True, compile=compile, tlv=tl)
    for prompt in PROMPTS:
        assert dec.generate(prompt, 48, eos=set()).tokens == cpu_ar(family, 2, 97, prompt, 48, eos=set())
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        res = dec.generate(PROMPTS[1], 40, eos=set())
        torch.cuda.synchronize()
    d2h = [e for e in prof.events() if "DtoH" in e.name or "Device -> Host" in e.name]
    assert len(d2h) == 1 + len(res.steps) + 1
    lanes = FastDecoder(tgt, drafter("block_markov", tgt), 8, None, max_len=256, graphs=True, compile=compile,
                        lanes=2, tlv=tl)
    got = lanes.generate_batch(list(PROMPTS) + [[5, 6]], [48, 30, 20], eos=set())
    assert [r.tokens for r in got] == [cpu_ar(family, 2, 97, p, n, eos=set())
                                       for p, n in zip(list(PROMPTS) + [[5, 6]], [48, 30, 20])]
