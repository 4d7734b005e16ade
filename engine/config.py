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
        """RoPE inverse frequencies (float64), including Llama-3 frequency scaling."""
        dim = self.rotary_dim
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
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

        archs = d.get("architectures") or []
        known = [a for a in archs if a in ARCHITECTURES]
        if not known:
            raise ConfigError(
                f"{source}: field 'architectures' = {archs!r} names no supported architecture; "
                f"supported: {', '.join(ARCHITECTURES)}"
            )
        family = ARCHITECTURES[known[0]]
        n_layers = int(need("num_hidden_layers"))
        n_heads = int(need("num_attention_heads"))
        hidden = int(need("hidden_size"))
        rope = d.get("rope_parameters") or {}
        rope_theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
        scaling = d.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        # Transformers' Qwen3NextConfig defaults partial_rotary_factor to 0.25 when the field is absent
        partial = float(rope.get("partial_rotary_factor",
                                 d.get("partial_rotary_factor", 0.25 if family == "qwen3_next" else 1.0)))
        sliding = d.get("sliding_window")
        if family == "qwen3" and not d.get("use_sliding_window", False) and not d.get("layer_types"):
            sliding = None
        layer_types = d.get("layer_types")
        if layer_types is None:
            if family == "qwen3_next":
                interval = int(d.get("full_attention_interval", 4))
                layer_types = [
                    "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)
                ]
            elif family == "qwen3" and sliding is not None:
                mwl = int(d.get("max_window_layers", n_layers))
                layer_types = ["sliding_attention" if i >= mwl else "full_attention" for i in range(n_layers)]
            elif family == "mistral" and sliding is not None:
                layer_types = ["sliding_attention"] * n_layers
            else:
                layer_types = ["full_attention"] * n_layers
        if len(layer_types) != n_layers:
            raise ConfigError(f"{source}: 'layer_types' has {len(layer_types)} entries, num_hidden_layers is {n_layers}")
        for t in layer_types:
            allowed = LAYER_TYPES if family == "qwen3_next" else LAYER_TYPES[:2]
            if t not in allowed:
                raise ConfigError(f"{source}: layer type {t!r} in 'layer_types' is not supported for {known[0]}")
        if "sliding_attention" in layer_types and not sliding:
            raise ConfigError(f"{source}: 'layer_types' has sliding_attention layers but 'sliding_window' is not set")
        if family == "qwen3_next":
            mlp_only = set(d.get("mlp_only_layers") or [])
            n_exp = int(d.get("num_experts", 0) or 0)
            moe = [i for i in range(n_layers) if i not in mlp_only and n_exp > 0
                   and (i + 1) % int(d.get("decoder_sparse_step", 1)) == 0]
            if moe:
                raise ConfigError(
                    f"{source}: layers {moe} are mixture-of-experts; this engine runs dense MLPs only — "
                    "set 'mlp_only_layers' to all layer indices (or num_experts to 0)"
                )
        eos = d.get("eos_token_id")
        eos = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
        cfg = cls(
            family=family,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or n_heads),
            head_dim=int(d.get("head_dim") or hidden // n_heads),
            layer_types=list(layer_types),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=dict(scaling) if scaling else None,
            partial_rotary_factor=partial,
            max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
            sliding_window=int(sliding) if sliding and "sliding_attention" in layer_types else None,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", False)),
            mlp_bias=bool(d.get("mlp_bias", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos,
            linear_num_key_heads=int(d.get("linear_num_key_heads", 0) or 0),
            linear_num_value_heads=int(d.get("linear_num_value_heads", 0) or 0),
            linear_key_head_dim=int(d.get("linear_key_head_dim", 0) or 0),
            linear_value_head_dim=int(d.get("linear_value_head_dim", 0) or 0),
            linear_conv_kernel_dim=int(d.get("linear_conv_kernel_dim", 4) or 4),
        )
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{source}: 'hidden_act' = {act!r} is not supported (silu is)")
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ConfigError(f"{source}: num_attention_heads must be a multiple of num_key_value_heads")
        if cfg.is_hybrid and (cfg.linear_num_key_heads <= 0 or cfg.linear_num_value_heads % cfg.linear_num_key_heads):
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
