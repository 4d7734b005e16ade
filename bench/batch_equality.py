"""Does batched decoding on CUDA give each request its batch-1 tokens? AR and the n-gram chain on a random
model of the zoo small dense shape, 8 prompts, at batch 1, 4 and 8, in the dtype given (float64 separates a
defect of the captured batched path from bf16 rounding; SPECPILOT_COMPILE=0 separates compile from graphs;
the 'eager' line runs the same lanes decoder on CUDA without graphs or compile).
Prints, per mode, how many requests match and where each first differs.

  python bench/batch_equality.py float64|float32|bfloat16
"""
import sys, tempfile, torch
from specpilot.engine import fast
from specpilot.engine.checkpoint import save_model
from specpilot.engine.config import ModelConfig
from specpilot.engine.drafters import save_drafter
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.engine.synthetic import random_drafter_net, random_model
from specpilot.zoo.workloads import Request
sys.path.insert(0, "bench")
from batching import SMALL_DENSE


def same(one, other):
    first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
             for a, b in zip(one, other)]
    return sum(a == b for a, b in zip(one, other)), first


dtype = sys.argv[1]
g = torch.Generator().manual_seed(0)
reqs = [Request(id=f"p{i}", prompt_ids=tuple(torch.randint(1, 16000, (64,), generator=g).tolist()), max_new_tokens=64) for i in range(8)]
with tempfile.TemporaryDirectory() as tmp:
    save_model(random_model(ModelConfig(**SMALL_DENSE), seed=0, dtype=getattr(torch, dtype)), tmp)
    save_drafter(random_drafter_net("block", ModelConfig(**SMALL_DENSE), seed=0), f"{tmp}/block", getattr(torch, dtype))
    ar1 = None
    for mode in ["ar", "chain", "block"]:
        drafter = {"ar": None, "chain": "ngram", "block": f"{tmp}/block"}[mode]
        eng = Engine(EngineConfig(target=tmp, drafter=drafter, mode="ar" if mode == "ar" else "chain", draft_len=8, dtype=dtype, device="cuda", max_new_tokens=64))
        one = [eng.generate(r).tokens for r in reqs]
        for b in (8, 4):
            print(dtype, mode, f"b{b}", *same(one, [r.tokens for r in eng.generate_batch(reqs, b)]), flush=True)
        dec = fast.FastDecoder(eng.target, eng.drafter, 8, eng.policy, 1024, graphs=False, compile=False, lanes=8)
        eager = [r.tokens for r in dec.generate_batch([list(r.prompt_ids) for r in reqs], [64] * 8)]
        print(dtype, mode, "b8 eager (no graphs, no compile)", *same(one, eager), flush=True)
        if mode != "ar":
            print(dtype, f"ar b1 == {mode} b1", *same(ar1, one), flush=True)
            i = next((j for j, (a, b) in enumerate(zip(one, eager)) if a != b), None)
            if i is not None:
                print("request", i, "b1   ", one[i][:40], "\n          b8eag", eager[i][:40], flush=True)
        ar1 = one if mode == "ar" else ar1
