"""Bad checkpoint folders raise ONE clear `CheckpointError` (a ValueError) naming the file and the
tensor or field; nothing half-loaded survives (engine/checkpoint.py, docs/METHOD.md §3).

Folders are written with the engine's own `save_model` / `write_checkpoint` and then corrupted.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specpilot.engine.checkpoint import (
    INDEX,
    SINGLE,
    CheckpointError,
    load_model,
    read_tensors,
    save_model,
    write_checkpoint,
)
from specpilot.engine.synthetic import random_model, tiny_config

IDS = torch.tensor([[5, 17, 3, 99, 42, 7, 250, 8, 1, 64, 33, 2]])


# ---- helpers ----------------------------------------------------------------------------------------

def make(folder: Path, family: str = "llama", tied: bool = False, seed: int = 0, **kw):
    """A valid checkpoint folder; returns (folder, model, config dict, state dict)."""
    model = random_model(tiny_config(family, tied=tied), seed=seed)
    save_model(model, folder, **kw)
    return folder, model, model.cfg.to_hf(), {k: v.clone() for k, v in model.state_dict().items()}


def rewrite(folder: Path, config: dict, tensors: dict, **kw) -> Path:
    write_checkpoint(folder, config, tensors, **kw)
    return folder


def load_error(folder: Path, *needles: str) -> str:
    """load_model must raise exactly one CheckpointError (no chained internal error) whose message
    contains every needle; returns the message."""
    result = None
    with pytest.raises(CheckpointError) as ei:
        result = load_model(folder)
    assert result is None  # nothing returned
    err = ei.value
    assert isinstance(err, ValueError)
    assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__), \
        "the error should be one CheckpointError, not a chain around an internal exception"
    msg = str(err)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in error message: {msg}"
    return msg


def same_model(a, b) -> bool:
    with torch.no_grad():
        return torch.equal(a(IDS).logits, b(IDS).logits)


def header_of(path: Path) -> tuple[int, dict]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return n, json.loads(raw[8 : 8 + n])


def tensor_in_message(msg: str) -> str:
    m = re.search(r"tensor '([^']+)'", msg)
    assert m, f"no tensor named in: {msg}"
    return m.group(1)


# ---- the happy paths the error cases are measured against --------------------------------------------

@pytest.mark.parametrize("family", ["llama", "qwen3", "sliding", "hybrid"])
def test_valid_folder_loads_to_the_same_model(tmp_path, family):
    folder, model, _, _ = make(tmp_path / "ckpt", family)
    loaded = load_model(folder)
    assert loaded.cfg == model.cfg
    assert same_model(loaded, model)


def test_half_precision_tensors_load(tmp_path):
    folder, model, cfg, sd = make(tmp_path / "ckpt")
    rewrite(folder, cfg, {k: v.to(torch.bfloat16) for k, v in sd.items()})
    loaded = load_model(folder)
    assert loaded.dtype == torch.float32
    ref = {k: v.to(torch.bfloat16).float() for k, v in sd.items()}
    assert all(torch.equal(loaded.state_dict()[k], ref[k]) for k in ref)


# ---- tensors that do not fit the config ---------------------------------------------------------------

def test_missing_tensor(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt")
    del sd["model.layers.2.mlp.up_proj.weight"]
    rewrite(folder, cfg, sd)
    msg = load_error(folder, str(folder), "model.layers.2.mlp.up_proj.weight", "missing")
    assert "more" not in msg  # exactly one tensor is missing


def test_several_missing_tensors_are_counted(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt")
    gone = sorted(k for k in sd if k.startswith("model.layers.3."))
    for k in gone:
        del sd[k]
    rewrite(folder, cfg, sd)
    load_error(folder, str(folder), gone[0], f"and {len(gone) - 1} more")


def test_extra_tensor(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt")
    sd["model.layers.0.self_attn.rotary_bias"] = torch.zeros(16)
    rewrite(folder, cfg, sd)
    load_error(folder, str(folder), "model.layers.0.self_attn.rotary_bias", "unexpected")


def test_tied_model_with_lm_head_tensor_is_extra(tmp_path):
    folder, model, cfg, sd = make(tmp_path / "ckpt", "qwen3", tied=True)
    assert cfg["tie_word_embeddings"] and "lm_head.weight" not in sd
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    rewrite(folder, cfg, sd)
    load_error(folder, str(folder), "lm_head.weight", "unexpected")


def test_untied_model_without_lm_head_is_missing(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt", "qwen3", tied=False)
    del sd["lm_head.weight"]
    rewrite(folder, cfg, sd)
    load_error(folder, "lm_head.weight", "missing")


def test_wrong_shape(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt")
    name = "model.layers.1.self_attn.k_proj.weight"
    good = tuple(sd[name].shape)
    bad = (good[0] + 16, good[1])
    sd[name] = torch.zeros(bad)
    rewrite(folder, cfg, sd)
    load_error(folder, str(folder), name, str(bad), str(good))


@pytest.mark.parametrize("dtype,code", [(torch.int32, "I32"), (torch.int64, "I64"), (torch.uint8, "U8"),
                                        (torch.bool, "BOOL")])
def test_integer_dtype_tensor(tmp_path, dtype, code):
    folder, _, cfg, sd = make(tmp_path / "ckpt")
    name = "model.layers.0.mlp.down_proj.weight"
    sd[name] = sd[name].to(dtype)
    rewrite(folder, cfg, sd)
    load_error(folder, str(folder / SINGLE), name, code)


# ---- damaged files -----------------------------------------------------------------------------------

def test_truncated_in_the_data_section(tmp_path):
    folder, _, _, _ = make(tmp_path / "ckpt")
    path = folder / SINGLE
    n, hdr = header_of(path)
    body = path.stat().st_size - 8 - n
    cut = body // 2
    path.write_bytes(path.read_bytes()[: 8 + n + cut])
    incomplete = {k for k, v in hdr.items() if k != "__metadata__" and v["data_offsets"][1] > cut}
    assert incomplete
    msg = load_error(folder, str(path), "truncated")
    assert tensor_in_message(msg) in incomplete


def test_truncated_inside_the_last_tensor_names_it(tmp_path):
    folder, _, _, _ = make(tmp_path / "ckpt")
    path = folder / SINGLE
    n, hdr = header_of(path)
    last = max((k for k in hdr if k != "__metadata__"), key=lambda k: hdr[k]["data_offsets"][1])
    start, end = hdr[last]["data_offsets"]
    path.write_bytes(path.read_bytes()[: 8 + n + (start + end) // 2])
    msg = load_error(folder, str(path), last, "truncated")
    assert tensor_in_message(msg) == last


@pytest.mark.parametrize("keep", [0, 3, 7])
def test_truncated_inside_the_8_byte_length_prefix(tmp_path, keep):
    folder, _, _, _ = make(tmp_path / "ckpt")
    path = folder / SINGLE
    path.write_bytes(path.read_bytes()[:keep])
    load_error(folder, str(path), "truncated")


def test_truncated_inside_the_json_header(tmp_path):
    folder, _, _, _ = make(tmp_path / "ckpt")
    path = folder / SINGLE
    n, _ = header_of(path)
    path.write_bytes(path.read_bytes()[: 8 + n // 2])
    load_error(folder, str(path), "truncated")


def test_header_that_is_not_json(tmp_path):
    folder, _, _, _ = make(tmp_path / "ckpt")
    path = folder / SINGLE
    raw = bytearray(path.read_bytes())
    raw[8:12] = b"\x00\xff\x00\xff"
    path.write_bytes(bytes(raw))
    load_error(folder, str(path), "header")


def test_header_whose_shape_disagrees_with_its_byte_range(tmp_path):
    """A header edited in place (same length): tensor 'model.norm.weight' claims fewer elements than
    its bytes. safetensors rejects it; the engine must turn that into a CheckpointError."""
    folder, _, _, _ = make(tmp_path / "ckpt")
    path = folder / SINGLE
    raw = path.read_bytes()
    n, hdr = header_of(path)
    assert hdr["model.norm.weight"]["shape"] == [64]
    text = raw[8 : 8 + n].decode()
    entry = json.dumps({"model.norm.weight": hdr["model.norm.weight"]}, separators=(",", ":"))[1:-1]
    assert entry in text
    new_text = text.replace(entry, entry.replace('"shape":[64]', '"shape":[60]'))
    new_text += " " * (n - len(new_text))  # keep the header length: trailing spaces are allowed
    path.write_bytes(raw[:8] + new_text.encode() + raw[8 + n :])
    load_error(folder, str(path), "model.norm.weight")


@pytest.mark.parametrize("header", [b"[1, 2]", b'{"model.norm.weight": 5}'])
def test_header_that_is_json_but_not_a_tensor_table(tmp_path, header):
    folder, _, _, _ = make(tmp_path / "ckpt")
    path = folder / SINGLE
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(64))
    load_error(folder, str(path), "header")


def test_no_weights_file(tmp_path):
    folder, _, _, _ = make(tmp_path / "ckpt")
    (folder / SINGLE).unlink()
    load_error(folder, str(folder), SINGLE)


# ---- config.json --------------------------------------------------------------------------------------

def test_unknown_architecture(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt")
    rewrite(folder, {**cfg, "architectures": ["GPT2LMHeadModel"]}, sd)
    load_error(folder, str(folder / "config.json"), "'architectures'", "GPT2LMHeadModel")


def test_missing_architectures_field(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt")
    del cfg["architectures"]
    rewrite(folder, cfg, sd)
    load_error(folder, str(folder / "config.json"), "'architectures'")


def test_missing_required_field(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt")
    del cfg["vocab_size"]
    rewrite(folder, cfg, sd)
    load_error(folder, str(folder / "config.json"), "'vocab_size'")


def test_hidden_size_changed_in_config(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt")
    rewrite(folder, {**cfg, "hidden_size": 80}, sd)
    msg = load_error(folder, str(folder), "(256, 64)", "(256, 80)", "config.json")
    assert tensor_in_message(msg) in sd


def test_fewer_layers_in_config(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt")
    rewrite(folder, {**cfg, "num_hidden_layers": 3}, sd)
    msg = load_error(folder, str(folder), "unexpected", "model.layers.3.")
    assert tensor_in_message(msg).startswith("model.layers.3.")


def test_more_layers_in_config(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt")
    rewrite(folder, {**cfg, "num_hidden_layers": 5}, sd)
    msg = load_error(folder, str(folder), "missing", "model.layers.4.")
    assert tensor_in_message(msg).startswith("model.layers.4.")


def test_tie_flag_flipped_in_config(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt", "qwen3", tied=False)
    rewrite(folder, {**cfg, "tie_word_embeddings": True}, sd)
    load_error(folder, "lm_head.weight", "unexpected")


def test_config_json_missing(tmp_path):
    folder, _, _, _ = make(tmp_path / "ckpt")
    (folder / "config.json").unlink()
    load_error(folder, str(folder / "config.json"), "missing")


@pytest.mark.parametrize("raw", [b'{"architectures": ["LlamaForCausalLM"', b"", b"not json at all",
                                 b"\xff\xfe{}"])
def test_config_json_not_json(tmp_path, raw):
    folder, _, _, _ = make(tmp_path / "ckpt")
    (folder / "config.json").write_bytes(raw)
    load_error(folder, str(folder / "config.json"), "JSON")


def test_config_json_not_an_object(tmp_path):
    folder, _, _, _ = make(tmp_path / "ckpt")
    (folder / "config.json").write_text("[1, 2, 3]")
    load_error(folder, str(folder / "config.json"), "object")


def test_folder_missing(tmp_path):
    load_error(tmp_path / "nowhere", str(tmp_path / "nowhere"))


def test_qwen3_next_mixture_of_experts_layers(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt", "hybrid")
    assert cfg["num_experts"] == 0 and cfg["mlp_only_layers"] == [0, 1, 2, 3]
    rewrite(folder, {**cfg, "num_experts": 8, "mlp_only_layers": [0, 2]}, sd)
    msg = load_error(folder, str(folder / "config.json"), "mixture-of-experts", "mlp_only_layers")
    assert "[1, 3]" in msg  # the MoE layers are named


def test_qwen3_next_experts_without_mlp_only_layers(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt", "hybrid")
    cfg = {**cfg, "num_experts": 8}
    del cfg["mlp_only_layers"]
    rewrite(folder, cfg, sd)
    load_error(folder, str(folder / "config.json"), "mixture-of-experts")


def test_qwen3_next_experts_covered_by_mlp_only_layers_load(tmp_path):
    folder, model, cfg, sd = make(tmp_path / "ckpt", "hybrid")
    rewrite(folder, {**cfg, "num_experts": 8, "num_experts_per_tok": 2}, sd)  # every layer is mlp-only
    assert same_model(load_model(folder), model)


# ---- sharded checkpoints --------------------------------------------------------------------------------

def sharded(tmp_path, family="llama", max_shard_bytes=40_000):
    folder, model, cfg, sd = make(tmp_path / "ckpt", family, max_shard_bytes=max_shard_bytes)
    index = json.loads((folder / INDEX).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (folder / SINGLE).exists()
    return folder, model, cfg, sd, index, shards


@pytest.mark.parametrize("family", ["llama", "hybrid"])
def test_sharded_round_trip_equals_single_file(tmp_path, family):
    folder, model, cfg, sd, index, shards = sharded(tmp_path, family)
    single, _, _, _ = make(tmp_path / "single", family)
    a, b = read_tensors(folder), read_tensors(single)
    assert a.keys() == b.keys() == sd.keys()
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    assert set(index["weight_map"]) == set(sd)
    # every shard holds exactly the tensors the index assigns to it, and respects the size limit
    for shard in shards:
        content = load_file(str(folder / shard))
        assert set(content) == {k for k, v in index["weight_map"].items() if v == shard}
        big = max(t.numel() * t.element_size() for t in content.values())
        assert len(content) == 1 or sum(t.numel() * t.element_size() for t in content.values()) <= max(40_000, big)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in sd.values())
    assert same_model(load_model(folder), load_model(single))
    assert same_model(load_model(folder), model)


def test_index_lists_a_missing_shard(tmp_path):
    folder, _, _, _, _, shards = sharded(tmp_path)
    (folder / shards[1]).unlink()
    load_error(folder, str(folder / INDEX), shards[1], "missing")


def test_index_weight_map_points_to_the_wrong_shard(tmp_path):
    folder, _, _, _, index, shards = sharded(tmp_path)
    per_shard = {s: [k for k, v in index["weight_map"].items() if v == s] for s in shards}
    src = next(s for s in shards if len(per_shard[s]) >= 2)  # the shard stays listed for its other tensors
    dst = next(s for s in shards if s != src)
    name = per_shard[src][0]
    index["weight_map"][name] = dst
    (folder / INDEX).write_text(json.dumps(index))
    msg = load_error(folder, str(folder / src), name, dst, INDEX)
    assert tensor_in_message(msg) == name


def test_index_moves_the_only_tensor_of_a_shard(tmp_path):
    """The shard holding it is then not listed at all: the index names a tensor its shard lacks."""
    folder, _, _, _, index, shards = sharded(tmp_path)
    per_shard = {s: [k for k, v in index["weight_map"].items() if v == s] for s in shards}
    src = next(s for s in shards if len(per_shard[s]) == 1)
    dst = next(s for s in shards if s != src)
    name = per_shard[src][0]
    index["weight_map"][name] = dst
    (folder / INDEX).write_text(json.dumps(index))
    load_error(folder, str(folder / INDEX), name)


def test_index_omits_a_tensor_that_a_shard_holds(tmp_path):
    folder, _, _, _, index, shards = sharded(tmp_path)
    name = next(k for k, v in index["weight_map"].items() if v == shards[-1])
    del index["weight_map"][name]
    (folder / INDEX).write_text(json.dumps(index))
    msg = load_error(folder, name, shards[-1])
    assert tensor_in_message(msg) == name


def test_index_lists_a_tensor_that_no_shard_holds(tmp_path):
    folder, _, _, _, index, shards = sharded(tmp_path)
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = shards[0]
    (folder / INDEX).write_text(json.dumps(index))
    load_error(folder, str(folder / INDEX), "model.layers.9.mlp.up_proj.weight")


def test_tensor_in_two_shards(tmp_path):
    folder, _, cfg, sd = make(tmp_path / "ckpt")
    write_checkpoint(folder, cfg, sd, max_shard_bytes=40_000)
    index = json.loads((folder / INDEX).read_text())
    shards = sorted(set(index["weight_map"].values()))
    # put a copy of one of shard 1's tensors into shard 2 as well
    name = next(k for k, v in index["weight_map"].items() if v == shards[0])
    second = load_file(str(folder / shards[1]))
    from safetensors.torch import save_file
    save_file({**second, name: sd[name]}, str(folder / shards[1]), metadata={"format": "pt"})
    load_error(folder, name, shards[1])


@pytest.mark.parametrize("text", ["{", "{\"metadata\": {}}", "[]", "{\"weight_map\": 3}"])
def test_corrupt_index(tmp_path, text):
    folder, _, _, _, _, _ = sharded(tmp_path)
    (folder / INDEX).write_text(text)
    load_error(folder, str(folder / INDEX), "weight_map")


def test_truncated_shard_names_file_and_tensor(tmp_path):
    folder, _, _, _, index, shards = sharded(tmp_path)
    path = folder / shards[-1]
    n, hdr = header_of(path)
    last = max((k for k in hdr if k != "__metadata__"), key=lambda k: hdr[k]["data_offsets"][1])
    start, end = hdr[last]["data_offsets"]
    path.write_bytes(path.read_bytes()[: 8 + n + start + (end - start) // 3])
    load_error(folder, str(path), last, "truncated")


# ---- nothing half-loaded survives ------------------------------------------------------------------------

def test_failed_load_then_repaired_folder_loads(tmp_path):
    folder, model, cfg, sd = make(tmp_path / "ckpt", "sliding")
    # damage only the last shard: everything before it is valid and must not come back half-loaded
    write_checkpoint(folder, cfg, sd, max_shard_bytes=40_000)
    shards = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
    good_last = (folder / shards[-1]).read_bytes()
    (folder / shards[-1]).write_bytes(good_last[: len(good_last) - 100])
    load_error(folder, shards[-1], "truncated")
    load_error(folder, shards[-1], "truncated")  # failing again is the same single error
    # repaired in place
    (folder / shards[-1]).write_bytes(good_last)
    assert same_model(load_model(folder), model)


def test_repair_by_rewriting_replaces_stale_shards(tmp_path):
    """A folder that failed as a sharded checkpoint, rewritten as a single file (and back): stale
    shards and index are gone and the new content is what loads."""
    folder, model, cfg, sd = make(tmp_path / "ckpt", "hybrid")
    write_checkpoint(folder, cfg, sd, max_shard_bytes=40_000)
    shards = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
    (folder / shards[0]).unlink()
    load_error(folder, shards[0], "missing")
    other = random_model(model.cfg, seed=11)
    save_model(other, folder)  # single file now
    assert not (folder / INDEX).exists() and not any(folder.glob("model-*.safetensors"))
    loaded = load_model(folder)
    assert same_model(loaded, other) and not same_model(loaded, model)
    save_model(model, folder, max_shard_bytes=40_000)  # and sharded again
    assert not (folder / SINGLE).exists()
    assert same_model(load_model(folder), model)


def test_error_on_one_folder_does_not_affect_another(tmp_path):
    good, model, cfg, sd = make(tmp_path / "good", "qwen3")
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    cfg_bad = {**cfg, "hidden_size": 96}
    (bad / "config.json").write_text(json.dumps(cfg_bad))
    load_error(bad, "config.json")
    assert same_model(load_model(good), model)
    (bad / "config.json").write_text(json.dumps(cfg))  # repaired
    assert same_model(load_model(bad), model)
