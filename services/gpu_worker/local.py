"""A GPU worker in its own process, speaking JSON lines on stdin/stdout: the local stand-in for
the gRPC server (docs/METHOD.md §2), used by the embedded mode and the controller's paired runs.

  python -m specpilot.services.gpu_worker.local '{"engine": {...EngineConfig...}, "device": "cpu:0", "root": "/wt"}'

"root" (optional) is a built worktree (build.py): the system's engine and kernels load from it,
everything else (this worker, the zoo) from the installed package.

It loads the system, prints {"ready": true}, then answers each line:
- {"requests": [...], "batch": B} (workload request objects; B at a time, default 1) →
  {"outputs": [[token, ...], ...], "prompt_ids": [...]} once the device has finished — it never reports a time: the controller times the round trip;
- {"encode": [...]} (request objects) → {"prompt_ids": [[id, ...], ...]}: the target's tokenization;
- {"score": [{"prompt_ids", "tokens"}, ...]} → {"scores": [{argmax_token_ids, token_logprob,
  argmax_logprob}, ...]}: teacher-forced scores by the system's target with a float32 LM head
  (the scorer of token forcing, when the system is stock);
- {"profile": {"requests": [...], "new_tokens": N, "budgets": [policy, ...], "replay": [policy, ...],
  "batch": B}} → {"profile": {...}}: the cost model's measurements of this system at B requests
  decoded at once (default 1; see `profiling.measure`).
"""

from __future__ import annotations

import json
import os
import sys

import torch


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    device = spec.get("device", "cpu")
    engine_cfg = dict(spec["engine"])
    root = spec.get("root")
    if root:
        from .build import use_root

        use_root(root)  # before anything imports specpilot.engine
    if device.startswith("cpu:"):  # one core per system, as the paired design wants
        os.sched_setaffinity(0, {int(device.split(":")[1])})
        torch.set_num_threads(1)
        engine_cfg["device"] = "cpu"
    else:
        engine_cfg["device"] = device
    from specpilot.engine.engine import Engine, EngineConfig
    from specpilot.zoo.workloads import request_from_json

    from .profiling import measure
    from .scoring import load_scorer, score

    try:
        engine = Engine(EngineConfig(**engine_cfg))
    except (ValueError, TypeError, OSError, RuntimeError) as e:  # a system that cannot load: one line, no traceback
        print(json.dumps({"error": " ".join(str(e).split()) or type(e).__name__}), flush=True)
        return 1
    scorer = None
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        try:
            msg = json.loads(line)
            if "encode" in msg:
                reply = {"prompt_ids": [engine.encode(request_from_json(r)) for r in msg["encode"]]}
            elif "profile" in msg:
                p = msg["profile"]
                prompts = [engine.encode(request_from_json(r)) for r in p["requests"]]
                reply = {"profile": measure(engine, prompts, int(p["new_tokens"]), list(p.get("budgets", [])),
                                            list(p.get("replay", [])), batch=p.get("batch", 1))}
            elif "score" in msg:
                scorer = scorer or load_scorer(engine_cfg["target"], engine_cfg["device"])
                reply = {"scores": [vars(score(scorer, s["prompt_ids"], s["tokens"])) for s in msg["score"]]}
            else:
                reqs = [request_from_json(r) for r in msg["requests"]]
                batch = msg.get("batch", 1)
                if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
                    raise ValueError(f"batch = {batch!r}: expected a positive integer")
                if batch > 1 and not hasattr(engine, "generate_batch"):
                    raise ValueError(f"batch = {batch}: this engine decodes one request at a time")
                results = engine.generate_batch(reqs, batch) if batch > 1 else [engine.generate(r) for r in reqs]
                if engine_cfg["device"].startswith("cuda"):
                    torch.cuda.synchronize()
                reply = {"outputs": [r.tokens for r in results], "prompt_ids": [engine.encode(r) for r in reqs],
                         "acceptance": acceptance_counts([s for r in results for s in r.steps])}
            print(json.dumps(reply), flush=True)
        except (ValueError, KeyError, TypeError) as e:  # a bad request is answered, never fatal
            print(json.dumps({"error": " ".join(f"{type(e).__name__}: {e}".split())}), flush=True)
    return 0


def acceptance_counts(steps) -> dict:
    """Target passes and, per drafted position (1, 2, …), how many of them accepted a token there."""
    drafted = max((st.drafted for st in steps), default=0)
    return {"steps": len(steps), "accepted": [sum(st.tau > i + 1 for st in steps) for i in range(drafted)]}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
