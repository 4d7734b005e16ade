"""The static-cache decoder (the CUDA-graph path) emits exactly what the dynamic decoder emits."""

import pytest
import torch

from specpilot.engine.decode import generate
from specpilot.engine.graphs import StaticDecoder
from specpilot.engine.synthetic import FAMILIES, random_model, tiny_config


@pytest.mark.parametrize("family", FAMILIES)
def test_static_decoder_equals_dynamic(family):
    m = random_model(tiny_config(family, vocab=97), seed=5, dtype=torch.float64)
    dec = StaticDecoder(m, 96, graph=False)
    for prompt in ([1, 2, 3], list(range(10, 30)), [7]):  # reused: the decoder must reset its state
        assert dec.generate(prompt, 40, eos=set()).tokens == generate(m, prompt, 40, eos=set()).tokens


def test_static_decoder_rejects_overlong_requests():
    m = random_model(tiny_config("llama", vocab=97), seed=5)
    with pytest.raises(ValueError, match="static cache"):
        StaticDecoder(m, 16, graph=False).generate(list(range(10)), 10)
