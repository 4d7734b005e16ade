"""Compile a kernel module's Triton kernels for a GPU architecture on a machine without one, and read
what each needs from the GPU (registers, local memory a thread spills to, shared memory).

Triton's interpreter runs a kernel's arithmetic on the CPU but not its compiler: code that the
interpreter accepts can still fail to compile (a loop-carried value whose type changes), and
register spills only show in the compiled code. Triton's wheel brings ptxas and cuobjdump, so both
can be checked here: `compile_kernel` builds the cubin, `resources` reads it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def available() -> bool:
    return (BIN / "ptxas").exists() and (BIN / "cuobjdump").exists()


def compile_kernel(fn, constexprs: dict, capability: int = 90, warps: int = 4, stages: int = 3,
                   ints: tuple[str, ...] = ("T",), types: dict[str, str] | None = None,
                   aligned: tuple[str, ...] = ()):
    """fn compiled for sm_<capability>: the arguments named in `constexprs` fixed, those in `ints`
    int32, those in `types` of the type given there (Triton's names: "*u8", "*bf16", "*i32", …),
    every other one a float32 pointer. Those in `aligned` are taken to be multiples of 16 (bytes for
    a pointer), as Triton's launcher specializes such arguments at run time."""
    sig = {a: "constexpr" if a in constexprs else "i32" if a in ints else "*fp32" for a in fn.arg_names}
    sig.update({a: t for a, t in (types or {}).items() if a in sig and a not in constexprs})
    consts = {(fn.arg_names.index(a),): v for a, v in constexprs.items() if a in fn.arg_names}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned if a in sig and a not in constexprs}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", capability, 32),
                          options=dict(num_warps=warps, num_stages=stages))


def resources(compiled, workdir: Path) -> dict:
    """Registers a thread, bytes of local memory (stack: spills) a thread, shared memory a program."""
    cubin = workdir / f"{compiled.name}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    out = subprocess.run([str(BIN / "cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True,
                         text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", out)
    if m is None:
        raise RuntimeError(f"cuobjdump printed no resource usage for {compiled.name}: {out.strip()[:200]}")
    return {"registers": int(m.group(1)), "local_bytes": int(m.group(2)), "shared_bytes": int(compiled.metadata.shared)}
