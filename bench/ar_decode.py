"""AR decode speed of the engine on a Llama-3.1-8B-shaped random-weight checkpoint, batch 1, bf16,
against Hugging Face Transformers (eager, dynamic cache) on the same checkpoint, and against the
HBM floor (weight bytes read per token / measured copy bandwidth).

Run on a GPU machine:  python bench/ar_decode.py --out results.json
Decode speed is bound by reading the weights, so their values do not matter (random bf16).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from specpilot.engine.checkpoint import load_model, write_checkpoint
from specpilot.engine.config import ModelConfig
from specpilot.engine.graphs import StaticDecoder
from specpilot.engine.model import Model

LLAMA_8B = dict(
    family="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, layer_types=["full_attention"] * 32,
    rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072, eos_token_id=[128001],
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192},
)


def git_sha() -> str:
    """GIT_SHA from the caller (a machine's copy of the tree may have no .git), else git's own answer."""
    if os.environ.get("GIT_SHA"):
        return os.environ["GIT_SHA"]
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "unknown"


def copy_bandwidth(gb: float = 4.0) -> float:
    """Device-to-device copy, bytes read + written per second (median of 20)."""
    n = int(gb * 2**30) // 2
    a, b = torch.randn(n, device="cuda", dtype=torch.bfloat16), torch.empty(n, device="cuda", dtype=torch.bfloat16)
    times = []
    for _ in range(25):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * n * 2 / statistics.median(times[5:])


def make_checkpoint(folder: Path, cfg: ModelConfig) -> None:
    """Random bf16 weights made on the GPU, written as 5 GB shards."""
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in Model(cfg).state_dict().items()}
    g = torch.Generator(device="cuda").manual_seed(0)
    tensors = {}
    for k, shape in shapes.items():
        if len(shape) == 1:
            tensors[k] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            w = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g) * shape[-1] ** -0.5
            tensors[k] = w.cpu()
    write_checkpoint(folder, cfg.to_hf() | {"torch_dtype": "bfloat16"}, tensors, max_shard_bytes=5 * 2**30)


def weight_bytes_per_token(model: Model) -> int:
    """Every parameter is read once per decode step, except the embedding table (one row)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.model.embed_tokens.weight
    return total - emb.numel() * emb.element_size() + emb.shape[1] * emb.element_size()


def time_engine(model: Model, prompt: list[int], n: int, graph: bool, reps: int, compile: bool = False) -> dict:
    dec = StaticDecoder(model, len(prompt) + n + 8, graph=graph, compile=compile)
    dec.generate(prompt, 16, eos=set())  # warm-up
    runs = [dec.generate(prompt, n, eos=set()) for _ in range(reps)]
    per_tok = statistics.median(r.decode_s / (n - 1) for r in runs)  # the first token comes from prefill
    return {"ms_per_token": per_tok * 1e3, "tokens_per_s": 1 / per_tok, "tokens": runs[0].tokens}


def time_transformers(folder: Path, prompt: list[int], n: int) -> dict:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).cuda().eval()
    ids = torch.tensor([prompt], device="cuda")
    kw = dict(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=0)
    hf.generate(ids, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = hf.generate(ids, **kw)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    del hf
    torch.cuda.empty_cache()
    return {"tokens_per_s": n / dt, "ms_per_token": dt / n * 1e3, "tokens": out[0, len(prompt):].tolist()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--hf-new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shape", choices=("llama8b", "tiny"), default="llama8b", help="tiny: a quick smoke run")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile'd step inside the graph")
    ap.add_argument("--workdir", default=None, help="where the 16 GB checkpoint is written (default: a temp dir)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/ar_decode.py needs a CUDA GPU", file=sys.stderr)
        return 2
    shape = LLAMA_8B if args.shape == "llama8b" else {
        **LLAMA_8B, "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "layer_types": ["full_attention"] * 2}
    cfg = ModelConfig(**shape)
    folder = Path(args.workdir or tempfile.mkdtemp()) / "llama8b-random"
    t = time.perf_counter()
    make_checkpoint(folder, cfg)
    t_write = time.perf_counter() - t
    bw = copy_bandwidth()
    t = time.perf_counter()
    model = load_model(folder, torch.bfloat16, "cuda")
    t_load = time.perf_counter() - t
    wbytes = weight_bytes_per_token(model)
    floor_ms = wbytes / bw * 1e3
    prompt = list(range(1000, 1032))
    graphed = time_engine(model, prompt, args.new_tokens, graph=True, reps=args.reps)
    eager = time_engine(model, prompt, 32, graph=False, reps=1)
    compiled = time_engine(model, prompt, args.new_tokens, graph=True, reps=args.reps, compile=True) \
        if args.compile else None
    del model
    torch.cuda.empty_cache()
    hf = time_transformers(folder, prompt, args.hf_new_tokens)
    agree = next((i for i, (a, b) in enumerate(zip(graphed["tokens"], hf["tokens"])) if a != b),
                 min(len(graphed["tokens"]), len(hf["tokens"])))
    result = {
        "command": " ".join(["python"] + sys.argv),
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "git_sha": git_sha(),
        "torch": torch.__version__,
        "checkpoint": f"{args.shape} shape, random bf16 weights",
        "copy_bandwidth_TBps": bw / 1e12,
        "weight_GB_read_per_token": wbytes / 1e9,
        "floor_ms_per_token": floor_ms,
        "engine_cuda_graph_ms_per_token": graphed["ms_per_token"],
        "engine_cuda_graph_tokens_per_s": graphed["tokens_per_s"],
        "engine_fraction_of_floor": floor_ms / graphed["ms_per_token"],
        "engine_eager_ms_per_token": eager["ms_per_token"],
        "engine_compiled_graph_ms_per_token": compiled["ms_per_token"] if compiled else None,
        "engine_compiled_graph_fraction_of_floor": floor_ms / compiled["ms_per_token"] if compiled else None,
        "transformers_eager_tokens_per_s": hf["tokens_per_s"],
        "speedup_over_transformers": graphed["tokens_per_s"] / hf["tokens_per_s"],
        "greedy_tokens_equal_to_transformers": agree,
        "new_tokens": args.new_tokens,
        "checkpoint_write_s": t_write,
        "checkpoint_load_s": t_load,
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    for k, v in result.items():
        print(f"{k:40s} {v:.4g}" if isinstance(v, float) else f"{k:40s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
