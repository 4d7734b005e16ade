"""Model configuration read from (and written to) a Hugging Face `config.json`.

One dataclass covers every supported family: Llama, Mistral (sliding window), Qwen3 (q/k-norm,
optional sliding layers) and Qwen3-Next-style hybrids (full attention + Gated DeltaNet layers).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch


class ConfigError(ValueError):
    """A config.json that this engine cannot run; the message names the file and the field."""


ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3NextForCausalLM": "qwen3_next",
}
LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")


_MISSING = object()
MAX_LAYERS, MAX_HEADS = 1024, 1024  # beyond any released model: a larger value is a typo


def checked_field(d: dict, key: str, source: str, kind: str, default=_MISSING, low=None, high=None):
    """One config.json field checked for its JSON type and range; a `ConfigError` naming the file,
    the field, the value and what is allowed otherwise. kind: "int" | "float" | "bool"."""
    if key not in d or (d[key] is None and default is not _MISSING):
        if default is _MISSING:
            raise ConfigError(f"{source}: required field '{key}' is missing")
        return default
    v = d[key]
    if kind == "bool":
        if not isinstance(v, bool):
            raise ConfigError(f"{source}: field '{key}' = {v!r}: expected true or false")
        return v
    ok = isinstance(v, int) and not isinstance(v, bool) if kind == "int" else \
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    what = "an integer" if kind == "int" else "a finite number"
    rng = (f" >= {low}" if low is not None else "") + (f" and <= {high}" if high is not None else "")
    if not ok or (low is not None and v < low) or (high is not None and v > high):
        raise ConfigError(f"{source}: field '{key}' = {v!r}: expected {what}{rng}")
    return int(v) if kind == "int" else float(v)


def _positive(d, key, source, default=_MISSING):
    return checked_field(d, key, source, "int", default, low=1)


@dataclass
class ModelConfig:
    family: str  # llama | mistral | qwen3 | qwen3_next
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: list[str]
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "llama3", "factor": ..., ...} or None
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int = 4096
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    # Gated DeltaNet (linear_attention layers)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4

    @property
    def qk_norm(self) -> bool:
        return self.family in ("qwen3", "qwen3_next")

    @property
    def zero_centered_norm(self) -> bool:
        """Qwen3-Next stores RMSNorm weights as w with scale (1 + w)."""
        return self.family == "qwen3_next"

    @property
    def attn_output_gate(self) -> bool:
        return self.family == "qwen3_next"

    @property
    def is_hybrid(self) -> bool:
        return "linear_attention" in self.layer_types

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def inv_freq(self) -> torch.Tensor:
        """RoPE inverse frequencies (float64, on the CPU whatever the default device: a module built
        on the meta device gets real values), including Llama-3 frequency scaling."""
        dim = self.rotary_dim
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim))
        rs = self.rope_scaling
        if not rs or rs.get("rope_type", rs.get("type", "default")) == "default":
            return inv
        if rs.get("rope_type", rs.get("type")) != "llama3":
            raise ConfigError(f"rope_scaling type {rs!r} is not supported (default and llama3 are)")
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return torch.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)

    # ---- Hugging Face config.json -------------------------------------------------------
    @classmethod
    def from_hf(cls, d: dict, source: str = "config.json") -> ModelConfig:
        def need(key):
            if key not in d:
                raise ConfigError(f"{source}: required field '{key}' is missing")
            return d[key]

        archs = d.get("architectures")
        if archs is None or not isinstance(archs, list):
            raise ConfigError(f"{source}: field 'architectures' = {archs!r}: expected a list naming one of "
                              f"{', '.join(ARCHITECTURES)}")
        known = [a for a in archs if isinstance(a, str) and a in ARCHITECTURES]
        if not known:
            raise ConfigError(
                f"{source}: field 'architectures' = {archs!r} names no supported architecture; "
                f"supported: {', '.join(ARCHITECTURES)}"
            )
        family = ARCHITECTURES[known[0]]
        n_layers = checked_field(d, "num_hidden_layers", source, "int", low=1, high=MAX_LAYERS)
        n_heads = checked_field(d, "num_attention_heads", source, "int", low=1, high=MAX_HEADS)
        hidden = _positive(d, "hidden_size", source)
        vocab = _positive(d, "vocab_size", source)
        rope = d.get("rope_parameters") or {}
        if not isinstance(rope, dict):
            raise ConfigError(f"{source}: field 'rope_parameters' = {rope!r}: expected an object")
        rope_theta = checked_field(rope, "rope_theta", f"{source} (rope_parameters)", "float",
                            checked_field(d, "rope_theta", source, "float", 10000.0, low=1e-9), low=1e-9)
        scaling = d.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if scaling is not None and not isinstance(scaling, dict):
            raise ConfigError(f"{source}: field 'rope_scaling' = {scaling!r}: expected an object or null")
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) not in ("default", "llama3"):
            raise ConfigError(f"{source}: field 'rope_scaling' has rope_type "
                              f"{scaling.get('rope_type', scaling.get('type'))!r}; supported: default, llama3")
        if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
            for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
                checked_field(scaling, k, f"{source} (rope_scaling)", "float", low=1e-9)
            if not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
                raise ConfigError(f"{source}: rope_scaling needs high_freq_factor > low_freq_factor, got "
                                  f"{scaling['high_freq_factor']!r} and {scaling['low_freq_factor']!r}")
        # Transformers' Qwen3NextConfig defaults partial_rotary_factor to 0.25 when the field is absent
        partial = checked_field(rope, "partial_rotary_factor", f"{source} (rope_parameters)", "float",
                         checked_field(d, "partial_rotary_factor", source, "float",
                                0.25 if family == "qwen3_next" else 1.0, low=1e-9, high=1.0), low=1e-9, high=1.0)
        sliding = checked_field(d, "sliding_window", source, "int", None, low=1)
        if family == "qwen3" and not d.get("use_sliding_window", False) and not d.get("layer_types"):
            sliding = None
        layer_types = d.get("layer_types")
        if layer_types is None:
            if family == "qwen3_next":
                interval = _positive(d, "full_attention_interval", source, 4)
                layer_types = [
                    "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)
                ]
            elif family == "qwen3" and sliding is not None:
                mwl = checked_field(d, "max_window_layers", source, "int", n_layers, low=0)
                layer_types = ["sliding_attention" if i >= mwl else "full_attention" for i in range(n_layers)]
            elif family == "mistral" and sliding is not None:
                layer_types = ["sliding_attention"] * n_layers
            else:
                layer_types = ["full_attention"] * n_layers
        if not isinstance(layer_types, list):
            raise ConfigError(f"{source}: field 'layer_types' = {layer_types!r}: expected a list of layer types")
        if len(layer_types) != n_layers:
            raise ConfigError(f"{source}: 'layer_types' has {len(layer_types)} entries, num_hidden_layers is {n_layers}")
        for t in layer_types:
            allowed = LAYER_TYPES if family == "qwen3_next" else LAYER_TYPES[:2]
            if t not in allowed:
                raise ConfigError(f"{source}: layer type {t!r} in 'layer_types' is not supported for {known[0]} "
                                  f"(allowed: {', '.join(allowed)})")
        if "sliding_attention" in layer_types and not sliding:
            raise ConfigError(f"{source}: 'layer_types' has sliding_attention layers but 'sliding_window' is not set")
        if family == "qwen3_next":
            mlp_only = d.get("mlp_only_layers") or []
            if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only):
                raise ConfigError(f"{source}: field 'mlp_only_layers' = {mlp_only!r}: expected a list of layer indices")
            mlp_only = set(mlp_only)
            n_exp = checked_field(d, "num_experts", source, "int", 0, low=0)
            step = _positive(d, "decoder_sparse_step", source, 1)
            moe = [i for i in range(n_layers) if i not in mlp_only and n_exp > 0 and (i + 1) % step == 0]
            if moe:
                raise ConfigError(
                    f"{source}: layers {moe} are mixture-of-experts; this engine runs dense MLPs only — "
                    "set 'mlp_only_layers' to all layer indices (or num_experts to 0)"
                )
        eos = d.get("eos_token_id")
        eos = [] if eos is None else [eos] if not isinstance(eos, list) else eos
        for e in eos:
            if not isinstance(e, int) or isinstance(e, bool) or not 0 <= e < vocab:
                raise ConfigError(f"{source}: field 'eos_token_id' = {d.get('eos_token_id')!r}: expected token ids "
                                  f"in [0, {vocab}) (vocab_size)")
        bos = d.get("bos_token_id")
        if bos is not None and (not isinstance(bos, int) or isinstance(bos, bool) or not 0 <= bos < vocab):
            raise ConfigError(f"{source}: field 'bos_token_id' = {bos!r}: expected a token id in [0, {vocab}) or null")
        head_dim = _positive(d, "head_dim", source, None)
        if head_dim is None:
            if hidden % n_heads:
                raise ConfigError(f"{source}: hidden_size {hidden} is not a multiple of num_attention_heads {n_heads}; "
                                  "set 'head_dim'")
            head_dim = hidden // n_heads
        hybrid = "linear_attention" in layer_types
        lin = {k: checked_field(d, k, source, "int", 0, low=0) for k in ("linear_num_key_heads", "linear_num_value_heads",
                                                                  "linear_key_head_dim", "linear_value_head_dim")}
        if hybrid:
            for k, v in lin.items():
                if v < 1:
                    raise ConfigError(f"{source}: field '{k}' = {d.get(k)!r}: linear_attention layers need a positive "
                                      "integer")
        cfg = cls(
            family=family,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=_positive(d, "intermediate_size", source),
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=_positive(d, "num_key_value_heads", source, n_heads),
            head_dim=head_dim,
            layer_types=list(layer_types),
            rms_norm_eps=checked_field(d, "rms_norm_eps", source, "float", 1e-6, low=0.0),
            rope_theta=rope_theta,
            rope_scaling=dict(scaling) if scaling else None,
            partial_rotary_factor=partial,
            max_position_embeddings=_positive(d, "max_position_embeddings", source, 4096),
            sliding_window=sliding if sliding and "sliding_attention" in layer_types else None,
            tie_word_embeddings=checked_field(d, "tie_word_embeddings", source, "bool", False),
            attention_bias=checked_field(d, "attention_bias", source, "bool", False),
            mlp_bias=checked_field(d, "mlp_bias", source, "bool", False),
            bos_token_id=bos,
            eos_token_id=list(eos),
            linear_conv_kernel_dim=_positive(d, "linear_conv_kernel_dim", source, 4),
            **lin,
        )
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{source}: field 'hidden_act' = {act!r} is not supported (silu is)")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ConfigError(f"{source}: num_attention_heads ({cfg.num_attention_heads}) must be a multiple of "
                              f"num_key_value_heads ({cfg.num_key_value_heads})")
        if cfg.rotary_dim < 2 or cfg.rotary_dim % 2:
            raise ConfigError(f"{source}: head_dim {head_dim} × partial_rotary_factor {partial} gives a rotary "
                              "dimension that is not a positive even number")
        if cfg.is_hybrid and cfg.linear_num_value_heads % cfg.linear_num_key_heads:
            raise ConfigError(f"{source}: linear_num_value_heads must be a positive multiple of linear_num_key_heads")
        return cfg

    def to_hf(self) -> dict:
        """A config.json that both this engine and Hugging Face Transformers load."""
        arch = {v: k for k, v in ARCHITECTURES.items()}[self.family]
        d = {
            "architectures": [arch],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta,
                                "partial_rotary_factor": self.partial_rotary_factor},
            "layer_types": list(self.layer_types),
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id[0] if len(self.eos_token_id) == 1 else (self.eos_token_id or None),
            "torch_dtype": "float32",
        }
        if self.rope_scaling:
            d["rope_parameters"] = {**self.rope_scaling, "rope_theta": self.rope_theta,
                                    "partial_rotary_factor": self.partial_rotary_factor}
        if self.family == "llama":
            d["mlp_bias"] = self.mlp_bias
        if self.family in ("llama", "mistral"):  # their HF configs derive the layer pattern themselves
            d.pop("layer_types")
        if self.sliding_window:
            d["sliding_window"] = self.sliding_window
            if self.family == "qwen3":
                d["use_sliding_window"] = True
        if self.family == "qwen3_next":
            d.update(
                linear_num_key_heads=self.linear_num_key_heads,
                linear_num_value_heads=self.linear_num_value_heads,
                linear_key_head_dim=self.linear_key_head_dim,
                linear_value_head_dim=self.linear_value_head_dim,
                linear_conv_kernel_dim=self.linear_conv_kernel_dim,
                num_experts=0,
                mlp_only_layers=list(range(self.num_hidden_layers)),
            )
        return d

    def as_dict(self) -> dict:
        return asdict(self)
