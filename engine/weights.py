"""How the target's projections read their weights: `EngineConfig.weights` and `.lm_head`.

weights  "bf16"       the checkpoint's dense weights (the stock system)
         "w12"        every layer projection in W12, 12 bits a weight, bit-exact
                      (kernels/w12): q/k/v, gate/up and the Gated DeltaNet input projections
                      fused first, so a pass reads each layer in four W12 GEMMs
lm_head  "bf16"       the dense head
         "w12"        the head in W12
         "certified"  an INT8 copy of the head with a per-row error bound: tokens proven not
                      to be the argmax are dropped and the rest rescored on the dense head
                      (kernels/certified_head); it gives the argmax alone, so the drivers ask
                      the model for `greedy` rows

Both are lossless switches: a W12 weight is the checkpoint's weight bit for bit and the certified
head's argmax is the dense head's. They need weights whose values are bf16 values (any float
dtype holding them: the float64 tests run them too). The embedding and `lm_head_weight` stay dense
(drafters and the scorer read them).
"""

from __future__ import annotations

from .model import Dense, Model

WEIGHTS = ("bf16", "w12")
LM_HEADS = ("bf16", "w12", "certified")


def _w12(proj, name: str):
    from specpilot.kernels.w12.linear import W12Linear

    return proj if isinstance(proj, W12Linear) else W12Linear.from_weight(proj.weight, proj.bias, name)


def projections(model: Model):
    """(owner module, attribute, name) of every layer projection a pass reads, fused ones included
    (call after `model.fuse()`): what `weights: w12` stores in W12 and what the Q pass of
    two-level verification (tlv.py) reads through its 8-bit view."""
    for i, blk in enumerate(model.model.layers):
        at = f"model.layers.{i}"
        if blk.kind == "linear_attention":
            yield blk.linear_attn, "in_proj", f"{at}.linear_attn.in_proj (fused)"
            yield blk.linear_attn, "out_proj", f"{at}.linear_attn.out_proj"
        else:
            yield blk.self_attn, "qkv", f"{at}.self_attn.qkv (fused)"
            yield blk.self_attn, "o_proj", f"{at}.self_attn.o_proj"
        yield blk.mlp, "gate_up", f"{at}.mlp.gate_up (fused)"
        yield blk.mlp, "down_proj", f"{at}.mlp.down_proj"


def apply(model: Model, weights: str = "bf16", lm_head: str = "bf16") -> Model:
    """Set the target's weight formats (after its last .to()); a ValueError names a weight that
    cannot take them."""
    if weights not in WEIGHTS or lm_head not in LM_HEADS:
        raise ValueError(f"weights {weights!r} / lm_head {lm_head!r}: expected one of {WEIGHTS} / {LM_HEADS}")
    if weights == "w12":
        model.fuse()
        for owner, attr, name in list(projections(model)):
            setattr(owner, attr, _w12(getattr(owner, attr), name))
    if lm_head == "w12":
        model.head = _w12(Dense(model.lm_head_weight), "lm_head")
    elif lm_head == "certified":
        from specpilot.kernels.certified_head import CertifiedHead

        model.greedy_head = CertifiedHead.from_weight(model.lm_head_weight.detach())
    return model
