"""The engine computes what Hugging Face Transformers computes on the same checkpoint (docs/METHOD.md §3).

Two directions:
  * HF → engine: a tiny random Transformers model of every supported family (weights perturbed with
    a fixed seed so norms, biases and the zero-centred Qwen3-Next norms are not trivial) is saved with
    `save_pretrained` and loaded with `load_model`; prefill logits, cached one-token-per-pass decode
    and greedy generation must match Transformers.
  * engine → HF: `save_model` (config from `ModelConfig.to_hf()`) writes a folder that
    `AutoModelForCausalLM.from_pretrained` loads, giving the engine's logits.

float32 on CPU; the relative tolerance is max|Δ| / max|ref| ≤ 1e-4.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    Qwen3Config,
    Qwen3NextConfig,
)

from specpilot.engine.checkpoint import load_model, save_model  # noqa: E402
from specpilot.engine.decode import generate  # noqa: E402
from specpilot.engine.synthetic import random_model, tiny_config  # noqa: E402

transformers.logging.set_verbosity_error()
try:  # the "Writing model shards" bar of save_pretrained
    transformers.utils.logging.disable_progress_bar()
except AttributeError:  # pragma: no cover
    pass

RTOL = 1e-4
VOCAB = 384
PROMPT_LEN = 48  # longer than every sliding window below (8)
N_PROMPTS, NEW_TOKENS = 20, 64

DENSE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
             rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)

# name -> Transformers config. Spelling as in transformers 5.x: RoPE settings live in `rope_parameters`.
HF_CONFIGS = {
    "llama": lambda: LlamaConfig(**DENSE, attention_bias=True, mlp_bias=True),
    "llama_rope_llama3": lambda: LlamaConfig(
        **DENSE, rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  # small, so that some frequencies are scaled and some smoothed
                                  "original_max_position_embeddings": 16}),
    "qwen3_untied": lambda: Qwen3Config(**DENSE, tie_word_embeddings=False),
    "qwen3_tied": lambda: Qwen3Config(**DENSE, tie_word_embeddings=True),
    # layers >= max_window_layers slide: layers 2 and 3 here
    "qwen3_sliding": lambda: Qwen3Config(**DENSE, use_sliding_window=True, sliding_window=8, max_window_layers=2),
    "mistral_sliding": lambda: MistralConfig(**DENSE, sliding_window=8),
    # Qwen3-Next hybrid: GDN + gated full attention, dense MLP everywhere; partial rotary 0.25
    "qwen3_next_hybrid": lambda: Qwen3NextConfig(
        **DENSE,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        mlp_only_layers=[0, 1, 2, 3], num_experts=0,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These models are tiny: one intra-op thread is fastest, and on a busy 2-core machine several
    threads spin on each other (25-40x slower generation)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert out.shape == ref.shape, (out.shape, ref.shape)
    return float((out.double() - ref.double()).abs().max() / ref.double().abs().max())


def perturb_(model: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """Add N(0, std²) to every parameter (deterministically), so nothing sits at its init value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1 and name.endswith("norm.weight"):
                noise = noise * 5  # norms (and Qwen3-Next's zero-centred ones, init 0) visibly away from init
            p.add_(noise.to(p) * std)


@pytest.fixture(scope="module", params=list(HF_CONFIGS))
def pair(request, tmp_path_factory):
    """(name, HF model, engine model loaded from the HF-written folder)."""
    name = request.param
    torch.manual_seed(1234)
    hf = AutoModelForCausalLM.from_config(HF_CONFIGS[name](), dtype=torch.float32).eval()
    perturb_(hf, seed=sum(map(ord, name)))
    if name == "qwen3_next_hybrid":
        norms = [p for n, p in hf.named_parameters() if n.endswith("layernorm.weight") or n.endswith("norm.weight")]
        assert norms and all(p.abs().max() > 0.01 for p in norms)
    folder = tmp_path_factory.mktemp(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.save_pretrained(folder)
    eng = load_model(folder, torch.float32, "cpu")
    # the parity check below is only meaningful if the engine read the feature under test
    cfg = eng.cfg
    if name == "llama":
        assert cfg.attention_bias and cfg.mlp_bias
    if name == "llama_rope_llama3":
        assert cfg.rope_scaling and cfg.rope_scaling.get("rope_type") == "llama3"
    if name == "qwen3_tied":
        assert cfg.tie_word_embeddings and not hasattr(eng, "lm_head")
    if name == "qwen3_sliding":
        assert cfg.sliding_window == 8 and cfg.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    if name == "mistral_sliding":
        assert cfg.sliding_window == 8 and set(cfg.layer_types) == {"sliding_attention"}
    if name == "qwen3_next_hybrid":
        assert cfg.is_hybrid and cfg.rotary_dim == 4
    return name, hf, eng


def prompt_ids(name: str, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 7919 + sum(map(ord, name)))
    return torch.randint(0, VOCAB, (1, length), generator=g)


@torch.no_grad()
def test_prefill_logits_match_transformers(pair):
    name, hf, eng = pair
    ids = prompt_ids(name, PROMPT_LEN, 0)
    ref = hf(ids).logits
    out = eng(ids).logits
    assert rel_err(out, ref) <= RTOL, f"{name}: prefill logits differ, rel err {rel_err(out, ref):.2e}"
    # a batch of two different rows gives each row's logits
    ids2 = torch.cat((ids, prompt_ids(name, PROMPT_LEN, 1)))
    assert rel_err(eng(ids2).logits, hf(ids2).logits) <= RTOL


@torch.no_grad()
def test_cached_one_token_decode_matches_transformers(pair):
    name, hf, eng = pair
    ids = prompt_ids(name, PROMPT_LEN, 2)
    ref = hf(ids).logits
    cache = eng.new_cache(PROMPT_LEN)
    steps = []
    for t in range(PROMPT_LEN):
        steps.append(eng(ids[:, t : t + 1], cache).logits)
        cache.commit(1)
    assert cache.length == PROMPT_LEN
    out = torch.cat(steps, dim=1)
    err = rel_err(out, ref)
    worst = int((out - ref).abs().amax(-1).argmax())
    assert err <= RTOL, f"{name}: cached decode differs, rel err {err:.2e} (worst at position {worst})"


@torch.no_grad()
def test_cached_chunked_prefill_then_decode_matches_transformers(pair):
    """Chunks of several tokens against a committed cache (crossing the sliding window), then steps."""
    name, hf, eng = pair
    ids = prompt_ids(name, PROMPT_LEN, 3)
    ref = hf(ids).logits
    cache = eng.new_cache(PROMPT_LEN)
    outs, t = [], 0
    for n in (13, 1, 9, 2, 11):
        outs.append(eng(ids[:, t : t + n], cache).logits)
        cache.commit(n)
        t += n
    while t < PROMPT_LEN:
        outs.append(eng(ids[:, t : t + 1], cache).logits)
        cache.commit(1)
        t += 1
    assert rel_err(torch.cat(outs, 1), ref) <= RTOL


def _hf_greedy(hf, prompt: list[int]) -> tuple[list[int], float]:
    """HF greedy continuation with EOS disabled; also the smallest top-1/top-2 logit gap it saw."""
    gen = hf.generation_config
    gen.eos_token_id = None  # never stop early: the engine side runs with eos=set()
    gen.pad_token_id = 0
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS,
                      use_cache=True, output_scores=True, return_dict_in_generate=True,
                      generation_config=gen)
    new = out.sequences[0, len(prompt):].tolist()
    scores = torch.stack(out.scores)[:, 0]  # [steps, V]
    top2 = scores.topk(2, dim=-1).values
    gap = float(((top2[:, 0] - top2[:, 1]) / scores.abs().amax(-1)).min())
    return new, gap


@torch.no_grad()
def test_greedy_generation_matches_transformers(pair):
    name, hf, eng = pair
    g = torch.Generator().manual_seed(99 + sum(map(ord, name)))
    config_eos = set(eng.cfg.eos_token_id)
    assert config_eos == {2}  # read from config.json; disabled on both sides below
    mismatches = []
    for i in range(N_PROMPTS):
        length = int(torch.randint(4, 25, (1,), generator=g))
        prompt = torch.randint(0, VOCAB, (length,), generator=g).tolist()
        ref, gap = _hf_greedy(hf, prompt)
        assert len(ref) == NEW_TOKENS, f"{name}: HF stopped early ({len(ref)} tokens)"
        got = generate(eng, prompt, NEW_TOKENS, eos=set()).tokens
        if got != ref:
            first = next((j for j, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
            mismatches.append(f"prompt {i} (len {length}): first difference at new token {first}: "
                              f"engine {got[first:first + 5]} vs HF {ref[first:first + 5]}; "
                              f"smallest relative top-2 gap seen by HF {gap:.1e}")
    assert not mismatches, f"{name}: greedy generation differs from Transformers:\n" + "\n".join(mismatches)


# ---- engine → Transformers: save_model writes real HF checkpoints ----------------------------------

def _engine_configs():
    cfgs = {f: tiny_config(f) for f in ("llama", "qwen3", "sliding", "hybrid")}
    cfgs["qwen3_tied"] = tiny_config("qwen3", tied=True)
    mistral = tiny_config("llama")
    mistral.family, mistral.sliding_window = "mistral", 8
    mistral.layer_types = ["sliding_attention"] * mistral.num_hidden_layers
    cfgs["mistral"] = mistral
    llama3 = tiny_config("llama")
    llama3.rope_scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 16}
    cfgs["llama_rope_llama3"] = llama3
    hybrid_llama3 = tiny_config("hybrid")  # partial rotary (0.5) together with rope scaling
    hybrid_llama3.rope_scaling = dict(llama3.rope_scaling)
    cfgs["hybrid_rope_llama3"] = hybrid_llama3
    return cfgs


ENGINE_CONFIGS = _engine_configs()


@pytest.mark.parametrize("family", list(ENGINE_CONFIGS))
@torch.no_grad()
def test_engine_checkpoint_loads_in_transformers(family, tmp_path):
    cfg = ENGINE_CONFIGS[family]
    eng = random_model(cfg, seed=5)
    save_model(eng, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written == cfg.to_hf()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(hf).__name__ == written["architectures"][0]
    # every HF parameter came from the file (none freshly initialised), and vice versa
    hf_sd = hf.state_dict()
    eng_sd = eng.state_dict()
    for k, v in eng_sd.items():
        assert k in hf_sd, f"{family}: HF model has no tensor '{k}'"
        assert torch.equal(hf_sd[k], v), f"{family}: tensor '{k}' differs after loading into Transformers"
    if cfg.tie_word_embeddings:
        assert torch.equal(hf.get_output_embeddings().weight, eng.model.embed_tokens.weight)
    hf_layer_types = getattr(hf.config, "layer_types", None)
    if hf_layer_types is not None:
        assert list(hf_layer_types) == cfg.layer_types
    if cfg.sliding_window:
        assert hf.config.sliding_window == cfg.sliding_window
    ids = torch.randint(0, cfg.vocab_size, (2, PROMPT_LEN), generator=torch.Generator().manual_seed(3))
    ref = hf(ids).logits
    out = eng(ids).logits
    assert rel_err(out, ref) <= RTOL, f"{family}: rel err {rel_err(out, ref):.2e}"
    # and the engine reads its own folder back to the same model
    again = load_model(tmp_path)
    assert again.cfg.to_hf() == written
    assert again.cfg.rotary_dim == cfg.rotary_dim
    assert torch.equal(again.inv_freq, cfg.inv_freq())
    assert torch.equal(again(ids).logits, out)


# ---- config.json spellings of other writers ------------------------------------------------------

def _legacy(d: dict, drop_partial: bool = False) -> dict:
    """A transformers-4.x style config.json (as most published checkpoints are): top-level
    rope_theta / partial_rotary_factor, scaling under 'rope_scaling', no 'rope_parameters'."""
    d = dict(d)
    rope = dict(d.pop("rope_parameters"))
    d["rope_theta"] = rope.pop("rope_theta")
    partial = rope.pop("partial_rotary_factor", None)
    if partial is not None and not drop_partial:
        d["partial_rotary_factor"] = partial
    if rope.get("rope_type", "default") != "default":
        d["rope_scaling"] = rope
    return d


@pytest.mark.parametrize("case,drop_partial", [("llama_rope_llama3", False), ("qwen3_next_hybrid", False),
                                               ("qwen3_next_hybrid", True)])
@torch.no_grad()
def test_legacy_config_spelling_matches_transformers(case, drop_partial, tmp_path):
    """Llama-3.1-style `rope_scaling` + top-level `rope_theta`; Qwen3-Next with top-level
    `partial_rotary_factor`, or none (Transformers then uses 0.25)."""
    torch.manual_seed(4321)
    hf = AutoModelForCausalLM.from_config(HF_CONFIGS[case](), dtype=torch.float32).eval()
    perturb_(hf, seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.save_pretrained(tmp_path)
    cfg_path = tmp_path / "config.json"
    legacy = _legacy(json.loads(cfg_path.read_text()), drop_partial)
    assert "rope_parameters" not in legacy
    cfg_path.write_text(json.dumps(legacy))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    eng = load_model(tmp_path)
    assert ref_model.config.rope_parameters["rope_type"] == hf.config.rope_parameters["rope_type"]
    assert eng.cfg.rotary_dim == int(16 * ref_model.config.rope_parameters.get("partial_rotary_factor", 1.0))
    ids = prompt_ids(case, PROMPT_LEN, 5)
    ref = ref_model(ids).logits
    assert rel_err(ref, hf(ids).logits) <= RTOL  # the rewrite kept the model's meaning for Transformers
    assert rel_err(eng(ids).logits, ref) <= RTOL
