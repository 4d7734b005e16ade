"""W12: bf16 weights stored bit-exactly in 12 bits (format.py), and the few-row GEMMs that stream them
(gemm.py: `w12_linear`, and `bf16_linear` over plain bf16 weights), beside their references
(reference.py)."""

from .format import W12, W12Error, pack, unpack
from .gemm import Config, Workspace, bf16_linear, heuristic, w12_linear
from .reference import bf16_linear_ref, w12_linear_ref

__all__ = ["W12", "W12Error", "pack", "unpack", "Config", "Workspace", "bf16_linear", "heuristic", "w12_linear",
           "bf16_linear_ref", "w12_linear_ref"]
