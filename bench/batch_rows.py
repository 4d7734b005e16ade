"""The batch's row selection on the CPU: τ of a shared node budget (`shared:N:C`) against equal
per-request trees (`best-first:N`) at the same total draft nodes (lanes × N), and with per-request
draft lengths (`draft_lens`), through the static driver's lanes (FastDecoder.generate_batch).

The fixture: a random float64 target (the tests' tiny llama shape) and a noisy oracle drafter per
request, which proposes the request's own AR continuation with a top-1 error rate of its own
(requests range from easy to hard, `--noise`); `calibrated` drafters score their top-1 at 1 - p (the
confidence a shared budget ranks requests by), uncalibrated ones score every request alike. Every
output is checked against its AR tokens. Nothing is timed: the figures are τ (tokens a request
commits per pass, the bonus included), tokens per pass over the batch, and the rows each pass
verified (every lane plans the largest share: lanes × (C + 1)).

  python bench/batch_rows.py --out bench/results/batch_rows_cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
from pathlib import Path

import torch

from specpilot.engine.decode import generate
from specpilot.engine.fast import FastDecoder
from specpilot.engine.replay import make_policy
from specpilot.engine.synthetic import NoisyOracle, random_model, tiny_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha  # noqa: E402

VOCAB = 61


class Oracle(NoisyOracle):
    """A noisy oracle that, after each reset, takes its continuation and error rate by the prompt."""

    def __init__(self, conts: dict, noise: dict, calibrated: bool, seed: int):
        super().__init__([], 0, 0.0, seed, VOCAB, calibrated=calibrated)
        self.conts, self.noise = conts, noise

    def observe(self, committed, next_tokens, feats=None) -> None:
        if self.seen == 0:
            key = tuple(committed)
            self.cont, self.prompt_len, self.p = self.conts[key], len(key), self.noise[key]
        super().observe(committed, next_tokens, feats)


def run(target, prompts, limit, conts, noise, calibrated, policy, lanes, draft_len, lengths, seed) -> dict:
    dec = FastDecoder(target, Oracle(conts, noise, calibrated, seed), draft_len, make_policy(policy), max_len=256,
                      graphs=False, lanes=lanes, lengths=lengths)
    out = dec.generate_batch(prompts, [limit] * len(prompts), eos=set())
    for q, res in zip(prompts, out):
        assert res.tokens == conts[tuple(q)][:limit], "an output differs from its AR tokens"
    steps = [s for r in out for s in r.steps]
    full = [s for s in steps if s.lanes == lanes]  # passes with every lane busy (the batch's steady state)
    return {"policy": policy, "draft_lens": ",".join(map(str, lengths)) if lengths else None,
            "calibrated": calibrated, "tau": sum(s.tau for s in steps) / len(steps),
            "tau_full_batch": sum(s.tau for s in full) / max(len(full), 1),
            "tokens_per_pass": sum(s.tau for s in steps) / sum(1 / s.lanes for s in steps),  # a pass: `lanes` records
            "drafted_per_request": sum(s.drafted for s in steps) / len(steps),
            "verified_rows_per_pass": dec.lanes * dec.spec.rows,
            "tau_by_noise": {str(p): sum(s.tau for q, r in zip(prompts, out) if noise[tuple(q)] == p for s in r.steps)
                             / sum(len(r.steps) for q, r in zip(prompts, out) if noise[tuple(q)] == p)
                             for p in sorted(set(noise.values()))}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--lanes", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--draft-len", type=int, default=8)
    ap.add_argument("--budgets", default="4,8,16", help="N, draft nodes per request")
    ap.add_argument("--noise", default="0.05,0.2,0.4,0.7", help="top-1 error rates, dealt to the requests in turn")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    target = random_model(tiny_config("llama", vocab=VOCAB), seed=2, dtype=torch.float64)
    rnd = random.Random(0)
    rates = [float(x) for x in a.noise.split(",")]
    prompts = [[rnd.randrange(VOCAB) for _ in range(rnd.randint(3, 12))] for _ in range(a.prompts)]
    # the continuation runs past the limit by the draft length (the static driver drafts its full length)
    conts = {tuple(q): generate(target, q, a.new_tokens + a.draft_len + 1, eos=set()).tokens for q in prompts}
    noise = {tuple(q): rates[i % len(rates)] for i, q in enumerate(prompts)}
    rows = []
    for calibrated in (True, False):
        for n in (int(x) for x in a.budgets.split(",")):
            cases = [(f"best-first:{n}", None), (f"shared:{n}:{min(2 * n, 63)}", None),
                     (f"shared:{n}:{min(4 * n, 63)}", None), (f"shared:{n}:{min(4 * n, 63)}", (8, 6, 4))]
            for policy, lengths in dict.fromkeys(cases):
                r = run(target, prompts, a.new_tokens, conts, noise, calibrated, policy, a.lanes, a.draft_len,
                        lengths, seed=1)
                rows.append({"nodes_per_request": n, **r})
                print(f"calibrated={calibrated!s:5} {policy:14} lens={r['draft_lens'] or '-':6} τ {r['tau']:.3f} "
                      f"(full batch {r['tau_full_batch']:.3f}) rows/pass {r['verified_rows_per_pass']}", flush=True)
    out = {"command": " ".join(["python"] + sys.argv), "device": "cpu", "date": datetime.date.today().isoformat(),
           "git_sha": git_sha(), "torch": torch.__version__, "target": "tiny llama (random, float64, vocab 61)",
           "prompts": a.prompts, "lanes": a.lanes, "new_tokens": a.new_tokens, "draft_len": a.draft_len,
           "noise": rates, "runs": rows}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
