"""The memory's seed: one entry per built-in mechanism of the engine as it exists.

Every seed entry has an empty delta: each is a switch of a mechanism already in the stock engine
code (stock = `EngineConfig` with every mechanism off), so stock + the entry reproduces stock's
code exactly. Variants are named option sets of `EngineConfig` fields (`mode`, `tree`,
`draft_len`, and `drafter` named by kind — `kind:block_markov` — never by path), or, for the
`server-*` entries, a serving program's flags (`server_args`, for `server_program`: SGLang, vLLM,
our engine served) that apply to a server stock; all mechanisms are greedy and lossless, so each
contract is token forcing with `output_may_differ = False`.

Requirements. The speculation mechanisms require nothing: they are independent switches of the one
engine: a tree policy does not need a different draft length to run (it sets its own `draft_len`),
and the block-Markov drafter works in chain mode as well as under any tree policy. The weight
formats are GPU mechanisms: W12 pays only through its GEMM on a GPU and the certified head only
through its INT8 kernel there (on the CPU both run their torch references, exact and slower), so
their `limits` name the Hopper device kinds. W12 requires the static driver: its GEMM is written
for the fixed-shape, graph-captured step (`driver-static`, which `auto` already takes on CUDA — the
entry pins it, and a candidate of it alone is the stock system there). Two-level verification
(`tlv`) requires W12 (its Q pass reads the W12 views of the weights) and the best-first tree
builder (tree ① and the second draft's subtree are best-first trees); it runs on the eager driver,
one request at a time (`batch_max` 1), so its variants pin driver eager. Sequoia's
acceptance profile comes from a replay recording (`specpilot replay --profile-out`), which is a
measurement step, not another entry's code or configuration, so it is noted under `unverified`
instead of being a requirement. Inventing edges would make porting drop entries for no reason.

The batch's row selection (`batch-*`: a shared node budget, per-request draft length, prompt
admission) acts only
where several requests share a step, so those entries are limited to batch ≥ 2 (`batch_min`): a
deployment at batch 1 does not port them. They require nothing either: each runs alone, and they
combine (a variant of the draft length rule runs it under a shared budget). Prompt admission (a
waiting prompt's prefill rows riding a busy batch's verify steps instead of a prefill pass) needs
no drafter: AR batches take it too.

There is no evidence (nothing is measured yet) and no other `limits` (no deployment has excluded
any of them); what has not been checked is listed under `unverified`.

This module does not import the engine (a service never does); the seed's tests check the
option names against `EngineConfig` and the tree policies against `trees.parse_policy`.
"""

from __future__ import annotations

from .entries import Contract, Entry, Requirement

MARKOV = "kind:block_markov"  # a drafter named by kind, resolved against the deployment's drafters
LOSSLESS = Contract(rule="token_forcing", output_may_differ=False, options={})
_BATCH = ("no evidence at batch > 1 yet (every lane verifies its own tree of the same rows; the batch's row "
          "selection is the batch-* entries)")
BATCHED = {"batch_min": 2}  # a batch's row selection: nothing to select at one request a step
_ROWS = ("every lane plans the same rows (static shapes): a step verifies lanes × rows whatever each request "
         "uses (Step.rows, the engine's `verified_rows_mean`); replay runs one request at a time, so no replay "
         "ranks these rules: the search agent proposes them unpredicted, timing judges them")
HOPPER = ["h100-sxm", "h200"]  # the W12 GEMM and the INT8 head kernel are Triton kernels built for sm_90
CUDA = [*HOPPER, "rtx-pro-6000"]
_DRAFTER = ("needs a drafter in the deployment (EngineConfig.drafter: a checkpoint folder or 'ngram'); "
            "the entry does not name one")


_SERVER = ("a server system's flags (server_args), for the serving program server_program: applies only to a "
           "server stock; untested here against SGLang and vLLM themselves (no wheel of theirs runs on the test "
           "machines), tested with `specpilot serve engine`")


def _sglang(steps: int, topk: int, tokens: int) -> dict:
    return {"server_program": "sglang", "server_args": {"--speculative-num-steps": steps,
                                                        "--speculative-eagle-topk": topk,
                                                        "--speculative-num-draft-tokens": tokens}}


def _tree(policy: str, draft_len: int = 16) -> dict:
    return {"mode": "tree", "tree": policy, "draft_len": draft_len}


def _tlv(nodes: int, q_depth: int) -> dict:
    return {"mode": "tlv", "tlv_nodes": nodes, "tlv_q_depth": q_depth, "draft_len": 16, "weights": "w12"}


def seed_entries() -> list[Entry]:
    """The seed entries, in id order with requirements first, each version 1."""
    entries = [
        Entry(
            id="batch-draft-length",
            version=1,
            title="Batching: per-request draft length, each request picking its drafted positions on the device "
                  "every step from its recent acceptance and its drafter's confidence (built-in: draft_lens)",
            variants={
                "16-12-8": {"draft_len": 16, "draft_lens": "16,12,8"},
                "16-8-4": {"draft_len": 16, "draft_lens": "16,8,4"},
                "16-12-8-shared-n16": {"draft_len": 16, "draft_lens": "16,12,8", **_tree("shared:16:48")},
            },
            contract=LOSSLESS,
            limits=BATCHED,
            unverified=(
                _DRAFTER,
                "frees tree nodes, not rows: the drafter still drafts draft_len positions and every lane plans the "
                "decoder's rows; a shared budget gives the freed nodes to other requests, a best-first tree spends "
                "them wider in the same request, a chain only loses the positions it drops",
                "the rule's constants (engine/lengths.py: KEEP, HEADROOM, P_MIN) are not tuned per deployment",
                _ROWS,
            ),
        ),
        Entry(
            id="batch-prompt-admission",
            version=1,
            title="Batching: prompt admission, a waiting prompt whose prefill fits K verify steps riding a busy "
                  "batch's steps in its lane's rows instead of a prefill pass that stalls every lane "
                  "(built-in: admit_steps)",
            variants={
                "k1": {"admit_steps": 1},
                "k2": {"admit_steps": 2},
                "k4": {"admit_steps": 4},
            },
            contract=LOSSLESS,
            limits=BATCHED,
            unverified=(
                "a lane feeds min(rows, path rows) prompt tokens a step (a chain of draft length d: d + 1; AR: 1), so "
                "which prompts fit K steps depends on the tree; a fed request's first token waits up to K steps where a "
                "pass takes one",
                "pays only where lanes free up while others decode (continuous batching with a queue); a batch whose "
                "requests all start together prefills in one pass",
                _ROWS,
            ),
        ),
        Entry(
            id="batch-shared-budget",
            version=1,
            title="Batching: a shared node budget, one best-first selection over every request's lattice "
                  "(N nodes a request in all, at most C for one; built-in tree policy shared:N:C)",
            variants={
                "n8-c24": _tree("shared:8:24"),
                "n16-c32": _tree("shared:16:32"),
                "n16-c48": _tree("shared:16:48"),
                "n32-c63": _tree("shared:32:63"),
            },
            contract=LOSSLESS,
            limits=BATCHED,
            unverified=(
                _DRAFTER,
                "every lane verifies C + 1 rows (the largest share; the rows outside its share are masked): a step "
                "costs lanes × (C + 1) rows for lanes × N draft nodes, more than equal trees of N at C > N",
                "ranks requests by their drafters' path scores: pays where those scores are calibrated across "
                "requests; one request alone gets best-first:N",
                _ROWS,
            ),
        ),
        Entry(
            id="draft-length",
            version=1,
            title="Chain speculation with a tuned draft length (built-in: mode=chain, draft_len)",
            variants={
                "d4": {"mode": "chain", "draft_len": 4},
                "d8": {"mode": "chain", "draft_len": 8},
                "d16": {"mode": "chain", "draft_len": 16},
            },
            contract=LOSSLESS,
            unverified=(_DRAFTER, _BATCH, "the best length depends on the drafter's acceptance; re-tune per deployment"),
        ),
        Entry(
            id="drafter-block-markov",
            version=1,
            title="Block drafter with a Markov head (built-in drafter kind block_markov) scoring child given parent",
            variants={
                "chain-d8": {"drafter": MARKOV, "mode": "chain", "draft_len": 8},
                "best-first-n32": {"drafter": MARKOV, **_tree("best-first:32")},
            },
            contract=LOSSLESS,
            unverified=(
                "switches the drafter: `drafter: kind:block_markov` names the deployment's checkpoint folder whose "
                "config.json has drafter_kind = 'block_markov', trained for the deployment's target (a round maps "
                "the kind through the deployment's `drafters`); a deployment without such a checkpoint cannot use it",
                "the Markov transitions score children given parents in trees (best-first / topk), and in chain "
                "mode the chain follows them (each later position: the best child of the previous pick)",
                _BATCH,
            ),
        ),
        Entry(
            id="server-sglang-eagle",
            version=1,
            title="SGLang server: EAGLE speculative settings (--speculative-num-steps / -eagle-topk / "
                  "-num-draft-tokens)",
            variants={
                "steps3-topk1-tokens4": _sglang(3, 1, 4),
                "steps5-topk4-tokens8": _sglang(5, 4, 8),
                "steps7-topk8-tokens32": _sglang(7, 8, 32),
            },
            contract=LOSSLESS,
            unverified=(_SERVER, "needs a server stock launched with --speculative-algorithm EAGLE or EAGLE3 and "
                        "its drafter (--speculative-draft-model-path)"),
        ),
        Entry(
            id="server-specpilot-engine",
            version=1,
            title="SpecPilot's engine served (`specpilot serve engine`): draft length and tree policy flags",
            variants={
                "chain-d4": {"server_program": "specpilot", "server_args": {"--mode": "chain", "--draft-len": 4}},
                "chain-d16": {"server_program": "specpilot", "server_args": {"--mode": "chain", "--draft-len": 16}},
                "best-first-n16": {"server_program": "specpilot",
                                   "server_args": {"--mode": "tree", "--tree": "best-first:16"}},
            },
            contract=LOSSLESS,
            unverified=(_SERVER, "needs a server stock launched with --drafter"),
        ),
        Entry(
            id="server-vllm-speculative",
            version=1,
            title="vLLM server: number of speculative tokens (--speculative-config num_speculative_tokens)",
            variants={f"k{k}": {"server_program": "vllm", "server_args": {"--speculative-config":
                                                                           {"num_speculative_tokens": k}}}
                      for k in (2, 3, 5)},
            contract=LOSSLESS,
            unverified=(_SERVER, "needs a server stock whose args hold --speculative-config as an object (its method "
                        "and drafter model): the variant merges its keys into it"),
        ),
        Entry(
            id="tree-best-first",
            version=1,
            title="Draft tree: best-first expansion of the N highest path-score nodes (built-in tree policy)",
            variants={
                "n16": _tree("best-first:16"),
                "n32": _tree("best-first:32"),
                "n63": _tree("best-first:63"),
            },
            contract=LOSSLESS,
            unverified=(_DRAFTER, _BATCH, "tree depth is capped at 15 (trees.MAX_DEPTH) whatever draft_len says"),
        ),
        Entry(
            id="tree-sequoia",
            version=1,
            title="Draft tree: Sequoia-like static shape fitted to a measured rank-acceptance profile",
            variants={"n16": _tree("sequoia:16")},
            contract=LOSSLESS,
            unverified=(
                "needs an acceptance profile (EngineConfig.profile, JSON from `specpilot replay --record FILE "
                "--profile-out PROFILE`) measured on the deployment; the variant does not carry it, and "
                "EngineConfig.validate refuses sequoia without one",
                _DRAFTER,
                _BATCH,
            ),
        ),
        Entry(
            id="tree-topk",
            version=1,
            title="Draft tree: EAGLE-2-like top-K expansion per depth, N best kept (built-in tree policy)",
            variants={
                "k4n16": _tree("topk:4:16"),
                "k8n32": _tree("topk:8:32"),
            },
            contract=LOSSLESS,
            unverified=(_DRAFTER, _BATCH),
        ),
        Entry(
            id="driver-static",
            version=1,
            title="The static-shape driver: fixed buffers, the step captured as CUDA graphs, one device → host read "
                  "a step (built-in: driver=static)",
            variants={"static": {"driver": "static"}},
            contract=LOSSLESS,
            limits={"devices": CUDA},
            unverified=("on CUDA the default driver (auto) already takes it where it runs the drafter and policy; a "
                        "drafter it cannot run is refused", _BATCH),
        ),
        Entry(
            id="weights-w12",
            version=1,
            requires=(Requirement("driver-static"),),
            title="W12 weights: every layer projection of the target in 12 bits a weight, bit-exact, read by the "
                  "W12 GEMM (built-in: weights=w12)",
            variants={"layers": {"weights": "w12", "driver": "static"},
                      "layers-and-head": {"weights": "w12", "lm_head": "w12", "driver": "static"}},
            contract=LOSSLESS,
            limits={"devices": HOPPER},
            unverified=(
                "needs weights whose values are bf16 values (a bf16 checkpoint); other weights are refused at load",
                "the dense weights stay resident beside the packed ones: the step reads 12 bits a weight, the "
                "memory is not yet freed",
                _BATCH,
            ),
        ),
        Entry(
            id="lm-head-certified",
            version=1,
            title="Certified LM head: an INT8 copy with a per-row error bound drops the tokens proven not to be "
                  "the argmax, the rest rescored exactly (built-in: lm_head=certified)",
            variants={"int8": {"lm_head": "certified"}},
            contract=LOSSLESS,
            limits={"devices": HOPPER},
            unverified=("pays where the head is a large part of the step (a large vocabulary at few rows)", _BATCH),
        ),
        Entry(
            id="tlv",
            version=1,
            requires=(Requirement("weights-w12"), Requirement("tree-best-first")),
            title="Two-level verification: a Q pass reading W12's 8-bit views picks a chain from a best-first "
                  "tree, a second draft grows it, one exact pass verifies both (built-in: mode=tlv)",
            variants={
                "n16-q6": _tlv(16, 6),
                "n32-q8": _tlv(32, 8),
                "n63-q15": _tlv(63, 15),
            },
            contract=LOSSLESS,
            limits={"devices": HOPPER},
            unverified=(
                _DRAFTER,
                "the Q pass's view-only W12 GEMM (8 of 12 bits a weight) is unmeasured on a GPU, so the search "
                "agent's outlook prices a Q pass like an exact pass and refuses TLV until it is measured",
                "the static driver's captured cycle (device drafters, any batch) is untimed on a GPU; the paper "
                "saw TLV lose 13 % at a batch of 16–24 in bf16, so each batch size is for the round to judge",
                "needs weights whose values are bf16 values and a drafter that can forget observed tokens "
                "(Drafter.mark / rewind: every built-in drafter can)",
            ),
        ),
    ]
    return _requirements_first(sorted(entries, key=lambda e: e.id))


def _requirements_first(entries: list[Entry]) -> list[Entry]:
    """`entries` in id order, each moved after the entries it requires (a store adds an entry only
    once its requirements are in)."""
    done: list[Entry] = []
    ids: set[str] = set()
    while len(done) < len(entries):
        ready = [e for e in entries if e.id not in ids and all(r.id in ids for r in e.requires)]
        if not ready:
            raise ValueError("the seed entries' requirements form a cycle or name a missing entry")
        done.append(ready[0])
        ids.add(ready[0].id)
    return done


def seed_catalog() -> dict[str, list[Entry]]:
    """The seed as a catalog for `graph.resolve` / `porting.port`: id -> [versions]."""
    return {e.id: [e] for e in seed_entries()}
