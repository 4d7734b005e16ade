"""EAGLE-3 drafter checkpoints: load the public layouts into the engine's sequential drafter (the
`layer0_input = "eagle3"` variant of `FeatureDrafterNet`, so both drivers, the trees and the
lattice run it as any sequential drafter), and write the zoo's such drafters in those layouts.

Two layouts, told apart by config.json:

- **sglang** (SGLang, also read by vLLM): `architectures` LlamaForCausalLMEagle3 or
  Eagle3LlamaForCausalLM; the decoder layer's fields at the top level (hidden_size,
  intermediate_size, num_attention_heads, num_key_value_heads, head_dim, num_hidden_layers,
  rms_norm_eps, rope_theta, rope_scaling, max_position_embeddings, vocab_size = the target's
  vocabulary); `draft_vocab_size` (default vocab_size), `target_hidden_size` (default
  hidden_size), `norm_before_residual` (default false), `eagle_config` with
  `eagle_aux_hidden_state_layer_ids` and `use_aux_hidden_state`. The first layer's tensors under
  `midlayer.*` (or `layers.0.*`).
- **speculators** (vLLM's `speculators` library): `speculators_model_type: "eagle3"`, the layer's
  fields in `transformer_layer_config`, `draft_vocab_size` (the library's default 32000),
  `norm_before_residual`, `target_hidden_size`, `eagle_aux_hidden_state_layer_ids`,
  `speculators_config`. The first layer under `layers.0.*`.

Weights, both layouts: `fc.weight` [H, n·H_target] over n target layers' hidden states; the first
layer (`self_attn.{q,k,v}_proj` on 2H inputs, `o_proj`, `hidden_norm`, `input_layernorm` — the
embedding's norm —, `post_attention_layernorm`, `mlp.{gate,up,down}_proj`), further layers
`layers.i.*` as plain Llama layers; `norm.weight`; `lm_head.weight` [draft_vocab_size, H];
optionally `embed_tokens.weight` (else the target's embedding); `d2t` [draft_vocab_size] integer
offsets, target id = draft id + d2t[draft id]; optionally `t2d` [vocab_size] bool (not needed).

The layer computes, for a row (token embedding e at t+1, hidden h at t): a = attention over
[input_layernorm(e) ‖ hidden_norm(h)]; x = r + a with r = h (r = hidden_norm(h) with
norm_before_residual); out = x + mlp(post_attention_layernorm(x)). The logits are
lm_head(norm(out)); `out` (before the norm) is the hidden the next drafted step reads. A context
row's h is fc(the target's hidden states at t of the aux layers, concatenated in ascending layer
order — the order the serving engines capture them in).

Aux layer ids. A config's `eagle_aux_hidden_state_layer_ids` count hidden-state boundaries: id k
is the residual stream entering target layer k, i.e. the output of layer k-1 (what vLLM and
`speculators` read, and SGLang's default [2, L/2, L-3] for a target of L layers when the field is
absent). SGLang reads an sglang-layout list whose first id is 1 as layer outputs instead (id k =
the output of layer k), and so does this loader; the engine's `target_layers` are layer outputs.
Id 0 (the embedding output) has no counterpart here and is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from .checkpoint import (FLOAT_CODES, CheckpointError, check_names_shapes, header_infos, load_into, read_config,
                         read_entries, write_checkpoint)
from .config import ConfigError, ModelConfig, checked_field
from .drafters import DraftConfig, FeatureDrafter, FeatureDrafterNet

SGLANG_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
LAYOUTS = ("sglang", "speculators")
INT_CODES = frozenset({"I64", "I32"})
CODES = FLOAT_CODES | INT_CODES | {"BOOL"}
LAYER_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
              "max_position_embeddings", "hidden_act", "attention_bias", "mlp_bias", "tie_word_embeddings")


def is_eagle3(d: dict) -> bool:
    """Whether a config.json describes an EAGLE-3 drafter (either layout)."""
    archs = d.get("architectures")
    named = isinstance(archs, list) and any(isinstance(a, str) and "Eagle3" in a for a in archs)
    return named or d.get("speculators_model_type") == "eagle3"


def layout_of(d: dict) -> str:
    return "speculators" if "speculators_model_type" in d or "transformer_layer_config" in d else "sglang"


@dataclass
class _Plan:
    cfg: DraftConfig
    layout: str
    rename: dict[str, str]  # checkpoint tensor name → FeatureDrafterNet name
    draft_ids: torch.Tensor | None  # target id of each head row (None: row i is target id i)
    tie: bool  # the head is a copy of the checkpoint's embedding (tie_word_embeddings, no lm_head.weight)


def _err(e: ConfigError) -> CheckpointError:
    return CheckpointError(str(e))


def _layer_config(d: dict, source: str) -> ModelConfig:
    """The decoder layer's fields, checked as a Llama target's config.json is (types, ranges)."""
    sub = {k: d[k] for k in LAYER_KEYS if k in d}
    try:
        cfg = ModelConfig.from_hf({"architectures": ["LlamaForCausalLM"], **sub}, source)
    except ConfigError as e:
        raise _err(e) from None
    for k in ("attention_bias", "mlp_bias"):
        if getattr(cfg, k):
            raise CheckpointError(f"{source}: field '{k}' = true: EAGLE-3 layers with biases are not supported")
    return cfg


def _ids(value, source: str, key: str):
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(i, int) and not isinstance(i, bool)
                                                           for i in value):
        raise CheckpointError(f"{source}: field '{key}' = {value!r}: expected a non-empty list of layer ids")
    return value


def _fields(d: dict, source: str) -> tuple[str, dict, ModelConfig]:
    """(layout, the EAGLE-3 fields with defaults, the layer's config) of a config.json."""
    layout = layout_of(d)
    try:
        if layout == "speculators":
            if d.get("speculators_model_type") != "eagle3":
                raise CheckpointError(f"{source}: field 'speculators_model_type' = {d.get('speculators_model_type')!r}:"
                                      " expected 'eagle3'")
            tl = d.get("transformer_layer_config")
            if not isinstance(tl, dict):
                raise CheckpointError(f"{source}: field 'transformer_layer_config' = {tl!r}: expected an object with "
                                      "the drafter layer's fields")
            if tl.get("model_type", "llama") != "llama":
                raise CheckpointError(f"{source}: field 'transformer_layer_config.model_type' = "
                                      f"{tl.get('model_type')!r}: only llama layers are supported (a qwen3 layer's "
                                      "q/k norms are not)")
            if "speculators_config" in d and not isinstance(d["speculators_config"], dict):
                raise CheckpointError(f"{source}: field 'speculators_config' = {d['speculators_config']!r}: expected "
                                      "an object")
            layer = _layer_config(tl, f"{source} (transformer_layer_config)")
            f = {"draft_vocab_size": checked_field(d, "draft_vocab_size", source, "int", 32000, low=1),
                 "ids": _ids(d.get("eagle_aux_hidden_state_layer_ids"), source, "eagle_aux_hidden_state_layer_ids"),
                 "use_aux": True}
        else:
            archs = [a for a in d.get("architectures") or [] if isinstance(a, str)]
            if not any(a in SGLANG_ARCHS for a in archs):
                raise CheckpointError(f"{source}: field 'architectures' = {d.get('architectures')!r}: supported "
                                      f"EAGLE-3 architectures are {', '.join(SGLANG_ARCHS)} (and the speculators "
                                      "layout)")
            layer = _layer_config(d, source)
            eagle = d.get("eagle_config", {}) or {}
            if not isinstance(eagle, dict):
                raise CheckpointError(f"{source}: field 'eagle_config' = {eagle!r}: expected an object")
            top = _ids(d.get("eagle_aux_hidden_state_layer_ids"), source, "eagle_aux_hidden_state_layer_ids")
            inner = _ids(eagle.get("eagle_aux_hidden_state_layer_ids"), f"{source} (eagle_config)",
                         "eagle_aux_hidden_state_layer_ids")
            if top is not None and inner is not None and top != inner:
                raise CheckpointError(f"{source}: field 'eagle_aux_hidden_state_layer_ids' = {top} differs from "
                                      f"eagle_config's {inner}: which layers the drafter reads is ambiguous")
            f = {"draft_vocab_size": checked_field(d, "draft_vocab_size", source, "int", layer.vocab_size, low=1),
                 "ids": top if top is not None else inner,
                 "use_aux": checked_field(eagle, "use_aux_hidden_state", f"{source} (eagle_config)", "bool", True)}
            if checked_field(d, "bias", source, "bool", False):
                raise CheckpointError(f"{source}: field 'bias' = true (a bias on fc): not supported")
        f["target_hidden_size"] = checked_field(d, "target_hidden_size", source, "int", layer.hidden_size, low=1)
        f["norm_before_residual"] = checked_field(d, "norm_before_residual", source, "bool", False)
        if checked_field(d, "norm_before_fc", source, "bool", False):
            raise CheckpointError(f"{source}: field 'norm_before_fc' = true (a norm over the target features before fc)"
                                  ": not supported")
    except ConfigError as e:
        raise _err(e) from None
    if not f["use_aux"]:
        raise CheckpointError(f"{source}: field 'eagle_config.use_aux_hidden_state' = false (the drafter reads only "
                              "the target's last hidden state): not supported; EAGLE-3 drafters read aux layers")
    if f["draft_vocab_size"] > layer.vocab_size:
        raise CheckpointError(f"{source}: field 'draft_vocab_size' = {f['draft_vocab_size']}: more than vocab_size "
                              f"({layer.vocab_size})")
    return layout, f, layer


def target_layers(ids: list[int] | None, layout: str, n_layers: int, source: str) -> list[int]:
    """The target layers (their outputs, ascending, each once) whose hidden states fc reads, from a
    config's aux layer ids (None: the default [2, L/2, L-3]); see the module doc for the convention."""
    key = "eagle_aux_hidden_state_layer_ids"
    given = ids
    if ids is None:
        ids = [2, n_layers // 2, n_layers - 3]
    output = layout == "sglang" and given is not None and ids[0] == 1
    out = sorted({i if output else i - 1 for i in ids})
    if out[0] < 0 or out[-1] >= n_layers:
        what = (f"read as layer outputs (the first id is 1), each must lie in [0, {n_layers - 1}]" if output else
                f"id k is the output of target layer k-1, so each must lie in [1, {n_layers}]")
        shown = f"= {given}" if given is not None else f"absent (default {ids})"
        raise CheckpointError(f"{source}: field '{key}' {shown}: {what} for a target of {n_layers} layers")
    return out


def _plan(folder: Path, target: ModelConfig) -> _Plan:
    """Everything load_eagle3 checks, from config.json and the safetensors headers (and the small d2t
    tensor), before a weight is read."""
    source = str(folder / "config.json")
    d = read_config(folder)
    layout, f, layer = _fields(d, source)
    V, H, Ht = layer.vocab_size, layer.hidden_size, f["target_hidden_size"]
    if V != target.vocab_size:
        raise CheckpointError(f"{source}: field 'vocab_size' = {V}: the target's vocabulary has {target.vocab_size} "
                              "ids (vocab_size is the target's vocabulary; draft_vocab_size the head's)")
    if Ht != target.hidden_size:
        raise CheckpointError(f"{source}: field 'target_hidden_size' = {Ht}: the target's hidden_size is "
                              f"{target.hidden_size}" + ("" if "target_hidden_size" in d else
                                                         " (target_hidden_size is absent: it defaults to hidden_size)"))
    layers = target_layers(f["ids"], layout, target.num_hidden_layers, source)
    infos = header_infos(folder, CODES)
    given = {n: tuple(info.get("shape", [])) for n, (_, info) in infos.items() if not n.endswith("rotary_emb.inv_freq")}
    for n, (path, info) in infos.items():
        want = INT_CODES if n == "d2t" else {"BOOL"} if n == "t2d" else FLOAT_CODES
        if info.get("dtype") not in want:
            raise CheckpointError(f"{path}: tensor '{n}' has dtype {info.get('dtype')}, expected "
                                  f"{'an integer' if n == 'd2t' else 'a bool' if n == 't2d' else 'a floating-point'} "
                                  "dtype")
    mid, zero = any(n.startswith("midlayer.") for n in given), any(n.startswith("layers.0.") for n in given)
    if mid and zero:
        raise CheckpointError(f"{folder}: holds both midlayer.* and layers.0.* tensors: which is the first layer is "
                              "ambiguous")
    prefix = "midlayer." if mid else "layers.0."
    own_emb, own_head = "embed_tokens.weight" in given, "lm_head.weight" in given
    Vd = f["draft_vocab_size"]
    tie = not own_head and layer.tie_word_embeddings and own_emb
    if not own_head and not tie:
        if layer.tie_word_embeddings and not target.tie_word_embeddings:
            raise CheckpointError(f"{folder}: tie_word_embeddings without embed_tokens.weight or lm_head.weight: the "
                                  "head would be the target's embedding, which is not its head; not supported")
        if Vd != V:
            raise CheckpointError(f"{folder}: missing tensor 'lm_head.weight' (config.json says draft_vocab_size "
                                  f"{Vd}; only a head over the whole vocabulary, {V} ids, may come from the target)")
    if tie and Vd != V:
        raise CheckpointError(f"{source}: tie_word_embeddings with draft_vocab_size {Vd} < vocab_size {V}: the "
                              "embedding cannot be a head over the draft vocabulary")
    if H != target.hidden_size and not (own_emb and (own_head or tie)):
        raise CheckpointError(f"{source}: field 'hidden_size' = {H} differs from the target's {target.hidden_size}, "
                              "and the drafter lacks its own embed_tokens.weight / lm_head.weight to use instead of "
                              "the target's")
    cfg = DraftConfig(
        kind="sequential", vocab_size=V, hidden_size=H, intermediate_size=layer.intermediate_size,
        num_hidden_layers=layer.num_hidden_layers, num_attention_heads=layer.num_attention_heads,
        num_key_value_heads=layer.num_key_value_heads, head_dim=layer.head_dim, target_hidden_size=Ht,
        target_layers=layers, rms_norm_eps=layer.rms_norm_eps, rope_theta=layer.rope_theta,
        max_position_embeddings=layer.max_position_embeddings, layer0_input="eagle3",
        norm_before_residual=f["norm_before_residual"], draft_vocab_size=Vd if own_head or tie else None,
        own_embedding=own_emb, rope_scaling=layer.rope_scaling)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in FeatureDrafterNet(cfg).state_dict().items()}
    rename = {_ck_name(k, prefix): k for k in shapes}
    if tie:
        rename.pop("lm_head.weight")
    expected = {ck: shapes[k] for ck, k in rename.items()}
    fc = given.get("fc.weight")
    if fc is not None and fc != expected["fc.weight"]:
        raise CheckpointError(f"{infos['fc.weight'][0]}: tensor 'fc.weight' has shape {fc}, but {len(layers)} target "
                              f"layers {layers} (from {'the default ids' if f['ids'] is None else f['ids']}) × "
                              f"target_hidden_size {Ht} imply {expected['fc.weight']}")
    check_names_shapes(expected, {n: s for n, s in given.items() if n not in ("d2t", "t2d")}, folder)
    if "t2d" in given and given["t2d"] != (V,):
        raise CheckpointError(f"{infos['t2d'][0]}: tensor 't2d' has shape {given['t2d']}, expected ({V},) (vocab_size)")
    ids = None
    if "d2t" in given:
        path = infos["d2t"][0]
        if given["d2t"] != (Vd,):
            raise CheckpointError(f"{path}: tensor 'd2t' has shape {given['d2t']}, expected ({Vd},) (draft_vocab_size)")
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            ids = fh.get_tensor("d2t").long() + torch.arange(Vd)
        bad = ((ids < 0) | (ids >= V)).nonzero()
        if len(bad):
            i = int(bad[0])
            raise CheckpointError(f"{path}: tensor 'd2t' maps draft id {i} to target id {int(ids[i])}, outside the "
                                  f"target's vocabulary [0, {V})")
        if len(ids.unique()) != Vd:
            raise CheckpointError(f"{path}: tensor 'd2t' maps two draft ids to the same target id")
        if torch.equal(ids, torch.arange(V)[:Vd]) and Vd == V:
            ids = None
        elif not (own_head or tie):
            raise CheckpointError(f"{path}: tensor 'd2t' reorders the vocabulary, but the head is the target's (no "
                                  "lm_head.weight): not supported")
    elif Vd != V:
        raise CheckpointError(f"{folder}: missing tensor 'd2t' (a head over a draft vocabulary of {Vd} ids needs the "
                              "map to target ids)")
    return _Plan(cfg, layout, rename, ids, tie)


def _ck_name(name: str, prefix: str = "layers.0.") -> str:
    """A FeatureDrafterNet tensor name → its EAGLE-3 checkpoint name."""
    if name.startswith("fc_feat."):
        return "fc." + name.removeprefix("fc_feat.")
    if name.startswith("layers.0."):
        return prefix + name.removeprefix("layers.0.")
    return name


def check_eagle3(folder, target: ModelConfig) -> DraftConfig:
    """Everything `load_eagle3` checks — config.json fields, tensor names, dtypes and shapes against
    the config and the target, the vocabulary map — without reading a weight; the drafter's config."""
    return _plan(Path(folder), target).cfg


def load_eagle3(folder, target_config: ModelConfig, dtype: torch.dtype = torch.float32,
                device="cpu") -> FeatureDrafterNet:
    """An EAGLE-3 folder (either layout) as the engine's sequential drafter network, checked in full
    first (`check_eagle3`): wrap it in `FeatureDrafter(net, target)` (load_drafter does)."""
    folder = Path(folder)
    plan = _plan(folder, target_config)
    tensors = {plan.rename[n]: t for _, n, t in read_entries(folder, device, CODES) if n in plan.rename}
    if plan.tie:
        tensors["lm_head.weight"] = tensors["embed_tokens.weight"]
    with torch.device("meta"):
        net = FeatureDrafterNet(plan.cfg)
    load_into(net, tensors, folder, dtype)
    net.inv_freq = plan.cfg.body().inv_freq().to(device)
    net.draft_ids = plan.draft_ids.to(device) if plan.draft_ids is not None else None
    return net.eval()


def _layer_fields(c: DraftConfig) -> dict:
    d = {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
         "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
         "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "hidden_act": "silu",
         "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
         "max_position_embeddings": c.max_position_embeddings, "attention_bias": False, "mlp_bias": False,
         "tie_word_embeddings": False}
    if c.rope_scaling:
        d["rope_scaling"] = dict(c.rope_scaling)
    return d


def export_eagle3(drafter: FeatureDrafter | FeatureDrafterNet, folder, layout: str = "sglang",
                  dtype: torch.dtype | None = None, verifier: str | None = None) -> None:
    """Write a sequential drafter built with `layer0_input = "eagle3"` as an EAGLE-3 folder in the
    sglang or speculators layout. Exact: the folder computes the same logits (`load_eagle3` gives
    back the same network). A drafter that uses its target's head needs to come as a
    `FeatureDrafter` (the head is written as `lm_head.weight`); the target's embedding is not
    written (both serving engines then use the target's). `verifier`: the target's name or path,
    recorded in the speculators layout's `speculators_config`.

    Drafters with the `fc_in` first layer have no exact EAGLE-3 form (their residual stream starts
    from a learned mix of embedding and hidden, EAGLE-3's from the hidden alone) and are refused."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {LAYOUTS}")
    net = drafter.net if isinstance(drafter, FeatureDrafter) else drafter
    c = net.cfg
    if c.kind != "sequential" or c.layer0_input != "eagle3":
        raise ValueError(f"a {c.kind} drafter with layer0_input {c.layer0_input!r} has no exact EAGLE-3 form: "
                         "EAGLE-3's first layer reads [embedding ‖ hidden] in q/k/v with the hidden half as its "
                         "residual; only sequential drafters built with layer0_input 'eagle3' export exactly")
    layers = list(c.target_layers)
    if layers != sorted(set(layers)) or len(layers) != 3:
        raise ValueError(f"target_layers {layers}: the serving engines read three distinct target layers, "
                         "concatenated in ascending order")
    ids = [i + 1 for i in layers]  # hidden-state boundaries: id k is the output of layer k-1
    if layout == "sglang" and ids[0] == 1:
        raise ValueError(f"target_layers {layers}: SGLang reads an id list starting with 1 as layer outputs, so the "
                         "output of layer 0 cannot be named in the sglang layout; use the speculators layout")
    prefix = "midlayer." if layout == "sglang" else "layers.0."
    tensors = {_ck_name(k, prefix): v.detach() for k, v in net.state_dict().items()}
    if c.draft_vocab_size is None:
        if not isinstance(drafter, FeatureDrafter):
            raise ValueError("this drafter scores with its target's head: pass it as a FeatureDrafter (with its "
                             "target) so that the head can be written as lm_head.weight")
        tensors["lm_head.weight"] = drafter.head.detach()
    if dtype is not None:
        tensors = {k: v.to(dtype) for k, v in tensors.items()}
    V, Vd = c.vocab_size, c.draft_vocab_size or c.vocab_size
    target_ids = net.draft_ids.cpu() if net.draft_ids is not None else torch.arange(Vd)
    tensors["d2t"] = target_ids - torch.arange(Vd)
    tensors["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill_(0, target_ids, True)
    stored = str(dtype or next(iter(net.state_dict().values())).dtype).removeprefix("torch.")
    common = {"draft_vocab_size": Vd, "target_hidden_size": c.target_hidden_size,
              "norm_before_residual": c.norm_before_residual}
    if layout == "sglang":
        config = {"architectures": [SGLANG_ARCHS[0]], "model_type": "llama", **_layer_fields(c), **common,
                  "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": ids},
                  "torch_dtype": stored}
    else:
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", **common,
                  "eagle_aux_hidden_state_layer_ids": ids,
                  "transformer_layer_config": {"model_type": "llama", **_layer_fields(c)},
                  "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                         "proposal_methods": [{"proposal_type": "greedy",
                                                               "speculative_tokens": c.block_size}],
                                         "verifier": {"name_or_path": verifier, "architectures": []}},
                  "torch_dtype": stored}
    write_checkpoint(folder, config, tensors)
