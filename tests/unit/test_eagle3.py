"""EAGLE-3 drafter folders (engine/eagle3.py): both public layouts load into the engine's sequential
drafter and run on both drivers; the zoo's eagle3-variant drafters export to them exactly; a draft
vocabulary maps to the right target ids through d2t; every malformed field is one CheckpointError
naming it; and decoding with an EAGLE-3 drafter equals AR token for token in float64
(docs/METHOD.md §3)."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from safetensors.torch import load_file

from specpilot.entrypoints.cli import main
from specpilot.engine.checkpoint import CheckpointError, check_system, drafter_kind, save_model, write_checkpoint
from specpilot.engine.decode import generate
from specpilot.engine.drafters import DraftConfig, FeatureDrafter, load_drafter, save_drafter
from specpilot.engine.eagle3 import check_eagle3, export_eagle3, load_eagle3, target_layers
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.engine.fast import FastDecoder
from specpilot.engine.replay import make_policy
from specpilot.engine.synthetic import FAMILIES, random_drafter_net, random_eagle3_net, random_model, tiny_config
from specpilot.zoo.workloads import Request

VOCAB, LAYERS = 97, 5
PROMPT = [5, 9, 2, 7, 1, 5, 9, 2, 4]
F64 = torch.float64


@lru_cache(maxsize=None)
def target(family: str = "llama", seed: int = 1):
    return random_model(tiny_config(family, vocab=VOCAB, layers=LAYERS), seed=seed, dtype=F64)


def eagle3(tgt, seed: int = 2, **kw) -> FeatureDrafter:
    return FeatureDrafter(random_eagle3_net(tgt.cfg, seed=seed, dtype=F64, **kw), tgt)


VARIANTS = {
    "plain": {},
    "draft_vocab": {"draft_vocab": 40},
    "norm_before_residual": {"norm_before_residual": True, "draft_vocab": 40},
    "own_embedding": {"own_embedding": True, "draft_vocab": 33},
    "two_layers": {"layers": 2},
    "narrower": {"hidden": 32},  # its own embedding and head; fc maps the target's 64-wide features to 32
}


def one_error(fn, *needles: str) -> str:
    """fn must raise exactly one CheckpointError, on one line, naming every needle."""
    with pytest.raises(CheckpointError) as ei:
        fn()
    err = ei.value
    assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__)
    msg = str(err)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, f"{n!r} not in: {msg}"
    return msg


# ---- export → load: the same network, the same lattices on both drivers ------------------------------

def lattices(tgt, d, driver: str, policy="best-first:12"):
    pol = make_policy(policy)
    rec = []
    if driver == "static":
        res = FastDecoder(tgt, d, 6, pol, max_len=256, graphs=False).generate(PROMPT, 30, eos=set(), record=rec)
    else:
        res = generate(tgt, PROMPT, 30, d, 6, policy=pol, eos=set(), record=rec)
    return res, rec


@pytest.mark.parametrize("layout", ["sglang", "speculators"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_export_then_load_gives_the_same_lattices_on_both_drivers(layout, variant, tmp_path):
    tgt = target()
    d = eagle3(tgt, **VARIANTS[variant])
    export_eagle3(d, tmp_path / "e3", layout)
    cfg = json.loads((tmp_path / "e3" / "config.json").read_text())
    names = set(load_file(tmp_path / "e3" / "model.safetensors"))
    assert ("midlayer.hidden_norm.weight" in names) is (layout == "sglang")
    assert ("layers.0.hidden_norm.weight" in names) is (layout == "speculators")
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    assert ("embed_tokens.weight" in names) is d.net.cfg.own_embedding
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] if layout == "sglang" else \
        cfg["eagle_aux_hidden_state_layer_ids"]
    assert ids == [i + 1 for i in d.net.cfg.target_layers]  # hidden-state boundaries
    assert drafter_kind(tmp_path / "e3") == "sequential"
    loaded = load_drafter(str(tmp_path / "e3"), F64, "cpu", tgt)
    assert isinstance(loaded, FeatureDrafter) and loaded.net.cfg.layer0_input == "eagle3"
    assert loaded.target_layers == d.target_layers
    assert (loaded.net.draft_ids is None) == (d.net.draft_ids is None)
    if d.net.draft_ids is not None:
        assert torch.equal(loaded.net.draft_ids, d.net.draft_ids)
    runs = {}
    for who, drafter in (("original", d), ("loaded", loaded)):
        for driver in ("eager", "static"):
            runs[who, driver] = lattices(tgt, drafter, driver)
    ar = generate(tgt, PROMPT, 30, eos=set()).tokens
    ref_res, ref = runs["original", "eager"]
    assert len(ref) >= 3
    for (who, driver), (res, rec) in runs.items():
        assert res.tokens == ar
        assert [s.tau for s in res.steps] == [s.tau for s in ref_res.steps]
        for a, b in zip(rec, ref):
            if a.room < 6 or b.room < 6:  # near the token limit the eager driver drafts fewer positions
                continue
            m = b.lattice.positions
            assert torch.equal(a.lattice.tokens[:m], b.lattice.tokens), (who, driver)
            # the same computation, though a loaded copy's tensors may take other SIMD paths (their
            # alignment): float64 agrees to its last few bits
            torch.testing.assert_close(a.lattice.logp[:m], b.lattice.logp, rtol=1e-12, atol=1e-12)
            assert sorted(a.tree_tokens) == sorted(b.tree_tokens)


def test_loaded_network_has_the_exported_weights(tmp_path):
    tgt = target()
    d = eagle3(tgt, draft_vocab=40, own_embedding=True)
    export_eagle3(d, tmp_path / "e3", "speculators")
    net = load_eagle3(tmp_path / "e3", tgt.cfg, F64)
    a, b = d.net.state_dict(), net.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert check_eagle3(tmp_path / "e3", tgt.cfg) == net.cfg


def test_a_drafter_using_the_targets_head_exports_it_as_lm_head(tmp_path):
    tgt = target()
    d = eagle3(tgt)
    assert d.net.cfg.draft_vocab_size is None and d.head is tgt.lm_head_weight
    export_eagle3(d, tmp_path / "e3")
    t = load_file(tmp_path / "e3" / "model.safetensors")
    assert torch.equal(t["lm_head.weight"], tgt.lm_head_weight) and torch.equal(t["d2t"], torch.zeros(VOCAB).long())
    with pytest.raises(ValueError, match="FeatureDrafter"):  # the bare network does not know the head
        export_eagle3(d.net, tmp_path / "bare")


def test_drafters_without_the_eagle3_first_layer_are_not_exported(tmp_path):
    tgt = target()
    for kind in ("sequential", "block"):
        d = FeatureDrafter(random_drafter_net(kind, tgt.cfg, seed=3, dtype=F64, input_norm=True), tgt)
        with pytest.raises(ValueError, match="no exact EAGLE-3 form"):
            export_eagle3(d, tmp_path / kind)
    with pytest.raises(ValueError, match="layer 0"):  # id 1 would read as a layer output in SGLang's layout
        export_eagle3(eagle3(tgt, target_layers=[0, 2, 4]), tmp_path / "zero")
    export_eagle3(eagle3(tgt, target_layers=[0, 2, 4]), tmp_path / "zero", "speculators")
    assert load_drafter(str(tmp_path / "zero"), F64, "cpu", tgt).target_layers == (0, 2, 4)


def test_the_native_format_keeps_eagle3_drafters_over_the_whole_vocabulary(tmp_path):
    tgt = target()
    d = eagle3(tgt, own_embedding=True, hidden=32)
    save_drafter(d.net, tmp_path / "native")
    loaded = load_drafter(str(tmp_path / "native"), F64, "cpu", tgt)
    assert loaded.net.cfg == d.net.cfg
    assert generate(tgt, PROMPT, 20, loaded, 5).tokens == generate(tgt, PROMPT, 20).tokens
    with pytest.raises(ValueError, match="export_eagle3"):
        save_drafter(eagle3(tgt, draft_vocab=40).net, tmp_path / "mapped")


# ---- the computation, written out from the checkpoint's tensors -------------------------------------

def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    d = x.shape[-1]
    f = pos[:, None].double() * (1.0 / theta ** (torch.arange(0, d, 2, dtype=F64) / d))[None]
    cos, sin = torch.cat((f, f), -1).cos()[:, None], torch.cat((f, f), -1).sin()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat((-x2, x1), -1) * sin


def reference_step(t: dict, cfg: dict, e: torch.Tensor, h: torch.Tensor, nbr: bool) -> torch.Tensor:
    """EAGLE-3's first layer over rows (embedding e [T, H], hidden h [T, H]) at positions 0..T-1, causal,
    as its definition reads: q/k/v from [input_layernorm(e) ‖ hidden_norm(h)], residual h (or
    hidden_norm(h)), post-attention norm, MLP. Returns the pre-norm outputs [T, H]."""
    p, eps = "midlayer.", cfg["rms_norm_eps"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    hn = rms(h, t[p + "hidden_norm.weight"], eps)
    z = torch.cat((rms(e, t[p + "input_layernorm.weight"], eps), hn), -1)
    T = len(e)
    q = (z @ t[p + "self_attn.q_proj.weight"].T).view(T, nh, hd)
    k = (z @ t[p + "self_attn.k_proj.weight"].T).view(T, nkv, hd)
    v = (z @ t[p + "self_attn.v_proj.weight"].T).view(T, nkv, hd)
    pos = torch.arange(T)
    q, k = rope(q, pos, cfg["rope_theta"]), rope(k, pos, cfg["rope_theta"])
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    a = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(T, nh * hd) @ t[p + "self_attn.o_proj.weight"].T
    x = (hn if nbr else h) + a
    y = rms(x, t[p + "post_attention_layernorm.weight"], eps)
    mlp = (F.silu(y @ t[p + "mlp.gate_proj.weight"].T) * (y @ t[p + "mlp.up_proj.weight"].T)) @ \
        t[p + "mlp.down_proj.weight"].T
    return x + mlp


@pytest.mark.parametrize("nbr", [False, True])
def test_the_drafter_computes_eagle3s_definition(nbr, tmp_path):
    """The loaded drafter's position-1 and position-2 logits against EAGLE-3's layer written out
    from the checkpoint's own tensors and config, draft logits mapped through d2t."""
    tgt = target()
    export_eagle3(eagle3(tgt, draft_vocab=40, norm_before_residual=nbr), tmp_path / "e3")
    t = load_file(tmp_path / "e3" / "model.safetensors")
    cfg = json.loads((tmp_path / "e3" / "config.json").read_text())
    d = load_drafter(str(tmp_path / "e3"), F64, "cpu", tgt)
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    layers = [i - 1 for i in ids]  # boundary k: the output of layer k-1
    out = tgt(torch.tensor([PROMPT]), feature_layers=tuple(layers))
    newest = int(out.logits[0, -1].argmax())
    d.reset(64)
    d.observe(PROMPT, PROMPT[1:] + [newest], out.features[0])
    lat = d.propose(2)

    emb, eps = tgt.model.embed_tokens.weight, cfg["rms_norm_eps"]
    hs = out.features[0] @ t["fc.weight"].T  # fc over the aux layers' states, ascending
    es = emb[torch.tensor(PROMPT[1:] + [newest])]
    o = reference_step(t, cfg, es, hs, nbr)
    target_of = torch.arange(40) + t["d2t"]

    def mapped(row):
        draft = rms(row, t["norm.weight"], eps) @ t["lm_head.weight"].T
        return torch.full((VOCAB,), float("-inf"), dtype=F64).index_copy(0, target_of, draft), draft

    full1, draft1 = mapped(o[-1])
    assert int(lat.tokens[0, 0]) == int(target_of[draft1.argmax()])  # the draft argmax, mapped through d2t
    torch.testing.assert_close(lat.logp[0], F.log_softmax(full1, -1)[lat.tokens[0]], rtol=1e-10, atol=1e-10)
    # position 2: the drafted token's embedding with the drafter's own pre-norm output as its hidden
    o2 = reference_step(t, cfg, torch.cat((es, emb[lat.tokens[0, :1]])), torch.cat((hs, o[-1:])), nbr)
    full2, _ = mapped(o2[-1])
    assert torch.equal(lat.tokens[1], F.log_softmax(full2, -1).topk(16).indices)
    torch.testing.assert_close(lat.logp[1], F.log_softmax(full2, -1).topk(16).values, rtol=1e-10, atol=1e-10)
    assert set(lat.tokens.flatten().tolist()) <= set(target_of.tolist())  # only draft-vocabulary ids


# ---- a hand-built checkpoint with a small draft vocabulary ------------------------------------------

def hand_built(folder: Path, layout: str = "sglang") -> tuple[Path, list[int]]:
    """An EAGLE-3 folder whose drafter's output is the same all-ones vector at every row (fc, mlp off;
    attention averages a constant value), with lm_head row i = 0.1 (i + 1) · ones / H: draft id i
    scores 0.1 (i + 1), so the order of the draft vocabulary is known. d2t sends draft id i to target
    id (5 i + 3) mod 97, out of order."""
    H, Vd, nh, nkv, hd = 64, 20, 4, 2, 16
    tids = [(5 * i + 3) % VOCAB for i in range(Vd)]
    t = {"fc.weight": torch.zeros(H, 3 * H), "norm.weight": torch.ones(H),
         "embed_tokens.weight": torch.ones(VOCAB, H),
         "lm_head.weight": 0.1 * torch.arange(1, Vd + 1, dtype=torch.float32)[:, None].expand(Vd, H) / H,
         "d2t": torch.tensor(tids) - torch.arange(Vd), "t2d": torch.zeros(VOCAB, dtype=torch.bool)}
    t["t2d"][tids] = True
    v = torch.zeros(nkv * hd, 2 * H)
    v[:, :H] = 1.0 / H  # the value reads the (normed, all-ones) embedding half only: 1 everywhere
    p = "midlayer." if layout == "sglang" else "layers.0."
    g = torch.Generator().manual_seed(0)
    t.update({p + "self_attn.q_proj.weight": torch.randn(nh * hd, 2 * H, generator=g),
              p + "self_attn.k_proj.weight": torch.randn(nkv * hd, 2 * H, generator=g),
              p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": torch.ones(H, nh * hd) / (nh * hd),
              p + "mlp.gate_proj.weight": torch.randn(2 * H, H, generator=g),
              p + "mlp.up_proj.weight": torch.randn(2 * H, H, generator=g),
              p + "mlp.down_proj.weight": torch.zeros(H, 2 * H)})
    for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        t[p + n + ".weight"] = torch.ones(H)
    layer = {"vocab_size": VOCAB, "hidden_size": H, "intermediate_size": 2 * H, "num_hidden_layers": 1,
             "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd, "rms_norm_eps": 1e-6,
             "rope_theta": 10000.0, "max_position_embeddings": 2048, "hidden_act": "silu"}
    if layout == "sglang":
        cfg = {"architectures": ["LlamaForCausalLMEagle3"], **layer, "draft_vocab_size": Vd,
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 3, 5]}}
    else:
        cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": Vd,
               "transformer_layer_config": layer, "eagle_aux_hidden_state_layer_ids": [2, 3, 5],
               "speculators_config": {"algorithm": "eagle3"}}
    write_checkpoint(folder, cfg, t)
    return folder, tids


@pytest.mark.parametrize("layout", ["sglang", "speculators"])
def test_a_small_draft_vocabulary_drafts_the_target_ids_d2t_names(layout, tmp_path):
    tgt = target()
    folder, tids = hand_built(tmp_path / "hand", layout)
    d = load_drafter(str(folder), F64, "cpu", tgt)
    assert d.target_layers == (1, 2, 4) and d.net.cfg.draft_vocab_size == 20
    assert d.net.draft_ids.tolist() == tids
    expected = [tids[i] for i in range(19, 3, -1)]  # the 16 best draft ids, 19 first, in target ids
    logp = F.log_softmax(0.1 * torch.arange(1, 21, dtype=F64), -1).flip(0)[:16]
    assert expected[:3] == [(5 * 19 + 3) % 97, (5 * 18 + 3) % 97, (5 * 17 + 3) % 97] == [1, 93, 88]
    for driver in ("eager", "static"):
        res, rec = lattices(tgt, d, driver, "chain")
        assert res.tokens == generate(tgt, PROMPT, 30, eos=set()).tokens
        drafted = [r for r in rec if r.lattice is not None]  # (none at the last token)
        assert len(drafted) >= 3
        for r in drafted:
            for row, lp in zip(r.lattice.tokens, r.lattice.logp):
                assert row.tolist() == expected
                torch.testing.assert_close(lp, logp, rtol=1e-6, atol=1e-6)
            assert list(r.tree_tokens[1:]) == [1] * (len(r.tree_tokens) - 1)  # the chain: draft id 19 → target id 1


# ---- malformed folders: one line naming the field or tensor -----------------------------------------

def edited(tmp_path: Path, layout: str, edit_cfg=None, edit_tensors=None) -> Path:
    folder, _ = hand_built(tmp_path / "bad", layout)
    cfg = json.loads((folder / "config.json").read_text())
    t = load_file(folder / "model.safetensors")
    if edit_cfg:
        edit_cfg(cfg, cfg.get("transformer_layer_config", cfg))  # (top level, the layer's fields)
    if edit_tensors:
        edit_tensors(t, "midlayer." if layout == "sglang" else "layers.0.")
    write_checkpoint(folder, cfg, t)
    return folder


def _pop(key):
    return lambda top, layer: layer.pop(key)


def _set(key, value, where="top"):
    return lambda top, layer: (top if where == "top" else layer).__setitem__(key, value)


def _ids(value):
    def edit(top, layer):
        if "eagle_config" in top:
            top["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = value
        else:
            top["eagle_aux_hidden_state_layer_ids"] = value
    return edit


CONFIG_CASES = {
    "missing hidden_size": (_pop("hidden_size"), ["'hidden_size'", "missing"]),
    "missing num_hidden_layers": (_pop("num_hidden_layers"), ["'num_hidden_layers'", "missing"]),
    "heads as a string": (_set("num_attention_heads", "4", "layer"), ["'num_attention_heads'", "'4'"]),
    "negative eps": (_set("rms_norm_eps", -1.0, "layer"), ["'rms_norm_eps'"]),
    "norm_before_residual not a bool": (_set("norm_before_residual", "yes"), ["'norm_before_residual'"]),
    "draft_vocab_size a float": (_set("draft_vocab_size", 20.5), ["'draft_vocab_size'"]),
    "draft vocab above vocab": (_set("draft_vocab_size", 500), ["'draft_vocab_size'"]),
    "layer ids not a list": (_ids("2,3,5"), ["'eagle_aux_hidden_state_layer_ids'"]),
    "layer id past the target": (_ids([2, 3, 9]), ["'eagle_aux_hidden_state_layer_ids'", "5 layers"]),
    "layer id 0": (_ids([0, 2, 3]), ["'eagle_aux_hidden_state_layer_ids'"]),
    "two layer ids": (_ids([2, 3]), ["'fc.weight'", "(64, 192)", "(64, 128)"]),
    "target hidden mismatch": (_set("target_hidden_size", 32), ["'target_hidden_size'", "64"]),
    "vocab mismatch": (_set("vocab_size", 96, "layer"), ["'vocab_size'", "97"]),
    "attention bias": (_set("attention_bias", True, "layer"), ["'attention_bias'"]),
    "other activation": (_set("hidden_act", "gelu", "layer"), ["'hidden_act'"]),
    "norm before fc": (_set("norm_before_fc", True), ["'norm_before_fc'"]),
}


def _t_set(name, fn):
    def edit(t, p):
        key = name.replace("LAYER0.", p)
        t[key] = fn(t[key])
    return edit


def _t_pop(name):
    return lambda t, p: t.pop(name.replace("LAYER0.", p))


TENSOR_CASES = {
    "fc too narrow": (_t_set("fc.weight", lambda w: w[:, :128].clone()), ["'fc.weight'", "(64, 128)"]),
    "q_proj on H inputs": (_t_set("LAYER0.self_attn.q_proj.weight", lambda w: w[:, :64].clone()),
                           ["q_proj.weight'", "(64, 64)", "(64, 128)"]),
    "lm_head rows": (_t_set("lm_head.weight", lambda w: w[:19].clone()), ["'lm_head.weight'", "(19, 64)"]),
    "embedding width": (_t_set("embed_tokens.weight", lambda w: w[:, :32].clone()), ["'embed_tokens.weight'"]),
    "missing norm": (_t_pop("norm.weight"), ["missing tensor 'norm.weight'"]),
    "missing hidden_norm": (_t_pop("LAYER0.hidden_norm.weight"), ["hidden_norm.weight'", "missing"]),
    "missing lm_head": (_t_pop("lm_head.weight"), ["'lm_head.weight'", "missing"]),
    "missing d2t": (_t_pop("d2t"), ["'d2t'", "missing"]),
    "d2t too short": (_t_set("d2t", lambda x: x[:19].clone()), ["'d2t'", "(19,)", "(20,)"]),
    "d2t out of range": (_t_set("d2t", lambda x: x.index_fill(0, torch.tensor([3]), 200)), ["'d2t'", "draft id 3",
                                                                                             "[0, 97)"]),
    "d2t below zero": (_t_set("d2t", lambda x: x.index_fill(0, torch.tensor([0]), -5)), ["'d2t'", "draft id 0"]),
    "d2t collision": (_t_set("d2t", lambda x: x.index_fill(0, torch.tensor([1]), int(x[0]) - 1)),
                      ["'d2t'", "same target id"]),
    "d2t as floats": (_t_set("d2t", lambda x: x.double()), ["'d2t'", "integer"]),
    "t2d shape": (_t_set("t2d", lambda x: x[:50].clone()), ["'t2d'"]),
    "a weight as integers": (_t_set("norm.weight", lambda w: w.long()), ["'norm.weight'", "floating-point"]),
    "an unknown tensor": (lambda t, p: t.__setitem__("midlayers.1.mlp.up_proj.weight", torch.zeros(2, 2)),
                          ["unexpected tensor 'midlayers.1.mlp.up_proj.weight'"]),
}


@pytest.mark.parametrize("layout", ["sglang", "speculators"])
@pytest.mark.parametrize("case", list(CONFIG_CASES) + list(TENSOR_CASES))
def test_each_malformed_field_is_one_error_naming_it(layout, case, tmp_path):
    tgt = target()
    if case in CONFIG_CASES:
        edit, needles = CONFIG_CASES[case]
        folder = edited(tmp_path, layout, edit_cfg=edit)
    else:
        edit, needles = TENSOR_CASES[case]
        folder = edited(tmp_path, layout, edit_tensors=edit)
    msg = one_error(lambda: load_drafter(str(folder), F64, "cpu", tgt), *needles)
    assert str(folder) in msg  # the folder (config.json or the weights file) is named
    save_model(tgt, tmp_path / "target")  # the CLI's check, before anything loads: the same error
    assert one_error(lambda: check_system(tmp_path / "target", str(folder)), *needles) == msg


def test_layout_specific_fields_are_checked(tmp_path):
    tgt = target()
    folder = edited(tmp_path, "speculators", edit_cfg=lambda top, layer: top.pop("transformer_layer_config"))
    one_error(lambda: load_drafter(str(folder), F64, "cpu", tgt), "'transformer_layer_config'")
    folder = edited(tmp_path, "speculators", edit_cfg=_set("speculators_model_type", "eagle"))
    one_error(lambda: load_drafter(str(folder), F64, "cpu", tgt), "'speculators_model_type'")
    folder = edited(tmp_path, "speculators", edit_cfg=_set("model_type", "qwen3", "layer"))
    one_error(lambda: load_drafter(str(folder), F64, "cpu", tgt), "model_type", "qwen3")
    folder = edited(tmp_path, "sglang", edit_cfg=_set("architectures", ["Qwen3ForCausalLMEagle3"]))
    one_error(lambda: load_drafter(str(folder), F64, "cpu", tgt), "'architectures'", "LlamaForCausalLMEagle3")
    folder = edited(tmp_path, "sglang", edit_cfg=lambda top, layer: top.__setitem__(
        "eagle_config", {"use_aux_hidden_state": False}))
    one_error(lambda: load_drafter(str(folder), F64, "cpu", tgt), "use_aux_hidden_state")
    folder = edited(tmp_path, "sglang", edit_cfg=_set("eagle_aux_hidden_state_layer_ids", [2, 3, 4]))
    one_error(lambda: load_drafter(str(folder), F64, "cpu", tgt), "ambiguous")
    folder = edited(tmp_path, "sglang", edit_tensors=lambda t, p: t.update(
        {k.replace("midlayer.", "layers.0."): v.clone() for k, v in list(t.items()) if k.startswith("midlayer.")}))
    one_error(lambda: load_drafter(str(folder), F64, "cpu", tgt), "midlayer.* and layers.0.*")
    folder = edited(tmp_path, "sglang", edit_cfg=_set("hidden_size", 32, "layer"))
    one_error(lambda: load_drafter(str(folder), F64, "cpu", tgt), "hidden_size")
    with pytest.raises(CheckpointError, match="together with the target"):
        load_drafter(str(folder))


def test_aux_layer_id_conventions():
    # boundaries (vLLM, speculators, SGLang's default and any sglang list not starting at 1): id k = output of k-1
    assert target_layers(None, "sglang", 32, "c") == [1, 15, 28]
    assert target_layers(None, "speculators", 8, "c") == [1, 3, 4]
    assert target_layers([2, 16, 29], "sglang", 32, "c") == [1, 15, 28]
    assert target_layers([29, 2, 16], "speculators", 32, "c") == [1, 15, 28]  # captured in ascending order
    assert target_layers([3, 32], "speculators", 32, "c") == [2, 31]  # id L: the last layer's output
    # SGLang reads a sglang-layout list starting with 1 as layer outputs
    assert target_layers([1, 15, 28], "sglang", 32, "c") == [1, 15, 28]
    assert target_layers([1, 15, 28], "speculators", 32, "c") == [0, 14, 27]
    with pytest.raises(CheckpointError, match=r"\[1, 32\]"):
        target_layers([2, 33], "speculators", 32, "c")
    with pytest.raises(CheckpointError, match="default"):
        target_layers(None, "sglang", 3, "c")


# ---- losslessness -----------------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(family=st.sampled_from(FAMILIES), variant=st.sampled_from(list(VARIANTS)), seed=st.integers(0, 2),
       data=st.data(), draft_len=st.integers(1, 7), max_new=st.integers(1, 30),
       policy=st.sampled_from(["chain", "best-first:8", "topk:2:8"]), driver=st.sampled_from(["eager", "static"]))
def test_speculative_with_an_eagle3_drafter_equals_ar(family, variant, seed, data, draft_len, max_new, policy, driver):
    unit = data.draw(st.lists(st.integers(1, 96), min_size=1, max_size=10))
    prompt = (unit * data.draw(st.integers(1, 3)))[:24]
    tgt = target(family, seed)
    d = eagle3(tgt, seed=seed + 5, **VARIANTS[variant])
    spec = generate(tgt, prompt, max_new, d, draft_len, policy=make_policy(policy), driver=driver)
    assert spec.tokens == generate(tgt, prompt, max_new).tokens
    assert spec.driver == driver


@pytest.mark.parametrize("layout", ["sglang", "speculators"])
@pytest.mark.parametrize("mode,driver", [("chain", "eager"), ("chain", "static"), ("tree", "eager"),
                                         ("tree", "static")])
def test_engine_with_an_eagle3_folder_equals_ar(layout, mode, driver, tmp_path):
    tgt = target("qwen3")
    save_model(tgt, tmp_path / "target")
    export_eagle3(eagle3(tgt, draft_vocab=40), tmp_path / "e3", layout)
    reqs = [Request(id=f"p{i}", prompt_ids=tuple(p)) for i, p in enumerate([PROMPT, [3, 1, 4, 1, 5, 9, 2, 6]])]

    def run(**kw):
        eng = Engine(EngineConfig(target=str(tmp_path / "target"), dtype="float64", max_new_tokens=24, draft_len=5,
                                  **kw))
        return eng, [o["tokens"] for o in eng.run(reqs)["outputs"]]

    eng, spec = run(drafter=str(tmp_path / "e3"), mode=mode, tree="best-first:10", driver=driver)
    assert eng.driver == driver and eng.drafter.net.cfg.layer0_input == "eagle3"
    assert spec == run(mode="ar")[1]
    assert all(len(t) == 24 for t in spec)


def test_generate_cli_takes_an_eagle3_folder(tmp_path, capsys):
    tgt = target()
    save_model(tgt, tmp_path / "target")
    export_eagle3(eagle3(tgt, draft_vocab=40), tmp_path / "e3")
    (tmp_path / "w.jsonl").write_text(json.dumps({"id": "a", "prompt_ids": PROMPT}) + "\n")
    argv = ["generate", "--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "e3"), "--mode", "chain",
            "--workload", str(tmp_path / "w.jsonl"), "--max-new-tokens", "12", "--dtype", "float64", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outputs"][0]["tokens"] == generate(tgt, PROMPT, 12).tokens


# ---- the zoo trains such drafters ---------------------------------------------------------------------

def test_the_zoo_trains_an_eagle3_drafter_whose_training_rows_equal_inference(tmp_path):
    """zoo/train.py trains the eagle3 variant unchanged (its rows and layers are the net's own), the
    unrolled training logits are the drafter's at inference, and the trained drafter exports exactly."""
    from specpilot.zoo import build, train

    tgt = random_model(tiny_config("qwen3", vocab=61, layers=LAYERS), seed=3)  # float32: training's dtype
    r = build.PRESETS["nano"]
    r = build.Recipe(**{**r.__dict__, "sequential_layer0": "eagle3"})
    cfg = build.drafter_config(r, "sequential", tgt.cfg)
    assert cfg.layer0_input == "eagle3" and cfg.input_norm is False
    with pytest.raises(ValueError, match="sequential_layer0"):
        build.Recipe(**{**r.__dict__, "sequential_layer0": "other"})
    cfg = DraftConfig(**{**cfg.__dict__, "vocab_size": 61, "hidden_size": 64, "intermediate_size": 128,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "target_hidden_size": 64})
    layers = tuple(cfg.target_layers)
    seqs = torch.randint(1, 61, (8, 24), generator=torch.Generator().manual_seed(5)) % 5 + 1
    feats = tgt(seqs, feature_layers=layers).features.float().detach()
    kw = dict(target=tgt, seqs=seqs, feats=feats, start=8, batch=4, lr=1e-2, seed=1, desc="t", log=None)

    def loss(n):
        with torch.no_grad():
            return float(train.drafter_loss(n, tgt.model.embed_tokens.weight, tgt.lm_head_weight, seqs, feats, 8))

    first = loss(train.train_drafter(cfg, steps=0, **kw))
    net = train.train_drafter(cfg, steps=30, muon=True, **kw)
    assert loss(net) < first - 0.5
    # unrolled training rows (train.drafter_loss's) against the drafter's own proposals
    d = FeatureDrafter(net.double(), tgt.double())  # inference in float64 (in place: tgt is this test's own)
    seq, p, steps = seqs[0].tolist(), 9, 3
    emb, head = d.emb, d.head

    def primed(dr, s):
        out = tgt(torch.tensor([s[: p + 1]]), feature_layers=layers)
        dr.reset(64)
        dr.observe(s[: p + 1], s[1 : p + 2], out.features[0])
        return dr

    lat = primed(d, seq).propose(steps)
    seq[p + 2 : p + 2 + steps - 1] = lat.chain()[: steps - 1]  # the drafted tokens are its own argmaxes
    lat = primed(d, seq).propose(steps)
    ctx = len(seq) - 2
    f = tgt(torch.tensor([seq]), feature_layers=layers).features[0]
    x = net.rows(torch.tensor([seq[1 : ctx + 1]]), net.fc_feat(f[:ctx])[None], emb)
    got, hidden = [], None
    for s in range(1, steps + 1):
        if s > 1:
            prev = torch.cat((torch.zeros_like(hidden[:, :1]), hidden[:, :-1]), 1)
            x = torch.cat((x, net.rows(torch.tensor([seq[1 : ctx + 1]]), prev, emb)), 1)
        h, logits = net(x, head, positions=torch.arange(ctx).repeat(s)[None], tree_mask=train.unroll_mask(ctx, s, "cpu"))
        hidden = h[:, -ctx:]
        got.append(logits[0, -ctx:][p + s - 1])
    ref = torch.log_softmax(torch.stack(got), -1).topk(16, dim=-1)
    assert torch.equal(lat.tokens, ref.indices)
    torch.testing.assert_close(lat.logp, ref.values, rtol=1e-9, atol=1e-9)
    # the zoo's target layers start at 0: the speculators layout names them exactly
    export_eagle3(d, tmp_path / "e3", "speculators")
    back = load_drafter(str(tmp_path / "e3"), F64, "cpu", tgt)
    assert back.target_layers == layers
    lat2 = primed(back, seq).propose(steps)
    assert torch.equal(lat2.tokens, lat.tokens)
    torch.testing.assert_close(lat2.logp, lat.logp, rtol=1e-12, atol=1e-12)  # a loaded copy: last bits may differ


def test_llama3_rope_scaling_reaches_the_drafters_rotary_frequencies(tmp_path):
    """Public Llama-3.1 EAGLE-3 configs carry the target's llama3 rope_scaling; the drafter's layer uses it."""
    tgt = target()
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    folder = edited(tmp_path, "sglang", edit_cfg=_set("rope_scaling", scaling, "layer"))
    d = load_drafter(str(folder), F64, "cpu", tgt)
    assert d.net.cfg.rope_scaling == scaling
    plain = d.net.cfg.body().__class__(**{**d.net.cfg.body().__dict__, "rope_scaling": None}).inv_freq()
    assert torch.equal(d.net.inv_freq, d.net.cfg.body().inv_freq()) and not torch.equal(d.net.inv_freq, plain)
    bad = edited(tmp_path, "sglang", edit_cfg=_set("rope_scaling", {"rope_type": "yarn", "factor": 2.0}, "layer"))
    one_error(lambda: load_drafter(str(bad), F64, "cpu", tgt), "'rope_scaling'", "yarn")
