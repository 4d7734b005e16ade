"""A runnable system: one `EngineConfig` (the stock system is every mechanism off) → loaded target,
drafter and tokenizer → outputs and statistics for a list of requests."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .checkpoint import CheckpointError, load_model
from .decode import DRIVERS, Result, generate, pick_driver
from .drafters import load_drafter
from .lengths import parse as parse_draft_lens
from .replay import make_policy
from .tlv import TwoLevel, check as check_tlv, check_drafter
from .trees import parse_policy
from .weights import LM_HEADS, WEIGHTS, apply as apply_weights

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
MODES = ("ar", "chain", "tree", "tlv")


@dataclass
class EngineConfig:
    target: str
    drafter: str | None = None  # checkpoint folder, or "ngram"
    mode: str = "chain"  # ar | chain | tree | tlv (two-level verification, engine/tlv.py)
    tree: str = "best-first:32"  # tree mode: best-first:N | topk:K:N | sequoia:N | shared:N:C | chain
    profile: str | None = None  # sequoia: an acceptance profile (JSON) from `specpilot replay --profile-out`
    draft_len: int = 8
    # per-request draft length: the lengths ("16,12,8", each ≤ draft_len) a request picks from, each
    # step, by its recent acceptance (engine/lengths.py); None: every request drafts draft_len
    draft_lens: str | None = None
    # prompt admission at batch > 1: a waiting prompt whose prefill fits this many verify steps rides
    # a busy batch's steps in its lane's rows (no prefill pass); 0: every prompt gets a prefill pass
    admit_steps: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    max_new_tokens: int = 64
    weights: str = "bf16"  # bf16 | w12: how the target's layer projections store their weights (weights.py)
    lm_head: str = "bf16"  # bf16 | w12 | certified: how the target's LM head finds the next token
    # planted defects, for the controller's self-tests only: "logit_bias:TOKEN,TOKEN:NATS" adds
    # NATS to those tokens' logits; "slowdown:F" makes every generation F × slower (busy wait)
    defect: str | None = None
    # auto: the static (CUDA-graph) driver on CUDA where it runs the drafter and policy, else the
    # eager one; static | eager: that driver (static where it cannot run: refused, with the reason)
    driver: str = "auto"
    # tlv mode: the nodes N of the Q pass's tree and of each exact pass (the root aside), and the
    # depth of the Q pass's tree; the Q pass needs weights whose values are bf16 values
    tlv_nodes: int = 32
    tlv_q_depth: int = 8

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: expected one of {MODES}")
        if self.driver not in DRIVERS:
            raise ValueError(f"driver {self.driver!r}: expected one of {DRIVERS}")
        if self.mode != "ar" and not self.drafter:
            raise ValueError(f"mode {self.mode!r} needs a drafter (a checkpoint folder or 'ngram')")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: expected one of {tuple(DTYPES)}")
        if self.mode == "tree":
            name, _ = parse_policy(self.tree)
            if name == "oracle":
                raise ValueError("the oracle is a replay-only policy (specpilot replay --policy oracle)")
            if name == "sequoia" and not self.profile:
                raise ValueError("sequoia:N needs --profile FILE (from `specpilot replay --profile-out`)")
        if self.weights not in WEIGHTS:
            raise ValueError(f"weights {self.weights!r}: expected one of {WEIGHTS}")
        if self.lm_head not in LM_HEADS:
            raise ValueError(f"lm_head {self.lm_head!r}: expected one of {LM_HEADS}")
        if self.defect is not None:
            parse_defect(self.defect)
        if self.draft_len < 1 or self.max_new_tokens < 1:
            raise ValueError("draft_len and max_new_tokens must be positive")
        if self.draft_lens is not None:
            parse_draft_lens(self.draft_lens, self.draft_len)
            if self.mode == "ar":
                raise ValueError(f"draft_lens {self.draft_lens!r}: mode 'ar' drafts nothing (use chain or tree)")
            if self.driver == "eager":
                raise ValueError(f"draft_lens {self.draft_lens!r}: runs on the static driver; driver 'eager' "
                                 "cannot run it (use 'auto' or 'static')")
        from .fast import check_admit_steps

        check_admit_steps(self.admit_steps)
        if self.admit_steps and self.driver == "eager":
            raise ValueError(f"admit_steps {self.admit_steps}: batched decoding runs the static driver; driver 'eager' "
                             "cannot run it (use 'auto' or 'static')")
        if self.mode == "tlv":
            check_tlv(self.tlv_nodes, self.tlv_q_depth)
            for name, on in (("draft_lens", self.draft_lens is not None), ("admit_steps", self.admit_steps)):
                if on:
                    raise ValueError(f"{name}: mode 'tlv' does not combine with it (its trees come from the cycle; "
                                     f"drop --{name.replace('_', '-')})")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} asked for, but CUDA is not available here; use --device cpu")

    def as_dict(self) -> dict:
        return asdict(self)


def accepted_per_position(steps) -> list[float]:
    """Of the target passes, the share that accepted a drafted token at position 1, 2, …: entry
    i is the fraction of steps with τ > i + 1 (τ counts the bonus token)."""
    drafted = max((s.drafted for s in steps), default=0)
    if not steps or not drafted:
        return []
    return [round(sum(s.tau > i + 1 for s in steps) / len(steps), 6) for i in range(drafted)]


def load_tokenizer(folder):
    """The checkpoint's tokenizer.json as a `tokenizers.Tokenizer`, or None when it has none."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the tokenizers library raises plain Exceptions on bad files
        raise CheckpointError(f"{path}: cannot be read as a tokenizer ({e})") from None


def parse_defect(spec: str) -> tuple[dict[int, float], float]:
    """'logit_bias:T1,T2:NATS' → ({token: nats}, 0) or 'slowdown:F' → ({}, F)."""
    try:
        kind, *args = spec.split(":")
        if kind == "logit_bias" and len(args) == 2:
            return {int(t): float(args[1]) for t in args[0].split(",")}, 0.0
        if kind == "slowdown" and len(args) == 1 and float(args[0]) >= 0:
            return {}, float(args[0])
        raise ValueError("unknown form")
    except ValueError as e:
        raise ValueError(f"defect {spec!r} ({e}): expected logit_bias:TOKEN,TOKEN:NATS or slowdown:F") from None


def read_profile(path) -> torch.Tensor:
    """An acceptance profile [depth, k] written by `specpilot replay --profile-out`."""
    try:
        p = torch.tensor(json.loads(Path(path).read_text())["profile"], dtype=torch.float64)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not an acceptance profile ({e}); write one with "
                         "`specpilot replay --record FILE --profile-out PROFILE`") from None
    if p.dim() != 2 or (p < 0).any() or (p > 1).any():
        raise ValueError(f"{path}: a profile is a [depth, k] table of probabilities")
    return p


class Engine:
    def __init__(self, cfg: EngineConfig):
        cfg.validate()
        self.cfg = cfg
        dtype = DTYPES[cfg.dtype]
        self.target = apply_weights(load_model(cfg.target, dtype, cfg.device), cfg.weights, cfg.lm_head)
        self.drafter = load_drafter(cfg.drafter, dtype, cfg.device, self.target) if cfg.mode != "ar" else None
        self.tokenizer = load_tokenizer(cfg.target)
        self.policy = None
        biased, self.slowdown = parse_defect(cfg.defect) if cfg.defect else ({}, 0.0)
        self.bias = None
        if biased:
            if not all(0 <= t < self.target.cfg.vocab_size for t in biased):
                raise ValueError(f"defect {cfg.defect!r}: a token lies outside the vocabulary")
            self.bias = torch.zeros(self.target.cfg.vocab_size, dtype=torch.float64)
            self.bias[list(biased)] = torch.tensor(list(biased.values()), dtype=torch.float64)
        if cfg.mode == "tree":
            self.policy = make_policy(cfg.tree, read_profile(cfg.profile) if cfg.profile else None)
        self.tlv = None
        if cfg.mode == "tlv":
            check_drafter(self.drafter)
            self.tlv = TwoLevel(self.target, cfg.tlv_nodes, cfg.tlv_q_depth)
        self.driver = pick_driver(self.target, self.drafter, self.policy, cfg.driver, self.tlv)
        self.lengths = parse_draft_lens(cfg.draft_lens, cfg.draft_len) if cfg.draft_lens else None
        if self.lengths:  # the static driver's mechanism, at every batch size
            from . import fast

            why = fast.unsupported(self.drafter, self.policy)
            if why:
                raise ValueError(f"draft_lens {cfg.draft_lens!r}: the static driver it runs on cannot run {why}")
            self.driver = "static"

    def encode(self, req) -> list[int]:
        if getattr(req, "prompt_ids", None) is not None:
            ids = list(req.prompt_ids)
            bad = [t for t in ids if not 0 <= t < self.target.cfg.vocab_size]
            if bad:
                raise ValueError(f"request {req.id!r}: prompt_ids {bad[:3]} outside the vocabulary "
                                 f"(size {self.target.cfg.vocab_size})")
            return ids
        if self.tokenizer is None:
            raise ValueError(f"request {req.id!r} has a text prompt but {self.cfg.target} has no tokenizer.json; "
                             "give prompt_ids instead")
        return self.tokenizer.encode(req.prompt).ids

    def decode_text(self, tokens: list[int]) -> str | None:
        return self.tokenizer.decode(tokens, skip_special_tokens=False) if self.tokenizer else None

    def generate(self, req, record: list | None = None) -> Result:
        n = getattr(req, "max_new_tokens", None) or self.cfg.max_new_tokens
        prompt = self.encode(req)
        t0 = time.perf_counter()
        if self.lengths:
            from . import fast

            res = fast.decoder(self.target, self.drafter, self.cfg.draft_len, self.policy, self.bias, len(prompt) + n,
                               lengths=self.lengths).generate(prompt, n, record=record)
        else:  # records of two-level cycles: the eager driver's (the static one keeps none)
            driver = "eager" if record is not None and self.tlv is not None and self.cfg.driver == "auto" else \
                self.driver
            res = generate(self.target, prompt, n, self.drafter, self.cfg.draft_len, policy=self.policy,
                           record=record, logit_bias=self.bias, driver=driver, tlv=self.tlv)
        self._slow(t0)
        return res

    def generate_batch(self, requests, batch: int, progress=None) -> list[Result]:
        """Greedy outputs of the requests, `batch` decoding at once on the static driver (uncompiled
        on the CPU, captured on CUDA): one target pass verifies every request's draft, and a
        request that ends frees its place for the next (continuous batching). Every request's
        tokens are its own AR tokens, whatever shares its steps."""
        from . import fast

        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"batch {batch!r}: expected a positive integer")
        if self.cfg.driver == "eager":
            raise ValueError("driver 'eager' decodes one request at a time; batched decoding runs the static "
                             "driver (use driver 'auto' or 'static')")
        why = fast.unsupported(self.drafter, self.policy, self.tlv)
        if why:
            raise ValueError(f"batch {batch}: batched decoding cannot run {why}; use batch 1")
        if not requests:
            return []
        prompts = [self.encode(r) for r in requests]
        limits = [getattr(r, "max_new_tokens", None) or self.cfg.max_new_tokens for r in requests]
        lanes = min(batch, len(requests))
        t0 = time.perf_counter()
        dec = fast.decoder(self.target, self.drafter, self.cfg.draft_len, self.policy, self.bias,
                           max(len(p) + n for p, n in zip(prompts, limits)), lanes, self.lengths,
                           self.cfg.admit_steps, self.tlv)
        out = dec.generate_batch(prompts, limits, progress=progress)
        self._slow(t0)
        return out

    def _slow(self, t0: float) -> None:
        """The planted slowdown defect: the same output, later."""
        if self.slowdown:
            until = time.perf_counter() + self.slowdown * (time.perf_counter() - t0)
            while time.perf_counter() < until:
                pass

    def run(self, requests, progress=None, records: list | None = None, batch: int = 1) -> dict:
        """The CLI's JSON: outputs, mean τ over all steps, tokens/s over all generation time.
        `records`, when given, receives (id, policy, step records) per request (batch 1 only).
        batch > 1: `generate_batch`, and tokens/s is the batch's total throughput."""
        outputs, steps, n_tok, wall = [], [], 0, 0.0
        if batch > 1:
            if records is not None:
                raise ValueError("records are kept at batch 1 only; drop --record or use --batch 1")
            t0 = time.perf_counter()
            results = self.generate_batch(requests, batch, progress)
            wall = time.perf_counter() - t0
        else:
            results = []
            for req in requests:
                rec = [] if records is not None else None
                t0 = time.perf_counter()
                results.append(self.generate(req, rec))
                wall += time.perf_counter() - t0
                if records is not None:
                    records.append((req.id, self.cfg.tree if self.cfg.mode == "tree" else "chain", rec))
                if progress is not None:
                    progress(1)
        for req, res in zip(requests, results):
            outputs.append({"id": req.id, "tokens": res.tokens, "text": self.decode_text(res.tokens),
                            "tau_mean": res.tau_mean, "steps": len(res.steps),
                            "accepted_per_position": accepted_per_position(res.steps),
                            "prefill_steps": res.prefill_steps})  # verify steps its prompt rode (0: a pass)
            steps += res.steps
            n_tok += len(res.tokens)
        return {
            "batch": batch,
            "accepted_per_position": accepted_per_position(steps),
            "outputs": outputs,
            "tau_mean": sum(s.tau for s in steps) / len(steps) if steps else 0.0,
            "tokens_per_s": n_tok / wall if wall else 0.0,
            "steps": len(steps),
            "drafted_mean": sum(s.drafted for s in steps) / len(steps) if steps else 0.0,
            # rows its passes verified, per request and pass: every lane's rows (padding, masked
            # rows and idle lanes included) over the requests the pass decoded
            "verified_rows_mean": sum(s.rows / s.lanes for s in steps) / len(steps) if steps else 0.0,
            "time_s": {"draft": sum(s.t_draft for s in steps), "quick": sum(s.t_quick for s in steps),
                       "verify": sum(s.t_verify for s in steps),
                       "commit": sum(s.t_commit for s in steps), "total": wall},
            "driver": self.driver,
            "config": self.cfg.as_dict(),
        }
