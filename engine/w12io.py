"""W12 checkpoint folders: a Hugging Face folder whose 2-D floating weights are stored in W12
(`kernels/w12/format.py`: every bf16 weight in 12 bits, bit-exactly), so that a model converted
once loads like any other and the loader proves it got the original weights back.

A W12 folder is a bf16 folder with two changes. Its config.json carries

    "quantization_config": {"quant_method": "w12", "format_version": 1,
                            "packed": {NAME: {"shape": [N, K], "sha256": HEX}, ...}}

where HEX is the sha256 of the original bf16 tensor's bytes (row-major, little-endian), and its
safetensors files hold, for every packed NAME, the five parts `format.to_tensors` writes
(NAME.w12_view, .w12_low, .w12_lo, .w12_esc_idx, .w12_esc_val) in place of NAME; every other tensor
(norms, biases, conv weights: anything not 2-D) is stored as it was.

Reading (`read_tensors` in checkpoint.py calls `read_restored`) unpacks every packed weight and
compares the sha256 of the restored bf16 bytes with the recorded one, so a flipped bit anywhere in
a weight's parts is an error naming the tensor, never a silently different model. `header_shapes`
(and so `check_model` / `check_system`) sees a W12 folder's tensors under their own names and
shapes, its parts checked against config.json from the headers alone. `read_w12` gives the packed
form itself (checked the same way) for a GEMM that reads W12 as it is.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specpilot.kernels.w12.format import SUFFIXES, W12, W12Error, from_tensors, pack, stats, to_tensors, unpack

from .checkpoint import (
    FLOAT_CODES,
    INDEX,
    SINGLE,
    CheckpointError,
    header_infos,
    read_config,
    read_entries,
    write_checkpoint,
)

QUANT_METHOD, FORMAT_VERSION = "w12", 1
PART_CODES = dict(zip(SUFFIXES, ("U8", "U8", "U8", "I32", "I16")))  # safetensors dtype of each part
W12_CODES = FLOAT_CODES | set(PART_CODES.values())
MAX_WEIGHTS = 2 ** 31  # W12's escape index is 32-bit: a matrix of more weights stays as it is
SHARD_BYTES = 5 * 10 ** 9  # Transformers' default shard size
_INT_OF = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
           torch.float64: torch.int64}
_SHA = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Packed:
    """What config.json records of one packed weight."""

    shape: tuple[int, int]
    sha256: str


def packable(t: torch.Tensor) -> bool:
    """Whether a checkpoint tensor is stored in W12: every 2-D floating-point matrix (projections,
    embeddings, LM heads, drafters' matrices) that W12's 32-bit escape index can address."""
    return t.dim() == 2 and t.is_floating_point() and 0 < t.numel() < MAX_WEIGHTS


def sha256(w: torch.Tensor) -> str:
    """The sha256 (hex) of a bf16 tensor's bytes, row-major."""
    return hashlib.sha256(w.detach().contiguous().cpu().view(torch.int16).numpy().tobytes()).hexdigest()


def _part(name: str) -> tuple[str, str] | None:
    """(packed name, suffix) of a W12 part's tensor name, None for any other tensor."""
    base, _, suffix = name.rpartition(".")
    return (base, suffix) if base and suffix in PART_CODES else None


# ---- config.json ------------------------------------------------------------------------------
def w12_spec(folder) -> dict[str, Packed] | None:
    """The packed weights a W12 folder's config.json records (name → shape, sha256); None for a
    folder without a quantization_config (or without config.json); a CheckpointError naming the
    field for a quantization_config that is not a well-formed W12 one."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        return None
    q = read_config(folder).get("quantization_config")
    if q is None:
        return None
    src = f"{folder / 'config.json'}: quantization_config"
    if not isinstance(q, dict) or q.get("quant_method") != QUANT_METHOD:
        method = q.get("quant_method") if isinstance(q, dict) else q
        raise CheckpointError(f"{src}: quant_method {method!r} is not supported; only {QUANT_METHOD!r} "
                              "checkpoints (specpilot w12 pack) or unquantized ones are read")
    if q.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{src}: format_version {q.get('format_version')!r}, expected {FORMAT_VERSION}")
    packed = q.get("packed")
    if not isinstance(packed, dict):
        raise CheckpointError(f"{src}: field 'packed' = {packed!r}: expected an object "
                              '{name: {"shape": [N, K], "sha256": hex}}')
    out = {}
    for name, e in packed.items():
        shape = e.get("shape") if isinstance(e, dict) else None
        if not (isinstance(shape, list) and len(shape) == 2
                and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
            raise CheckpointError(f"{src}: packed '{name}' has shape {shape!r}, expected [N, K] of positive integers")
        digest = e.get("sha256")
        if not (isinstance(digest, str) and _SHA.fullmatch(digest)):
            raise CheckpointError(f"{src}: packed '{name}' has sha256 {digest!r}, expected 64 lowercase hex digits")
        out[name] = Packed((shape[0], shape[1]), digest)
    return out


# ---- headers only ---------------------------------------------------------------------------------
def w12_header_shapes(folder, spec: dict[str, Packed]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape as the model sees it (packed ones from config.json), with every part's
    presence, dtype and shape checked from the headers: no tensor data is read."""
    folder = Path(folder)
    out: dict[str, tuple[int, ...]] = {}
    parts: dict[str, dict[str, tuple[Path, dict]]] = {}
    for name, (path, info) in header_infos(folder, W12_CODES).items():
        if (split := _part(name)) is None:
            if name in spec:
                raise CheckpointError(f"{path}: tensor '{name}' is stored as it was, but config.json's "
                                      "quantization_config lists it as packed (its W12 parts are expected instead)")
            if info["dtype"] not in FLOAT_CODES:
                raise CheckpointError(f"{path}: tensor '{name}' has dtype {info['dtype']}, expected a floating-point "
                                      "dtype (only the parts of W12 weights are integer)")
            out[name] = tuple(info.get("shape", []))
        elif split[0] not in spec:
            raise CheckpointError(f"{path}: tensor '{name}' is a W12 part of '{split[0]}', which config.json's "
                                  "quantization_config.packed does not list")
        else:
            parts.setdefault(split[0], {})[split[1]] = (path, info)
    for base, p in spec.items():
        if base not in parts:
            raise CheckpointError(f"{folder}: config.json lists packed tensor '{base}' but the weight files hold "
                                  f"none of its parts ({base}.w12_view, ...)")
        got = parts[base]
        for suffix in SUFFIXES:
            if suffix not in got:
                raise CheckpointError(f"{next(iter(got.values()))[0]}: W12 tensor '{base}': part '{base}.{suffix}' "
                                      "is missing")
            path, info = got[suffix]
            if info["dtype"] != PART_CODES[suffix]:
                raise CheckpointError(f"{path}: tensor '{base}.{suffix}' has dtype {info['dtype']}, expected "
                                      f"{PART_CODES[suffix]} (a W12 part of '{base}')")
        shape = {s: list(got[s][1].get("shape", [])) for s in SUFFIXES}
        (n, k), path = p.shape, got["w12_view"][0]
        for suffix, want in (("w12_view", [n, k]), ("w12_low", [n, (k + 1) // 2]), ("w12_lo", [n])):
            if shape[suffix] != want:
                raise CheckpointError(f"{got[suffix][0]}: tensor '{base}.{suffix}' has shape {shape[suffix]}, "
                                      f"expected {want} for '{base}' of shape [{n}, {k}]")
        if len(shape["w12_esc_idx"]) != 1 or shape["w12_esc_val"] != shape["w12_esc_idx"]:
            raise CheckpointError(f"{path}: W12 tensor '{base}' has escape indices of shape {shape['w12_esc_idx']} "
                                  f"and values of shape {shape['w12_esc_val']}, expected one length [E] for both")
        out[base] = p.shape
    return out


# ---- reading ----------------------------------------------------------------------------------------
def _restored(folder, spec: dict[str, Packed], device):
    """(name, W12 or None, tensor) of every tensor of a W12 folder: a packed weight's W12 and its
    restored bf16 tensor, checked against its recorded hash; any other tensor as stored. The
    headers are checked first (`w12_header_shapes`: every listed weight's parts present, of their
    dtypes and shapes, nothing unlisted), so only the parts' contents are left to check here."""
    folder = Path(folder)
    w12_header_shapes(folder, spec)
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for path, name, t in read_entries(folder, device, W12_CODES):
        if (split := _part(name)) is None:
            yield name, None, t
            continue
        base = split[0]
        pending.setdefault(base, {})[name] = t
        if len(pending[base]) < len(SUFFIXES):
            continue
        try:
            p = from_tensors(base, pending.pop(base), spec[base].shape, device)
        except W12Error as e:
            raise CheckpointError(f"{path}: W12 tensor '{base}' is malformed ({e})") from None
        w = unpack(p)
        if sha256(w) != spec[base].sha256:
            raise CheckpointError(f"{folder}: tensor '{base}' does not match its recorded hash — the W12 file is "
                                  "corrupt")
        yield base, p, w


def read_restored(folder, spec: dict[str, Packed], device="cpu") -> dict[str, torch.Tensor]:
    """Every tensor of a W12 folder under its original name, packed ones restored to bf16 bit for bit
    (each checked against its recorded sha256)."""
    return {name: t for name, _, t in _restored(folder, spec, device)}


def read_w12(folder, device="cpu") -> dict[str, W12]:
    """The packed weights of a W12 folder as `W12` (on `device`), each checked against its recorded
    sha256 as `read_tensors` checks it: what a GEMM that reads W12 directly loads."""
    spec = w12_spec(folder)
    if spec is None:
        raise CheckpointError(f"{Path(folder) / 'config.json'}: no quantization_config — not a W12 checkpoint "
                              "(specpilot w12 pack makes one)")
    return {name: p for name, p, _ in _restored(folder, spec, device) if p is not None}


# ---- packing ------------------------------------------------------------------------------------------
def _as_bf16(path, name: str, t: torch.Tensor, round_bf16: bool) -> tuple[torch.Tensor, bool]:
    """(the tensor in bf16, whether that changed a value); a float16/32/64 tensor whose values are not
    all bf16 values is refused unless `round_bf16`."""
    if t.dtype == torch.bfloat16:
        return t, False
    w = t.to(torch.bfloat16)
    differ = w.to(t.dtype).view(_INT_OF[t.dtype]) != t.view(_INT_OF[t.dtype])
    if not differ.any():
        return w, False
    if not round_bf16:
        at = tuple(int(i) for i in differ.nonzero()[0])
        raise CheckpointError(f"{path}: tensor '{name}' ({str(t.dtype).removeprefix('torch.')}) holds values that "
                              f"are not bfloat16 values (e.g. {t[at].item()!r} at {list(at)}); W12 stores bfloat16 "
                              "weights bit for bit — pass --round-bf16 to pack their bfloat16 rounding instead")
    return w, True


def _row(p: W12) -> dict:
    s = stats(p)
    return {"shape": list(p.shape), "weights": s["weights"], "bits_per_weight": s["bits_per_weight"],
            "escapes": s["escapes"], "escape_rate": s["escape_rate"]}


def _report(folder, fmt: str, rows: dict, kept: int, before: int, after: int, seconds: float, device: str,
            exact: bool | None, rounded: list[str] | None) -> dict:
    """One report for `w12 pack` and `w12 stats`: per packed tensor and in total, bits per weight on
    disk (views, low bits, channel exponents and escapes) over the packed weights, and escape rate."""
    weights = sum(r["weights"] for r in rows.values())
    escapes = sum(r["escapes"] for r in rows.values())
    bits = sum(r["bits_per_weight"] * r["weights"] for r in rows.values())
    note = (f"{len(rounded)} tensors were rounded to bfloat16 (--round-bf16): the W12 checkpoint equals the "
            "source's bfloat16 rounding, not the source" if rounded else None)
    return {"checkpoint": str(folder), "format": fmt, "out": None, "device": device, "packed_tensors": len(rows),
            "kept_tensors": kept, "weights": weights, "escapes": escapes,
            "bits_per_weight": bits / weights if weights else None,
            "escape_rate": escapes / weights if weights else None, "bytes_before": before, "bytes_after": after,
            "roundtrip_bit_exact": exact, "rounded": rounded, "note": note, "seconds": seconds, "tensors": rows}


def _source(src) -> dict:
    """A bf16 (or float) checkpoint folder's config.json, refused when the folder is W12 already or
    holds another quantization."""
    src = Path(src)
    config = read_config(src)
    if "quantization_config" in config:
        q = config["quantization_config"]
        method = q.get("quant_method") if isinstance(q, dict) else q
        what = "already a W12 checkpoint" if method == QUANT_METHOD else f"a {method!r}-quantized checkpoint"
        raise CheckpointError(f"{src}: {what} (config.json has a quantization_config); W12 packs unquantized bf16 "
                              "checkpoints")
    header_infos(src)  # every header checked before any weight is read
    return config


def _pack_folder(src, round_bf16: bool, device, progress, keep: bool):
    """(the W12 folder's tensors — empty unless `keep` —, its packed table, the report) of a bf16
    folder, packed tensor by tensor on `device`, each one's unpack checked bit for bit."""
    t0 = time.perf_counter()
    tensors, table, rows, rounded = {}, {}, {}, []
    before = after = kept = 0
    exact = True
    for path, name, t in read_entries(src):
        before += t.numel() * t.element_size()
        if packable(t):
            w, changed = _as_bf16(path, name, t, round_bf16)
            if changed:
                rounded.append(name)
            p = pack(w.to(device))
            exact &= bool(torch.equal(unpack(p).view(torch.int16).cpu(), w.view(torch.int16)))
            table[name] = {"shape": list(w.shape), "sha256": sha256(w)}
            rows[name] = _row(p)
            after += p.nbytes()
            if keep:
                tensors.update(to_tensors(name, p))
        else:
            kept += 1
            after += t.numel() * t.element_size()
            if keep:
                tensors[name] = t
        if progress is not None:
            progress(1)
    return tensors, table, _report(src, "bf16", rows, kept, before, after, time.perf_counter() - t0, str(device),
                                   exact, rounded)


def pack_checkpoint(src, out, progress=None, round_bf16: bool = False, device="cpu",
                    max_shard_bytes: int | None = SHARD_BYTES) -> dict:
    """Write `out/`, the W12 form of the checkpoint folder `src` (single file or sharded): every
    packable tensor in W12 (packed on `device`), the rest as they are, sharded by size with an index
    when larger than `max_shard_bytes`, config.json with its quantization_config, and every other
    file of the folder copied. `progress(1)` is called after each tensor. Returns the report
    (`_report`, with "out" and "copied")."""
    t0 = time.perf_counter()
    src, out = Path(src), Path(out)
    config = _source(src)
    if out.resolve() == src.resolve():
        raise CheckpointError(f"{out}: is the source checkpoint folder itself; give another folder for the W12 one")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{out}: exists and is not an empty folder; give a new or empty folder for the W12 "
                              "checkpoint")
    tensors, table, report = _pack_folder(src, round_bf16, device, progress, keep=True)
    if not report["roundtrip_bit_exact"]:
        raise RuntimeError(f"{src}: a packed tensor did not unpack to itself bit for bit; nothing was written")
    config = {**config, "quantization_config": {"quant_method": QUANT_METHOD, "format_version": FORMAT_VERSION,
                                                "packed": table}}
    write_checkpoint(out, config, tensors, max_shard_bytes)
    weights = {SINGLE, INDEX, "config.json"}
    if (src / INDEX).is_file():
        weights |= set(json.loads((src / INDEX).read_text())["weight_map"].values())
    copied = sorted(f.name for f in src.iterdir() if f.is_file() and f.name not in weights)
    for name in copied:
        shutil.copy2(src / name, out / name)
    return {**report, "out": str(out), "copied": copied, "seconds": time.perf_counter() - t0}


def checkpoint_stats(folder, round_bf16: bool = False, device="cpu", progress=None) -> dict:
    """The report `pack_checkpoint` would give, writing nothing: a bf16 folder packed in memory
    (`progress(1)` after each tensor), or a W12 folder's figures from its files' headers (no weight
    is read; "roundtrip_bit_exact" and "rounded" are then None: reading checks the hashes)."""
    folder = Path(folder)
    spec = w12_spec(folder)
    if spec is None:
        _source(folder)
        return _pack_folder(folder, round_bf16, device, progress, keep=False)[2]
    t0 = time.perf_counter()
    w12_header_shapes(folder, spec)  # the parts checked against config.json
    infos = header_infos(folder, W12_CODES)
    nbytes = {base: 0 for base in spec}
    escapes, plain = {}, 0
    for name, (_, info) in infos.items():
        size = info["data_offsets"][1] - info["data_offsets"][0]
        if (split := _part(name)) is None:
            plain += size
            continue
        nbytes[split[0]] += size
        if split[1] == "w12_esc_idx":
            escapes[split[0]] = info["shape"][0]
    rows = {}
    for base, p in spec.items():
        count = p.shape[0] * p.shape[1]
        rows[base] = {"shape": list(p.shape), "weights": count, "bits_per_weight": 8 * nbytes[base] / count,
                      "escapes": escapes[base], "escape_rate": escapes[base] / count}
    before = plain + 2 * sum(r["weights"] for r in rows.values())
    return _report(folder, "w12", rows, len(infos) - len(spec) * len(SUFFIXES), before, plain + sum(nbytes.values()),
                   time.perf_counter() - t0, "cpu", None, None)
