"""A runnable system: one `EngineConfig` (the stock system is every mechanism off) → loaded target,
drafter and tokenizer → outputs and statistics for a list of requests."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .checkpoint import CheckpointError, load_model
from .decode import Result, generate
from .drafters import load_drafter
from .replay import make_policy
from .trees import parse_policy

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
MODES = ("ar", "chain", "tree")


@dataclass
class EngineConfig:
    target: str
    drafter: str | None = None  # checkpoint folder, or "ngram"
    mode: str = "chain"  # ar | chain | tree
    tree: str = "best-first:32"  # tree mode: best-first:N | topk:K:N | sequoia:N | chain
    profile: str | None = None  # sequoia: an acceptance profile (JSON) from `specpilot replay --profile-out`
    draft_len: int = 8
    dtype: str = "float32"
    device: str = "cpu"
    max_new_tokens: int = 64
    # planted defects, for the controller's self-tests only: "logit_bias:TOKEN,TOKEN:NATS" adds
    # NATS to those tokens' logits; "slowdown:F" makes every generation F × slower (busy wait)
    defect: str | None = None

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: expected one of {MODES}")
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
        if self.defect is not None:
            parse_defect(self.defect)
        if self.draft_len < 1 or self.max_new_tokens < 1:
            raise ValueError("draft_len and max_new_tokens must be positive")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} asked for, but CUDA is not available here; use --device cpu")

    def as_dict(self) -> dict:
        return asdict(self)


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
        self.target = load_model(cfg.target, dtype, cfg.device)
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
        t0 = time.perf_counter()
        res = generate(self.target, self.encode(req), n, self.drafter, self.cfg.draft_len,
                       policy=self.policy, record=record, logit_bias=self.bias)
        if self.slowdown:  # a silent slowdown: the same output, later
            until = time.perf_counter() + self.slowdown * (time.perf_counter() - t0)
            while time.perf_counter() < until:
                pass
        return res

    def run(self, requests, progress=None, records: list | None = None) -> dict:
        """The CLI's JSON: outputs, mean τ over all steps, tokens/s over all generation time.
        `records`, when given, receives (id, policy, step records) per request."""
        outputs, steps, n_tok, wall = [], [], 0, 0.0
        for req in requests:
            rec = [] if records is not None else None
            t0 = time.perf_counter()
            res = self.generate(req, rec)
            wall += time.perf_counter() - t0
            if records is not None:
                records.append((req.id, self.cfg.tree if self.cfg.mode == "tree" else "chain", rec))
            outputs.append({"id": req.id, "tokens": res.tokens, "text": self.decode_text(res.tokens),
                            "tau_mean": res.tau_mean, "steps": len(res.steps)})
            steps += res.steps
            n_tok += len(res.tokens)
            if progress is not None:
                progress(1)
        return {
            "outputs": outputs,
            "tau_mean": sum(s.tau for s in steps) / len(steps) if steps else 0.0,
            "tokens_per_s": n_tok / wall if wall else 0.0,
            "steps": len(steps),
            "drafted_mean": sum(s.drafted for s in steps) / len(steps) if steps else 0.0,
            "time_s": {"draft": sum(s.t_draft for s in steps), "verify": sum(s.t_verify for s in steps),
                       "commit": sum(s.t_commit for s in steps), "total": wall},
            "config": self.cfg.as_dict(),
        }
