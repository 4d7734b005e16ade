"""W12 and the certified head in the decode users run, on one GPU. Parts, each writing its JSON under
--out-dir as it finishes (the kernels alone are timed by bench/w12_gemm.py and bench/certified_head.py):

  ar     Llama-3.1-8B shape, random bf16 weights: AR ms per token through `generate`'s static path
         (CUDA graphs, compiled) for weights × lm_head = bf16 × bf16 (stock), bf16 × certified,
         w12 × bf16, w12 × w12, w12 × certified; the bf16 step against the HBM floor (weight bytes
         read per token over the measured copy bandwidth) → ar_floor_fraction_bf16; each system over
         stock → w12_ar_speedup (w12 × bf16) and the rest; whether each system's tokens equal stock's.
  hf     the same shape in Hugging Face Transformers (LlamaForCausalLM, random bf16): a greedy decode
         with a static cache, one token a step captured in a CUDA graph, before and after
         `kernels.w12.linear.convert` swaps its nn.Linear layers for W12 ones → hf_w12_speedup.
  force  the shipped micro dense pair (zoo/checkpoints/micro) on the GPU in bf16: stock (chain,
         block + Markov drafter) against the same system with weights w12 and the certified head, on
         HumanEval prompts, judged by token forcing (`services.controller.forcing`, float32 scorer).

  python bench/w12.py ar hf force --out-dir /tmp/w12     # then: python bench/w12.py merge DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_fastpath import LLAMA_8B, eight_b, forcing, parts_main, requests  # noqa: E402

from specpilot.engine.decode import generate  # noqa: E402
from specpilot.engine.weights import apply  # noqa: E402

MICRO = Path(__file__).resolve().parents[1] / "zoo" / "checkpoints" / "micro"
SYSTEMS = (("bf16", "bf16"), ("bf16", "certified"), ("w12", "bf16"), ("w12", "w12"), ("w12", "certified"))


def ar_ms(model, prompt, n, reps=3) -> tuple[float, float, list[int]]:
    """Median over reps of the mean AR decode step (ms), the first call's seconds (build, compile,
    capture) and the tokens. The model's decoders are dropped first: its weights changed."""
    model.__dict__.pop("_static_decoders", None)
    t = time.perf_counter()
    generate(model, prompt, 8, eos=set())
    first = time.perf_counter() - t
    runs = [generate(model, prompt, n, eos=set()) for _ in range(reps)]
    return statistics.median(r.decode_s / len(r.steps) * 1e3 for r in runs), first, runs[0].tokens


def part_ar(args) -> dict:
    model, bw, floor_ms = eight_b()
    prompt = list(range(1000, 1032))
    out = {"copy_bandwidth_TBps": bw / 1e12, "floor_ms_per_token": floor_ms, "new_tokens": args.new_tokens,
           "systems": {}}
    stock = None
    for weights, head in SYSTEMS:  # in order: the layers are converted once, between the bf16 and w12 systems
        model.head = model.greedy_head = None
        apply(model, weights, head)
        ms, first, tokens = ar_ms(model, prompt, args.new_tokens)
        stock = stock or (ms, tokens)
        same = next((i for i, (a, b) in enumerate(zip(tokens, stock[1])) if a != b), len(tokens))
        name = f"{weights}+{head}"
        out["systems"][name] = {"ms_per_token": ms, "first_call_s": first, "over_stock": stock[0] / ms,
                                "tokens_equal_stock_for": same, "tokens": len(tokens)}
        print(f"  {name:16s} {ms:7.3f} ms/token  ×{stock[0] / ms:.3f}  equal for {same}/{len(tokens)}", flush=True)
    s = out["systems"]
    out["ar_ms_per_token_bf16"] = s["bf16+bf16"]["ms_per_token"]
    out["ar_floor_fraction_bf16"] = floor_ms / s["bf16+bf16"]["ms_per_token"]
    out["w12_ar_speedup"] = s["w12+bf16"]["over_stock"]
    out["w12_certified_ar_speedup"] = s["w12+certified"]["over_stock"]
    return out


def hf_decode(model, prompt: list[int], n: int, graph: bool) -> tuple[float, list[int]]:
    """ms per token of a greedy decode with a static cache, each step replayed from a CUDA graph
    (or eager), and the tokens."""
    from transformers import StaticCache

    dev = model.device
    cache = StaticCache(config=model.config, max_cache_len=len(prompt) + n + 8)
    ids = torch.tensor([prompt], device=dev)
    with torch.no_grad():
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True,
                       cache_position=torch.arange(len(prompt), device=dev)).logits
        tok = logits[:, -1:].argmax(-1)
        pos = torch.tensor([len(prompt)], device=dev)

        def step():
            nxt = model(input_ids=tok, past_key_values=cache, use_cache=True, cache_position=pos,
                        position_ids=pos[None]).logits[:, -1:].argmax(-1)
            tok.copy_(nxt)
            pos.add_(1)

        run = step
        if graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            saved = (tok.clone(), pos.clone())
            with torch.cuda.stream(side):
                for _ in range(2):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            tok.copy_(saved[0]), pos.copy_(saved[1])
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            tok.copy_(saved[0]), pos.copy_(saved[1])
            run = g.replay
        tokens = [int(tok)]
        t = time.perf_counter()
        for _ in range(n):
            run()
            tokens.append(int(tok))  # one read a step, as a server streams tokens
        return (time.perf_counter() - t) / n * 1e3, tokens


def part_hf(args) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    from specpilot.kernels.w12.linear import convert

    c = LLAMA_8B
    cfg = LlamaConfig(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
                      num_hidden_layers=c["num_hidden_layers"], num_attention_heads=c["num_attention_heads"],
                      num_key_value_heads=c["num_key_value_heads"], head_dim=c["head_dim"], rms_norm_eps=1e-5,
                      rope_theta=c["rope_theta"], max_position_embeddings=8192, tie_word_embeddings=False)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    prompt = list(range(1000, 1032))
    out = {"new_tokens": args.new_tokens}
    for graph in (True, False):
        key = "graph" if graph else "eager"
        try:
            out[f"hf_bf16_{key}_ms"], ref = hf_decode(model, prompt, args.new_tokens, graph)
        except Exception as e:  # noqa: BLE001 — a capture Transformers refuses is reported, the rest goes on
            out[f"hf_bf16_{key}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    out["swapped_linears"] = convert(model)
    for graph in (True, False):
        key = "graph" if graph else "eager"
        try:
            out[f"hf_w12_{key}_ms"], toks = hf_decode(model, prompt, args.new_tokens, graph)
        except Exception as e:  # noqa: BLE001
            out[f"hf_w12_{key}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            continue
        if f"hf_bf16_{key}_ms" in out:
            out[f"hf_w12_speedup_{key}"] = out[f"hf_bf16_{key}_ms"] / out[f"hf_w12_{key}_ms"]
    return out


def part_force(args) -> dict:
    from specpilot.engine.engine import Engine, EngineConfig

    reqs = requests(args.prompts, args.new_tokens)
    runs = {}
    for name, extra in (("stock", {}), ("w12_certified", {"weights": "w12", "lm_head": "certified"}),
                        ("ar", {"mode": "ar"})):
        cfg = {"target": str(MICRO / "dense"), "drafter": str(MICRO / "dense-block-markov"), "mode": "chain",
               "dtype": "bfloat16", "device": "cuda", "max_new_tokens": args.new_tokens, **extra}
        res = Engine(EngineConfig(**cfg)).run(reqs)
        runs[name] = {"outputs": res["outputs"], "tokens_per_s": res["tokens_per_s"]}
    out = forcing(MICRO, {"w12_certified": runs["w12_certified"]["outputs"]}, runs["stock"]["outputs"],
                  runs["ar"]["outputs"], reqs)["w12_certified"]
    same = sum(a["tokens"] == b["tokens"] for a, b in zip(runs["w12_certified"]["outputs"], runs["stock"]["outputs"]))
    return {"prompts": len(reqs), "new_tokens": args.new_tokens, "forcing": out, "forcing_passed": out["passed"],
            "outputs_equal_stock": same, **{f"{k}_tokens_per_s": v["tokens_per_s"] for k, v in runs.items()}}


PARTS = {"ar": part_ar, "hf": part_hf, "force": part_force}
FIGURES = ("ar_floor_fraction_bf16", "w12_ar_speedup", "w12_certified_ar_speedup", "ar_ms_per_token_bf16",
           "floor_ms_per_token", "hf_w12_speedup_graph", "hf_w12_speedup_eager", "forcing_passed")


def merge(folder: Path) -> dict:
    parts = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json")) if p.stem in PARTS or
             p.stem in ("w12_gemm", "certified_head")}
    out = {"command": " ".join(["python"] + sys.argv)}
    for key in ("device", "date", "git_sha"):
        out[key] = ", ".join(dict.fromkeys(str(p.get(key)) for p in parts.values()))
    for p in parts.values():
        out |= {k: p[k] for k in FIGURES + ("gemm_speedup_min",) if k in p}
    if "certified_head" in parts:  # the head at one row, per kind of hidden state (bench/certified_head.py)
        for case, cells in parts["certified_head"].get("results", {}).items():
            one = cells.get("M=1", {})
            out |= {f"{k}_1row_{case}": one[k] for k in ("bf16_head_us", "certified_head_us", "ratio") if k in one}
    out["parts"] = parts
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="+", help="ar | hf | force, or: merge DIR")
    ap.add_argument("--out-dir", default="bench/results/w12_parts")
    ap.add_argument("--out", default="bench/results/w12.json", help="merge: the merged result")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=32, help="force: HumanEval prompts")
    args = ap.parse_args()
    return parts_main("bench/w12.py", PARTS, args, merge, FIGURES, needs_cuda=True)


if __name__ == "__main__":
    sys.exit(main())
