"""`W12Linear`: an `nn.Linear` whose weight is stored in W12 (format.py), for any torch model.

On a CUDA device with bf16 inputs of at most `MAX_ROWS` rows (a decode step's verify pass) it runs
the W12 GEMM (gemm.py), reading 12 bits a weight. Otherwise — the CPU, other dtypes, a long prefill
— it multiplies by the restored bf16 weight (`format.unpack`, bit for bit the packed one): on the
CPU restored once and kept, on the GPU restored for the call and dropped, so the layer keeps only
the 12-bit copy. Either way the result is that of the dense layer on the original weight, up to
the GEMM's own rounding (fp32 accumulation, one rounding to bf16).

`convert(module)` swaps every `nn.Linear` of a module tree (a Hugging Face Transformers model, say)
for a `W12Linear`, in place. Convert once the model has its final device: the packed weight is not
a parameter or buffer, so `.to()` does not move it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import format as w12

MAX_ROWS = 64  # rows the GEMM takes; longer passes (prefill) multiply by the restored weight


@torch.library.custom_op("specpilot::w12_linear", mutates_args=())
def _gemm(x: torch.Tensor, records: torch.Tensor, lo: torch.Tensor, esc_idx: torch.Tensor, esc_val: torch.Tensor,
          tile_ptr: torch.Tensor, n: int, k: int, quick: bool = False) -> torch.Tensor:
    """The W12 GEMM as one operator: torch.compile sees its output shape (below) and leaves the
    Triton launch to run as it is, so a compiled, graph-captured decode step keeps it whole."""
    from . import gemm  # Triton loads only where the kernel runs

    return gemm.w12_linear(x, w12.W12((n, k), records, lo, esc_idx, esc_val, tile_ptr), quick=quick)


@_gemm.register_fake
def _(x, records, lo, esc_idx, esc_val, tile_ptr, n, k, quick=False):
    return x.new_empty(x.shape[0], n)


def bf16_exact(w: torch.Tensor) -> bool:
    """Whether every value of w is a bf16 value (then W12 stores it losslessly)."""
    return w.dtype == torch.bfloat16 or bool(torch.equal(w.to(torch.bfloat16).to(w.dtype), w))


class W12Linear(nn.Module):
    """`quick`: the layer as a view-only reader sees it (format.quick: the low bits at their
    midpoint), two-level verification's Q pass; the GEMM then reads 8 of the 12 bits."""

    def __init__(self, packed: w12.W12, bias: torch.Tensor | None = None, quick: bool = False):
        super().__init__()
        self.packed, self.out_features, self.in_features = packed, *packed.shape
        self.quick = quick
        self.bias = None if bias is None else bias.detach()
        self._dense: torch.Tensor | None = None  # the restored weight, kept on the CPU

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, name: str = "weight") -> W12Linear:
        """Pack a weight whose values are bf16 values (of any float dtype); a `W12Error` names it otherwise."""
        if not bf16_exact(weight):
            raise w12.W12Error(f"{name}: W12 stores bf16 weights losslessly, and this {weight.dtype} weight holds "
                               "values that are not bf16 values")
        return cls(w12.pack(weight.detach().to(torch.bfloat16)), bias)

    @property
    def nbytes(self) -> int:
        """Bytes a pass reads: the records, the channel windows and the escapes (and the bias)."""
        p = self.packed
        bias = self.bias.numel() * self.bias.element_size() if self.bias is not None else 0
        return p.records.numel() + p.lo.numel() + 6 * p.escapes + 4 * p.tile_ptr.numel() + bias

    def restored(self, dtype: torch.dtype) -> torch.Tensor:
        decode = w12.quick if self.quick else w12.unpack
        if self.packed.device.type != "cpu":
            return decode(self.packed).to(dtype)
        if self._dense is None or self._dense.dtype != dtype:
            self._dense = decode(self.packed).to(dtype)
        return self._dense

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k)
        if x2.is_cuda and x2.dtype == torch.bfloat16 and x2.shape[0] <= MAX_ROWS:
            p = self.packed
            y = _gemm(x2.contiguous(), p.records, p.lo, p.esc_idx, p.esc_val, p.tile_ptr, *p.shape, self.quick)
            if self.bias is not None:
                y = y + self.bias
        else:
            y = F.linear(x2, self.restored(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        view = ", view only" if self.quick else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, escapes={self.packed.escapes}{view}"


def convert(module: nn.Module, skip=lambda name: False) -> int:
    """Swap every nn.Linear under `module` (whose dotted name `skip` does not select) for a W12Linear
    of the same weight, in place; the number swapped."""
    swapped = 0
    for name, child in list(module.named_modules()):
        for attr, sub in list(child.named_children()):
            full = f"{name}.{attr}" if name else attr
            if type(sub) is nn.Linear and not skip(full):
                setattr(child, attr, W12Linear.from_weight(sub.weight, sub.bias, full))
                swapped += 1
    return swapped
