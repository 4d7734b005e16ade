"""How large each half of a feature drafter's input row is: fc_in([embedding of token t+1, hidden
at t]) is the sum of an embedding part and a hidden part, and without input norms their sizes are
whatever the target's embedding and features happen to be.

  python bench/drafter_rows.py --zoo zoo/checkpoints/micro --out results.json

For every feature drafter of a built zoo, over the context rows of the first `--prompts` HumanEval
prompts (the rows `generate` gives the drafter): the root mean square of the embedding part and of
the hidden part after fc_in, and their ratio.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha  # noqa: E402

from specpilot.engine.checkpoint import load_model  # noqa: E402
from specpilot.engine.drafters import FEATURE_KINDS, FeatureDrafter, load_drafter  # noqa: E402
from specpilot.zoo import tokenizer as tok_mod  # noqa: E402
from specpilot.zoo import workloads  # noqa: E402


def rms(x: torch.Tensor) -> float:
    return float(x.pow(2).mean().sqrt())


@torch.no_grad()
def halves(drafter: FeatureDrafter, target, prompts: list[list[int]]) -> dict:
    """RMS of the embedding and hidden parts of fc_in over every context row of the prompts."""
    net, emb = drafter.net, drafter.emb
    H = net.cfg.hidden_size
    w_emb, w_hidden = net.fc_in.weight[:, :H], net.fc_in.weight[:, H:]
    parts_e, parts_h = [], []
    for p in prompts:
        feats = target(torch.tensor([p]), feature_layers=drafter.target_layers, logits=False).features[0]
        e, h = F.embedding(torch.tensor(p[1:]), emb), net.fc_feat(feats[:-1])
        if net.cfg.input_norm:
            e, h = net.emb_norm(e), net.hidden_norm(h)
        parts_e.append(e @ w_emb.T)
        parts_h.append(h @ w_hidden.T)
    e, h = rms(torch.cat(parts_e)), rms(torch.cat(parts_h))
    return {"input_norm": net.cfg.input_norm, "embedding_part_rms": e, "hidden_part_rms": h, "hidden_over_embedding": h / e}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--zoo", default="zoo/checkpoints/micro", help="a built zoo folder (with zoo.json)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    zoo = Path(args.zoo)
    manifest = json.loads((zoo / "zoo.json").read_text())
    result = {"command": " ".join(["python"] + sys.argv), "date": datetime.date.today().isoformat(),
              "git_sha": git_sha(), "device": "cpu", "torch": torch.__version__, "preset": manifest["preset"],
              "prompts": args.prompts, "drafters": {}}
    reqs, targets = workloads.humaneval(limit=args.prompts), {}  # a target and its prompts, loaded once
    for m in manifest["models"]:
        if m["role"] != "drafter" or m["kind"] not in FEATURE_KINDS:
            continue
        if m["target"] not in targets:
            tok = tok_mod.load(zoo / m["target"])
            targets[m["target"]] = (load_model(zoo / m["target"], torch.float32),
                                    [tok_mod.encode(tok, q.prompt)[-512:] for q in reqs])
        target, prompts = targets[m["target"]]
        drafter = load_drafter(str(zoo / m["path"]), target=target)
        result["drafters"][m["name"]] = row = halves(drafter, target, prompts)
        print(f"{m['name']:22s} embedding part {row['embedding_part_rms']:.3f}  hidden part "
              f"{row['hidden_part_rms']:.3f}  ratio {row['hidden_over_embedding']:.1f}", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
