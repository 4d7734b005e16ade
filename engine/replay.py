"""Exact replay of tree policies on recorded target passes.

Decoding is lossless, so the tokens the passes emitted, concatenated, are the target's greedy
continuation; at a recorded step, a policy's tree accepts exactly its deepest root path that
spells a prefix of that continuation. Replaying the policy a record was made with reproduces its
online τ step for step; other policies are scored on the same lattices (the paper's offline
oracle / policy comparison). The oracle accepts while the continuation's token is among the
drafter's top-k at each position.

The same fact measures a drafter without the target's verify passes: `continuation` runs the target
once per prompt (AR, plus one pass for its features), and `drafter_taus` then drives the drafter
through exactly the observe / propose calls `generate` would make, accepting against the known
continuation — the same τ at every step (float64: token for token; lower precisions differ only
where rounding breaks a near-tie), at a fraction of the cost when the target is the slow part.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from . import trees
from .decode import MAX_TREE, Policy, StepRecord, emit, generate
from .drafters import Drafter, Lattice
from .model import Model


def make_policy(spec: str, profile: torch.Tensor | None = None) -> trees.TreePolicy:
    """A tree builder `(root, lattice) -> Tree` for a policy spec (see trees.parse_policy)."""
    name, args = trees.parse_policy(spec)
    if name != "chain" and args[-1] > MAX_TREE - 1:
        raise ValueError(f"tree policy {spec!r}: at most {MAX_TREE - 1} nodes besides the root")
    if name == "oracle":
        raise ValueError("the oracle is a replay-only policy: it needs the target's continuation")
    shape = None
    if name == "sequoia":
        if profile is None:
            raise ValueError("sequoia:N needs an acceptance profile: record a run (generate --record FILE) "
                             "and pass --profile FILE")
        shape = tuple(trees.fit_sequoia(profile, args[0]))
    return trees.TreePolicy(name, args, shape)


def continuations(steps: list[StepRecord], depth: int = trees.MAX_DEPTH + 1) -> list[list[int]]:
    """For each step, the greedy tokens after its root, as far as the record knows them."""
    stream = [t for s in steps for t in s.emitted]
    out, at = [], 0
    for s in steps:
        out.append(stream[at : at + depth])
        at += len(s.emitted)
    return out


def tree_tau(tree: trees.Tree, cont: list[int]) -> int:
    return len(tree.accept(_argmax_along(tree, cont)))


def _argmax_along(tree: trees.Tree, cont: list[int]) -> list[int]:
    """The target's argmax at every node that lies on the continuation (other nodes: -1, since
    nothing below them can be accepted)."""
    out = [-1] * len(tree)
    depth = tree.depths
    on_path = [True] + [False] * (len(tree) - 1)
    for i in range(len(tree)):
        if i and on_path[tree.parents[i]] and depth[i] <= len(cont) and tree.tokens[i] == cont[depth[i] - 1]:
            on_path[i] = True
        if on_path[i] and depth[i] < len(cont):
            out[i] = cont[depth[i]]
    return out


@dataclass(frozen=True)
class Continuation:
    """A prompt's greedy continuation, run past any EOS to the token limit, and the target's
    features at every position of prompt + continuation."""
    prompt: list[int]
    tokens: list[int]
    layers: tuple[int, ...]
    features: torch.Tensor | None  # [len(prompt) + len(tokens), F]; None when layers is ()

    def to(self, device) -> Continuation:
        """The same continuation with its features on `device` (made on a GPU, replayed on CPUs)."""
        return self if self.features is None else dataclasses.replace(self, features=self.features.to(device))


@torch.no_grad()
def continuation(target: Model, prompt: list[int], max_new: int, layers: tuple[int, ...] = ()) -> Continuation:
    tokens = generate(target, prompt, max_new, eos=set()).tokens
    feats = None
    if layers:
        ids = torch.tensor([prompt + tokens], device=target.lm_head_weight.device)
        feats = target(ids, feature_layers=layers, logits=False).features[0]
    return Continuation(list(prompt), tokens, tuple(layers), feats)


@torch.no_grad()
def drafter_taus(cont: Continuation, drafter: Drafter, draft_len: int, eos: set[int],
                 policy: Policy = trees.chain, record: list | None = None) -> list[int]:
    """τ of every target pass of `generate(target, cont.prompt, len(cont.tokens), drafter, draft_len,
    eos, policy)`, with the target's part read from the continuation. `record` receives a StepRecord
    per pass, as generate's does (argmax: -1 off the continuation's path)."""
    prompt, y, P = cont.prompt, cont.tokens, len(cont.prompt)
    if not y:
        return []
    if drafter.target_layers and tuple(drafter.target_layers) != cont.layers:
        raise ValueError(f"the drafter reads target layers {tuple(drafter.target_layers)}, the continuation "
                         f"holds {cont.layers}: make it with continuation(..., layers=drafter.target_layers)")
    feats = (lambda a, b: cont.features[a:b]) if drafter.target_layers else (lambda a, b: None)
    drafter.reset(P + len(y) + max(draft_len, MAX_TREE) + 1)
    drafter.observe(list(prompt), list(prompt[1:]) + [y[0]], feats(0, P))
    out, taus = [], []
    done = emit(out, [y[0]], eos, len(y))
    while not done:
        n = len(out)  # the newest token y[n-1] sits at position P + n - 1
        room = len(y) - n - 1
        # a chain accepts nothing past the first miss: drafters may stop there (unless recording)
        known = y[n:] if policy is trees.chain and record is None else None
        lattice = drafter.propose(min(draft_len, room), known) if room > 0 else None
        tree = policy(y[n - 1], lattice) if lattice is not None else trees.Tree((y[n - 1],), (-1,))
        argmax = _argmax_along(tree, y[n:])
        path = tree.accept(argmax)
        taus.append(len(path))
        if record is not None:
            record.append(StepRecord(lattice, room, len(path), tree.tokens, argmax, y[n : n + len(path)]))
        done = emit(out, y[n : n + len(path)], eos, len(y))  # the accepted tokens and the bonus
        if not done:
            at = P + n - 1
            drafter.observe([tree.tokens[i] for i in path], y[n : n + len(path)], feats(at, at + len(path)))
    return taus


def oracle_tau(lat: Lattice | None, cont: list[int]) -> int:
    tau = 1
    if lat is None:
        return tau
    for i in range(min(lat.positions, len(cont))):
        if cont[i] not in lat.tokens[i].tolist():
            break
        tau += 1
    return tau


def replay(steps: list[StepRecord], spec: str, profile: torch.Tensor | None = None) -> list[int]:
    """τ of every recorded step under a policy."""
    conts = continuations(steps)
    if spec == "oracle":
        return [oracle_tau(s.lattice, c) for s, c in zip(steps, conts)]
    policy = make_policy(spec, profile)
    return [1 if s.lattice is None else tree_tau(policy(s.tree_tokens[0], s.lattice), c)
            for s, c in zip(steps, conts)]


def acceptance_profile(steps: list[StepRecord], k: int = 16, depth: int = trees.MAX_DEPTH) -> torch.Tensor:
    """profile[d, r]: how often the continuation's token at depth d+1 was the drafter's rank-r
    candidate, among steps whose continuation was in the top-k at every shallower depth."""
    hits = torch.zeros(depth, k, dtype=torch.float64)
    seen = torch.zeros(depth, dtype=torch.float64)
    for s, c in zip(steps, continuations(steps)):
        if s.lattice is None:
            continue
        for d in range(min(depth, s.lattice.positions, len(c))):
            seen[d] += 1
            row = s.lattice.tokens[d].tolist()
            if c[d] not in row:
                break
            hits[d, row.index(c[d])] += 1
    return hits / seen.clamp_min(1)[:, None]


# ---- files ------------------------------------------------------------------------------------
def _lat_json(lat: Lattice | None):
    if lat is None:
        return None
    return {"tokens": lat.tokens.tolist(), "logp": lat.logp.double().tolist(),
            "trans": lat.trans.double().tolist() if lat.trans is not None else None}


def _lat_from(d) -> Lattice | None:
    if d is None:
        return None
    k = len(d["tokens"][0]) if d["tokens"] else 16
    trans = torch.tensor(d["trans"], dtype=torch.float64) if d["trans"] is not None else None
    return Lattice(torch.tensor(d["tokens"], dtype=torch.long).view(-1, k),
                   torch.tensor(d["logp"], dtype=torch.float64).view(-1, k), trans)


def write_record(path, runs: list[tuple[str, str, list[StepRecord]]]) -> None:
    """JSONL: one line per request: {"id", "policy", "steps": [...]}."""
    with open(path, "w") as f:
        for rid, policy, steps in runs:
            f.write(json.dumps({"id": rid, "policy": policy, "steps": [
                {"lattice": _lat_json(s.lattice), "room": s.room, "tau": s.tau, "tree_tokens": list(s.tree_tokens),
                 "argmax": s.argmax, "emitted": s.emitted} for s in steps]}) + "\n")


def read_record(path) -> list[tuple[str, str, list[StepRecord]]]:
    runs = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            steps = [StepRecord(_lat_from(s["lattice"]), s["room"], s["tau"], tuple(s["tree_tokens"]), s["argmax"],
                                s["emitted"]) for s in d["steps"]]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: line {n} is not a step record ({e}); write one with "
                             "`specpilot generate --mode tree --record FILE`") from None
        runs.append((d["id"], d.get("policy", "?"), steps))
    return runs
