"""`specpilot force`: token forcing of a system's outputs against stock's, from the command line.

This module composes two services in one process, which only `specpilot/` may do (docs/METHOD.md §2):
the controller's pure token-forcing logic (`services/controller/forcing.py`) and a local scorer
from the GPU worker (`services/gpu_worker/scoring.py`). torch and the engine load only when the
command runs, so registering the command costs nothing.

Outputs files are what `specpilot generate --out FILE` writes (JSON lines, one `{"id", "prompt_ids",
"tokens", ...}` object per request) or `generate --json` printed.
"""

from __future__ import annotations

import json
import re

from specpilot.services.controller.forcing import (
    ForcingSettings,
    SystemOutput,
    calibrate_delta,
    check_forcing,
)


def register(subparsers) -> None:
    f = subparsers.add_parser(
        "force", help="token forcing: judge a system's outputs against stock's with the scorer",
        description="Teacher-force a candidate's and stock's outputs through the scorer (the target with an "
                    "FP32 LM head); count mismatches and events (mismatches with margin >= 2δ); verdict.")
    f.add_argument("--scorer", required=True, metavar="DIR", help="the stock target's checkpoint folder")
    f.add_argument("--outputs", required=True, metavar="FILE",
                   help="the candidate's outputs: a `generate --out` file (or `generate --json` output)")
    f.add_argument("--baseline", required=True, metavar="FILE", help="stock's outputs on the same requests, same format")
    f.add_argument("--delta", type=float, metavar="X", help="near-tie threshold δ in nat (from Phase 0)")
    f.add_argument("--ar", metavar="FILE",
                   help="without --delta: AR outputs on the same requests; δ is calibrated from stock vs AR (Phase 0)")
    f.add_argument("--device", default="cpu", help="scorer device: cpu, cuda or cuda:N")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.set_defaults(func=run)


def read_outputs(path) -> list[SystemOutput]:
    """A system's outputs from `generate --out` JSON lines or `generate --json` output; errors name the
    file and line."""
    from specpilot.entrypoints.cli import read_generated

    out = []
    for n, d in enumerate(read_generated(path), 1):
        try:
            o = SystemOutput(str(d["id"]), tuple(_token(t) for t in d["prompt_ids"]), tuple(_token(t) for t in d["tokens"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f'{path}: output {n}: expected {{"id", "prompt_ids", "tokens"}} with non-negative '
                             f"integer token ids ({e})") from None
        out.append(o)
    if not out:
        raise ValueError(f"{path} holds no outputs")
    return out


def _token(t) -> int:
    if isinstance(t, bool) or not isinstance(t, int) or t < 0:
        raise ValueError(f"token id {t!r}")
    return t


def _check_vocab(outputs: list[SystemOutput], path, vocab: int) -> None:
    for o in outputs:
        bad = [t for t in (*o.prompt_ids, *o.tokens) if t >= vocab]
        if bad:
            raise ValueError(f"{path}: output {o.id!r} holds token id {bad[0]}, outside the scorer's vocabulary "
                             f"(size {vocab}); were these outputs made with another target?")


def run(args) -> int:
    from specpilot.engine.checkpoint import check_model
    from specpilot.services.gpu_worker.scoring import load_scorer, memo_scorer

    if args.delta is None and args.ar is None:
        raise ValueError("give --delta X, or --ar FILE (AR outputs) to calibrate δ from stock vs AR")
    if args.delta is not None and not args.delta > 0:
        raise ValueError(f"--delta must be > 0; got {args.delta}")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        raise ValueError(f"--device {args.device!r}: expected cpu, cuda or cuda:N")
    vocab = check_model(args.scorer).vocab_size
    candidate, baseline = read_outputs(args.outputs), read_outputs(args.baseline)
    ar_outputs = read_outputs(args.ar) if args.delta is None else None
    for path, outs in ((args.outputs, candidate), (args.baseline, baseline), (args.ar, ar_outputs or [])):
        _check_vocab(outs, path, vocab)
    if {o.id for o in candidate} != {o.id for o in baseline}:
        raise ValueError(f"{args.outputs} and {args.baseline} must cover the same requests (ids differ: "
                         f"{sorted({o.id for o in candidate} ^ {o.id for o in baseline})[:3]})")
    scorer = memo_scorer(load_scorer(args.scorer, args.device))

    delta = args.delta
    if delta is None:
        ar = {o.id: o for o in ar_outputs}
        base = {o.id: o for o in baseline}
        if ar.keys() != base.keys():
            raise ValueError(f"{args.ar} and {args.baseline} must cover the same requests")
        delta = calibrate_delta({i: o.tokens for i, o in base.items()}, {i: ar[i].tokens for i in base},
                                {i: scorer(o.prompt_ids, o.tokens) for i, o in base.items()})
    out = check_forcing(candidate, baseline, scorer, delta, ForcingSettings())
    if args.json:
        print(json.dumps(out))
    else:
        print(format_result(out, args.delta is None))
    return 0 if out["passed"] else 1  # like a test run: a rejected candidate fails the command


def format_result(out: dict, calibrated: bool = False) -> str:
    lines = [f"δ = {out['delta']:g} nat{' (calibrated from stock vs AR)' if calibrated else ''}; "
             f"event = mismatch with margin >= {out['candidate']['event_threshold']:g} nat"]
    for name in ("candidate", "baseline"):
        r = out[name]
        q = r["margin_quantiles"]
        qs = " ".join(f"{k}:{v:.3f}" if v is not None else f"{k}:-" for k, v in q.items())
        lines.append(f"{name:9s} {r['tokens']} tokens · mismatches {r['mismatches']} ({r['mismatch_rate']:.3%}) · "
                     f"events {r['events']} ({r['event_rate']:.3%}) · mismatch margins {qs}")
    worst = out["candidate"]["worst_events"]
    if worst:
        lines.append("candidate's worst events:")
        for e in worst:
            lines.append(f"  {e['request_id']} @{e['position']}: token {e['token']} vs argmax {e['argmax']}, "
                         f"margin {e['margin']:.3f}  after {e['context']}")
    lines.append("PASS" if out["passed"] else "REJECT: " + "; ".join(out["reasons"]))
    return "\n".join(lines)
