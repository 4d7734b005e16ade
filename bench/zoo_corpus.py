"""The code corpus as prepared: sizes, tokens with the zoo's tokenizers, and the leak check.

  python bench/zoo_corpus.py --out bench/results/zoo_corpus.json

Reads the prepared file (zoo/data/code-corpus.jsonl.xz; `specpilot zoo corpus` makes it), checks its
sha256 against the lock, then
- tokens: a byte-level BPE tokenizer per vocabulary size, trained on a stable `--tokenizer-sample` share
  of the training files (as the build's recipes do), counts the tokens of a stable `--count-sample`
  share of the training and held-out files (1.0: every file); with a share below 1 the result also
  gives the whole split's count at the sample's bytes per token, marked as scaled;
- leaks: for every held-out file, the runs of corpus.RUN_LINES significant lines it shares with the
  training files, and for every HumanEval problem (prompt, solution, tests) the runs of
  corpus.HUMANEVAL_RUN_LINES lines; both must be 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha  # noqa: E402

from specpilot.zoo import corpus as C  # noqa: E402
from specpilot.zoo import tokenizer as T  # noqa: E402


def shared(train_runs: set[int], texts: list[str], run: int) -> list[int]:
    return [len(C.line_runs(t, run) & train_runs) for t in texts]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", default=str(C.CODE_CORPUS))
    ap.add_argument("--vocab", default="4096,16384")
    ap.add_argument("--tokenizer-sample", type=float, default=0.25)
    ap.add_argument("--count-sample", type=float, default=1.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t = time.perf_counter()
    c, header = C.read_corpus(Path(args.corpus))
    result = {"command": " ".join(["python"] + sys.argv), "date": datetime.date.today().isoformat(),
              "git_sha": git_sha(), "device": "cpu", "sha256": c.sha256, "python_version": c.python_version,
              "file_mb": Path(args.corpus).stat().st_size / 1e6, "read_s": time.perf_counter() - t,
              "train_files": len(c.train), "heldout_files": len(c.heldout),
              "train_bytes": sum(len(d.text.encode()) for d in c.train),
              "heldout_bytes": sum(len(d.text.encode()) for d in c.heldout),
              "packages": len(header["packages"]), "dropped": header["dropped"], "preparation": header["timings"],
              "tokens": {}}
    for v in map(int, args.vocab.split(",")):
        t = time.perf_counter()
        tok = T.train_tokenizer([d.text for d in C.subsample(c.train, args.tokenizer_sample)], v)
        t_train = time.perf_counter() - t
        row = {"tokenizer_s": t_train, "count_sample": args.count_sample}
        for split, docs in (("train", c.train), ("heldout", c.heldout)):
            docs = C.subsample(docs, args.count_sample)
            n = sum(len(e.ids) + 1 for e in tok.encode_batch([d.text for d in docs], add_special_tokens=False))
            size = sum(len(d.text.encode()) for d in docs)
            row[split] = {"files": len(docs), "bytes": size, "tokens": n, "bytes_per_token": size / n}
            if args.count_sample < 1.0:
                row[split]["tokens_scaled_to_split"] = round(result[f"{split}_bytes"] / (size / n))
        row["encode_s"] = time.perf_counter() - t - t_train
        result["tokens"][str(v)] = row
        print(f"vocab {v}: {row['train']}", flush=True)
    t = time.perf_counter()
    runs: set[int] = set()
    for d in c.train:
        runs |= C.line_runs(d.text, C.RUN_LINES)
    held = shared(runs, [d.text for d in c.heldout], C.RUN_LINES)
    runs = set()
    for d in c.train:
        runs |= C.line_runs(d.text, C.HUMANEVAL_RUN_LINES)
    he = shared(runs, C.humaneval_texts(), C.HUMANEVAL_RUN_LINES)
    result["leaks"] = {"heldout_files_sharing_a_run": sum(x > 0 for x in held), "heldout_shared_runs": sum(held),
                       "humaneval_problems_sharing_a_run": sum(x > 0 for x in he), "humaneval_shared_runs": sum(he),
                       "run_lines": C.RUN_LINES, "humaneval_run_lines": C.HUMANEVAL_RUN_LINES,
                       "check_s": time.perf_counter() - t}
    print(f"leaks: {result['leaks']}")
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
