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


def apply(model: Model, weights: str = "bf16", lm_head: str = "bf16") -> Model:
    """Set the target's weight formats (after its last .to()); a ValueError names a weight that
    cannot take them."""
    if weights not in WEIGHTS or lm_head not in LM_HEADS:
        raise ValueError(f"weights {weights!r} / lm_head {lm_head!r}: expected one of {WEIGHTS} / {LM_HEADS}")
    if weights == "w12":
        model.fuse()
        for i, blk in enumerate(model.model.layers):
            at = f"model.layers.{i}"
            if blk.kind == "linear_attention":
                g = blk.linear_attn
                g.in_proj = _w12(g.in_proj, f"{at}.linear_attn.in_proj (fused)")
                g.out_proj = _w12(g.out_proj, f"{at}.linear_attn.out_proj")
            else:
                a = blk.self_attn
                a.qkv = _w12(a.qkv, f"{at}.self_attn.qkv (fused)")
                a.o_proj = _w12(a.o_proj, f"{at}.self_attn.o_proj")
            blk.mlp.gate_up = _w12(blk.mlp.gate_up, f"{at}.mlp.gate_up (fused)")
            blk.mlp.down_proj = _w12(blk.mlp.down_proj, f"{at}.mlp.down_proj")
    if lm_head == "w12":
        model.head = _w12(Dense(model.lm_head_weight), "lm_head")
    elif lm_head == "certified":
        from specpilot.kernels.certified_head import CertifiedHead

        model.greedy_head = CertifiedHead.from_weight(model.lm_head_weight.detach())
    return model
