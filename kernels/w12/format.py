"""W12: every bf16 weight of a matrix in 12 bits, bit-exactly.

Per output channel n (a row of an [N, K] weight) a window of 16 binades [E_n − 15, E_n] is chosen
to cover as many of the row's weights as possible. A weight inside it is stored as

    view (8 bits): sign · 4-bit exponent offset from E_n − 15 · top 3 mantissa bits
    low  (4 bits): the 4 low mantissa bits

Zeros, denormals, infinities, NaNs and weights outside the window are escapes: their slot holds
code 0 and (flat index, bf16 bits) pairs restore them exactly. `lo[n]` is the biased exponent of
the window's lowest binade (E_n − 15, in 1..239, so every in-window exponent is a normal one).

Decoding an in-window weight is three integer operations on its 12 bits, because the view byte
keeps the exponent offset and the mantissa's top bits where bf16 keeps them (shifted by 4):

    bits = (view & 0x80) << 8  |  ((view & 0x7F) << 4) + (lo << 7)  |  low

In memory (`W12.records`) the weight is tiled in records of 128 channels × 64 inputs: 8 KB of
views (channel-major, inputs inner) then 4 KB of low bits (two inputs a byte, the even one in the
low nibble), records of one channel tile contiguous along K. A GEMM program streams its tile's
records in order; a pass that needs only the 8-bit view reads the first two thirds of each. The
weight is padded to whole records (code 0; the padded inputs multiply zeros). A checkpoint file
stores the same bits unpadded (`to_tensors`), so small matrices pay no padding on disk.

Pure torch: packs and unpacks on the CPU or the GPU. This is the reference of the format; the
GEMM (gemm.py) reads `W12` as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

RECORD_N, RECORD_K = 128, 64  # channels × inputs of one record
VIEW_BYTES = RECORD_N * RECORD_K  # 8192
RECORD_BYTES = VIEW_BYTES + VIEW_BYTES // 2  # 12288: the view, then the low bits
WINDOW = 16  # binades per channel
MIDPOINT = 0x8  # the low bits a view-only reader restores: the middle of 0..15
SUFFIXES = ("w12_view", "w12_low", "w12_lo", "w12_esc_idx", "w12_esc_val")  # a packed tensor's parts on disk


class W12Error(ValueError):
    """A weight that cannot be packed, or packed parts that do not form a W12 weight."""


@dataclass
class W12:
    """One packed [N, K] weight (see the module's docstring)."""

    shape: tuple[int, int]
    records: torch.Tensor  # uint8 [ceil(N/128), ceil(K/64), 12288]
    lo: torch.Tensor  # uint8 [ceil(N/128)·128]: each channel's lowest binade (biased exponent)
    esc_idx: torch.Tensor  # int32 [E]: n·K + k of every escape, ascending
    esc_val: torch.Tensor  # int16 [E]: its bf16 bits
    tile_ptr: torch.Tensor  # int32 [ceil(N/128) + 1]: tile t's escapes are esc_idx[tile_ptr[t]:tile_ptr[t+1]]

    @property
    def device(self) -> torch.device:
        return self.records.device

    @property
    def escapes(self) -> int:
        return self.esc_idx.numel()

    def to(self, device) -> W12:
        return W12(self.shape, *(t.to(device) for t in (self.records, self.lo, self.esc_idx, self.esc_val,
                                                          self.tile_ptr)))

    def nbytes(self) -> int:
        """Bytes on disk (`to_tensors`): views, low bits, one exponent a channel, 6 bytes an escape."""
        n, k = self.shape
        return n * k + n * ((k + 1) // 2) + n + 6 * self.escapes


def _bits(w: torch.Tensor) -> torch.Tensor:
    """A bf16 tensor's 16 bits as int32 in 0..65535."""
    return w.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def _windows(expf: torch.Tensor) -> torch.Tensor:
    """lo [N] (int32) for biased exponents [N, K]: the window of 16 normal binades holding the most
    of each row's weights (the highest such window on a tie; 127 − 15 for a row with no normal weight)."""
    n, k = expf.shape
    normal = (expf >= 1) & (expf <= 254)
    rows = torch.arange(n, device=expf.device, dtype=torch.int64)[:, None].expand(n, k)
    hist = torch.zeros(n * 256, dtype=torch.int64, device=expf.device)
    hist.index_add_(0, (rows * 256 + expf.to(torch.int64))[normal], torch.ones_like(expf, dtype=torch.int64)[normal])
    cs = torch.nn.functional.pad(hist.view(n, 256).cumsum(1), (1, 0))  # cs[:, e] = count of exponents < e
    top = torch.arange(WINDOW, 255, device=expf.device)  # E_n: lo = E_n − 15 ≥ 1 and E_n ≤ 254
    covered = cs[:, top + 1] - cs[:, top + 1 - WINDOW]  # [N, len(top)]
    best = top[covered.flip(1).argmax(1).neg() + len(top) - 1]  # the highest E_n among the best
    best = torch.where(covered.amax(1) > 0, best, torch.full_like(best, 127))
    return (best - (WINDOW - 1)).to(torch.int32)


def pack(w: torch.Tensor) -> W12:
    """A bf16 matrix [N, K] → W12 (on w's device)."""
    if w.dtype != torch.bfloat16:
        raise W12Error(f"W12 packs bfloat16 weights, got {w.dtype}")
    if w.dim() != 2 or w.numel() == 0:
        raise W12Error(f"W12 packs non-empty matrices, got shape {tuple(w.shape)}")
    n, k = w.shape
    if n * k >= 2 ** 31:
        raise W12Error(f"a {n}×{k} matrix has more weights than W12's 32-bit escape index holds")
    bits = _bits(w)
    sign, expf, mant = bits >> 15, (bits >> 7) & 0xFF, bits & 0x7F
    lo = _windows(expf)
    off = expf - lo[:, None]
    inside = (off >= 0) & (off < WINDOW)
    view = torch.where(inside, (sign << 7) | (off << 3) | (mant >> 4), 0)
    low = torch.where(inside, mant & 0xF, 0)
    flat = (~inside).flatten().nonzero().flatten()
    esc_idx = flat.to(torch.int32)
    esc_val = bits.flatten()[flat].to(torch.int16)  # wraps 32768..65535 to the negative int16 with the same bits
    return _tile(n, k, view.to(torch.uint8), low.to(torch.uint8), lo.to(torch.uint8), esc_idx, esc_val)


def _tile(n, k, view, low, lo, esc_idx, esc_val) -> W12:
    """Records from unpadded views [N, K] and low nibbles [N, K] (uint8)."""
    tn, tk = -(-n // RECORD_N), -(-k // RECORD_K)
    pad = (0, tk * RECORD_K - k, 0, tn * RECORD_N - n)
    view = torch.nn.functional.pad(view, pad).view(tn, RECORD_N, tk, RECORD_K).transpose(1, 2)
    low = torch.nn.functional.pad(low, pad).view(tn, RECORD_N, tk, RECORD_K // 2, 2).transpose(1, 2)
    low = low[..., 0] | (low[..., 1] << 4)
    records = torch.cat((view.reshape(tn, tk, -1), low.reshape(tn, tk, -1)), dim=2).contiguous()
    lo = torch.nn.functional.pad(lo, (0, tn * RECORD_N - n), value=1)
    bounds = torch.arange(tn + 1, device=view.device, dtype=torch.int64) * RECORD_N * k
    tile_ptr = torch.searchsorted(esc_idx.to(torch.int64), bounds).to(torch.int32)
    return W12((n, k), records, lo, esc_idx, esc_val, tile_ptr)


def _untile(p: W12) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpadded views and low nibbles [N, K] (uint8) of the records."""
    n, k = p.shape
    tn, tk, _ = p.records.shape
    view = p.records[..., :VIEW_BYTES].view(tn, tk, RECORD_N, RECORD_K).transpose(1, 2).reshape(tn * RECORD_N, -1)
    pairs = p.records[..., VIEW_BYTES:].view(tn, tk, RECORD_N, RECORD_K // 2).transpose(1, 2)
    low = torch.stack((pairs & 0xF, pairs >> 4), dim=-1).reshape(tn * RECORD_N, -1)
    return view[:n, :k], low[:n, :k]


def decode(view: torch.Tensor, low: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """bf16 weights [N, K] from views, low nibbles and channel windows (escapes not restored): the
    three operations of the module's docstring."""
    v, l = view.to(torch.int32), low.to(torch.int32)
    bits = ((v & 0x80) << 8) | (((v & 0x7F) << 4) + (lo[: v.shape[0], None].to(torch.int32) << 7)) | l
    return bits.to(torch.int16).view(torch.bfloat16)  # int32 → int16 keeps the low 16 bits


def quick(p: W12) -> torch.Tensor:
    """The bf16 matrix [N, K] that a pass reading only the 8-bit views sees (two-level verification's
    Q pass): each in-window weight's dropped 4 low mantissa bits at their midpoint (`MIDPOINT`), so
    it lies within 2^-4 of the packed weight, relatively; every escape exact."""
    view, _ = _untile(p)
    w = decode(view, torch.full_like(view, MIDPOINT), p.lo).flatten()
    w.view(torch.int16)[p.esc_idx.to(torch.int64)] = p.esc_val
    return w.view(p.shape)


def unpack(p: W12) -> torch.Tensor:
    """The bf16 matrix [N, K], bit for bit the one packed."""
    view, low = _untile(p)
    w = decode(view, low, p.lo).flatten()
    w.view(torch.int16)[p.esc_idx.to(torch.int64)] = p.esc_val
    return w.view(p.shape)


# ---- checkpoint files: the same bits, unpadded ------------------------------------------------
def to_tensors(name: str, p: W12) -> dict[str, torch.Tensor]:
    """The parts a safetensors file stores for weight `name` (CPU tensors)."""
    n, k = p.shape
    view, low = _untile(p)
    if k % 2:
        low = torch.nn.functional.pad(low, (0, 1))
    pairs = low[:, 0::2] | (low[:, 1::2] << 4)
    parts = (view, pairs, p.lo[:n], p.esc_idx, p.esc_val)
    return {f"{name}.{s}": t.contiguous().cpu() for s, t in zip(SUFFIXES, parts)}


def from_tensors(name: str, parts: dict[str, torch.Tensor], shape: tuple[int, int], device="cpu") -> W12:
    """The W12 weight `name` of `shape` from a file's parts; a `W12Error` naming the part that is
    missing or malformed."""
    got = {}
    for s, dtype in zip(SUFFIXES, (torch.uint8, torch.uint8, torch.uint8, torch.int32, torch.int16)):
        t = parts.get(f"{name}.{s}")
        if t is None:
            raise W12Error(f"{name}: part '{name}.{s}' is missing")
        if t.dtype != dtype:
            raise W12Error(f"{name}.{s}: dtype {t.dtype}, expected {dtype}")
        got[s] = t.to(device)
    n, k = shape
    want = {"w12_view": (n, k), "w12_low": (n, (k + 1) // 2), "w12_lo": (n,)}
    for s, shp in want.items():
        if tuple(got[s].shape) != shp:
            raise W12Error(f"{name}.{s}: shape {tuple(got[s].shape)}, expected {shp}")
    idx, val = got["w12_esc_idx"], got["w12_esc_val"]
    if idx.dim() != 1 or val.shape != idx.shape:
        raise W12Error(f"{name}: escape index {tuple(idx.shape)} and values {tuple(val.shape)} differ in shape")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n * k or bool((idx[1:] <= idx[:-1]).any())):
        raise W12Error(f"{name}.w12_esc_idx: escape indices must ascend inside [0, {n * k})")
    lo = got["w12_lo"].to(torch.int32)
    if lo.numel() and (int(lo.min()) < 1 or int(lo.max()) > 254 - (WINDOW - 1)):
        raise W12Error(f"{name}.w12_lo: a channel window outside the normal exponents (1..{254 - WINDOW + 1})")
    pairs = got["w12_low"]
    low = torch.stack((pairs & 0xF, pairs >> 4), dim=-1).reshape(n, -1)[:, :k]
    return _tile(n, k, got["w12_view"], low, got["w12_lo"], idx, val)


def stats(p: W12) -> dict:
    """Bits per weight on disk (escapes and channel windows included) and the escape rate."""
    count = p.shape[0] * p.shape[1]
    return {"weights": count, "bits_per_weight": 8 * p.nbytes() / count, "escapes": p.escapes,
            "escape_rate": p.escapes / count}
