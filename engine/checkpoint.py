"""Hugging Face–format checkpoint folders: `config.json` + `model.safetensors`, or shards listed in
`model.safetensors.index.json`. Reading validates everything before a module is built, so bad
input raises one `CheckpointError` naming the file, tensor and field, and nothing half-loaded
survives.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from .config import ConfigError, ModelConfig
from .model import Model

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
FLOAT_CODES = {"F16", "BF16", "F32", "F64"}
ITEMSIZE = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message says which file, tensor and field."""


def read_config(folder) -> dict:
    path = Path(folder) / "config.json"
    if not Path(folder).is_dir():
        raise CheckpointError(f"{folder}: not a checkpoint folder (no such directory)")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing — a checkpoint folder needs config.json")
    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: must hold a JSON object")
    return d


def _header(path: Path) -> dict:
    """The safetensors header, with every tensor's byte range checked against the file size."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointError(f"{path}: truncated file (shorter than the 8-byte safetensors header)")
        n = int.from_bytes(raw, "little")
        if n > size - 8:
            raise CheckpointError(f"{path}: truncated file (header says {n} bytes, file has {size - 8})")
        try:
            hdr = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CheckpointError(f"{path}: corrupt safetensors header (not JSON)") from None
    if not isinstance(hdr, dict) or not all(isinstance(v, dict) for v in hdr.values()):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object of tensor entries)")
    body = size - 8 - n
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        end = info.get("data_offsets", [0, 0])[1]
        if end > body:
            raise CheckpointError(
                f"{path}: tensor '{name}' needs bytes up to {end} but the data section holds {body} "
                "(truncated file — copy or download it again)"
            )
        if info.get("dtype") not in FLOAT_CODES:
            raise CheckpointError(
                f"{path}: tensor '{name}' has dtype {info.get('dtype')}, expected a floating-point dtype"
            )
        start, shape = info.get("data_offsets", [0, 0])[0], info.get("shape", [])
        if end - start != math.prod(shape) * ITEMSIZE[info["dtype"]]:
            raise CheckpointError(
                f"{path}: tensor '{name}' has shape {shape} ({info['dtype']}) but data_offsets "
                f"[{start}, {end}] hold {end - start} bytes (corrupt header)"
            )
    return hdr


def read_tensors(folder, device="cpu") -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder, single-file or sharded."""
    folder = Path(folder)
    if (folder / INDEX).is_file():
        try:
            wmap = json.loads((folder / INDEX).read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise CheckpointError(f"{folder / INDEX}: corrupt index (needs a 'weight_map' object)") from None
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            raise CheckpointError(f"{folder / INDEX}: corrupt index (needs a 'weight_map' object)")
        files = sorted(set(wmap.values()))
    elif (folder / SINGLE).is_file():
        wmap, files = None, [SINGLE]
    else:
        raise CheckpointError(f"{folder}: no {SINGLE} or {INDEX} — not a safetensors checkpoint")
    out: dict[str, torch.Tensor] = {}
    for fname in files:
        path = folder / fname
        if not path.is_file():
            raise CheckpointError(f"{folder / INDEX}: shard '{fname}' is listed but missing")
        hdr = _header(path)
        try:
            handle = safe_open(str(path), framework="pt", device=str(device))
        except Exception as e:  # safetensors' own error types on a header it rejects
            raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
        with handle as f:
            for name in f.keys():
                if wmap is not None and wmap.get(name) != fname:
                    raise CheckpointError(
                        f"{path}: tensor '{name}' is not listed for this shard in {INDEX}"
                        f" (index says {wmap.get(name)!r})")
                if name in out:
                    raise CheckpointError(f"{path}: tensor '{name}' appears in more than one shard")
                try:
                    out[name] = f.get_tensor(name)
                except Exception as e:  # safetensors raises its own error types on corrupt data
                    raise CheckpointError(f"{path}: tensor '{name}' cannot be read ({e})") from None
        del hdr
    if wmap is not None:
        missing = sorted(set(wmap) - set(out))
        if missing:
            raise CheckpointError(f"{folder / INDEX}: lists tensors not found in their shards: {missing[:5]}")
    return out


def load_into(module: nn.Module, tensors: dict[str, torch.Tensor], source, dtype: torch.dtype,
              ignore=lambda name: False) -> nn.Module:
    """Validate names and shapes against a module built on the meta device, then assign."""
    expected = module.state_dict()
    given = {k: v for k, v in tensors.items() if not ignore(k)}
    missing = sorted(set(expected) - set(given))
    extra = sorted(set(given) - set(expected))
    if missing:
        raise CheckpointError(f"{source}: missing tensor '{missing[0]}'" +
                              (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "") +
                              " — config.json and the weights do not describe the same model")
    if extra:
        raise CheckpointError(f"{source}: unexpected tensor '{extra[0]}'" +
                              (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "") +
                              " — config.json and the weights do not describe the same model")
    for name, ref in expected.items():
        if tuple(given[name].shape) != tuple(ref.shape):
            raise CheckpointError(f"{source}: tensor '{name}' has shape {tuple(given[name].shape)}, "
                                  f"config.json implies {tuple(ref.shape)}")
    module.load_state_dict({k: v.to(dtype) for k, v in given.items()}, strict=True, assign=True)
    return module


def load_model(folder, dtype: torch.dtype = torch.float32, device="cpu") -> Model:
    """A target (or draft LM) from a Llama / Mistral / Qwen3 / Qwen3-Next checkpoint folder."""
    folder = Path(folder)
    d = read_config(folder)
    try:
        cfg = ModelConfig.from_hf(d, str(folder / "config.json"))
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    tensors = read_tensors(folder, device)
    with torch.device("meta"):
        model = Model(cfg)
    ignore = lambda n: n.endswith("rotary_emb.inv_freq") or (cfg.family == "qwen3_next" and n.startswith("mtp."))
    load_into(model, tensors, folder, dtype, ignore)
    model.inv_freq = cfg.inv_freq().to(device)
    return model.eval()


def write_checkpoint(folder, config: dict, tensors: dict[str, torch.Tensor], max_shard_bytes: int | None = None):
    """Write config.json and the tensors, sharded with an index when they exceed max_shard_bytes."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    shards, cur, size = [], {}, 0
    for k in sorted(tensors):
        nbytes = tensors[k].numel() * tensors[k].element_size()
        if cur and max_shard_bytes and size + nbytes > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k], size = tensors[k], size + nbytes
    shards.append(cur)
    for stale in [*folder.glob("model*.safetensors"), folder / INDEX]:
        stale.unlink(missing_ok=True)
    if len(shards) == 1:
        save_file(shards[0], str(folder / SINGLE), metadata={"format": "pt"})
    else:
        wmap = {}
        for i, shard in enumerate(shards, 1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(folder / name), metadata={"format": "pt"})
            wmap.update({k: name for k in shard})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wmap}, indent=1))
    (folder / "config.json").write_text(json.dumps(config, indent=1))


def save_model(model: Model, folder, max_shard_bytes: int | None = None, dtype: torch.dtype | None = None):
    sd = {k: (v.to(dtype) if dtype else v) for k, v in model.state_dict().items()}
    config = model.cfg.to_hf()
    if dtype is not None:
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
    write_checkpoint(folder, config, sd, max_shard_bytes)
