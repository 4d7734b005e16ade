"""Random-weight models and drafters of every supported family and kind, for tests, the demo's
fallback and benchmarks (decode speed does not depend on weight values)."""

from __future__ import annotations

import copy
import math
import random

import torch

from .config import ModelConfig
from .drafters import TOP_K, DraftConfig, Drafter, FeatureDrafterNet, Lattice
from .model import Model

FAMILIES = ("llama", "qwen3", "sliding", "hybrid")


def tiny_config(family: str, vocab: int = 256, hidden: int = 64, layers: int = 4, heads: int = 4,
                kv_heads: int = 2, window: int = 8, tied: bool = False) -> ModelConfig:
    """A small config of a family: llama, qwen3, sliding (Qwen3 with sliding layers) or hybrid
    (Qwen3-Next layout: GDN layers with full attention every other layer)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    hf = {"llama": "llama", "qwen3": "qwen3", "sliding": "qwen3", "hybrid": "qwen3_next"}[family]
    layer_types = ["full_attention"] * layers
    if family == "sliding":
        layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if family == "hybrid":
        layer_types = ["full_attention" if i % 2 else "linear_attention" for i in range(layers)]
    return ModelConfig(
        family=hf, vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=hidden // heads, layer_types=layer_types, tie_word_embeddings=tied,
        sliding_window=window if family == "sliding" else None,
        partial_rotary_factor=0.5 if family == "hybrid" else 1.0,
        linear_num_key_heads=2 if family == "hybrid" else 0,
        linear_num_value_heads=4 if family == "hybrid" else 0,
        linear_key_head_dim=hidden // 8 if family == "hybrid" else 0,
        linear_value_head_dim=hidden // 8 if family == "hybrid" else 0,
        eos_token_id=[0], bos_token_id=None,
    )


def randomize(module: torch.nn.Module, seed: int, std: float = 0.2) -> torch.nn.Module:
    """Deterministic random weights: linear/embedding ~ N(0, std²/fan_in-ish), norms near 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.01, 4, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.rand(p.shape, generator=g))
            elif p.dim() == 1:  # norm weights (zero-centred ones get small offsets)
                centre = 0.0 if (getattr(module, "cfg", None) is not None and name.endswith("norm.weight")
                                 and getattr(module.cfg, "zero_centered_norm", False)) else 1.0
                p.copy_(centre + 0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] if p.dim() == 2 else p[0].numel()
                scale = std if name.endswith("embed_tokens.weight") else fan_in ** -0.5
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module


def random_model(cfg: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu") -> Model:
    return randomize(Model(cfg), seed).to(device=device, dtype=dtype).eval()


def perturbed(model: Model, seed: int, noise: float) -> Model:
    """A copy of a model with relative Gaussian noise on every weight: a draft LM that agrees with
    the target often, but not always."""
    m = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p) * noise * p.abs().mean())
    return m


def drafter_config(kind: str, target: ModelConfig, layers: int = 1, block: int = 8,
                   target_layers: list[int] | None = None, markov_rank: int = 8,
                   lead_token: bool = False, input_norm: bool = False, copy_head: bool = False) -> DraftConfig:
    """A drafter for `target`: its hidden size is the target's (it shares embedding and LM head)."""
    n, hidden = target.num_hidden_layers, target.hidden_size
    return DraftConfig(
        kind=kind, vocab_size=target.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
        target_hidden_size=target.hidden_size,
        target_layers=target_layers if target_layers is not None else sorted({0, n // 2, n - 1}),
        block_size=block, markov_rank=markov_rank, lead_token=lead_token, input_norm=input_norm,
        copy_head=copy_head)


def random_drafter_net(kind: str, target: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                       **kw) -> FeatureDrafterNet:
    return randomize(FeatureDrafterNet(drafter_config(kind, target, **kw)), seed).to(dtype).eval()


def random_eagle3_net(target: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32, layers: int = 1,
                      target_layers: list[int] | None = None, draft_vocab: int | None = None,
                      own_embedding: bool = False, norm_before_residual: bool = False,
                      hidden: int | None = None) -> FeatureDrafterNet:
    """A sequential drafter with EAGLE-3's first layer (`layer0_input = "eagle3"`) for `target`:
    reading three target layers (default [1, n/2, n-1]); with `draft_vocab` an own head over a random
    draft vocabulary of that many target ids (`draft_ids`, ascending); `hidden` another width than the
    target's (then with its own embedding and head)."""
    n = target.num_hidden_layers
    H = hidden or target.hidden_size
    own = hidden is not None and hidden != target.hidden_size
    cfg = DraftConfig(
        kind="sequential", vocab_size=target.vocab_size, hidden_size=H, intermediate_size=2 * H,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=H // 4,
        target_hidden_size=target.hidden_size,
        target_layers=target_layers if target_layers is not None else sorted({1, n // 2, n - 1}),
        layer0_input="eagle3", norm_before_residual=norm_before_residual,
        draft_vocab_size=draft_vocab or (target.vocab_size if own else None), own_embedding=own_embedding or own)
    net = randomize(FeatureDrafterNet(cfg), seed).to(dtype).eval()
    if draft_vocab is not None and draft_vocab < target.vocab_size:
        g = torch.Generator().manual_seed(seed + 1)
        net.draft_ids = torch.randperm(target.vocab_size, generator=g)[:draft_vocab].sort().values
    return net


class NoisyOracle(Drafter):
    """A host drafter for losslessness tests that reaches deep into accepted paths: it knows the
    target's greedy continuation and proposes it with noise.

    At every drafted position the top-1 candidate is the continuation's token, except with
    probability `p`: then a random wrong token leads and the true one sits at a random lower rank
    or is missing. The top-1's log-probability is confident (about -0.05, the others -4 and
    below), so best-first, top-k and Sequoia trees spend their nodes along the top-1 chain and go
    as deep as the draft length allows. With `markov` the lattice carries random parent → child
    transitions (each child's own score plus Gaussian noise), which exercises the trees' Markov
    scoring. With `calibrated` the scores say how reliable the drafter is: the top-1's probability
    is 1 - p and the others share p, so requests of different `p` differ in confidence too.
    `continuation` must run past the tokens a run generates by the draft length (the static driver
    drafts its full length even at the token limit); past its end the drafter proposes random
    tokens.

    Every proposal draws from one seeded generator, so a run is reproducible as long as the
    driver makes the same observe / propose calls."""

    kind = "noisy_oracle"

    def __init__(self, continuation: list[int], prompt_len: int, p: float, seed: int = 0, vocab: int = 97,
                 k: int = 4, markov: bool = False, calibrated: bool = False):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"NoisyOracle: p = {p}; expected a probability in [0, 1]")
        if not 2 <= k <= min(TOP_K, vocab):
            raise ValueError(f"NoisyOracle: k = {k}; expected 2 ≤ k ≤ min({TOP_K}, vocab)")
        self.cont, self.prompt_len, self.p, self.seed = list(continuation), prompt_len, p, seed
        self.vocab, self.k, self.transitions, self.calibrated = vocab, k, markov, calibrated
        self.reset(0)

    def reset(self, max_len: int) -> None:
        self.seen = 0  # tokens committed to the target's cache so far
        self.rng = random.Random(self.seed)
        self.gen = torch.Generator().manual_seed(self.seed)

    def observe(self, committed, next_tokens, feats=None) -> None:
        self.seen += len(committed)

    def mark(self) -> int:
        return self.seen

    def rewind(self, mark: int) -> None:  # the generator draws on: a run stays reproducible
        self.seen = mark

    def propose(self, m: int, known: list[int] | None = None) -> Lattice:
        if m <= 0:
            return Lattice.empty()
        rng, k = self.rng, self.k
        at = self.seen - self.prompt_len + 1  # the continuation's index of the first drafted token
        tokens = torch.full((m, TOP_K), -1, dtype=torch.long)
        logp = torch.full((m, TOP_K), float("-inf"), dtype=torch.float64)
        for i in range(m):
            j = at + i
            true = self.cont[j] if 0 <= j < len(self.cont) else rng.randrange(self.vocab)
            others = [t for t in rng.sample(range(self.vocab), k + 1) if t != true][: k - 1]
            rank = rng.randrange(1, k + 1) if rng.random() < self.p else 0  # rank k: missing
            row = (others[:rank] + [true] + others[rank:])[:k]
            tokens[i, :k] = torch.tensor(row)
            if self.calibrated:  # (the others a little apart: no exact ties)
                lead, rest = math.log(max(1 - self.p, 1e-6)), math.log(max(self.p, 1e-6) / (k - 1))
                logp[i, :k] = torch.tensor([lead] + [rest - 0.01 * (r + rng.random()) for r in range(k - 1)],
                                           dtype=torch.float64)
            else:
                logp[i, :k] = torch.tensor([-0.05] + [-4.0 - r - rng.random() for r in range(k - 1)],
                                           dtype=torch.float64)
        trans = None
        if self.transitions and m > 1:
            noise = torch.randn(m - 1, TOP_K, TOP_K, generator=self.gen, dtype=torch.float64)
            trans = logp[1:, None, :] + noise  # missing children stay at -inf
        return Lattice(tokens, logp, trans)
