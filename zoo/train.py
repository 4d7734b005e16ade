"""Training the zoo: targets on the standard-library corpus, drafters by distillation.

Drafters learn from the frozen target: its hidden features and its greedy continuations of corpus
prompts (so every label is a token the target itself would emit under greedy decoding), in the
same row layout the engine drafts with (engine/drafters.py):

- context row t = (target features at t, embedding of the token at t+1), predicting token t+2;
- `block` / `block_markov`: per anchor p, mask rows at positions p+1..p+m-1 that see the context
  rows ≤ p and each other; row at position t predicts token t+2;
- `sequential`: EAGLE-3's training-time test — unrolled steps in which a row takes the drafter's
  own hidden state of the previous position in place of the target's features;
- Markov head: the same rows, conditioned on the token right before the predicted one; it trains
  alone, on top of a trained block drafter whose weights it copies and freezes.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from specpilot.engine.drafters import DraftConfig, FeatureDrafterNet, mix_copy, offset_copy
from specpilot.engine.model import Model
from specpilot.engine.synthetic import randomize
from specpilot.progress import progress_bar

from .realism import bits_per_byte

Log = Callable[[str], None]


SCHEDULES = ("cosine", "linear")


def lr_at(step: int, steps: int, lr: float, warmup: int, schedule: str = "cosine") -> float:
    """Linear warm-up, then "cosine" decay to a tenth of the peak or "linear" decay to zero."""
    if schedule not in SCHEDULES:
        raise ValueError(f"learning-rate schedule {schedule!r}: expected one of {SCHEDULES}")
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    if schedule == "linear":
        return lr * (1 - progress)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def fit(params, steps: int, lr: float, loss_fn: Callable[[torch.Tensor], torch.Tensor], desc: str, log: Log | None,
        progress: bool = True, graph: bool = False, matrices=(), schedule: str = "cosine") -> float:
    """AdamW with warm-up and decay (`lr_at`'s `schedule`); returns the mean loss of the last 10 % of steps. The
    parameters also in `matrices` (2-D weights inside the network: not embeddings, norms or biases)
    train with `Muon` instead, on the same schedule.
    loss_fn(step) reads its batch by `step`, a one-element long tensor on the parameters' device.
    On a GPU the forward runs under bf16 autocast (weights and optimizer state stay float32), the
    learning rate lives on the device, and with `graph` every step after the first few replays one
    captured CUDA graph of the whole step (forward, backward, clipping, the optimizers, the step
    counter): one launch a step in place of hundreds, for models too small to hide their launches.
    loss_fn must then neither read from the device nor copy from the host; a capture that fails
    warns and the steps run eagerly."""
    params = [p for p in params if p.requires_grad]
    mats = {id(p) for p in matrices}
    dev = params[0].device
    cuda = dev.type == "cuda"
    warmup, n_tail = max(1, steps // 20), max(1, steps // 10)
    sched = [lr_at(s, steps, lr, warmup, schedule) for s in range(steps)]
    lr_dev = torch.tensor(sched, device=dev) if cuda else None
    rest, ortho = [p for p in params if id(p) not in mats], [p for p in params if id(p) in mats]
    start_lr = lambda: torch.tensor(lr, device=dev) if cuda else lr  # noqa: E731 — each optimizer its own
    opts = [torch.optim.AdamW(rest, lr=start_lr(), betas=(0.9, 0.95), weight_decay=0.01, fused=cuda,
                              capturable=cuda)] if rest else []
    if ortho:
        opts.append(Muon(ortho, lr=start_lr()))
    step_t = torch.zeros(1, dtype=torch.long, device=dev)
    losses = torch.zeros(steps, device=dev)

    def one_step():
        for g in (g for opt in opts for g in opt.param_groups):
            if cuda:
                g["lr"].copy_(lr_dev[step_t][0])
            else:
                g["lr"] = sched[int(step_t)]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda, cache_enabled=False):
            loss = loss_fn(step_t)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for opt in opts:
            opt.step()
        losses.index_copy_(0, step_t, loss.detach().float().view(1))
        step_t.add_(1)

    eager = 3  # a capture follows this many eager steps (its memory and kernels warmed up)
    graph, replay = graph and cuda and steps > eager, None
    bar = progress_bar(steps, desc, "step", disable=not progress, leave=False)
    for step in range(steps):
        if graph and step == eager:
            replay = captured(one_step, desc)
        if replay is not None:
            replay.replay()
        elif graph and step < eager:
            warm_up(one_step)
        else:
            one_step()
        if step % 50 == 0:  # the only host read of the loss while training: the GPU runs ahead
            bar.set_postfix(loss=f"{float(losses[step]):.3f}")
        bar.update(1)
    bar.close()
    final = float(losses[steps - n_tail :].mean())
    if log:
        log(f"  {desc}: {steps} steps, final loss {final:.3f}")
    return final


# ---- Muon ----------------------------------------------------------------------------------
NS_COEFFS = (3.4445, -4.7750, 2.0315)  # a quintic that pushes every singular value into ~[0.7, 1.2] in 5 steps


def orthogonalized(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """[..., m, n] → U Vᵀ of each matrix's SVD U S Vᵀ, approximately: its singular values all
    brought near 1 by a Newton–Schulz iteration (matrix products only; bf16 on a GPU)."""
    x = g.to(torch.bfloat16 if g.is_cuda else g.dtype)
    wide = x.shape[-2] <= x.shape[-1]
    x = x if wide else x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp_min(1e-7)
    a, b, c = NS_COEFFS
    for _ in range(steps):
        s = x @ x.mT
        x = a * x + (b * s + c * (s @ s)) @ x
    return (x if wide else x.mT).to(g.dtype)


class Muon(torch.optim.Optimizer):
    """Momentum orthogonalized (Muon) for 2-D weights: Nesterov momentum, then each update replaced
    by `orthogonalized` of it and scaled by 0.2·√max(m, n): an RMS of 0.2 per entry, about an AdamW
    update's, so one learning rate and decoupled weight decay serve both optimizers. Matrices of one
    shape are orthogonalized together (batched products); `lr` may be a tensor (CUDA graphs)."""

    def __init__(self, params, lr, momentum: float = 0.95, weight_decay: float = 0.01):
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})
        for g in self.param_groups:
            if bad := [tuple(p.shape) for p in g["params"] if p.ndim != 2]:
                raise ValueError(f"Muon trains 2-D weights only, got shapes {bad}")

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            lr, mom, wd = g["lr"], g["momentum"], g["weight_decay"]
            by_shape: dict[torch.Size, list] = {}
            for p in g["params"]:
                if p.grad is not None:
                    by_shape.setdefault(p.shape, []).append(p)
            for shape, ps in by_shape.items():
                grads, bufs = [p.grad for p in ps], []
                for p in ps:
                    st = self.state[p]
                    if "momentum" not in st:
                        st["momentum"] = torch.zeros_like(p)
                    bufs.append(st["momentum"])
                torch._foreach_lerp_(bufs, grads, 1 - mom)
                upd = orthogonalized(torch.stack(grads).lerp_(torch.stack(bufs), mom)) * (lr * (0.2 * max(shape) ** 0.5))
                torch._foreach_mul_(ps, 1 - lr * wd)
                torch._foreach_sub_(ps, list(upd.unbind(0)))


def matrices(module: Model | FeatureDrafterNet) -> list[torch.Tensor]:
    """What `Muon` trains: the 2-D weights of a model's blocks, or of a feature drafter's blocks and
    its input projections (fc_feat, fc_in) — not embeddings, LM heads, norms, biases,
    convolutions, a block drafter's mask embedding or a Markov head."""
    if isinstance(module, Model):
        return [p for p in module.model.layers.parameters() if p.ndim == 2]
    fc = [module.fc_feat.weight] + ([module.fc_in.weight] if hasattr(module, "fc_in") else [])  # eagle3: no fc_in
    return [p for p in module.layers.parameters() if p.ndim == 2] + fc


def warm_up(fn) -> None:
    """fn on a side stream, as a CUDA graph's first runs must be (its libraries' lazy set-up stays
    out of the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)


def captured(fn, desc: str) -> torch.cuda.CUDAGraph | None:
    """fn captured as one CUDA graph (not run), or None with a warning if it cannot be captured."""
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            fn()
    except Exception as e:  # noqa: BLE001 — any capture failure: the steps run eagerly instead
        warnings.warn(f"{desc}: the training step could not be captured as a CUDA graph "
                      f"({type(e).__name__}: {e}); training eagerly", RuntimeWarning, stacklevel=3)
        torch.cuda.synchronize()
        return None
    return g


def windows(stream: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    if n == 0:
        return torch.empty(0, length, dtype=stream.dtype)
    starts = torch.randint(0, len(stream) - length - 1, (n,), generator=gen)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])


def prompt_windows(prompts: list[list[int]], n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """[≤ n, length]: the last `length` tokens of up to n distinct prompts (of those at least that
    long), drawn without replacement — e.g. workload-like signature + docstring prompts."""
    fit = [p for p in prompts if len(p) >= length]
    pick = torch.randperm(len(fit), generator=gen)[:n].tolist()
    if not pick:
        return torch.empty(0, length, dtype=torch.long)
    return torch.tensor([fit[i][len(fit[i]) - length :] for i in pick], dtype=torch.long)


# ---- targets --------------------------------------------------------------------------------
def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def compiled_loss(model: Model, scope: str = "block"):
    """windows [B, T+1] → the next-token loss through torch.compile. `scope` "block": each block of
    `model` and the loss compiled on their own — blocks of one kind share their compiled code, so a
    hybrid target compiles two blocks (and the loss), not one graph of all its layers; "model": one
    graph of the whole forward and the loss (longer to compile, fewer launches and graph seams)."""
    if scope == "model":
        return torch.compile(lambda x: next_token_loss(model(x[:, :-1]).logits, x[:, 1:]))
    if scope != "block":
        raise ValueError(f"compile scope {scope!r}: expected 'block' or 'model'")
    blocks, loss = [torch.compile(b) for b in model.model.layers], torch.compile(next_token_loss)
    return lambda x: loss(model(x[:, :-1], layers=blocks).logits, x[:, 1:])


def train_lm(model: Model, stream: torch.Tensor, steps: int, batch: int, seq: int, lr: float, seed: int,
             desc: str, log: Log | None, device="cpu", compile: bool = False, scope: str = "block",
             graph: bool = False, muon: bool = False, schedule: str = "cosine") -> float:
    """Next-token training on random windows of `stream` (learning rate as `lr_at`'s `schedule`); with `compile` on a GPU, through
    `compiled_loss` of that `scope` (a compiler failure warns and trains eagerly); else with `graph`,
    as CUDA graphs (`fit`). `muon`: the blocks' matrices train with `Muon`, the rest with AdamW."""
    gen = torch.Generator().manual_seed(seed)
    # every step's window starts drawn up front (as `windows` draws them, step by step), and the
    # stream on the device: a step gathers its batch there, with no host-to-device copy
    starts = torch.stack([torch.randint(0, len(stream) - seq - 2, (batch,), generator=gen) for _ in range(steps)])
    starts, stream = starts.to(device), stream.to(device)
    span = torch.arange(seq + 1, device=device)
    model.train()
    compiled = compiled_loss(model, scope) if compile and str(device).startswith("cuda") else None

    def loss_fn(step):
        nonlocal compiled
        x = stream[starts[step][0][:, None] + span]
        if compiled is not None:
            try:
                return compiled(x)
            except Exception as e:  # noqa: BLE001 — any compiler failure: train eagerly instead
                warnings.warn(f"{desc}: torch.compile failed ({type(e).__name__}); training eagerly",
                              RuntimeWarning, stacklevel=2)
                compiled = None
        return next_token_loss(model(x[:, :-1]).logits, x[:, 1:])

    out = fit(model.parameters(), steps, lr, loss_fn, desc, log, graph=graph and compiled is None,
              matrices=matrices(model) if muon else (), schedule=schedule)
    model.eval()
    return out


@torch.no_grad()
def heldout_loss(model: Model, stream: torch.Tensor, seq: int, n: int, seed: int, device="cpu") -> float:
    return heldout_eval(model, stream, seq, n, seed, device)[0]


@torch.no_grad()
def heldout_eval(model: Model, stream: torch.Tensor, seq: int, n: int, seed: int, device="cpu",
                 byte_lengths: torch.Tensor | None = None) -> tuple[float, float | None]:
    """(nats per token, bits per byte) over n random held-out windows; bits per byte counts the
    UTF-8 bytes of the predicted tokens (byte_lengths[id]; None: not computed)."""
    x = windows(stream, n, seq + 1, torch.Generator().manual_seed(seed)).to(device)
    total, count = 0.0, 0
    for c in x.split(16):
        nll = F.cross_entropy(model(c[:, :-1]).logits.flatten(0, 1).float(), c[:, 1:].flatten(), reduction="sum")
        total, count = total + float(nll), count + c[:, 1:].numel()
    bpb = None
    if byte_lengths is not None:
        bpb = bits_per_byte(total, int(byte_lengths[x[:, 1:].cpu()].sum()))
    return total / count, bpb


@torch.no_grad()
def stream_eval(model: Model, stream: torch.Tensor, seq: int, byte_lengths: torch.Tensor, device="cpu",
                batch: int = 16) -> tuple[float, float]:
    """(nats per token, bits per byte) over the whole stream, cut into consecutive windows of seq + 1
    tokens that overlap by one (every token after the first is predicted once, from its window)."""
    n = (len(stream) - 1) // seq
    if n < 1:
        raise ValueError(f"stream_eval needs more than {seq} tokens, got {len(stream)}")
    x = torch.stack([stream[i * seq : i * seq + seq + 1] for i in range(n)])
    total = 0.0
    for c in x.split(batch):
        c = c.to(device)
        total += float(F.cross_entropy(model(c[:, :-1]).logits.flatten(0, 1).float(), c[:, 1:].flatten(),
                                       reduction="sum"))
    return total / (n * seq), bits_per_byte(total, int(byte_lengths[x[:, 1:]].sum()))


# ---- distillation data ----------------------------------------------------------------------
@contextlib.contextmanager
def tf32_matmuls():
    """The passes that make training data (distillation continuations, target features): float32
    matmuls on a GPU's TF32 tensor cores (several times faster at batch 4096). What they make is data
    to train on; τ is measured on the float32 model as it ships."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


@torch.no_grad()
@tf32_matmuls()
def greedy_continuations(model: Model, prompts: torch.Tensor, new: int, batch: int = 128) -> torch.Tensor:
    """[N, P] prompts → [N, P + new]: the target's own greedy continuations (batched, cached)."""
    outs = []
    for chunk in prompts.split(batch):
        cache = model.new_cache(chunk.shape[1] + new, batch=chunk.shape[0])
        logits = model(chunk, cache, commit_all=True).logits[:, -1]
        cache.commit(chunk.shape[1])
        seq = [chunk]
        for _ in range(new):
            nxt = logits.argmax(-1, keepdim=True)
            seq.append(nxt)
            logits = model(nxt, cache).logits[:, -1]
            cache.commit(1)
        outs.append(torch.cat(seq, 1))
    return torch.cat(outs)


@torch.no_grad()
@tf32_matmuls()
def target_features(model: Model, seqs: torch.Tensor, layers: tuple[int, ...], batch: int = 64) -> torch.Tensor:
    return torch.cat([model(c, feature_layers=layers, logits=False).features.float() for c in seqs.split(batch)])


# ---- drafters -------------------------------------------------------------------------------
def position_weights(n: int, gamma: float = 8.0, device="cpu") -> torch.Tensor:
    """Earlier drafted positions matter more for acceptance (every later one needs them)."""
    return torch.exp(-torch.arange(n, device=device, dtype=torch.float32) / gamma)


def block_mask(ctx: int, anchors: torch.Tensor, m: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows: ctx context rows (positions 0..ctx-1, causal), then m-1 mask rows per anchor p of the
    long tensor `anchors` (positions p+1..p+m-1) that see context rows ≤ p and their own block.
    → (mask, positions). Made by tensor ops alone: the anchors may live on the device."""
    anchors = anchors.to(device)
    n_anchor = len(anchors)
    idx = torch.arange(ctx + n_anchor * (m - 1), device=device)
    block = torch.cat((torch.full((ctx,), -1, device=device),
                       torch.arange(n_anchor, device=device).repeat_interleave(m - 1)))  # -1: a context row
    ctx_row = block < 0
    sees_upto = torch.where(ctx_row, idx, anchors[block.clamp_min(0)])  # the last context row a row sees
    mask = ctx_row[None, :] & (idx[None, :] <= sees_upto[:, None])
    mask |= ~ctx_row[:, None] & (block[:, None] == block[None, :])
    pos = torch.cat((torch.arange(ctx, device=device), block_span(anchors, 1, m - 1)))
    return mask, pos


def block_span(anchors: torch.Tensor, first: int, n: int) -> torch.Tensor:
    """[len(anchors) * n]: positions p+first .. p+first+n-1 of every anchor p, block after block."""
    return (anchors[:, None] + torch.arange(first, first + n, device=anchors.device)).flatten()


@functools.lru_cache(maxsize=32)
def unroll_mask(T: int, steps: int, device) -> torch.Tensor:
    """EAGLE-3 training-time test over `steps` copies of T rows: the row of step s at position t
    sees step-1 rows at positions ≤ t-s+1 and the row of step u (2 ≤ u ≤ s) at position t-s+u.
    Made once per shape (its boolean indexing would make every training step wait for the device);
    callers only read it."""
    n = T * steps
    mask = torch.zeros(n, n, dtype=torch.bool, device=device)
    t = torch.arange(T, device=device)
    for s in range(1, steps + 1):
        rows = (s - 1) * T + t
        mask[rows[:, None], t[None, :]] = t[None, :] <= (t[:, None] - s + 1)
        for u in range(2, s + 1):
            src = t - s + u
            ok = src >= 0
            mask[rows[ok], (u - 1) * T + src[ok]] = True
    return mask


def anchor_range(L: int, start: int, m: int) -> tuple[int, int]:
    """(lo, hi): the anchors p a block drafter trains on, lo ≤ p ≤ hi, in sequences of L tokens
    whose greedy region starts at `start` (a block of m positions after p fits in them)."""
    return max(start - 2, 0), L - m - 2


def drafter_batches(kind: str, seqs: torch.Tensor, start: int, m: int, steps: int, batch: int, anchors: int,
                    seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every training step's rows of `seqs` ([steps, batch] indices) and, for the block kinds, its
    anchors ([steps, anchors], in `anchor_range`), on the device `seqs` is on, so a step copies
    nothing from the host and never waits for the device; drawn step by step from one generator
    seeded with `seed`."""
    gen, idx, picks = torch.Generator().manual_seed(seed), [], []
    lo, hi = anchor_range(seqs.shape[1], start, m)
    for _ in range(steps):
        idx.append(torch.randint(0, len(seqs), (batch,), generator=gen))
        if kind != "sequential":
            picks.append(torch.randint(lo, hi + 1, (anchors,), generator=gen))
    rows = (torch.stack(idx) if idx else torch.empty(0, batch, dtype=torch.long)).to(seqs.device)
    if kind == "sequential":
        return rows, None
    return rows, (torch.stack(picks) if picks else torch.empty(0, anchors, dtype=torch.long)).to(seqs.device)


def drafter_loss(net: FeatureDrafterNet, emb: torch.Tensor, head: torch.Tensor, seqs: torch.Tensor,
                 feats: torch.Tensor, start: int, picks: torch.Tensor | None = None, unroll: int = 3,
                 context_weight: float = 1.0):
    """Mean weighted cross-entropy of one batch. seqs [B, L] tokens, feats [B, L, F] target features;
    only rows predicting tokens at index ≥ start (the target's greedy region) count. picks: the
    block kinds' anchors (last committed positions, a long tensor on seqs' device), in
    `anchor_range`. context_weight (block kinds): each context row's weight (it drafts position 1)
    against a mask row's position weight (`position_weights`: 0.88 for position 2); with L-2 context
    rows and a few anchors, the context rows hold most of the loss at 1. Nothing here waits for the
    device: a CUDA graph can hold it (`fit`)."""
    B, L = seqs.shape
    dev = seqs.device
    ctx = L - 2  # context rows t = 0..L-3 predict token t+2 ≤ L-1
    rows_in = net.rows(seqs[:, 1 : ctx + 1], net.fc_feat(feats[:, :ctx].to(emb.dtype)), emb)
    labels_ctx = seqs[:, 2 : ctx + 2]
    valid_ctx = torch.arange(ctx, device=dev) + 2 >= start
    kind, m = net.cfg.kind, net.cfg.block_size
    lo, _ = anchor_range(L, start, m)  # context rows before lo predict prompt tokens: no logits for them
    terms = []

    def nll(logits, labels):  # per row
        return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), reduction="none").view(labels.shape)

    def mean(l, weight):
        return (l * weight).sum() / weight.sum().clamp_min(1e-9)

    if kind == "sequential":
        x, hidden, pw = rows_in, None, position_weights(unroll).tolist()
        for s in range(1, unroll + 1):
            if s > 1:  # the drafter's own hidden state of the previous position replaces the features
                prev = torch.cat((torch.zeros_like(hidden[:, :1]), hidden[:, :-1]), 1)
                x = torch.cat((x, net.rows(seqs[:, 1 : ctx + 1], prev, emb)), 1)
            mask = unroll_mask(ctx, s, dev)
            pos = torch.arange(ctx, device=dev).repeat(s).expand(B, -1)
            h, logits = net(x, head, positions=pos, tree_mask=mask, logits_from=(s - 1) * ctx + lo)
            hidden = h[:, -ctx:]
            valid = valid_ctx & (torch.arange(ctx, device=dev) >= s - 1)
            terms.append(mean(nll(logits, labels_ctx[:, lo:]), valid[lo:].float().expand(B, -1)) * pw[s - 1])
        return sum(terms) / sum(pw)

    mask, pos = block_mask(ctx, picks, m, dev)
    # a block's first mask row may read the position-1 token: the true one (the chain only keeps
    # later positions when position 1 was right)
    n_anchor = len(picks)
    blocks = net.block_rows(seqs[:, picks + 2].flatten(), m - 1, emb)  # [B * anchors, m-1, H], block after block
    x = torch.cat((rows_in, blocks.reshape(B, n_anchor * (m - 1), -1)), 1)
    with torch.set_grad_enabled(torch.is_grad_enabled() and kind == "block"):  # block_markov: frozen body
        h, logits = net(x, head, positions=pos.expand(B, -1), tree_mask=mask, logits_from=lo)
    lab = torch.cat((labels_ctx, seqs[:, block_span(picks, 3, m - 1)]), 1)  # row at t → token t+2
    w_block = position_weights(m, device=dev)[1:]  # mask row j is drafted position j+1
    weight = torch.cat((valid_ctx.float() * context_weight, w_block.repeat(n_anchor))).expand(B, -1)
    if kind == "block_markov":  # Markov head on the frozen block body: parent = the token right before (t+1)
        parents = torch.cat((seqs[:, 1 : ctx + 1], seqs[:, block_span(picks, 2, m - 1)]), 1)
        logits = net.markov_logits(logits, parents[:, lo:], emb)
    l = nll(logits, lab[:, lo:])
    if net.cfg.copy_head:  # mask rows mix in the pointer head's copies (context rows draft alone)
        p_copy, match = copy_probs(net, h, seqs, picks, m)
        n = ctx - lo
        l = torch.cat((l[:, :n], -mix_copy(-l[:, n:], net.copy_gate_logit(h[:, ctx:], match), p_copy)), 1)
    return mean(l, weight[:, lo:])


def copy_probs(net: FeatureDrafterNet, h: torch.Tensor, seqs: torch.Tensor, picks: torch.Tensor,
               m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pointer head's probability of each mask row's label and its match (`offset_copy`), both
    [B, anchors * (m-1)], from the rows' pre-norm hidden states h [B, rows, H] (`drafter_loss`'s
    rows: L-2 context rows, then m-1 mask rows per anchor). Anchor p's context row points; its mask
    row j-1 (drafted position j+1, label p+j+2) reads at offset j the sources whose token s+2 is the
    anchor's position-1 token and whose token s+j+1 is the label's true predecessor p+j+1 (the
    parent a transition is scored under: `copy_transitions`)."""
    B, L = seqs.shape
    ctx, dev = L - 2, seqs.device
    scores = net.copy_key(h[:, :ctx]) @ net.copy_query(h[:, picks]).transpose(1, 2)  # [B, source, anchor]
    j = torch.arange(1, m, device=dev)
    at = (torch.arange(ctx, device=dev) + j[:, None] + 1).clamp(max=L - 1)  # a source's predecessor, [m-1, source]
    agree = ((seqs[:, 2 : ctx + 2][:, None, None, :] == seqs[:, picks + 2][..., None, None])
             & (seqs[:, at][:, None] == seqs[:, block_span(picks, 2, m - 1)].view(B, len(picks), m - 1, 1)))
    w, match = offset_copy(scores.transpose(1, 2), picks.expand(B, -1), j, agree)  # [B, anchor, m-1, source]
    src = seqs[:, (at + 1).clamp(max=L - 1)]  # [B, m-1, source]
    labels = seqs[:, block_span(picks, 3, m - 1)].view(B, len(picks), m - 1)
    return (w * (src[:, None] == labels[..., None])).sum(-1).flatten(1), match.flatten(1)


def train_drafter(cfg: DraftConfig, target: Model, seqs: torch.Tensor, feats: torch.Tensor, start: int,
                  steps: int, batch: int, lr: float, seed: int, desc: str, log: Log | None,
                  anchors: int = 4, body: FeatureDrafterNet | None = None, graph: bool = False,
                  muon: bool = False, context_weight: float = 1.0) -> FeatureDrafterNet:
    """A drafter of cfg.kind trained from scratch; for `block_markov`, `body` is the trained block
    drafter it extends: its weights are copied and frozen, and only the Markov head trains (as a
    DSpark head is added to a DFlash drafter). `graph`: on a GPU, steps replay a CUDA graph (`fit`);
    `muon`: its `matrices` train with `Muon`, the rest with AdamW; `context_weight`: `drafter_loss`'s."""
    dev = target.lm_head_weight.device
    net = randomize(FeatureDrafterNet(cfg), seed).to(dev)
    if cfg.kind == "block_markov":
        if body is None or body.cfg.kind != "block":
            raise ValueError("a block_markov drafter extends a trained block drafter: pass it as body")
        net.load_state_dict(body.state_dict(), strict=False)
        for name, p in net.named_parameters():
            p.requires_grad_(name.startswith("markov_"))
    elif hasattr(net, "mask_embedding"):
        with torch.no_grad():
            net.mask_embedding.copy_(target.model.embed_tokens.weight.mean(0))
            if cfg.copy_head:  # rows start out trusting their own logits (a copy share of 0.12)
                net.copy_gate.bias.fill_(-2.0)
                net.copy_match.zero_()
    emb, head = target.model.embed_tokens.weight.detach(), target.lm_head_weight.detach()
    idx, picks = drafter_batches(cfg.kind, seqs, start, cfg.block_size, steps, batch, anchors, seed)
    net.train()

    def loss_fn(step):
        rows = idx[step][0]
        return drafter_loss(net, emb, head, seqs[rows].to(dev), feats[rows].to(dev), start,
                            None if picks is None else picks[step][0], context_weight=context_weight)

    fit(net.parameters(), steps, lr, loss_fn, desc, log, graph=graph, matrices=matrices(net) if muon else ())
    return net.eval()


def timed(fn, *a, **k):
    t = time.perf_counter()
    out = fn(*a, **k)
    return out, time.perf_counter() - t
