"""The GPU path at batch 1, measured through the path users run (`Engine.generate` →
`decode.generate` → the static-shape driver and its CUDA graphs). Parts, each writing a JSON file:

  eight-b   Llama-3.1-8B shape, random bf16: AR ms per token against the HBM floor (weight bytes
            read per token / measured copy bandwidth) → ar_floor_fraction; c16, c64 = step time with
            a 16- / 64-row best-first tree (a fixed random lattice, so drafting costs nothing and
            nothing is accepted) over the AR step time.
  small     a zoo set's dense pair on N HumanEval prompts: AR and speculative systems (drafter ×
            policy), screened on the first --screen prompts, the fastest and stock (chain) on all;
            token forcing (bf16, float32 scorer) on the first 32 of the fastest system other than
            stock against stock, and of AR against stock.
  hf        Transformers on the same checkpoint and the first 32 prompts: eager generate, assisted
            generation with the zoo's draft LM, prompt lookup — the engine's work: each request
            stops at the target's EOS or at --new-tokens, whichever comes first.
  tree-memory  the zoo small hybrid shape (random bf16): peak memory one best-first tree pass of
            16 / 32 / 63 nodes allocates (torch.cuda.max_memory_allocated), static path and eager
            driver — also part of small-shape, alone here because it needs a quiet GPU only for timing.
  merge     the parts → one result with the derived ratios (spec_over_ar, over_hf_assisted).

  python bench/gpu_fastpath.py eight-b --out /tmp/eight_b.json
  python bench/gpu_fastpath.py small --zoo DIR --out /tmp/small.json
  python bench/gpu_fastpath.py hf --zoo DIR --out /tmp/hf.json
  python bench/gpu_fastpath.py merge /tmp/eight_b.json /tmp/small.json /tmp/hf.json --out bench/results/gpu_fastpath.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from specpilot.engine.config import ModelConfig
from specpilot.engine.decode import generate
from specpilot.engine.drafters import TOP_K, Drafter, Lattice
from specpilot.engine.model import Model
from specpilot.engine.replay import make_policy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import git_sha  # noqa: E402

LLAMA_8B = dict(
    family="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, layer_types=["full_attention"] * 32,
    rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=131072, eos_token_id=[128001],
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192},
)


def header() -> dict:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"
    return {"command": " ".join(["python"] + sys.argv), "device": device,
            "date": datetime.date.today().isoformat(), "git_sha": git_sha(), "torch": torch.__version__,
            "compile": os.environ.get("SPECPILOT_COMPILE", "1") != "0", "clocks": clocks()}


def run_parts(parts: dict, names: list[str], args, out_dir, shown) -> None:
    """Each named part (`parts[name](args)` → dict) in turn, its result with the header, its seconds
    (or its one-line error: the others still run) written to out_dir/NAME.json as it finishes, the
    `shown` figures printed."""
    import gc

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for part in names:
        t = time.perf_counter()
        try:
            res = header() | {"part": part} | parts[part](args)
        except Exception as e:  # noqa: BLE001 — one failing part is reported; the others still run
            res = header() | {"part": part, "error": f"{type(e).__name__}: {str(e)[:500]}"}
        res["seconds"] = time.perf_counter() - t
        gc.collect()  # a target and its captured decoders hold each other: free them before the next part
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        Path(out_dir, f"{part}.json").write_text(json.dumps(res, indent=1))
        print(f"{part}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()
                                      if k in shown or k in ("error", "seconds")), flush=True)


def parts_main(script: str, parts: dict, args, merge, shown, needs_cuda: bool = False) -> int:
    """The command line of a script of parts (`SCRIPT PART ... | merge DIR`): merge DIR's part files
    into args.out, or run the named parts (`run_parts`) into args.out_dir; 2 on an unknown part."""
    if args.parts[0] == "merge":
        res = merge(Path(args.parts[1]))
        Path(args.out).write_text(json.dumps(res, indent=1))
        print(json.dumps({k: v for k, v in res.items() if k != "parts"}, indent=1))
        return 0
    unknown = [p for p in args.parts if p not in parts]
    if unknown or (needs_cuda and not torch.cuda.is_available()):
        print(f"{script}: {'unknown part ' + str(unknown) if unknown else 'needs a CUDA GPU'}", file=sys.stderr)
        return 2
    run_parts(parts, args.parts, args, args.out_dir, shown)
    return 0


def clocks() -> dict:
    """SM and memory clocks as nvidia-smi reads them now (left as they are)."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=index,clocks.sm,clocks.mem,clocks.max.sm",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True)
    except OSError:
        return {}
    return {"index,sm_MHz,mem_MHz,max_sm_MHz": r.stdout.strip()} if r.returncode == 0 else {}


def copy_bandwidth(gb: float = 4.0) -> float:
    """Device-to-device copy, bytes read + written per second (median of 20 after 5 warm-ups)."""
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
    del a, b
    torch.cuda.empty_cache()
    return 2 * n * 2 / statistics.median(times[5:])


def random_model(cfg: ModelConfig) -> Model:
    """Random bf16 weights made on the GPU (decode speed does not depend on their values)."""
    with torch.device("meta"):
        m = Model(cfg)
    m = m.to_empty(device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0, p.shape[-1] ** -0.5, generator=g)
    m.inv_freq = cfg.inv_freq().cuda()
    return m.to(torch.bfloat16).eval()


def weight_bytes_per_token(model: Model) -> int:
    """Every parameter is read once per decode step, except the embedding table (one row)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.model.embed_tokens.weight
    return total - emb.numel() * emb.element_size() + emb.shape[1] * emb.element_size()


class FixedLattice(Drafter):
    """A host drafter that proposes one fixed random lattice: trees of the full budget, at no
    drafting cost, that the target (random weights) never accepts."""

    kind = "fixed"

    def __init__(self, vocab: int, positions: int):
        g = torch.Generator().manual_seed(1)
        self.lat = Lattice(torch.randint(0, vocab, (positions, TOP_K), generator=g),
                           torch.randn(positions, TOP_K, generator=g, dtype=torch.float64).sort(-1, True).values)

    def propose(self, m: int, known: list[int] | None = None) -> Lattice:
        return self.lat


def step_ms(target, prompt, n, drafter=None, policy=None, draft_len=15, reps=3) -> tuple[float, float]:
    """Median over reps of the mean decode step (ms) and the first call's seconds (build, compile,
    capture)."""
    t = time.perf_counter()
    generate(target, prompt, 8, drafter, draft_len, eos=set(), policy=policy)
    first = time.perf_counter() - t
    runs = [generate(target, prompt, n, drafter, draft_len, eos=set(), policy=policy) for _ in range(reps)]
    return statistics.median(r.decode_s / len(r.steps) * 1e3 for r in runs), first


def kernel_profile(target, prompt, drafter=None, policy=None, draft_len=15, n=33, top=25) -> list[dict]:
    """The heaviest kernels of a decode, per step, as CUPTI sees them inside the graph replays
    (a diagnosis: the figures above are timed without the profiler)."""
    from torch.profiler import ProfilerActivity, profile

    generate(target, prompt, 8, drafter, draft_len, eos=set(), policy=policy)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        res = generate(target, prompt, n, drafter, draft_len, eos=set(), policy=policy)
    steps = len(res.steps)
    dt = lambda e: getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)  # noqa: E731
    events = sorted(prof.key_averages(), key=lambda e: -dt(e))
    rows = [{"kernel": e.key[:100], "calls_per_step": round(e.count / steps, 2), "us_per_step": dt(e) / steps}
            for e in events[:top]]
    rows.append({"kernel": "(all)", "calls_per_step": sum(e.count for e in events) / steps,
                 "us_per_step": sum(dt(e) for e in events) / steps})
    for r in rows:
        print(f"  {r['us_per_step']:9.1f} us {r['calls_per_step']:7.2f}x  {r['kernel']}")
    return rows


def eight_b():
    """A random model of the Llama-3.1-8B shape, the measured copy bandwidth and the HBM floor of one token
    (its weight bytes over that bandwidth, in ms)."""
    bw = copy_bandwidth()
    model = random_model(ModelConfig(**LLAMA_8B))
    return model, bw, weight_bytes_per_token(model) / bw * 1e3


def part_eight_b(args) -> dict:
    model, bw, floor_ms = eight_b()
    prompt = list(range(1000, 1032))
    ar_ms, ar_first = step_ms(model, prompt, args.new_tokens)
    out = {"copy_bandwidth_TBps": bw / 1e12, "weight_GB_read_per_token": weight_bytes_per_token(model) / 1e9,
           "floor_ms_per_token": floor_ms, "ar_ms_per_token": ar_ms, "ar_floor_fraction": floor_ms / ar_ms,
           "ar_first_call_s": ar_first}
    for rows in (16, 64):
        ms, first = step_ms(model, prompt, args.new_tokens // 2, FixedLattice(model.cfg.vocab_size, 15),
                            make_policy(f"best-first:{rows - 1}"))
        out[f"step{rows}_ms"], out[f"c{rows}"], out[f"step{rows}_first_call_s"] = ms, ms / ar_ms, first
    if args.profile:
        print("AR step:")
        out["profile_ar"] = kernel_profile(model, prompt)
        print("16-row step:")
        out["profile_16"] = kernel_profile(model, prompt, FixedLattice(model.cfg.vocab_size, 15), make_policy("best-first:15"))
    return out


def part_small_shape(args) -> dict:
    """The zoo small recipe's shapes with random bf16 weights: AR and speculative step times (a
    random drafter: nothing is accepted, so every step verifies its whole tree), dense and hybrid;
    and the memory one best-first:32 tree pass of the hybrid takes (torch.cuda.max_memory_allocated
    around the pass), static path against the eager driver."""
    from specpilot.engine.drafters import FeatureDrafter, FeatureDrafterNet
    from specpilot.engine.synthetic import randomize
    from specpilot.zoo.build import PRESETS, drafter_config, target_config

    r = PRESETS["small"]
    prompt = list(range(100, 164))
    out = {}
    for role, hybrid in (("dense", False), ("hybrid", True)):
        cfg = target_config(r, hybrid)
        tgt = randomize(Model(cfg), 0).to(device="cuda", dtype=torch.bfloat16).eval()
        d = FeatureDrafter(randomize(FeatureDrafterNet(drafter_config(r, "block_markov", cfg)), 1).to(
            device="cuda", dtype=torch.bfloat16).eval(), tgt)
        ar_ms, first = step_ms(tgt, prompt, args.new_tokens)
        out[f"{role}_ar_ms"], out[f"{role}_ar_tok_s"], out[f"{role}_ar_first_call_s"] = ar_ms, 1e3 / ar_ms, first
        for spec in ("chain", "best-first:32", "best-first:63"):
            ms, first = step_ms(tgt, prompt, args.new_tokens, d, make_policy(spec), draft_len=16)
            out[f"{role}_{spec}_step_ms"], out[f"{role}_{spec}_c"] = ms, ms / ar_ms
            out[f"{role}_{spec}_first_call_s"] = first
        if args.profile:
            print(f"{role} AR step:")
            out[f"{role}_profile_ar"] = kernel_profile(tgt, prompt)
            print(f"{role} best-first:32 step:")
            out[f"{role}_profile_bf32"] = kernel_profile(tgt, prompt, d, make_policy("best-first:32"), 16)
        if hybrid:
            out |= tree_pass_memory(tgt, prompt)
    return out


def part_tree_memory(args) -> dict:
    from specpilot.engine.synthetic import randomize
    from specpilot.zoo.build import PRESETS, target_config

    tgt = randomize(Model(target_config(PRESETS["small"], True)), 0).to(device="cuda", dtype=torch.bfloat16).eval()
    out = {}
    for nodes in (16, 32, 63):
        out |= tree_pass_memory(tgt, list(range(100, 164)), nodes)
    return out


@torch.no_grad()
def tree_pass_memory(tgt: Model, prompt: list[int], nodes: int = 32) -> dict:
    """Peak bytes allocated by one verify pass of a best-first tree of `nodes` nodes (+ root) over
    the committed prompt, static path (tree form) and eager driver (a state per root-path position)."""
    from specpilot.engine.replay import make_policy as mk

    g = torch.Generator().manual_seed(0)
    lat = Lattice(torch.randint(0, tgt.cfg.vocab_size, (15, TOP_K), generator=g),
                  torch.randn(15, TOP_K, generator=g, dtype=torch.float64).sort(-1, True).values)
    tree = mk(f"best-first:{nodes}")(5, lat)
    out = {}
    ids = torch.tensor([prompt], device="cuda")
    for name in ("static", "eager"):
        torch.cuda.synchronize()
        if name == "static":
            cache = tgt.static_cache(1024)
            cache.plan(len(prompt), commit_all=True)
            tgt(ids, cache, logits=False)
            cache.length.fill_(len(prompt))
            par = torch.tensor([0] + list(tree.parents[1:]), device="cuda")
            depth = torch.tensor(tree.depths, device="cuda")
            toks = torch.tensor([tree.tokens], device="cuda")
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            cache.plan(len(tree), par, depth, max(tree.depths))
            tgt(toks, cache)
        else:
            cache = tgt.new_cache(1024)
            tgt(ids, cache, logits=False)
            cache.commit(len(prompt))
            toks = torch.tensor([tree.tokens], device="cuda")
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            tgt(toks, cache, positions=len(prompt) + torch.tensor([tree.depths], device="cuda"),
                tree_mask=tree.ancestor_mask("cuda"))
        torch.cuda.synchronize()
        out[f"hybrid_tree{nodes}_pass_peak_MB_{name}"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        del cache
    out[f"hybrid_tree{nodes}_root_paths"] = sum(1 for i in range(len(tree)) if i not in set(tree.parents[1:]))
    return out


def requests(n: int, new_tokens: int):
    from specpilot.zoo.workloads import humaneval

    return [r.__class__(**{**r.__dict__, "max_new_tokens": new_tokens}) for r in humaneval(n)]


class System:
    """One system through Engine (the path `specpilot generate` and the worker take), built once."""

    def __init__(self, zoo: Path, mode: str, drafter: str | None, tree: str, new_tokens: int, draft_len: int = 16):
        from specpilot.engine.engine import Engine, EngineConfig

        path = str(zoo / drafter) if drafter and drafter != "ngram" else drafter
        self.name = "ar" if mode == "ar" else f"{mode}:{drafter}:{tree}"
        self.engine = Engine(EngineConfig(target=str(zoo / "dense"), drafter=path, mode=mode, tree=tree,
                                          draft_len=draft_len, dtype="bfloat16", device="cuda",
                                          max_new_tokens=new_tokens))

    def run(self, reqs) -> dict:
        t = time.perf_counter()
        self.engine.generate(reqs[0])  # the first call builds, compiles and captures
        first = time.perf_counter() - t
        res = self.engine.run(reqs)
        return {"system": self.name, "tokens_per_s": res["tokens_per_s"], "tau_mean": res["tau_mean"],
                "first_call_s": first, "outputs": [{"id": o["id"], "tokens": o["tokens"]} for o in res["outputs"]]}


SYSTEMS = [("ar", None, "chain"), ("chain", "dense-block-markov", "chain"),
           ("tree", "dense-block-markov", "best-first:16"), ("tree", "dense-block-markov", "best-first:32"),
           ("chain", "dense-block", "chain"), ("chain", "dense-draft-lm", "chain"),
           ("tree", "dense-block-markov", "best-first:63"), ("chain", "dense-sequential", "chain"),
           ("chain", "ngram", "chain")]


def part_small(args) -> dict:
    """Every system on all prompts (the first --screen of them timed apart too: the prompts the
    Transformers part uses), in SYSTEMS order while --budget-s lasts; results written as they come."""
    zoo, t0 = Path(args.zoo), time.perf_counter()
    reqs = requests(args.prompts, args.new_tokens)
    strip = lambda r: {k: v for k, v in r.items() if k != "outputs"}  # noqa: E731
    out = {"prompts": args.prompts, "new_tokens": args.new_tokens, "screen_prompts": args.screen, "systems": []}
    outputs = {}
    for mode, drafter, tree in SYSTEMS:
        if time.perf_counter() - t0 > args.budget_s or (drafter and drafter != "ngram" and not (zoo / drafter).exists()):
            continue
        sysm = System(zoo, mode, drafter, tree, args.new_tokens)
        first = sysm.run(reqs[: args.screen])
        full = sysm.run(reqs)
        outputs[sysm.name] = full["outputs"]
        out["systems"].append(strip(full) | {"screen_tokens_per_s": first["tokens_per_s"]})
        del sysm
        torch.cuda.empty_cache()
        best = max((r for r in out["systems"] if r["system"] != "ar"), key=lambda r: r["tokens_per_s"], default=None)
        ar = next(r for r in out["systems"] if r["system"] == "ar")
        if best:
            out |= {"small_ar_tok_s": ar["tokens_per_s"], "small_best_tok_s": best["tokens_per_s"],
                    "small_best_policy": best["system"], "spec_over_ar": best["tokens_per_s"] / ar["tokens_per_s"],
                    "best_on_screen_tok_s": best["screen_tokens_per_s"]}
        Path(args.out).write_text(json.dumps(header() | {"part": "small"} | out, indent=1))
        print(json.dumps(strip(out["systems"][-1])), flush=True)
    cand = forcing_candidate(out["systems"], STOCK)
    if cand and STOCK in outputs:
        n = args.screen
        forced = forcing(zoo, {cand: outputs[cand][:n], "ar": outputs["ar"][:n]}, outputs[STOCK][:n],
                         outputs["ar"][:n], reqs[:n])
        out |= {"forcing": forced, "forcing_candidate": cand,
                "forcing_passed": all(f["passed"] for f in forced.values())}
    return out


STOCK = "chain:dense-block-markov:chain"


def forcing_candidate(systems: list[dict], stock: str) -> str | None:
    """The fastest speculative system other than stock: forcing a system against itself proves nothing."""
    rows = [r for r in systems if r["system"] not in ("ar", stock)]
    return max(rows, key=lambda r: r["tokens_per_s"])["system"] if rows else None


def forcing(zoo: Path, cands: dict, stock, ar, reqs, device: str = "cuda") -> dict:
    """Token forcing of each candidate's outputs ({name: rows}) against stock's, δ calibrated on AR."""
    from specpilot.engine.engine import Engine, EngineConfig
    from specpilot.services.controller.forcing import SystemOutput, calibrate_delta, check_forcing
    from specpilot.services.gpu_worker.scoring import load_scorer, memo_scorer

    enc = Engine(EngineConfig(target=str(zoo / "dense"), mode="ar", device=device))
    prompts = {r.id: enc.encode(r) for r in reqs}
    scorer = memo_scorer(load_scorer(zoo / "dense", device))
    outs = lambda rows: [SystemOutput(o["id"], tuple(prompts[o["id"]]), tuple(o["tokens"])) for o in rows]  # noqa
    base = outs(stock)
    delta = calibrate_delta({o.id: o.tokens for o in base}, {o["id"]: tuple(o["tokens"]) for o in ar},
                            {o.id: scorer(o.prompt_ids, o.tokens) for o in base})
    out = {}
    for name, rows in cands.items():
        res = check_forcing(outs(rows), base, scorer, delta)
        out[name] = {k: res[k] for k in ("passed", "delta", "reasons")} | {
            "candidate_mismatch_rate": res["candidate"]["mismatch_rate"], "stock_mismatch_rate":
            res["baseline"]["mismatch_rate"], "candidate_events": res["candidate"]["events"],
            "stock_events": res["baseline"]["events"]}
    return out


def part_hf(args) -> dict:
    from specpilot.engine.engine import Engine, EngineConfig
    from transformers import AutoModelForCausalLM

    zoo = Path(args.zoo)
    reqs = requests(args.prompts, args.new_tokens)
    enc = Engine(EngineConfig(target=str(zoo / "dense"), mode="ar", device="cpu"))
    prompts = [enc.encode(r) for r in reqs]
    hf = AutoModelForCausalLM.from_pretrained(zoo / "dense", dtype=torch.bfloat16).cuda().eval()
    assistant = AutoModelForCausalLM.from_pretrained(zoo / "dense-draft-lm", dtype=torch.bfloat16).cuda().eval()
    eos = list(enc.target.cfg.eos_token_id)  # the engine's stopping rule: EOS or the token limit
    kw = dict(do_sample=False, max_new_tokens=args.new_tokens, eos_token_id=eos, pad_token_id=eos[0])
    variants = {"hf_eager_tok_s": {}, "hf_assisted_tok_s": {"assistant_model": assistant},
                "hf_prompt_lookup_tok_s": {"prompt_lookup_num_tokens": 10}}
    out = {"prompts": args.prompts, "new_tokens": args.new_tokens}
    for name, extra in variants.items():
        hf.generate(torch.tensor([prompts[0]], device="cuda"), **{**kw, "max_new_tokens": 8}, **extra)
        n, t = 0, time.perf_counter()
        for p in prompts:
            ids = torch.tensor([p], device="cuda")
            n += hf.generate(ids, **kw, **extra).shape[1] - len(p)
        torch.cuda.synchronize()
        out[name] = n / (time.perf_counter() - t)
        out[name.replace("_tok_s", "_tokens")] = n
    return out


FIGURES = ("copy_bandwidth_TBps", "floor_ms_per_token", "ar_ms_per_token", "ar_floor_fraction", "step16_ms", "c16",
           "step64_ms", "c64", "small_ar_tok_s", "small_best_tok_s", "small_best_policy", "spec_over_ar",
           "best_on_screen_tok_s", "forcing_passed", "hf_eager_tok_s", "hf_assisted_tok_s", "hf_prompt_lookup_tok_s")


def part_merge(args) -> dict:
    """Runs on any machine: device, date and commit come from the parts (each part keeps its own)."""
    parts = [json.loads(Path(p).read_text()) for p in args.parts]
    out = {"command": " ".join(["python"] + sys.argv)}
    for key in ("device", "date", "git_sha"):
        out[key] = ", ".join(dict.fromkeys(str(p.get(key)) for p in parts))
    out["parts"] = {p.get("part", str(i)): p for i, p in enumerate(parts)}
    for p in parts:
        out |= {k: p[k] for k in FIGURES if k in p}
    small, hf = (next((p for p in parts if p.get("part") == k), None) for k in ("small", "hf"))
    if small and hf:  # the same first prompts on both sides: the best system as screened there
        if (small["screen_prompts"], small["new_tokens"]) != (hf["prompts"], hf["new_tokens"]):
            raise SystemExit("merge: the small part's screen and the hf part must use the same prompts and tokens")
        out["over_hf_assisted"] = small["best_on_screen_tok_s"] / hf["hf_assisted_tok_s"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=("eight-b", "small-shape", "tree-memory", "small", "hf", "merge"))
    ap.add_argument("parts", nargs="*", help="merge: the part files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--zoo", help="a built zoo set (small): its dense target and drafters")
    ap.add_argument("--prompts", type=int, default=164, help="small: all prompts; hf: its prompts (use --screen's)")
    ap.add_argument("--screen", type=int, default=32)
    ap.add_argument("--budget-s", type=float, default=1e9, help="small: start no new system after this many seconds")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--profile", action="store_true", help="also list the heaviest kernels per step (CUPTI)")
    args = ap.parse_args()
    if args.part != "merge" and not torch.cuda.is_available():
        print("bench/gpu_fastpath.py needs a CUDA GPU", file=sys.stderr)
        return 2
    fn = {"eight-b": part_eight_b, "small-shape": part_small_shape, "tree-memory": part_tree_memory, "small": part_small, "hf": part_hf,
          "merge": part_merge}[args.part]
    t = time.perf_counter()
    res = fn(args)
    if args.part != "merge":
        res = header() | {"part": args.part, "seconds": time.perf_counter() - t} | res
    Path(args.out).write_text(json.dumps(res, indent=1))
    for k, v in res.items():
        if not isinstance(v, (dict, list)):
            print(f"{k:32s} {v:.4g}" if isinstance(v, float) else f"{k:32s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
