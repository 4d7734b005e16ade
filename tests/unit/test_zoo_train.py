"""Drafter training sees exactly the rows the engine drafts with (train/inference consistency), and
the training masks mean what their docstrings say."""

import pytest
import torch

from specpilot.engine.drafters import FeatureDrafter, FeatureDrafterNet
from specpilot.engine.synthetic import random_drafter_net, random_model, randomize, tiny_config
from specpilot.zoo import train

TARGET = random_model(tiny_config("qwen3", vocab=61), seed=3, dtype=torch.float64)


def features(seq):
    out = TARGET(torch.tensor([seq]), feature_layers=(0, 2, 3))
    return out.features[0]


def net(kind, block=6, lead_token=False, input_norm=False, copy_head=False):
    return random_drafter_net(kind, TARGET.cfg, seed=9, dtype=torch.float64, block=block,
                              target_layers=[0, 2, 3], lead_token=lead_token, input_norm=input_norm,
                              copy_head=copy_head)


def pointer(n, h, seq, p, j, parent=None):
    """The pointer head by its definition, source by source, for drafted position j+1 after the context
    row p (pre-norm hidden states h [rows, H] of the context rows): the sources s are those whose token
    s+j+2 is known (s+j+2 ≤ p+1), whose token s+2 is the position-1 token seq[p+2] and, given a
    parent (the token at drafted position j), whose token s+j+1 is that parent; → (the copy
    distribution: a softmax of q(p)·k(s) over them, each giving its token s+j+2; the match: log of
    the summed exp(q(p)·k(s)), at least -10, which the gate reads)."""
    out = torch.zeros(TARGET.cfg.vocab_size, dtype=torch.float64)
    srcs = [s for s in range(p) if s + j + 2 <= p + 1 and seq[s + 2] == seq[p + 2]
            and (parent is None or seq[s + j + 1] == parent)]
    if not srcs:
        return out, torch.tensor(-10.0, dtype=torch.float64)
    q = n.copy_query(h[p])
    scores = torch.stack([n.copy_key(h[s]) @ q for s in srcs])
    for s, ws in zip(srcs, torch.softmax(scores, 0)):
        out[seq[s + j + 2]] += ws
    return out, torch.logsumexp(scores, 0).clamp_min(-10.0)


def copied(n, h, seq, p, j, parent=None):
    return pointer(n, h, seq, p, j, parent)[0]


def gate(n, row, h, seq, p, j, parent=None):
    """The share a mask row's hidden state `row` gives its copies: sigmoid(its gate logit + copy_match × the match)."""
    return torch.sigmoid(n.copy_gate(n.norm(row))[0] + n.copy_match[0] * pointer(n, h, seq, p, j, parent)[1])


def primed(n, seq, p):
    """A FeatureDrafter that has observed the committed prefix seq[:p+1] with newest seq[p+1]."""
    d = FeatureDrafter(n, TARGET)
    d.reset(64)
    d.observe(seq[: p + 1], seq[1 : p + 2], features(seq[: p + 1]))
    return d


@pytest.mark.parametrize("lead_token,input_norm", [(False, False), (True, False), (True, True)])
def test_block_training_rows_equal_inference(lead_token, input_norm):
    n, m, p = net("block_markov", lead_token=lead_token, input_norm=input_norm), 6, 9
    seq = [int(t) for t in torch.randint(1, 61, (20,), generator=torch.Generator().manual_seed(1))]
    emb, head = TARGET.model.embed_tokens.weight, TARGET.lm_head_weight
    # training reads the true position-1 token; inference reads the drafted one: make them the same
    seq[p + 2] = int(primed(n, seq, p).propose(m).tokens[0, 0])
    ctx = len(seq) - 2
    rows = n.rows(torch.tensor([seq[1 : ctx + 1]]), n.fc_feat(features(seq)[:ctx])[None], emb)
    mask, pos = train.block_mask(ctx, torch.tensor([p]), m, "cpu")
    x = torch.cat((rows, n.block_rows(torch.tensor([seq[p + 2]]), m - 1, emb)), 1)
    _, logits = n(x, head, positions=pos[None], tree_mask=mask)
    train_logits = torch.cat((logits[0, p : p + 1], logits[0, ctx:]))  # context row p, then mask rows

    lat = primed(n, seq, p).propose(m)
    # block positions 2..m are the marginal logits; position 1 is Markov-conditioned on the newest token
    ref = torch.log_softmax(train_logits, -1)
    first = torch.log_softmax(n.markov_logits(train_logits[0], torch.tensor([seq[p + 1]]), emb), -1)[0]
    ref[0] = first
    top = ref.topk(16, dim=-1)
    assert torch.equal(lat.tokens, top.indices)
    torch.testing.assert_close(lat.logp, top.values, rtol=1e-9, atol=1e-9)


def copy_case(m, kind="block"):
    """A block-kind drafter with a pointer head, a sequence of a repeated unit and a context row p whose
    drafted position-1 token is in the unit, so that its copies take part (seq[p+2] set to it)."""
    n = net(kind, lead_token=True, copy_head=True)
    for seed in range(100):
        seq = ([int(t) for t in torch.randint(1, 61, (4,), generator=torch.Generator().manual_seed(seed))] * 7)[:26]
        for p in range(10, 18):
            lead = int(primed(n, seq, p).propose(m).tokens[0, 0])
            if lead in seq[2 : p + 1]:
                seq[p + 2] = lead  # training reads the true position-1 token: make it the drafted one
                return n, seq, p
    raise AssertionError("no case found")


@pytest.mark.parametrize("kind", ["block", "block_markov"])
def test_copy_head_inference_equals_its_definition(kind):
    """Positions 2..m of a pointer-head block drafter's lattice: (1 - g) × the mask row's softmax +
    g × `copied`, g the row's gate; position 1 is the context row's own. Its transitions mix, under
    each parent candidate, the copies of the sources that also agree with that parent into the
    position's own distribution (a Markov drafter's: the parent's)."""
    m = 6
    n, seq, p = copy_case(m, kind)
    emb, head = TARGET.model.embed_tokens.weight, TARGET.lm_head_weight
    ctx = len(seq) - 2
    rows = n.rows(torch.tensor([seq[1 : ctx + 1]]), n.fc_feat(features(seq)[:ctx])[None], emb)
    mask, pos = train.block_mask(ctx, torch.tensor([p]), m, "cpu")
    x = torch.cat((rows, n.block_rows(torch.tensor([seq[p + 2]]), m - 1, emb)), 1)
    h, logits = n(x, head, positions=pos[None], tree_mask=mask)
    first = logits[0, p]
    if kind == "block_markov":
        first = n.markov_logits(first, torch.tensor([seq[p + 1]]), emb)[0]
    ref = [torch.log_softmax(first, -1)]
    for j in range(1, m):
        g = gate(n, h[0, ctx + j - 1], h[0], seq, p, j)
        ref.append(torch.log((1 - g) * torch.softmax(logits[0, ctx + j - 1], -1) + g * copied(n, h[0], seq, p, j)))
    assert any(copied(n, h[0], seq, p, j).sum() > 0 for j in range(1, m))  # the copies do take part
    top = torch.stack(ref).topk(16, dim=-1)
    lat = primed(n, seq, p).propose(m)
    assert torch.equal(lat.tokens, top.indices)
    torch.testing.assert_close(lat.logp, top.values, rtol=1e-9, atol=1e-9)
    took_part = 0  # transition j-1: parent a (a candidate at position j) → child b
    for j in range(1, m):
        for a, parent in enumerate(lat.tokens[j - 1].tolist()):
            own = logits[0, ctx + j - 1]
            if kind == "block_markov":
                own = n.markov_logits(own, torch.tensor([parent]), emb)[0]
            g, c = gate(n, h[0, ctx + j - 1], h[0], seq, p, j, parent), copied(n, h[0], seq, p, j, parent)
            took_part += c.sum() > 0
            mix = (1 - g) * torch.softmax(own, -1) + g * c
            torch.testing.assert_close(lat.trans[j - 1, a], mix[lat.tokens[j]].log(), rtol=1e-9, atol=1e-9)
    assert took_part and (lat.tokens[:m - 1].numel() > took_part)  # some parents find sources, some none


@torch.no_grad()
def test_copy_head_training_equals_its_definition():
    m = 6
    n, seq, p = copy_case(m)
    broken = list(seq)  # a unit broken in places: sources that agree with the lead, not with the predecessor
    broken[5], broken[8] = broken[6], broken[4]
    seqs = torch.tensor([broken, seq[::-1]])
    emb = TARGET.model.embed_tokens.weight
    feats = TARGET(seqs, feature_layers=(0, 2, 3)).features
    picks = torch.tensor([p, 11, 7, p])
    ctx = seqs.shape[1] - 2
    rows = n.rows(seqs[:, 1 : ctx + 1], n.fc_feat(feats[:, :ctx]), emb)
    h, _ = n(rows, TARGET.lm_head_weight)  # context rows, causal
    got, match = train.copy_probs(n, torch.cat((h, torch.zeros(2, len(picks) * (m - 1), h.shape[-1], dtype=h.dtype)), 1),
                                  seqs, picks, m)
    refs = [[pointer(n, h[b], seqs[b].tolist(), a, j, int(seqs[b, a + j + 1])) for a in picks.tolist()
             for j in range(1, m)] for b in range(2)]
    labels = [[int(seqs[b, a + j + 2]) for a in picks.tolist() for j in range(1, m)] for b in range(2)]
    ref = torch.tensor([[float(d[t]) for (d, _), t in zip(rb, lb)] for rb, lb in zip(refs, labels)], dtype=torch.float64)
    assert (ref > 0).any()
    torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-12)
    ref_match = torch.tensor([[float(mt) for _, mt in rb] for rb in refs], dtype=torch.float64)
    assert (ref_match > -10).any() and (ref_match == -10).any()  # sources and none
    lead_only = [[pointer(n, h[b], seqs[b].tolist(), a, j)[1] for a in picks.tolist() for j in range(1, m)]
                 for b in range(2)]
    assert (torch.tensor(lead_only, dtype=torch.float64) != ref_match).any()  # the predecessor narrows the sources
    torch.testing.assert_close(match, ref_match, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("input_norm", [False, True])
def test_sequential_unrolled_rows_equal_inference(input_norm):
    n, p, steps = net("sequential", input_norm=input_norm), 7, 3
    emb, head = TARGET.model.embed_tokens.weight, TARGET.lm_head_weight
    seq = [int(t) for t in torch.randint(1, 61, (16,), generator=torch.Generator().manual_seed(2))]
    # make the drafted tokens the drafter's own argmaxes, as they are at inference
    d = primed(n, seq, p)
    lat = d.propose(steps)
    seq[p + 2 : p + 2 + steps - 1] = lat.chain()[: steps - 1]
    lat = primed(n, seq, p).propose(steps)
    ctx = len(seq) - 2
    x = n.rows(torch.tensor([seq[1 : ctx + 1]]), n.fc_feat(features(seq)[:ctx])[None], emb)
    got = []
    hidden = None
    for s in range(1, steps + 1):
        if s > 1:
            prev = torch.cat((torch.zeros_like(hidden[:, :1]), hidden[:, :-1]), 1)
            x = torch.cat((x, n.rows(torch.tensor([seq[1 : ctx + 1]]), prev, emb)), 1)
        h, logits = n(x, head, positions=torch.arange(ctx).repeat(s)[None], tree_mask=train.unroll_mask(ctx, s, "cpu"))
        hidden = h[:, -ctx:]
        got.append(logits[0, -ctx:][p + s - 1])  # step s drafts position s from the row at p+s-1
    ref = torch.log_softmax(torch.stack(got), -1).topk(16, dim=-1)
    assert torch.equal(lat.tokens, ref.indices)
    torch.testing.assert_close(lat.logp, ref.values, rtol=1e-9, atol=1e-9)


def test_unroll_mask_by_definition():
    T, S = 6, 3
    mask = train.unroll_mask(T, S, "cpu")
    for s in range(1, S + 1):
        for t in range(T):
            for u in range(1, S + 1):
                for t2 in range(T):
                    want = (t2 <= t - s + 1) if u == 1 else (u <= s and t2 == t - s + u)
                    assert bool(mask[(s - 1) * T + t, (u - 1) * T + t2]) == want


def test_block_mask_by_definition():
    mask, pos = train.block_mask(8, torch.tensor([2, 5]), 4, "cpu")
    assert pos.tolist() == list(range(8)) + [3, 4, 5] + [6, 7, 8]
    assert torch.equal(mask[:8, :8], torch.ones(8, 8, dtype=torch.bool).tril())
    assert not mask[:8, 8:].any()  # context rows never see mask rows
    assert mask[8:11, :3].all() and not mask[8:11, 3:8].any() and mask[8:11, 8:11].all()
    assert mask[11:, :6].all() and not mask[11:, 6:8].any() and not mask[11:, 8:11].any()


@pytest.mark.parametrize("kind,context_weight", [("block", 1.0), ("block_markov", 1.0), ("block", 0.25),
                                                 ("block_markov", 0.0), ("block_copy", 0.25),
                                                 ("block_markov_copy", 0.25)])
def test_block_loss_equals_a_block_by_block_reference(kind, context_weight):
    """drafter_loss gathers every anchor's rows, labels and parents at once (tensor anchors, so a
    CUDA graph can hold it); built block by block from block_rows and slices, the loss is the same.
    Each context row weighs context_weight against a mask row's position weight (0: mask rows only).
    With a pointer head a mask row's likelihood is its mixture with `copied` (context rows: their own)."""
    copy = kind.endswith("_copy")
    kind = kind.removesuffix("_copy")
    n, m, start = net(kind, lead_token=True, copy_head=copy), 6, 8
    emb, head = TARGET.model.embed_tokens.weight, TARGET.lm_head_weight
    seqs = torch.randint(1, 61, (3, 22), generator=torch.Generator().manual_seed(4))
    if copy:  # a small alphabet: sources agree with position 1 and copies hit labels
        seqs = seqs % 4 + 1
    feats = TARGET(seqs, feature_layers=(0, 2, 3)).features
    picks = torch.tensor([7, 12, 9])
    got = train.drafter_loss(n, emb, head, seqs, feats, start, picks, context_weight=context_weight)

    B, L = seqs.shape
    ctx, lo, ps = L - 2, train.anchor_range(L, start, m)[0], picks.tolist()
    rows = n.rows(seqs[:, 1 : ctx + 1], n.fc_feat(feats[:, :ctx]), emb)
    x = torch.cat([rows] + [n.block_rows(seqs[:, p + 2], m - 1, emb) for p in ps], 1)
    mask, pos = train.block_mask(ctx, picks, m, "cpu")
    h, logits = n(x, head, positions=pos.expand(B, -1), tree_mask=mask)
    labels = torch.cat([seqs[:, 2 : ctx + 2]] + [seqs[:, p + 3 : p + m + 2] for p in ps], 1)
    if kind == "block_markov":
        parents = torch.cat([seqs[:, 1 : ctx + 1]] + [seqs[:, p + 2 : p + m + 1] for p in ps], 1)
        logits = n.markov_logits(logits, parents, emb)
    w = torch.cat([(torch.arange(ctx) + 2 >= start).double() * context_weight]
                  + [train.position_weights(m)[1:].double()] * len(ps))
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(B, -1)
    if copy:
        for b in range(B):
            for a, p in enumerate(ps):
                for j in range(1, m):
                    r = ctx + a * (m - 1) + j - 1
                    before = int(seqs[b, p + j + 1])  # the label's true predecessor
                    g = gate(n, h[b, r], h[b, :ctx], seqs[b].tolist(), p, j, before)
                    c = copied(n, h[b, :ctx], seqs[b].tolist(), p, j, before)[labels[b, r]]
                    nll[b, r] = -torch.log((1 - g) * torch.exp(-nll[b, r]) + g * c)
    ref = (nll[:, lo:] * w[lo:]).sum() / (B * w[lo:].sum())
    torch.testing.assert_close(got, ref.to(got.dtype), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["sequential", "block", "block_markov"])
def test_drafter_batches_are_rows_and_anchors_inside_the_greedy_region(kind):
    """Every step's rows index `seqs`; a block kind's anchors leave room for its whole block of
    labels after them and lie past the prompt (start), and they vary from step to step."""
    seqs, start, m = torch.zeros(30, 40, dtype=torch.long), 12, 6
    idx, picks = train.drafter_batches(kind, seqs, start, m, steps=50, batch=4, anchors=3, seed=1)
    assert idx.shape == (50, 4) and 0 <= idx.min() and idx.max() < 30
    if kind == "sequential":
        assert picks is None
        return
    assert picks.shape == (50, 3) and picks.device == seqs.device
    flat = picks.flatten().tolist()
    # the labels of anchor p's mask rows are tokens p+3 .. p+m+1; its first row predicts token p+3 ≥ start
    assert all(seqs[0, p + 3 : p + m + 2].numel() == m - 1 and p + 3 > start for p in flat)
    assert len(set(flat)) > 10


def test_learning_rate_schedules_warm_up_then_decay_to_their_floor():
    steps, warmup, lr = 200, 10, 6e-3
    for schedule, floor in (("cosine", 0.1 * lr), ("linear", 0.0)):
        sched = [train.lr_at(s, steps, lr, warmup, schedule) for s in range(steps)]
        assert sched[:warmup] == pytest.approx([lr * (s + 1) / warmup for s in range(warmup)])
        assert sched[warmup] == pytest.approx(lr)
        assert all(a >= b for a, b in zip(sched[warmup:], sched[warmup + 1 :]))  # never rises after warm-up
        assert sched[-1] == pytest.approx(floor, abs=lr / (steps - warmup) + 1e-12)
    half = warmup + (steps - warmup) // 2  # halfway through the decay: linear at half the peak, cosine above it
    assert train.lr_at(half, steps, lr, warmup, "linear") == pytest.approx(lr / 2)
    assert train.lr_at(half, steps, lr, warmup, "cosine") == pytest.approx(0.55 * lr)
    for step in (0, 50):  # named during the warm-up too
        with pytest.raises(ValueError, match="schedule 'step'"):
            train.lr_at(step, steps, lr, warmup, "step")


def test_train_lm_follows_its_schedule():
    def final_weights(schedule):
        m = random_model(tiny_config("llama", vocab=61, hidden=32, layers=2), seed=0)
        stream = torch.randint(0, 61, (500,), generator=torch.Generator().manual_seed(0))
        train.train_lm(m, stream, steps=6, batch=2, seq=16, lr=1e-2, seed=4, desc="t", log=None, schedule=schedule)
        return [p.detach().clone() for p in m.parameters()]
    cos, lin = final_weights("cosine"), final_weights("linear")
    assert any(not torch.equal(a, b) for a, b in zip(cos, lin))


def test_training_is_deterministic():
    def once():
        m = random_model(tiny_config("llama", vocab=61, hidden=32, layers=2), seed=0)
        stream = torch.randint(0, 61, (500,), generator=torch.Generator().manual_seed(0))
        loss = train.train_lm(m, stream, steps=5, batch=2, seq=16, lr=1e-3, seed=4, desc="t", log=None)
        return loss, [p.detach().clone() for p in m.parameters()]
    (l1, p1), (l2, p2) = once(), once()
    assert l1 == l2 and all(torch.equal(a, b) for a, b in zip(p1, p2))


@pytest.mark.parametrize("muon", [False, True])
def test_markov_head_trains_alone_on_the_frozen_block_drafter(muon):
    """With `muon` too: the frozen body holds every matrix Muon would train, so AdamW trains the head alone."""
    target = random_model(tiny_config("qwen3", vocab=61), seed=3)
    seqs = torch.randint(1, 61, (4, 24), generator=torch.Generator().manual_seed(5))
    feats = target(seqs, feature_layers=(0, 2, 3)).features.float()
    block = random_drafter_net("block", target.cfg, seed=9, block=6, target_layers=[0, 2, 3])
    cfg = random_drafter_net("block_markov", target.cfg, block=6, target_layers=[0, 2, 3]).cfg
    kw = dict(target=target, seqs=seqs, feats=feats, start=8, steps=3, batch=2, lr=1e-2, seed=1, desc="t", log=None,
              muon=muon)
    with pytest.raises(ValueError, match="extends a trained block drafter"):
        train.train_drafter(cfg, **kw)
    markov = train.train_drafter(cfg, body=block, **kw)
    init = randomize(FeatureDrafterNet(cfg), 1).state_dict()
    for name, value in markov.state_dict().items():
        if name.startswith("markov_"):
            assert not torch.equal(value, init[name]), name  # the head learned
        else:
            assert torch.equal(value, block.state_dict()[name]), name  # the body is the block drafter's


@pytest.mark.parametrize("shape", [(6, 6), (4, 9), (9, 4), (3, 5, 12)])
def test_orthogonalized_brings_every_singular_value_near_one_along_the_svd_directions(shape):
    """Newton–Schulz's quintic does not converge to U Vᵀ exactly: its singular values land in a
    band around 1, its singular vectors are the input's."""
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    o = train.orthogonalized(g)
    assert o.shape == g.shape and o.dtype == g.dtype
    s = torch.linalg.svdvals(o)
    assert s.min() > 0.6 and s.max() < 1.25, s
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    # in the input's singular bases, the output is diagonal: the directions are kept
    inner = u.mT @ o @ vh.mT
    off = inner - torch.diag_embed(torch.diagonal(inner, dim1=-2, dim2=-1))
    assert off.abs().max() < 1e-9


@pytest.mark.parametrize("shape", [(6, 6), (4, 9), (9, 4), (3, 5, 12), (2, 3, 7, 4)])
def test_orthogonalized_is_the_newton_schulz_quintic_written_out(shape):
    """x ← a·x + b·(x xᵀ)·x + c·(x xᵀ)²·x, five times, from x / ‖x‖, on each matrix (the tall
    ones transposed): float64 agrees to rounding."""
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    a, b, c = train.NS_COEFFS
    tall = shape[-2] > shape[-1]
    x = g.mT if tall else g
    x = x / torch.linalg.matrix_norm(x, keepdim=True)
    for _ in range(5):
        s = x @ x.mT
        x = a * x + b * (s @ x) + c * (s @ (s @ x))
    torch.testing.assert_close(train.orthogonalized(g), x.mT if tall else x, rtol=1e-10, atol=1e-12)


def test_a_muon_step_is_the_orthogonalized_nesterov_momentum_scaled_to_adamws_rms():
    """Two steps by hand — momentum m = 0.95 m + 0.05 g, update g + 0.95 (m - g) orthogonalized,
    times lr · 0.2 · √max(rows, cols), after decoupled decay — against the optimizer's; matrices
    of one shape, stepped together, step as they would alone."""
    gen = torch.Generator().manual_seed(1)
    ws = [torch.randn(4, 6, generator=gen, dtype=torch.float64) for _ in range(2)] + \
        [torch.randn(6, 3, generator=gen, dtype=torch.float64)]
    grads = [[torch.randn_like(w) for w in ws] for _ in range(2)]
    params = [torch.nn.Parameter(w.clone()) for w in ws]
    opt = train.Muon(params, lr=0.1, weight_decay=0.5)
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = g.clone()
        opt.step()
    for i, w in enumerate(ws):
        m, w = torch.zeros_like(w), w.clone()
        for gs in grads:
            g = gs[i]
            m = 0.95 * m + 0.05 * g
            w = w * (1 - 0.1 * 0.5) - 0.1 * 0.2 * max(w.shape) ** 0.5 * train.orthogonalized(g + 0.95 * (m - g))
        torch.testing.assert_close(params[i].detach(), w)


def test_muon_takes_matrices_only():
    with pytest.raises(ValueError, match=r"2-D weights only.*\(5,\)"):
        train.Muon([torch.nn.Parameter(torch.zeros(5))], lr=0.1)


def test_train_lm_with_muon_trains_the_blocks_matrices_with_muon_and_the_rest_with_adamw():
    """The blocks' matrices are Muon's; embeddings and norms stay with AdamW; the loss goes down."""
    m = random_model(tiny_config("hybrid", vocab=61, hidden=32, layers=4), seed=0)
    mats = train.matrices(m)
    assert mats and all(p.ndim == 2 for p in mats)
    assert not any(p is m.model.embed_tokens.weight for p in mats)
    assert len(mats) < sum(p.ndim == 2 for p in m.parameters())
    stream = torch.randint(0, 61, (2000,), generator=torch.Generator().manual_seed(0)) % 7  # a learnable stream
    adamw = random_model(tiny_config("hybrid", vocab=61, hidden=32, layers=4), seed=0)
    first = train.heldout_loss(m, stream, 16, 8, 0)
    for model, muon in ((m, True), (adamw, False)):
        train.train_lm(model, stream, steps=30, batch=4, seq=16, lr=1e-2, seed=4, desc="t", log=None, muon=muon)
    assert train.heldout_loss(m, stream, 16, 8, 0) < first - 0.5
    # the matrices moved otherwise than under AdamW
    assert not torch.allclose(train.matrices(m)[0], train.matrices(adamw)[0], atol=1e-3)


def test_a_drafters_matrices_are_its_blocks_and_input_projections():
    target = random_model(tiny_config("qwen3", vocab=61), seed=3)
    net = random_drafter_net("block_markov", target.cfg, seed=9, block=6, target_layers=[0, 2, 3])
    mats = {id(p) for p in train.matrices(net)}
    assert {id(net.fc_feat.weight), id(net.fc_in.weight)} <= mats
    assert {id(p) for p in net.layers.parameters() if p.ndim == 2} <= mats
    for name, p in net.named_parameters():
        if name.startswith(("markov_", "mask_embedding")) or p.ndim != 2:
            assert id(p) not in mats, name


def test_drafter_training_with_muon_moves_its_matrices_otherwise_and_lowers_the_loss():
    target = random_model(tiny_config("qwen3", vocab=61), seed=3)
    seqs = torch.randint(1, 61, (8, 24), generator=torch.Generator().manual_seed(5)) % 5 + 1  # learnable
    feats = target(seqs, feature_layers=(0, 2, 3)).features.float().detach()
    cfg = random_drafter_net("block", target.cfg, block=6, target_layers=[0, 2, 3]).cfg
    kw = dict(target=target, seqs=seqs, feats=feats, start=8, batch=4, lr=1e-2, seed=1, desc="t", log=None)
    _, picks = train.drafter_batches("block", seqs, 8, 6, 1, 8, 4, 7)

    def loss(net):
        with torch.no_grad():
            return float(train.drafter_loss(net, target.model.embed_tokens.weight, target.lm_head_weight,
                                            seqs, feats, 8, picks[0]))

    first = loss(train.train_drafter(cfg, steps=0, **kw))
    adamw, muon = (train.train_drafter(cfg, steps=30, muon=m, **kw) for m in (False, True))
    assert loss(muon) < first - 0.5
    assert not torch.allclose(muon.fc_in.weight, adamw.fc_in.weight, atol=1e-3)
