"""Does batched decoding on CUDA give each request its batch-1 tokens? AR and the n-gram chain on a random
model of the zoo small dense shape, 8 prompts, at batch 1, 4 and 8, in the dtype given (float64 separates a
defect of the captured batched path from bf16 rounding; SPECPILOT_COMPILE=0 separates compile from graphs).
Prints, per mode, how many requests match and where each first differs.

  python bench/batch_equality.py float64|float32|bfloat16
"""
import sys, tempfile, torch
from specpilot.engine.checkpoint import save_model
from specpilot.engine.config import ModelConfig
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.engine.synthetic import random_model
from specpilot.zoo.workloads import Request
sys.path.insert(0, "bench")
from batching import SMALL_DENSE
dtype = sys.argv[1]
g = torch.Generator().manual_seed(0)
reqs = [Request(id=f"p{i}", prompt_ids=tuple(torch.randint(1, 16000, (64,), generator=g).tolist()), max_new_tokens=64) for i in range(8)]
with tempfile.TemporaryDirectory() as tmp:
    save_model(random_model(ModelConfig(**SMALL_DENSE), seed=0, dtype=getattr(torch, dtype)), tmp)
    for mode in ["ar", "chain"]:
        eng = Engine(EngineConfig(target=tmp, drafter=None if mode == "ar" else "ngram", mode=mode, draft_len=8, dtype=dtype, device="cuda", max_new_tokens=64))
        one = [eng.generate(r).tokens for r in reqs]
        b8 = [r.tokens for r in eng.generate_batch(reqs, 8)]
        b4 = [r.tokens for r in eng.generate_batch(reqs, 4)]
        first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(one, b8)]
        print(dtype, mode, "eq8", sum(a == b for a, b in zip(one, b8)), "eq4", sum(a == b for a, b in zip(one, b4)), "first diff", first, flush=True)
        if mode == "chain":
            print("ar==chain b1", sum(a == b for a, b in zip(ar1, one)), flush=True)
        ar1 = one
