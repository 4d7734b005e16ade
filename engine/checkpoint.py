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
FLOAT_CODES = frozenset({"F16", "BF16", "F32", "F64"})
ITEMSIZE = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "U8": 1, "I16": 2, "I32": 4, "I64": 8, "BOOL": 1}


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


def _header(path: Path, codes=FLOAT_CODES) -> dict:
    """The safetensors header, with every tensor's byte range checked against the file size and its
    dtype among `codes` (floating-point; a W12 folder's reader allows its parts' integer dtypes too)."""
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
        if info.get("dtype") not in codes:
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


def _weight_files(folder: Path) -> tuple[dict | None, list[str]]:
    """(the index's weight map or None, the safetensors files) of a checkpoint folder."""
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
    for fname in files:
        if not (folder / fname).is_file():
            raise CheckpointError(f"{folder / INDEX}: shard '{fname}' is listed but missing")
    return wmap, files


def _check_shard(wmap, fname: str, path: Path, name: str, seen) -> None:
    if wmap is not None and wmap.get(name) != fname:
        raise CheckpointError(f"{path}: tensor '{name}' is not listed for this shard in {INDEX}"
                              f" (index says {wmap.get(name)!r})")
    if name in seen:
        raise CheckpointError(f"{path}: tensor '{name}' appears in more than one shard")


def _check_index_covered(folder: Path, wmap, seen) -> None:
    if wmap is not None:
        missing = sorted(set(wmap) - set(seen))
        if missing:
            raise CheckpointError(f"{folder / INDEX}: lists tensors not found in their shards: {missing[:5]}")


def header_infos(folder, codes=FLOAT_CODES) -> dict[str, tuple[Path, dict]]:
    """Every tensor's (file, header entry: dtype, shape, data_offsets), from the safetensors headers
    only (no tensor data is read), checked as `read_tensors` checks them."""
    folder = Path(folder)
    wmap, files = _weight_files(folder)
    out: dict[str, tuple[Path, dict]] = {}
    for fname in files:
        path = folder / fname
        for name, info in _header(path, codes).items():
            if name == "__metadata__":
                continue
            _check_shard(wmap, fname, path, name, out)
            out[name] = (path, info)
    _check_index_covered(folder, wmap, out)
    return out


def header_shapes(folder) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, from the safetensors headers only (no tensor data is read), checked as
    `read_tensors` checks them; a W12 folder's packed weights under their own names and shapes
    (from config.json's quantization_config, their parts checked against it)."""
    from .w12io import w12_header_shapes, w12_spec

    spec = w12_spec(folder)
    if spec is not None:
        return w12_header_shapes(folder, spec)
    return {name: tuple(info.get("shape", [])) for name, (_, info) in header_infos(folder).items()}


def read_entries(folder, device="cpu", codes=FLOAT_CODES):
    """(file, name, tensor) of every tensor of a checkpoint folder as stored, file by file."""
    folder = Path(folder)
    wmap, files = _weight_files(folder)
    seen: set[str] = set()
    for fname in files:
        path = folder / fname
        _header(path, codes)
        try:
            handle = safe_open(str(path), framework="pt", device=str(device))
        except Exception as e:  # safetensors' own error types on a header it rejects
            raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
        with handle as f:
            for name in f.keys():
                _check_shard(wmap, fname, path, name, seen)
                try:
                    t = f.get_tensor(name)
                except Exception as e:  # safetensors raises its own error types on corrupt data
                    raise CheckpointError(f"{path}: tensor '{name}' cannot be read ({e})") from None
                seen.add(name)
                yield path, name, t
    _check_index_covered(folder, wmap, seen)


def read_tensors(folder, device="cpu") -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder, single-file or sharded. A W12 folder's packed weights come
    back as the bf16 tensors they were, each checked bit for bit against its recorded hash
    (`w12io.read_restored`)."""
    from .w12io import read_restored, w12_spec

    spec = w12_spec(folder)
    if spec is not None:
        return read_restored(folder, spec, device)
    return {name: t for _, name, t in read_entries(folder, device)}


def check_names_shapes(expected: dict[str, tuple], given: dict[str, tuple], source) -> None:
    """The tensors a module expects (name → shape) against those a checkpoint holds."""
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
        if tuple(given[name]) != tuple(ref):
            raise CheckpointError(f"{source}: tensor '{name}' has shape {tuple(given[name])}, "
                                  f"config.json implies {tuple(ref)}")


def load_into(module: nn.Module, tensors: dict[str, torch.Tensor], source, dtype: torch.dtype,
              ignore=lambda name: False) -> nn.Module:
    """Validate names and shapes against a module built on the meta device, then assign."""
    given = {k: v for k, v in tensors.items() if not ignore(k)}
    check_names_shapes({k: tuple(v.shape) for k, v in module.state_dict().items()},
                       {k: tuple(v.shape) for k, v in given.items()}, source)
    module.load_state_dict({k: v.to(dtype) for k, v in given.items()}, strict=True, assign=True)
    return module


def _model_config(folder: Path) -> ModelConfig:
    try:
        return ModelConfig.from_hf(read_config(folder), str(folder / "config.json"))
    except ConfigError as e:
        raise CheckpointError(str(e)) from None


def _ignored(cfg: ModelConfig):
    return lambda n: n.endswith("rotary_emb.inv_freq") or (cfg.family == "qwen3_next" and n.startswith("mtp."))


def load_model(folder, dtype: torch.dtype = torch.float32, device="cpu") -> Model:
    """A target (or draft LM) from a Llama / Mistral / Qwen3 / Qwen3-Next checkpoint folder."""
    folder = Path(folder)
    cfg = _model_config(folder)
    tensors = read_tensors(folder, device)
    with torch.device("meta"):
        model = Model(cfg)
    load_into(model, tensors, folder, dtype, _ignored(cfg))
    model.inv_freq = cfg.inv_freq().to(device)
    return model.eval()


def check_model(folder) -> ModelConfig:
    """Everything `load_model` checks — config.json fields, safetensors headers, tensor names and
    shapes — without reading a weight; its config."""
    folder = Path(folder)
    cfg = _model_config(folder)
    try:
        cfg.inv_freq()
    except (KeyError, TypeError, ZeroDivisionError) as e:
        raise CheckpointError(f"{folder / 'config.json'}: field 'rope_scaling' is incomplete ({e!r})") from None
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in Model(cfg).state_dict().items()}
    ignore = _ignored(cfg)
    check_names_shapes(expected, {k: v for k, v in header_shapes(folder).items() if not ignore(k)}, folder)
    return cfg


def _manifest_target(drafter: Path) -> Path | None:
    """The target folder a zoo manifest (`zoo.json` beside the drafter's folder) names for it."""
    manifest = drafter.parent / "zoo.json"
    try:
        models = json.loads(manifest.read_text())["models"]
        by_name = {m["name"]: m for m in models}
        entry = next(m for m in models if Path(m["path"]).name == drafter.name)
        return (manifest.parent / by_name[entry["target"]]["path"]).resolve() if entry.get("target") else None
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None


def check_system(target, drafter: str | None = None, force_drafter: bool = False) -> ModelConfig:
    """Refuse, before anything loads, a target or drafter folder that cannot be loaded, a drafter
    that does not fit its target, and — unless `force_drafter` — a drafter trained for another target
    (its zoo manifest names another one) or one whose vocabulary differs from the target's. Returns
    the target's config."""
    tcfg = check_model(target)
    from .engine import load_tokenizer

    load_tokenizer(target)  # a tokenizer.json that cannot be read is refused here, not in a worker
    if not drafter or drafter == "ngram" or drafter.startswith("ngram:"):
        if drafter and drafter.startswith("ngram:"):
            n = drafter.split(":", 1)[1]
            if not n.isdigit() or int(n) < 1:
                raise CheckpointError(f"drafter {drafter!r}: expected ngram or ngram:N with N a positive integer")
        return tcfg
    folder = Path(drafter)
    hint = "; pass --force-drafter to use it anyway"
    d = read_config(folder)
    from .eagle3 import check_eagle3, is_eagle3

    if is_eagle3(d):  # an EAGLE-3 folder: its fields, tensors and vocabulary map against the target
        check_eagle3(folder, tcfg)
    elif "SpecPilotDrafter" in (d.get("architectures") or []):
        from .drafters import DraftConfig, FeatureDrafterNet, misfit

        cfg = DraftConfig.from_hf(d, str(folder / "config.json"))
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in FeatureDrafterNet(cfg).state_dict().items()}
        given = header_shapes(folder)
        if len(given.get("mask_embedding", ())) == 1 and "mask_embedding" in expected:  # older: one shared row
            given["mask_embedding"] = expected["mask_embedding"]
        check_names_shapes(expected, given, folder)
        if why := misfit(cfg, tcfg, f"the target {target}"):
            raise CheckpointError(f"{folder}: {why}")
    else:
        dcfg = check_model(folder)
        if dcfg.vocab_size != tcfg.vocab_size and not force_drafter:
            raise CheckpointError(f"{folder}: the draft model's vocab_size {dcfg.vocab_size} differs from the "
                                  f"target's {tcfg.vocab_size} ({target}){hint}")
        if dcfg.is_hybrid:
            raise CheckpointError(f"{folder}: a standalone draft model must be attention-only (its cache is rolled "
                                  "back); this one has linear_attention layers")
    named = _manifest_target(folder)
    if named is not None and named != Path(target).resolve() and not force_drafter:
        raise CheckpointError(f"{folder}: zoo.json says this drafter was trained for {named}, not for the target "
                              f"{target}{hint}")
    return tcfg


def drafter_kind(folder) -> str:
    """The kind of drafter a checkpoint folder holds, from its config.json: a feature drafter's
    `drafter_kind`, "sequential" for an EAGLE-3 folder, else "draft_lm"."""
    from .eagle3 import is_eagle3

    d = read_config(folder)
    return "sequential" if is_eagle3(d) else d.get("drafter_kind", "draft_lm")


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
