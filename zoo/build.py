"""Recipes and the build: tokenizer → dense and hybrid targets → distillation data → drafters of
every kind → τ on held-out prompts → checkpoint folders + a `zoo.json` manifest.

`micro` builds on 2 CPU cores and ships in the repository; `small` trains on one GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from queue import Empty

import numpy as np
import torch

from specpilot import gitrun
from specpilot.engine.checkpoint import save_model
from specpilot.engine.config import ModelConfig
from specpilot.engine.drafters import LAYER0_INPUTS, DraftConfig, DraftLM, FeatureDrafter, NgramDrafter, save_drafter
from specpilot.engine.model import Model
from specpilot.engine.replay import Continuation, continuation, drafter_taus
from specpilot.engine.synthetic import randomize

from . import corpus as corpus_mod
from . import tokenizer as tok_mod
from . import train, workloads

SHIPPED = Path(__file__).resolve().parent / "checkpoints"
PROMPT_TOKENS = 512  # τ is measured on each prompt's last PROMPT_TOKENS tokens
KINDS = ("sequential", "block", "block_markov")


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    inter: int


@dataclass(frozen=True)
class Recipe:
    name: str
    vocab: int
    target: Shape
    draft_lm: Shape
    target_steps: int  # the hybrid target's (and the dense target's, unless dense_steps says otherwise)
    target_batch: int
    seq: int
    target_lr: float
    distill_seqs: int
    prompt_len: int
    gen_len: int
    drafter_steps: int
    drafter_batch: int
    drafter_lr: float
    dense_steps: int | None = None  # None: target_steps
    hybrid_lr: float | None = None  # the hybrid target's learning rate (None: target_lr)
    sequential_batch: int = 8  # its unrolled steps cost 3×: fewer sequences per step
    block: int = 16
    block_layers: int = 1  # block drafters draft every position in one pass: depth is cheap for them
    sequential_layers: int = 1  # a sequential drafter runs its layers once per drafted position
    # the sequential drafter's first layer (DraftConfig.layer0_input): "fc_in", or "eagle3" — EAGLE-3's
    # layer, which engine.eagle3.export_eagle3 writes exactly in the public EAGLE-3 layouts
    sequential_layer0: str = "fc_in"
    block_steps: int | None = None  # None: drafter_steps
    dense_block_steps: int | None = None  # the dense role's block drafter (None: block_steps)
    block_lr: float | None = None  # None: drafter_lr
    block_lead: bool = True  # the first mask row reads the drafted position-1 token (DraftConfig.lead_token)
    input_norm: bool = True  # feature drafters normalize both halves of an input row (DraftConfig.input_norm)
    block_copy: bool = False  # the block kinds' pointer head (DraftConfig.copy_head)
    markov_rank: int = 32
    markov_steps: int = 150  # the Markov head trains alone, on the frozen block drafter
    markov_lr: float = 6e-3
    draft_lm_steps: int = 300
    draft_lm_lr: float = 3e-3  # the draft LM's (AdamW), corpus and distillation steps alike
    draft_lm_corpus_steps: int = 0  # steps on the corpus itself before the draft LM's distillation steps
    eval_prompts: int = 8
    eval_new_tokens: int = 64
    # fraction of the distillation prompts cut like the workloads (signature + docstring of a
    # documented function, from TRAIN-split modules only); the rest are random corpus windows
    workload_prompts: float = 0.0
    workload_files: float = 1.0  # stable share of the training files searched for those prompts
    gen_batch: int = 128  # prompts per batched greedy-continuation pass (large on a GPU)
    anchors: int = 4  # blocks per training sequence (block kinds)
    context_weight: float = 1.0  # block kinds: a context row's loss weight against a mask row's (train.drafter_loss)
    store_dtype: str = "bfloat16"
    target_optimizer: str = "adamw"  # "muon": the targets' block matrices train with train.Muon (the rest AdamW)
    target_schedule: str = "cosine"  # the targets' learning rate after warm-up (train.lr_at): "cosine" or "linear"
    drafter_optimizer: str = "adamw"  # "muon": the feature drafters' matrices (train.matrices) train with train.Muon
    compile_target: bool = False  # on a GPU, train the target through torch.compile (eager if it fails)
    compile_scope: str = "block"  # what one compiled graph holds: "block" or the whole "model" (train.compiled_loss)
    triton_gdn: bool = False  # on a GPU, hybrid targets train with the Triton delta rule (kernels/gdn_chunk.py)
    cuda_graphs: bool = False  # on a GPU, drafters and the draft LM train by replaying a CUDA graph per step (train.fit)
    seed: int = 0
    corpus_bytes: int | None = None  # cap per split (tests); None = the whole standard library
    # "stdlib": this interpreter's standard library; "code": the prepared code corpus (stdlib + pinned
    # packages, corpus.read_corpus), of which a stable `corpus_sample` share of the files is used
    corpus: str = "stdlib"
    corpus_sample: float = 1.0
    tokenizer_sample: float = 1.0  # share of the training files the tokenizer learns its merges on

    def __post_init__(self) -> None:
        for field in ("target_optimizer", "drafter_optimizer"):
            if getattr(self, field) not in ("adamw", "muon"):
                raise ValueError(f"recipe {self.name}: {field} {getattr(self, field)!r} is not 'adamw' or 'muon'")
        if self.target_schedule not in train.SCHEDULES:
            raise ValueError(f"recipe {self.name}: target_schedule {self.target_schedule!r} is not one of "
                             f"{train.SCHEDULES}")
        if self.compile_scope not in ("block", "model"):
            raise ValueError(f"recipe {self.name}: compile_scope {self.compile_scope!r} is not 'block' or 'model'")
        if self.hybrid_lr is not None and not self.hybrid_lr > 0:
            raise ValueError(f"recipe {self.name}: hybrid_lr {self.hybrid_lr} is not a learning rate > 0")
        if not self.context_weight >= 0:
            raise ValueError(f"recipe {self.name}: context_weight {self.context_weight} is not a weight ≥ 0")
        if self.sequential_layer0 not in LAYER0_INPUTS:
            raise ValueError(f"recipe {self.name}: sequential_layer0 {self.sequential_layer0!r} is not one of "
                             f"{LAYER0_INPUTS}")

    def target_training(self, hybrid: bool) -> tuple[int, float]:
        """(steps, learning rate) of the hybrid or the dense target."""
        if hybrid:
            return self.target_steps, self.hybrid_lr or self.target_lr
        return self.dense_steps or self.target_steps, self.target_lr

    def training(self, kind: str, role: str) -> tuple[int, int, float]:
        """(steps, batch, learning rate) of a drafter kind of a target role."""
        if kind == "sequential":
            return self.drafter_steps, self.sequential_batch, self.drafter_lr
        if kind == "block":
            steps = (role == "dense" and self.dense_block_steps) or self.block_steps or self.drafter_steps
            return steps, self.drafter_batch, self.block_lr or self.drafter_lr
        if kind == "block_markov":
            return self.markov_steps, self.drafter_batch, self.markov_lr
        raise ValueError(f"no drafter training for kind {kind!r}")


PRESETS = {
    # the shipped set (zoo/checkpoints/micro) was built with this recipe: stdlib corpus, 4-layer targets,
    # drafters without input norms
    "micro": Recipe("micro", vocab=4096, target=Shape(128, 4, 4, 2, 384), draft_lm=Shape(64, 2, 4, 2, 192),
                    target_steps=500, target_batch=16, seq=128, target_lr=3e-3,
                    distill_seqs=768, prompt_len=32, gen_len=128,
                    drafter_steps=300, drafter_batch=16, drafter_lr=2e-3, draft_lm_steps=300,
                    block_steps=400, block_lr=3e-3, workload_prompts=0.5, input_norm=False),
    # code corpus (48.7 M training tokens): each target sees it 2.0 times (3000 compiled steps × 64 × 512
    # tokens; a 512-token context covers HumanEval prompts plus their completions), its blocks'
    # matrices trained with Muon (at 3000 steps both targets reached a lower held-out loss than 5000
    # AdamW steps gave, 2.37 / 2.40 against 2.42 / 2.43 nat per token on held-out stdlib text); the
    # hybrid at 9e-3, not the dense role's 6e-3 (0.850 against 0.858 bits per byte, as low as 4000
    # steps at 6e-3 reached, and 0.067 of its HumanEval completions looping against 0.09–0.19); the
    # draft LM (trained once for both roles, AdamW at 3e-3) sees 0.8 of it and then its distillation
    # data about once (100 × 64 × 512 tokens of 12288 × 256); feature drafters see their 12288
    # sequences 3 (sequential) to 19 times (block: 3600 steps lifted the dense block drafter's chain
    # from below n-gram to above it; its context rows weighted 0.25 lifted it from 2.50 to 2.87 on
    # HumanEval, the mask rows, which draft positions 2..16, then holding half the loss instead of a
    # fifth). Drafters and the draft LM train through CUDA graphs (one launch
    # a step: a hybrid block step took 14.2 ms in the build against 35.3 eager); the roles build side
    # by side
    "small": Recipe("small", vocab=16384, target=Shape(512, 8, 8, 4, 1536), draft_lm=Shape(256, 4, 4, 2, 768),
                    target_steps=3000, target_batch=64, seq=512, target_lr=6e-3, hybrid_lr=9e-3,
                    target_optimizer="muon",
                    compile_target=True, compile_scope="model",
                    draft_lm_corpus_steps=1200,
                    distill_seqs=12288, prompt_len=64, gen_len=192,
                    drafter_steps=1200, drafter_batch=64, sequential_batch=32, drafter_lr=1e-3, anchors=8, block_layers=2,
                    context_weight=0.25,
                    block_steps=3600, draft_lm_steps=100, eval_prompts=8, eval_new_tokens=64, markov_rank=64, markov_steps=600,
                    markov_lr=3e-3, workload_prompts=0.5, workload_files=0.1, gen_batch=4096, corpus="code", triton_gdn=True,
                    tokenizer_sample=0.25, cuda_graphs=True),
    # a seconds-long build of the whole pipeline for the test suite
    "nano": Recipe("nano", vocab=300, target=Shape(32, 2, 2, 1, 64), draft_lm=Shape(32, 1, 2, 1, 64),
                   target_steps=12, target_batch=4, seq=32, target_lr=3e-3,
                   distill_seqs=16, prompt_len=8, gen_len=24, drafter_steps=6, drafter_batch=4, sequential_batch=2,
                   drafter_lr=2e-3, draft_lm_steps=6, eval_prompts=2, eval_new_tokens=12, block=8,
                   markov_rank=4, markov_steps=4, block_layers=2, store_dtype="float32", corpus_bytes=300_000),
}


def target_config(r: Recipe, hybrid: bool) -> ModelConfig:
    s = r.target
    n = s.layers
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)] if hybrid \
        else ["full_attention"] * n
    hd = s.hidden // s.heads
    return ModelConfig(
        family="qwen3_next" if hybrid else "qwen3", vocab_size=r.vocab, hidden_size=s.hidden,
        intermediate_size=s.inter, num_hidden_layers=n, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
        head_dim=hd, layer_types=layer_types, tie_word_embeddings=True, max_position_embeddings=4096,
        partial_rotary_factor=0.25 if hybrid else 1.0, eos_token_id=[0], bos_token_id=None,
        linear_num_key_heads=s.heads // 2 if hybrid else 0, linear_num_value_heads=s.heads if hybrid else 0,
        linear_key_head_dim=hd if hybrid else 0, linear_value_head_dim=hd if hybrid else 0)


def draft_lm_config(r: Recipe) -> ModelConfig:
    s = r.draft_lm
    return ModelConfig(
        family="llama", vocab_size=r.vocab, hidden_size=s.hidden, intermediate_size=s.inter,
        num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
        head_dim=s.hidden // s.heads, layer_types=["full_attention"] * s.layers, tie_word_embeddings=True,
        max_position_embeddings=4096, eos_token_id=[0], bos_token_id=None)


def drafter_config(r: Recipe, kind: str, target: ModelConfig) -> DraftConfig:
    n = target.num_hidden_layers
    eagle3 = kind == "sequential" and r.sequential_layer0 == "eagle3"  # its first layer has its own input norms
    return DraftConfig(
        kind=kind, vocab_size=r.vocab, hidden_size=target.hidden_size, intermediate_size=2 * target.hidden_size,
        num_hidden_layers=r.block_layers if kind in ("block", "block_markov") else r.sequential_layers,
        num_attention_heads=target.num_attention_heads, num_key_value_heads=target.num_key_value_heads, head_dim=target.head_dim,
        target_hidden_size=target.hidden_size, target_layers=sorted({0, n // 2, n - 1}),
        block_size=r.block, markov_rank=r.markov_rank, lead_token=r.block_lead and kind != "sequential",
        input_norm=r.input_norm and not eagle3, copy_head=r.block_copy and kind != "sequential",
        layer0_input="eagle3" if eagle3 else "fc_in")


@torch.no_grad()
def as_stored(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The module as users load it, in place: its weights rounded to the stored dtype, computing in
    float32 (τ is measured on exactly what ships). Buffers that are not stored (RoPE frequencies)
    keep their float32 values, as loading recomputes them."""
    for p in module.parameters():
        p.copy_(p.to(dtype))
    return module


def params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def encode_docs(tok, docs) -> torch.Tensor:
    """Every document's tokens, each followed by EOS (id 0), in one stream (batched: the tokenizer's
    threads; joined in numpy, as a Python list of tens of millions of ids costs seconds)."""
    encs = tok.encode_batch([d.text for d in docs], add_special_tokens=False)
    eos = np.zeros(1, dtype=np.int64)
    parts = [a for e in encs for a in (np.asarray(e.ids, dtype=np.int64), eos)]
    return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))


def eval_prompts(r: Recipe, tok) -> dict[str, list[list[int]]]:
    """HumanEval prompts and held-out standard-library completion prompts, as token ids."""
    return {"humaneval": [tok_mod.encode(tok, q.prompt) for q in workloads.humaneval(limit=r.eval_prompts)],
            "stdlib": [tok_mod.encode(tok, q.prompt) for q in workloads.stdlib_completion(limit=r.eval_prompts)]}


def workload_like_prompts(tok, docs) -> list[list[int]]:
    """Signature + docstring prompts cut from `docs` as workloads.stdlib_completion cuts them (pass
    the TRAIN split: held-out modules stay unseen), as token ids, in document and line order."""
    out = []
    for d in docs:
        try:
            found = workloads.function_prompts(d.text)
        except SyntaxError:
            continue
        out += [tok_mod.encode(tok, p) for _, _, p in found]
    return out


def distill_prompts(r: Recipe, train_ids: torch.Tensor, fn_prompts: list[list[int]]) -> torch.Tensor:
    """[distill_seqs, prompt_len]: random corpus windows, then (workload_prompts of them)
    workload-like prompts; deterministic in the recipe's seed."""
    gen = torch.Generator().manual_seed(r.seed + 4)
    n_wl = round(r.distill_seqs * r.workload_prompts)
    win = train.windows(train_ids, r.distill_seqs - n_wl, r.prompt_len, gen)
    if n_wl:
        wl = train.prompt_windows(fn_prompts, n_wl, r.prompt_len, gen)
        win = torch.cat((win, wl))
        if len(wl) < n_wl:  # too few prompts that long: top up with corpus windows
            win = torch.cat((win, train.windows(train_ids, n_wl - len(wl), r.prompt_len, gen)))
    return win


def new_target(r: Recipe, hybrid: bool, device: str) -> Model:
    """The preset's dense or hybrid target at its initial weights, set to train as the recipe says."""
    target = randomize(Model(target_config(r, hybrid)), r.seed + 1).to(device)
    for blk in target.model.layers:
        if blk.kind == "linear_attention":
            blk.linear_attn.triton_rule = r.triton_gdn
    return target


def target_steps(r: Recipe, target: Model, train_ids: torch.Tensor, steps: int, device: str, desc: str, log) -> None:
    """`steps` more of the recipe's training steps of `target` on the corpus (`train.train_lm`; a
    compiled step is compiled once, on the first call)."""
    _, lr = r.target_training(target.cfg.is_hybrid)
    train.train_lm(target, train_ids, steps, r.target_batch, r.seq, lr, r.seed + 2, desc, log, device,
                   compile=r.compile_target, scope=r.compile_scope, muon=r.target_optimizer == "muon",
                   schedule=r.target_schedule)


def train_target(r: Recipe, hybrid: bool, train_ids: torch.Tensor, device: str, log) -> Model:
    """The preset's dense or hybrid target, trained on the corpus (float32, in training precision)."""
    target = new_target(r, hybrid, device)
    steps, _ = r.target_training(hybrid)
    target_steps(r, target, train_ids, steps, device, f"{'hybrid' if hybrid else 'dense'} target", log)
    return target


def drafter_options(r: Recipe) -> dict:
    """The recipe's keyword arguments of `train.train_drafter` besides shapes, steps and rates."""
    return {"anchors": r.anchors, "graph": r.cuda_graphs, "muon": r.drafter_optimizer == "muon",
            "context_weight": r.context_weight}


def distillation_data(r: Recipe, target: Model, train_ids: torch.Tensor, fn_prompts: list[list[int]],
                      device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequences, features): the target's greedy continuations of the distillation prompts and its
    features at the layers the feature drafters read."""
    seqs = train.greedy_continuations(target, distill_prompts(r, train_ids, fn_prompts).to(device), r.gen_len,
                                      batch=r.gen_batch)
    layers = tuple(drafter_config(r, "block", target.cfg).target_layers)
    return seqs, train.target_features(target, seqs, layers)


@contextlib.contextmanager
def uncompiled_decoders():
    """The build's evaluation decodes are short (eval_prompts × eval_new_tokens tokens): compiling a
    decoder step for them costs more than it saves, so on a GPU their CUDA graphs run uncompiled
    (as SPECPILOT_COMPILE=0 asks)."""
    old = os.environ.get("SPECPILOT_COMPILE")
    os.environ["SPECPILOT_COMPILE"] = "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["SPECPILOT_COMPILE"]
        else:
            os.environ["SPECPILOT_COMPILE"] = old


def eval_continuations(r: Recipe, target: Model, prompts: dict[str, list[list[int]]]) -> dict[str, list[Continuation]]:
    """Per workload, each evaluation prompt's greedy continuation and the target's features along it."""
    layers = tuple(drafter_config(r, "block", target.cfg).target_layers)
    with uncompiled_decoders():
        return {k: [continuation(target, p[-PROMPT_TOKENS:], r.eval_new_tokens, layers) for p in ps]
                for k, ps in prompts.items()}


def prompt_taus(target: Model, drafter, conts: list[Continuation], draft_len: int) -> list[list[int]]:
    """Per continuation, the stock-chain τ of every step of decoding its prompt (exactly the τ of
    `generate` with this drafter, replayed on the known continuation: engine/replay.py)."""
    eos = set(target.cfg.eos_token_id)
    return [drafter_taus(c, drafter, draft_len, eos) for c in conts]


def pooled_tau(per_prompt: list[list[int]]) -> float:
    """Mean τ over every step of every prompt."""
    steps = [t for p in per_prompt for t in p]
    return sum(steps) / max(1, len(steps))


def measure_tau(target: Model, drafter, conts: list[Continuation], draft_len: int) -> float:
    """The build's τ figure: pooled over every step of every continuation."""
    return pooled_tau(prompt_taus(target, drafter, conts, draft_len))


def recipe_from(d: dict) -> Recipe:
    """The recipe a manifest records (`zoo.json`'s "recipe"); fields it lacks take their defaults."""
    known = {f.name for f in dataclasses.fields(Recipe)}
    shapes = {k: Shape(**d[k]) for k in ("target", "draft_lm")}
    return Recipe(**{k: v for k, v in d.items() if k in known} | shapes)


def with_overrides(r: Recipe, assignments: list[str]) -> Recipe:
    """The recipe with `FIELD=VALUE` assignments applied (scalar fields, parsed as the field's type;
    `none` clears an optional one, e.g. dense_block_steps=none)."""
    types = {f.name: f.type for f in dataclasses.fields(Recipe)}
    parse = {"int": int, "float": float, "str": str,
             "bool": lambda v: {"1": True, "true": True, "0": False, "false": False}[v.lower()]}
    changes = {}
    for a in assignments:
        name, sep, value = a.partition("=")
        kind = types.get(name.strip(), "")
        base, optional = kind.removesuffix(" | None"), kind.endswith(" | None")
        if not sep or base not in parse:
            scalars = ", ".join(n for n, t in types.items() if t.removesuffix(" | None") in parse)
            raise ValueError(f"recipe override {a!r}: expected FIELD=VALUE with FIELD one of {scalars}")
        try:
            changes[name.strip()] = None if optional and value.strip().lower() == "none" else parse[base](value.strip())
        except (ValueError, KeyError):
            raise ValueError(f"recipe override {a!r}: {value!r} is not a {base}{' or none' if optional else ''}") from None
    return dataclasses.replace(r, **changes)


@dataclass(frozen=True)
class Inputs:
    """What every model of a recipe is trained and measured on."""
    corpus: corpus_mod.Corpus
    tok: object  # tokenizers.Tokenizer
    train_ids: torch.Tensor
    held_ids: torch.Tensor
    prompts: dict[str, list[list[int]]]  # evaluation prompts by workload
    fn_prompts: list[list[int]]  # workload-like distillation prompts from train modules
    timings: dict[str, float]  # seconds: reading the corpus, training the tokenizer, encoding


def load_recipe_corpus(r: Recipe) -> corpus_mod.Corpus:
    """The recipe's corpus (the code corpus is hash-checked against the lock), sampled as it says."""
    if r.corpus == "stdlib":
        return corpus_mod.load_corpus(max_bytes=r.corpus_bytes)
    if r.corpus != "code":
        raise ValueError(f"recipe {r.name}: corpus {r.corpus!r} is not one of stdlib, code")
    full, _ = corpus_mod.read_corpus()
    train_docs, held = corpus_mod.subsample(full.train, r.corpus_sample), corpus_mod.subsample(full.heldout, r.corpus_sample)
    # the manifest records the full corpus' (locked) hash; the sample is a function of it and the recipe
    return corpus_mod.Corpus(train_docs, held, full.sha256, full.python_version)


def prepare(r: Recipe, log=print, tok=None) -> Inputs:
    """Corpus, tokenizer, token streams and prompts of a recipe (deterministic in the recipe).
    `tok`: a built set's tokenizer, used instead of training one."""
    corpus, read_s = train.timed(load_recipe_corpus, r)
    log(f"corpus: {len(corpus.train)} train / {len(corpus.heldout)} held-out files, sha256 {corpus.sha256[:12]}")
    tokenizer_s = 0.0
    if tok is None:
        tok_docs = corpus_mod.subsample(corpus.train, r.tokenizer_sample)
        tok, tokenizer_s = train.timed(tok_mod.train_tokenizer, [d.text for d in tok_docs], r.vocab)
    # the prompts' parsing (Python) runs beside the encoding (the tokenizer's threads release the GIL)
    t = time.perf_counter()
    with ThreadPoolExecutor(1) as pool:
        fn = pool.submit(workload_like_prompts, tok, corpus_mod.subsample(corpus.train, r.workload_files)) \
            if r.workload_prompts else None
        evals = pool.submit(eval_prompts, r, tok)
        train_ids, held_ids = encode_docs(tok, corpus.train), encode_docs(tok, corpus.heldout)
        fn_prompts, prompts = fn.result() if fn else [], evals.result()
    log(f"tokenizer: vocab {tok.get_vocab_size()}, {len(train_ids)} train / {len(held_ids)} held-out tokens")
    return Inputs(corpus, tok, train_ids, held_ids, prompts, fn_prompts,
                  {"read_s": read_s, "tokenizer_s": tokenizer_s, "encode_s": time.perf_counter() - t})


def new_draft_lm(r: Recipe, device: str) -> Model:
    """The preset's draft LM at its initial weights (seeded by the recipe alone)."""
    return randomize(Model(draft_lm_config(r)), r.seed + 6).to(device)


def corpus_draft_lm(r: Recipe, train_ids: torch.Tensor, device: str, log) -> dict[str, torch.Tensor]:
    """The draft LM's weights after its corpus steps (on the CPU). Seeded by the recipe alone, so
    both roles start their draft LMs from it and a build trains it once."""
    lm = new_draft_lm(r, device)
    if r.draft_lm_corpus_steps:
        train.train_lm(lm, train_ids, r.draft_lm_corpus_steps, r.target_batch, r.seq, r.draft_lm_lr, r.seed + 8,
                       "draft LM (corpus)", log, device, graph=r.cuda_graphs)
    return {k: v.detach().cpu() for k, v in lm.state_dict().items()}


class Handoff:
    """Hands `corpus_draft_lm`'s weights from the forked process that trains them to the role
    processes, through a file under the build's folder; `failed` (set by the parent when a process
    fails) ends a wait."""

    def __init__(self, ctx, path: Path):
        self.path, self.ready, self.failed = path, ctx.Event(), ctx.Event()

    def put(self, state: dict) -> None:
        tmp = self.path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.path)
        self.ready.set()

    def get(self) -> dict:
        while not self.ready.wait(5):
            if self.failed.is_set():
                raise RuntimeError("the process training the draft LM's corpus steps failed")
        return torch.load(self.path, weights_only=True)


def build_role(r: Recipe, role: str, inp: Inputs, out: Path, device: str, log, t_all: float,
               lm_base: Callable[[], dict]) -> tuple[list, dict]:
    """One target (dense or hybrid) and every drafter of it, saved under `out`; returns (its
    manifest entries, its timings). `lm_base` gives `corpus_draft_lm`'s weights. Seeded per role:
    the result does not depend on what else runs."""
    torch.manual_seed(r.seed + (role == "hybrid"))
    hybrid, sdt = role == "hybrid", getattr(torch, r.store_dtype)
    tok, train_ids, held_ids = inp.tok, inp.train_ids, inp.held_ids
    byte_len = torch.tensor(tok_mod.byte_lengths(tok))
    timings: dict[str, float] = {}
    models = []
    t = time.perf_counter()
    target = train_target(r, hybrid, train_ids, device, log)
    cfg = target.cfg
    timings[f"{role}_target_s"] = time.perf_counter() - t
    loss, bpb = train.heldout_eval(target, held_ids, r.seq, 64, r.seed + 3, device, byte_len)
    log(f"  {role} target: {params(target) / 1e6:.2f} M parameters, held-out loss {loss:.3f} nat/token, "
        f"{bpb:.3f} bits/byte")
    save_model(target, out / role, dtype=sdt)
    tok_mod.save(tok, out / role)
    target = as_stored(target, sdt)
    entry = {"name": role, "path": role, "role": "target", "kind": cfg.family, "target": None,
             "params": params(target), "heldout_loss": loss, "heldout_bpb": bpb, "tau": None}
    models.append(entry)

    # distillation data: the target's greedy continuations of corpus prompts
    t = time.perf_counter()
    seqs, feats = distillation_data(r, target, train_ids, inp.fn_prompts, device)
    timings[f"{role}_distill_data_s"] = time.perf_counter() - t

    log(f"  [{time.perf_counter() - t_all:.0f} s] {role} target {timings[f'{role}_target_s']:.1f} s, "
        f"distillation data {timings[f'{role}_distill_data_s']:.1f} s")
    t = time.perf_counter()
    conts = eval_continuations(r, target, inp.prompts)
    timings[f"{role}_eval_continuations_s"] = time.perf_counter() - t
    t = time.perf_counter()
    taus = {"ngram": {k: measure_tau(target, NgramDrafter(), c, r.block) for k, c in conts.items()}}
    timings[f"{role}_ngram_tau_s"] = time.perf_counter() - t
    block = None  # the block drafter as shipped: the block + Markov drafter's frozen body
    for kind in KINDS:
        t = time.perf_counter()
        steps, batch, lr = r.training(kind, role)
        net = train.train_drafter(drafter_config(r, kind, cfg), target, seqs, feats, r.prompt_len,
                                  steps, batch, lr, r.seed + 5, f"{role} {kind} drafter", log, body=block,
                                  **drafter_options(r))
        timings[f"{role}_{kind}_s"] = time.perf_counter() - t
        name = f"{role}-{kind.replace('_', '-')}"
        save_drafter(net, out / name, dtype=sdt)
        net = as_stored(net, sdt)
        if kind == "block":
            block = net
        t = time.perf_counter()
        taus[kind] = {k: measure_tau(target, FeatureDrafter(net, target), c, r.block) for k, c in conts.items()}
        timings[f"{role}_{kind}_tau_s"] = time.perf_counter() - t
        log(f"  [{time.perf_counter() - t_all:.0f} s] {role} {kind}: train {timings[f'{role}_{kind}_s']:.1f} s, "
            f"τ {timings[f'{role}_{kind}_tau_s']:.1f} s")
        models.append({"name": name, "path": name, "role": "drafter", "kind": kind, "target": role,
                       "params": params(net), "heldout_loss": None, "tau": taus[kind]})

    # the classic standalone draft model, trained on the same greedy continuations
    t = time.perf_counter()
    lm = Model(draft_lm_config(r))
    lm.load_state_dict(lm_base())
    lm = lm.to(device)
    train.train_lm(lm, seqs.flatten(), r.draft_lm_steps, r.target_batch, r.seq, r.draft_lm_lr, r.seed + 7,
                   f"{role} draft LM", log, device, graph=r.cuda_graphs)
    timings[f"{role}_draft_lm_s"] = time.perf_counter() - t
    name = f"{role}-draft-lm"
    lm_loss, lm_bpb = train.heldout_eval(lm, held_ids, r.seq, 64, r.seed + 3, device, byte_len)
    save_model(lm, out / name, dtype=sdt)
    tok_mod.save(tok, out / name)
    lm = as_stored(lm, sdt)
    t = time.perf_counter()
    taus["draft_lm"] = {k: measure_tau(target, DraftLM(lm), c, r.block) for k, c in conts.items()}
    timings[f"{role}_draft_lm_tau_s"] = time.perf_counter() - t
    log(f"  [{time.perf_counter() - t_all:.0f} s] {role} draft LM: train {timings[f'{role}_draft_lm_s']:.1f} s, "
        f"τ {timings[f'{role}_draft_lm_tau_s']:.1f} s")
    models.append({"name": name, "path": name, "role": "drafter", "kind": "draft_lm", "target": role,
                   "params": params(lm), "heldout_loss": lm_loss, "heldout_bpb": lm_bpb, "tau": taus["draft_lm"]})
    entry["tau"] = {"ngram": taus["ngram"]}
    for kind, v in taus.items():
        log(f"  τ with {role} {kind:13s} humaneval {v['humaneval']:.2f}  stdlib {v['stdlib']:.2f}")
    return models, timings


_FORKED: tuple = ()  # what the forked jobs inherit (set just before the fork; nothing is pickled)


DRAFT_LM = "draft LM"  # the job of the side-by-side build that trains `corpus_draft_lm` for both roles


def _job_process(job: str, queue) -> None:
    r, inp, out, device, log, t_all, handoff = _FORKED
    try:
        if job == DRAFT_LM:
            base, seconds = train.timed(corpus_draft_lm, r, inp.train_ids, device, log)
            handoff.put(base)
            queue.put((job, ([], {"draft_lm_corpus_s": seconds}), None))
        else:
            queue.put((job, build_role(r, job, inp, out, device, log, t_all, handoff.get), None))
    except BaseException as e:  # noqa: BLE001 — reported to the parent, which raises it
        queue.put((job, None, f"{type(e).__name__}: {e}"))


def build(preset: str, out: Path, device: str = "cpu", log=print, roles: tuple[str, ...] = ("dense", "hybrid"),
          parallel: bool | None = None, command: str | None = None, recipe: Recipe | None = None) -> dict:
    """Build every model of a preset (of the given target roles) into `out`; returns (and writes)
    the manifest. `recipe`: the preset's recipe with changes (default: the preset's own). With
    `parallel` (default: on a GPU), the roles build side by side in forked processes sharing the
    device, and a third process trains the draft LM's corpus steps while the targets compile: the
    GPU is seldom left idle."""
    global _FORKED
    r = recipe or PRESETS[preset]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    inp = prepare(r, log)
    timings: dict[str, float] = inp.timings | {"prepare_s": time.perf_counter() - t_all}
    jobs = [role for role in ("dense", "hybrid") if role in roles]
    parallel = device != "cpu" if parallel is None else parallel
    if parallel and len(jobs) > 1:
        import multiprocessing as mp

        ctx = mp.get_context("fork")  # before any CUDA call in this process: prepare() stays on the CPU
        handoff = Handoff(ctx, out / "draft-lm-corpus.pt")
        queue, _FORKED = ctx.Queue(), (r, inp, out, device, log, t_all, handoff)
        names = [DRAFT_LM] + jobs
        procs = [ctx.Process(target=_job_process, args=(job, queue)) for job in names]
        for pr in procs:
            pr.start()
        done: dict[str, tuple] = {}
        while len(done) < len(procs):
            try:
                job, res, err = queue.get(timeout=5)
                done[job] = (res, err)
            except Empty:  # a process that died without a word (killed, out of memory) ends the wait
                for job, pr in zip(names, procs):
                    if job not in done and not pr.is_alive() and queue.empty():
                        done[job] = (None, f"its process ended with exit code {pr.exitcode}")
            if any(err for _, err in done.values()):
                handoff.failed.set()
        for pr in procs:
            pr.join()
        _FORKED = ()
        handoff.path.unlink(missing_ok=True)
        errors = [f"{job}: {err}" for job, (_, err) in done.items() if err]
        if errors:
            raise RuntimeError("zoo build failed — " + "; ".join(errors))
        results = [done[job][0] for job in names]
    else:
        base, timings["draft_lm_corpus_s"] = train.timed(corpus_draft_lm, r, inp.train_ids, device, log)
        results = [build_role(r, role, inp, out, device, log, t_all, lambda: base) for role in jobs]
    models = [m for ms, _ in results for m in ms]
    for _, t in results:
        timings |= t
    timings["total_s"] = time.perf_counter() - t_all
    manifest = {"command": command or f"specpilot zoo build --preset {preset} --device {device}",
                "git_sha": gitrun.head_sha(Path(__file__).resolve().parent), "preset": preset, "recipe": dataclasses.asdict(r), "seed": r.seed, "corpus_sha256": inp.corpus.sha256,
                "corpus_tokens": {"train": len(inp.train_ids), "heldout": len(inp.held_ids)},
                "python_version": inp.corpus.python_version, "device": device, "torch": torch.__version__,
                "device_name": torch.cuda.get_device_name(device) if str(device).startswith("cuda") else "cpu",
                "date": datetime.date.today().isoformat(),
                "parallel_roles": bool(parallel and len(jobs) > 1),
                "tau_measure": {"mode": "chain", "draft_len": r.block, "prompts": r.eval_prompts,
                                "new_tokens": r.eval_new_tokens, "dtype": "float32",
                                "method": "drafter replayed on the AR continuation"},
                "timings": timings, "models": models}
    (out / "zoo.json").write_text(json.dumps(manifest, indent=1))
    log(f"built {len(models)} models into {out} in {timings['total_s']:.0f} s")
    return manifest


def list_models(roots: list[Path] | None = None) -> list[dict]:
    """Every model of every manifest found under the roots (default: the shipped checkpoints)."""
    rows = []
    for root in roots or [SHIPPED]:
        for manifest in sorted(Path(root).glob("**/zoo.json")):
            rows += manifest_rows(manifest)
    return rows


MODEL_FIELDS = {"name": str, "path": str, "role": str, "kind": str, "params": int}


def manifest_rows(manifest: Path) -> list[dict]:
    """The models of one zoo.json, checked: a broken manifest is a ValueError naming the file and
    what is wrong in it (the fields `zoo list` shows: name, path, role, kind, params)."""
    try:
        m = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{manifest}: not a readable JSON manifest ({e})") from None
    models = m.get("models") if isinstance(m, dict) else None
    if not isinstance(models, list) or not isinstance(m.get("preset"), str):
        raise ValueError(f"{manifest}: expected an object with \"preset\" (text) and \"models\" (a list); "
                         "rebuild it with specpilot zoo build")
    rows = []
    for i, e in enumerate(models):
        bad = [k for k, t in MODEL_FIELDS.items() if not isinstance(e.get(k), t)] if isinstance(e, dict) \
            else ["everything (not an object)"]
        if bad:
            raise ValueError(f"{manifest}: models[{i}] lacks or mistypes {', '.join(bad)}")
        rows.append({"target": None, "heldout_loss": None, "tau": None, **e,
                     "path": str(manifest.parent / e["path"]), "preset": m["preset"]})
    return rows
