"""`specpilot w12 pack` and `specpilot w12 stats`: W12 checkpoints (every bf16 weight of a matrix
in 12 bits, bit-exactly; `engine/w12io.py`).

`pack` converts a bf16 checkpoint folder once; the engine then loads the W12 folder like any other
(`generate --target W12DIR`, ...), checking every restored weight against its recorded hash.
`stats` prints the same figures without writing anything.
"""

from __future__ import annotations

import json
import re

from specpilot.progress import progress_bar


def register(subparsers) -> None:
    w = subparsers.add_parser("w12", help="W12 checkpoints: every bf16 weight of a matrix in 12 bits, bit-exactly")
    cmds = w.add_subparsers(dest="w12_command", metavar="COMMAND", required=True)
    pack = cmds.add_parser("pack", help="write the W12 form of a bf16 checkpoint folder (loads like any other)")
    stats = cmds.add_parser("stats", help="bits per weight and escape rate of a bf16 folder packed in memory, or "
                            "of a W12 folder from its files; writes nothing")
    for p in (pack, stats):
        p.add_argument("--checkpoint", required=True, metavar="DIR",
                       help="a checkpoint folder (single file or sharded)")
        if p is pack:
            p.add_argument("--out", required=True, metavar="DIR", help="the W12 folder to write (new or empty)")
        p.add_argument("--round-bf16", action="store_true", help="pack float16/32/64 tensors' bfloat16 rounding "
                       "(default: refuse a tensor whose values are not all bfloat16 values)")
        p.add_argument("--device", default="cpu", help="where the weights are packed: cpu, cuda or cuda:N")
        p.add_argument("--json", action="store_true", help="print the full report as one JSON object")
    w.set_defaults(func=run)


def _check_device(device: str) -> None:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ValueError(f"--device {device!r}: expected cpu, cuda or cuda:N")
    if device.startswith("cuda"):
        import torch

        index = int(device.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: no such CUDA device here (use --device cpu)")


def run(args) -> int:
    from specpilot.engine.checkpoint import header_infos, read_config
    from specpilot.engine.w12io import checkpoint_stats, pack_checkpoint, w12_spec

    _check_device(args.device)
    read_config(args.checkpoint)  # a folder that is not a checkpoint: one line before anything else
    w12 = w12_spec(args.checkpoint) is not None
    if w12 and args.w12_command == "stats" and (args.round_bf16 or args.device != "cpu"):
        raise ValueError(f"--round-bf16 and --device apply to packing; {args.checkpoint} is a W12 checkpoint, whose "
                         "figures come from its files")
    total = None if w12 else len(header_infos(args.checkpoint))
    verb = "packing" if args.w12_command == "pack" else "measuring"
    with progress_bar(total, verb, "tensor", disable=args.json or total is None) as bar:
        if args.w12_command == "pack":
            report = pack_checkpoint(args.checkpoint, args.out, bar.update, args.round_bf16, args.device)
        else:
            report = checkpoint_stats(args.checkpoint, args.round_bf16, args.device, bar.update)
    if args.json:
        print(json.dumps(report))
        return 0
    print("\n".join(summary(report)))
    return 0


def summary(r: dict) -> list[str]:
    """The report's headline lines."""
    lines = [f"{r['checkpoint']} ({r['format']}): {r['packed_tensors']} tensors in W12, {r['kept_tensors']} kept "
             f"as they are"]
    if r["weights"]:
        lines.append(f"  {r['bits_per_weight']:.4f} bits per weight over {r['weights']:,} weights (views, low bits, "
                     f"channel exponents and escapes), escape rate {100 * r['escape_rate']:.4f} %")
    size = "bf16 equivalent" if r["format"] == "w12" else "source"
    lines.append(f"  tensor bytes {r['bytes_before']:,} ({size}) → {r['bytes_after']:,} "
                 f"(×{r['bytes_after'] / max(r['bytes_before'], 1):.3f})")
    if r["roundtrip_bit_exact"] is not None:
        lines.append(f"  unpack(pack(w)) bit-exact for every tensor: {r['roundtrip_bit_exact']}")
    if r["note"]:
        lines.append(f"  note: {r['note']}")
    if r["out"]:
        copied = f"; copied {', '.join(r['copied'])}" if r.get("copied") else ""
        lines.append(f"wrote {r['out']} (config.json with its quantization_config{copied}) in {r['seconds']:.1f} s")
    return lines
