"""Do the zoo's targets write code? Realism of every target of built sets.

  python bench/zoo_realism.py --zoo zoo/checkpoints/micro --baseline OLD_MICRO --out bench/results/zoo_realism.json

On all 164 HumanEval prompts, greedy, 128 new tokens (stopping at EOS), per target:
- parse_rate: share of prompt + completion, cut where the function body ends, that ast.parse
  accepts (an empty body fails; zoo/realism.py);
- loop_rate: share of completions in which one n-gram (n ≤ 4) of tokens repeats ≥ 4 times back to back;
  both rates with their 95 % Wilson intervals (`*_ci95`);
- heldout_bpb / heldout_nat_per_token: the target's loss over the first HELDOUT_BYTES of the held-out
  standard-library modules (the same text for every set and tokenizer; no set trains on them).
Sets given with --zoo land under "targets", --baseline under "baseline", keyed "preset/role"; an
existing output file keeps the entries this run does not measure (e.g. a GPU set added later).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha  # noqa: E402

from specpilot.engine.checkpoint import load_model  # noqa: E402
from specpilot.engine.decode import generate  # noqa: E402
from specpilot.zoo import corpus, realism, train, workloads  # noqa: E402
from specpilot.zoo import tokenizer as tok_mod  # noqa: E402
from specpilot.zoo.build import PRESETS, PROMPT_TOKENS, encode_docs  # noqa: E402

HELDOUT_BYTES = 400_000


def heldout_docs(limit: int = HELDOUT_BYTES) -> list[corpus.Document]:
    """The held-out stdlib modules' files in sorted order, up to `limit` bytes."""
    docs, total = [], 0
    for d in corpus.load_corpus().heldout:
        size = len(d.text.encode("utf-8"))
        if total + size > limit:
            continue
        docs.append(d)
        total += size
    return docs


def measure(folder: Path, seq: int, prompts: list[str], new: int, device: str, held) -> dict:
    target = load_model(folder, torch.float32, device)
    tok = tok_mod.load(folder)
    eos = set(target.cfg.eos_token_id)
    t = time.perf_counter()
    ids, texts = [], []
    for p in tqdm(prompts, desc=folder.name, leave=False):
        out = generate(target, tok_mod.encode(tok, p)[-PROMPT_TOKENS:], new).tokens
        out = out[: next((i for i, x in enumerate(out) if x in eos), len(out))]
        ids.append(out)
        texts.append(tok_mod.decode(tok, out))
    gen_s = time.perf_counter() - t
    nat, bpb = train.stream_eval(target, encode_docs(tok, held), seq, torch.tensor(tok_mod.byte_lengths(tok)), device)
    parsed = [realism.parses(p, c) for p, c in zip(prompts, texts)]
    grams = [realism.loop_gram(c) for c in ids]
    looped = [g is not None for g in grams]
    return {"parse_rate": sum(parsed) / len(prompts), "loop_rate": sum(looped) / len(ids),
            "parse_rate_ci95": realism.wilson(sum(parsed), len(prompts)),
            "loop_rate_ci95": realism.wilson(sum(looped), len(ids)),
            "heldout_bpb": bpb, "heldout_nat_per_token": nat, "prompts": len(prompts), "new_tokens": new,
            "params": sum(p.numel() for p in target.parameters()), "generate_s": gen_s,
            "examples": [{"id": i, "completion": texts[i][:400], "parses": parsed[i], "loops": looped[i]}
                         for i in range(min(3, len(prompts)))],
            # what each looping completion repeats, and the text around its first repeat
            "loops": [{"id": i, "gram": tok_mod.decode(tok, g), "completion": texts[i][:240]}
                      for i, g in enumerate(grams) if g is not None]}


def summary(row: dict) -> str:
    """One line of a target's figures, the rates with their 95 % intervals."""
    rates = "  ".join(f"{k} {row[k]:.3f} [{row[k + '_ci95'][0]:.3f}, {row[k + '_ci95'][1]:.3f}]"
                      for k in ("parse_rate", "loop_rate"))
    return f"{rates}  held-out {row['heldout_bpb']:.3f} bits/byte ({row['heldout_nat_per_token']:.3f} nat/token)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--zoo", action="append", default=[], help="a built set (folder with zoo.json); repeatable")
    ap.add_argument("--baseline", action="append", default=[], help="today's shipped set, for comparison")
    ap.add_argument("--target", action="append", default=[], metavar="PRESET/ROLE=FOLDER",
                    help="one target folder of a set still being built (its recipe: the preset's); repeatable")
    ap.add_argument("--prompts", type=int, default=164)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--heldout-bytes", type=int, default=HELDOUT_BYTES)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.is_file() else {}
    result.update({"command": " ".join(["python"] + sys.argv), "date": datetime.date.today().isoformat(),
                   "git_sha": git_sha(), "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                   "torch": torch.__version__, "heldout_text": f"held-out stdlib modules, first {args.heldout_bytes} bytes"})
    prompts = [q.prompt for q in workloads.humaneval(limit=args.prompts)]
    held = heldout_docs(args.heldout_bytes)
    for spec in args.target:
        key, _, folder = spec.partition("=")
        preset = key.split("/")[0]
        if not folder or preset not in PRESETS:
            raise SystemExit(f"--target {spec!r}: expected PRESET/ROLE=FOLDER with PRESET one of {', '.join(PRESETS)}")
        row = measure(Path(folder), PRESETS[preset].seq, prompts, args.new_tokens, args.device, held)
        result.setdefault("targets", {})[key] = {**row, "zoo": folder}
        print(f"targets  {key:14s} {summary(row)}", flush=True)
        out.write_text(json.dumps(result, indent=1))
    for section, sets in (("targets", args.zoo), ("baseline", args.baseline)):
        for zoo in map(Path, sets):
            manifest = json.loads((zoo / "zoo.json").read_text())
            for m in manifest["models"]:
                if m["role"] != "target":
                    continue
                key = f"{manifest['preset']}/{m['name']}"
                row = measure(zoo / m["path"], manifest["recipe"]["seq"], prompts, args.new_tokens, args.device, held)
                row.update(zoo=str(zoo), corpus_sha256=manifest["corpus_sha256"])
                result.setdefault(section, {})[key] = row
                print(f"{section:8s} {key:14s} {summary(row)}", flush=True)
                out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
