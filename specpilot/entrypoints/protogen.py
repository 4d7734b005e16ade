"""Generate the Python gRPC stubs of proto/specpilot/v1/*.proto (`make proto`).

  python -m specpilot.entrypoints.protogen [OUT]    # default OUT: the repository root → specpilot/v1/

The stubs are committed (the GPU machine has no grpcio-tools); a test regenerates them into a
temporary folder and fails when the committed ones differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTO = REPO / "proto"
GENERATED = ("_pb2.py", "_pb2_grpc.py")


def protos() -> list[Path]:
    return sorted((PROTO / "specpilot" / "v1").glob("*.proto"))


def generate(out: Path) -> list[Path]:
    """Write the stubs under `out`/specpilot/v1/; return their paths."""
    import grpc_tools
    from grpc_tools import protoc

    (out / "specpilot" / "v1").mkdir(parents=True, exist_ok=True)
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTO}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}",
            *(str(p.relative_to(PROTO)) for p in protos())]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed on " + ", ".join(p.name for p in protos()))
    return [out / "specpilot" / "v1" / f"{p.stem}{suffix}" for p in protos() for suffix in GENERATED]


def main(argv: list[str]) -> int:
    for path in generate(Path(argv[0]) if argv else REPO):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
