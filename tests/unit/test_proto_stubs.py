"""The committed gRPC stubs (specpilot/v1/) are what `make proto` generates from proto/ now."""

from pathlib import Path

from specpilot.entrypoints import protogen

COMMITTED = protogen.REPO / "specpilot" / "v1"


def test_committed_stubs_match_the_protos(tmp_path):
    fresh = protogen.generate(tmp_path)
    assert fresh, "no .proto files found"
    stale = [p.name for p in fresh if not (COMMITTED / p.name).is_file()
             or (COMMITTED / p.name).read_bytes() != p.read_bytes()]
    assert not stale, f"stale gRPC stubs {stale}: run `make proto` and commit specpilot/v1/"
    extra = sorted({p.name for p in COMMITTED.glob("*_pb2*.py")} - {p.name for p in fresh})
    assert not extra, f"stubs without a .proto: {extra}"
