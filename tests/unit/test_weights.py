"""Weight formats of the target (engine/weights.py): W12 layer projections and a W12 LM head give
the dense model's tokens, token for token in float64, for every family, AR and speculative, on
both drivers; they refuse weights that are not bf16 values."""

import copy

import pytest
import torch

from specpilot.engine.decode import generate
from specpilot.engine.drafters import DraftLM
from specpilot.engine.fast import FastDecoder
from specpilot.engine.synthetic import FAMILIES, perturbed, random_model, tiny_config
from specpilot.engine.replay import make_policy
from specpilot.engine.weights import apply
from specpilot.kernels.w12.format import W12Error
from specpilot.kernels.w12.linear import W12Linear, convert


def bf16_valued(model):
    """The model with every parameter rounded to a bf16 value (kept in float64)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    return model


def models(family, seed=0):
    dense = bf16_valued(random_model(tiny_config(family, vocab=97), seed=seed, dtype=torch.float64))
    return dense, apply(copy.deepcopy(dense), "w12", "w12")


@pytest.mark.parametrize("family", FAMILIES)
def test_w12_equals_dense_tokens(family):
    dense, packed = models(family)
    swapped = sum(isinstance(m, W12Linear) for m in packed.modules()) - 1  # the head is not in the layers
    kinds = [blk.kind for blk in dense.model.layers]
    assert swapped == 4 * len(kinds)  # qkv (or the GDN input projection), o/out, gate_up, down in every layer
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(1, 97, (12,), generator=g).tolist()
    ar = generate(dense, prompt, 24).tokens
    assert generate(packed, prompt, 24).tokens == ar
    drafter = DraftLM(bf16_valued(perturbed(dense if family != "hybrid" else
                                            random_model(tiny_config("llama", vocab=97), dtype=torch.float64), 1, 0.3)))
    assert generate(packed, prompt, 24, drafter, draft_len=4).tokens == ar
    assert generate(packed, prompt, 24, drafter, draft_len=4, policy=make_policy("best-first:8")).tokens == ar
    for policy in (None, make_policy("best-first:8")):  # the static driver, run eagerly
        static = FastDecoder(packed, drafter, 4, policy, max_len=128, graphs=False).generate(prompt, 24, eos=set())
        assert static.tokens == generate(dense, prompt, 24, eos=set()).tokens


@pytest.mark.parametrize("family", ("qwen3", "hybrid"))
def test_the_certified_head_gives_the_dense_tokens(family):
    dense, _ = models(family, seed=1)
    certified = apply(copy.deepcopy(dense), "bf16", "certified")
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(1, 97, (10,), generator=g).tolist()
    ar = generate(dense, prompt, 20).tokens
    assert generate(certified, prompt, 20).tokens == ar
    drafter = DraftLM(bf16_valued(perturbed(random_model(tiny_config("llama", vocab=97), dtype=torch.float64), 1, 0.3)))
    for policy in (None, make_policy("best-first:8")):
        static = FastDecoder(certified, drafter, 4, policy, max_len=128, graphs=False).generate(prompt, 20, eos=set())
        assert static.tokens == generate(dense, prompt, 20, eos=set()).tokens
    out = certified(torch.tensor([prompt]), greedy=True)
    assert out.logits is None and torch.equal(out.argmax, dense(torch.tensor([prompt])).logits.argmax(-1))


def test_w12_linear_is_the_dense_layer():
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(96, 70).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_((torch.randn(70, 96, generator=g) * 0.05).to(torch.bfloat16))
        lin.weight[3, :4] = 0.0  # escapes
    x = torch.randn(5, 96, generator=g).to(torch.bfloat16)
    w = W12Linear.from_weight(lin.weight, lin.bias)
    assert torch.equal(w(x.double()), torch.nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double()))
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(torch.bfloat16)
    ref = net(x[:, :8])
    assert convert(net) == 2 and all(isinstance(net[i], W12Linear) for i in (0, 2))
    assert torch.equal(net(x[:, :8]), ref)


def test_w12_refuses_weights_that_are_not_bf16_values():
    dense = random_model(tiny_config("llama", vocab=97), dtype=torch.float64)  # float64 weights, not bf16 values
    with pytest.raises(W12Error, match="model.layers.0.self_attn.qkv"):
        apply(dense, "w12")
    with pytest.raises(ValueError, match="weights 'w13'"):
        apply(dense, "w13")


def test_a_transformers_model_converted_to_w12_gives_the_same_logits():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=120, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, 120, (1, 9))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        assert convert(model) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
        assert torch.equal(model(input_ids=ids).logits, ref)


def test_applying_w12_twice_keeps_the_packed_layers():
    _, packed = models("llama")
    before = packed.model.layers[0].self_attn.qkv
    assert apply(packed, "w12", "w12").model.layers[0].self_attn.qkv is before
