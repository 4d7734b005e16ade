"""Planted bugs that the tests must catch.

Each mutation replaces one snippet of one source file in a scratch copy of the repository, runs the
tests meant to catch it there under each Hypothesis seed asked for, and expects them to FAIL. A
mutation the tests pass under some seed has escaped: the script says where and exits 1. The
unmutated copy is run first and must pass (else nothing the mutations show means anything).

The engine's mutations only bite on accepted paths of three or more nodes, on both decoding
drivers (the eager one: engine/cache.py Cache, engine/gdn.py replay_path; the static one:
StaticCache.commit, gdn.tree_state / tree_gated_delta_rule, treeops.accept, and the row a device
feature drafter keeps after acceptance, fast._FeatureDraft.observe); the batch's row selection
(treeops.share / build_shared, lengths.clip) and the batch's admission (prompts prefilled together,
padded: fast.FastDecoder._admit, the padding rows of a hybrid's prefill; prompts fed in verify steps:
fast.FastDecoder._feeding and what the step commits and the drafter reads of them) only with several lanes; two-level verification's
(decode.generate's acceptance of the Q pass's chain, tlv.TwoLevel.quick_pass dropping its rows,
the static cycle's drafter forgetting chain C) only where the Q pass is wrong, the target is a
hybrid or the cycle is compared with the eager one; the statistics' change the
lower bound by a few percent (services/controller/stats.py).

    python tests/mutations/run.py                  # every mutation, Hypothesis seeds 0..7
    python tests/mutations/run.py --seeds 0-2 --only eager-chain-state static-compaction
    python tests/mutations/run.py --property-only  # the engine's Hypothesis test alone, no fixed runs
    python tests/mutations/run.py --list | --json

Run it whenever acceptance, K/V compaction, the recurrent-state commit or the statistics change.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEEP = ["tests/unit/test_lossless_deep.py"]
STATS = ["tests/unit/test_paired_stats.py"]
DRAFTERS = ["tests/unit/test_fast_deep_drafters.py"]
BATCH = ["tests/unit/test_batch_decode.py"]
ROWS = ["tests/unit/test_row_selection.py"]
TLV = ["tests/unit/test_tlv.py"]
IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".hypothesis", ".pytest_cache", "*.egg-info",
                                "build", "dist")

# Makes `specpilot` and its mapped folders (setup.py's package_dir) import from the scratch copy,
# ahead of any installed or editable copy, then runs pytest there.
BOOT = """
import importlib.util, os, sys
root = os.getcwd()
folders = {"specpilot": "specpilot", "specpilot.engine": "engine", "specpilot.kernels": "kernels",
           "specpilot.zoo": "zoo", "specpilot.services": "services"}
class Scratch:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in folders:
            return None
        base = os.path.join(root, folders[name])
        return importlib.util.spec_from_file_location(name, os.path.join(base, "__init__.py"),
                                                      submodule_search_locations=[base])
sys.meta_path.insert(0, Scratch)
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    engine: bool = True  # --property-only narrows engine mutations to the Hypothesis test


MUTATIONS = [
    Mutation(
        "eager-chain-state",
        "(a) eager: a chain commit of n ≥ 3 tokens keeps the recurrent state after token n−1, not n",
        "engine/cache.py",
        "self.h[i] = states[:, n - 1 - (self.pending - states.shape[1])].clone()",
        "self.h[i] = states[:, (n - 1 if n < 3 else n - 2) - (self.pending - states.shape[1])].clone()",
        tuple(DEEP)),
    Mutation(
        "eager-tree-state",
        "(b) eager: the accepted tree path's recurrent state is replayed over its first two nodes only",
        "engine/gdn.py",
        "_, h = gated_delta_rule(*(t[idx][None] for t in stash[\"rule\"]), h0, every_state=False)",
        "_, h = gated_delta_rule(*(t[idx[:2]][None] for t in stash[\"rule\"]), h0, every_state=False)",
        tuple(DEEP)),
    Mutation(
        "eager-compaction",
        "(c) eager: only the first two accepted tree rows' K/V are moved to consecutive slots",
        "engine/cache.py",
        "            dst = slice(self.length, self.length + n)\n"
        "            for i in self.k:\n"
        "                src = torch.tensor(path, device=self.k[i].device) + self.length",
        "            dst = slice(self.length, self.length + min(n, 2))\n"
        "            for i in self.k:\n"
        "                src = torch.tensor(path[:2], device=self.k[i].device) + self.length",
        tuple(DEEP)),
    Mutation(
        "static-chain-state",
        "(a) static: a chain commit of τ ≥ 3 rows keeps the recurrent state after row τ−2, not τ−1",
        "engine/cache.py",
        "deepest = path.gather(1, (tau - 1).clamp_min(0)[:, None])[:, 0]",
        "deepest = path.gather(1, (tau - 1 - ((tau >= 3) & (not compact)).long()).clamp_min(0)[:, None])[:, 0]",
        tuple(DEEP)),
    Mutation(
        "static-tree-state",
        "(b) static: a tree commit takes the recurrent state of the path's second node, not its deepest",
        "engine/cache.py",
        "deepest = path.gather(1, (tau - 1).clamp_min(0)[:, None])[:, 0]",
        "deepest = path.gather(1, ((tau - 1).clamp(max=1) if compact else tau - 1).clamp_min(0)[:, None])[:, 0]",
        tuple(DEEP)),
    Mutation(
        "static-tree-rule",
        "(b) static: the tree delta rule lets each row see its parent, not every ancestor",
        "engine/gdn.py",
        "    decay = torch.where(anc[..., None, :, :], Gh[..., :, :, None] - Gh[..., :, None, :], float(\"-inf\")).exp()",
        "    near = anc & (anc.sum(-1)[..., :, None] - anc.sum(-1)[..., None, :] <= 1)\n"
        "    decay = torch.where(near[..., None, :, :], Gh[..., :, :, None] - Gh[..., :, None, :], float(\"-inf\")).exp()",
        tuple(DEEP)),
    Mutation(
        "static-compaction",
        "(c) static: only the first two accepted tree rows' K/V are moved to consecutive slots",
        "engine/cache.py",
        "src, dst = L[:, None] + path, L[:, None] + torch.arange(D, device=path.device)",
        "src, dst = L[:, None] + path[:, :2], L[:, None] + torch.arange(min(D, 2), device=path.device)",
        tuple(DEEP)),
    Mutation(
        "static-accept",
        "(c) static: acceptance reports the accepted rows of depth < 2 only (the rest: the root)",
        "engine/treeops.py",
        "path.scatter_(-1, torch.where(acc, tree.depth.clamp(max=path_len - 1), path_len), idx.expand_as(acc))",
        "path.scatter_(-1, torch.where(acc & (tree.depth < 2), tree.depth.clamp(max=path_len - 1), path_len), "
        "idx.expand_as(acc))",
        tuple(DEEP)),
    Mutation(
        "static-drafter-row",
        "(d) static: a feature drafter keeps the accepted path's third row (not its last) when τ ≥ 4",
        "engine/fast.py",
        "last = (tau - 1).clamp_min(0)[:, None, None]",
        "last = (tau - 1).clamp_min(0).clamp(max=2)[:, None, None]",
        tuple(DRAFTERS), engine=False),
    Mutation(
        "batch-neighbour-tau",
        "(e) batched: each lane commits its neighbour lane's accepted length",
        "engine/fast.py",
        "tau = tau * self.active  # an idle lane commits nothing",
        "tau = tau.roll(1) * self.active  # an idle lane commits nothing",
        tuple(BATCH), engine=False),
    Mutation(
        "batch-share-not-closed",
        "(e) batched: the shared budget takes each lane's worst-ranked nodes (a share that is not prefix-closed)",
        "engine/treeops.py",
        "order = top.flatten().argsort(descending=True, stable=True)",
        "order = top.flatten().argsort(descending=False, stable=True)",
        tuple(ROWS), engine=False),
    Mutation(
        "batch-share-idle-lane",
        "(e) batched: idle lanes take shares of the budget",
        "engine/treeops.py",
        "top = top.masked_fill(drafting[:, None] == 0, NEG)",
        "top = top",
        tuple(ROWS), engine=False),
    Mutation(
        "batch-shared-root",
        "(e) batched: each lane's shared-budget tree hangs from its neighbour lane's root token",
        "engine/treeops.py",
        "return _pick(roots, tokens, pool, sel, taken)",
        "return _pick(roots.roll(1), tokens, pool, sel, taken)",
        tuple(BATCH), engine=False),
    Mutation(
        "batch-length-past",
        "(e) batched: a lane's tree may use the position at its draft length (one past it)",
        "engine/lengths.py",
        "past = torch.arange(tokens.shape[1], device=tokens.device)[None, :] >= lengths[:, None]",
        "past = torch.arange(tokens.shape[1], device=tokens.device)[None, :] > lengths[:, None]",
        tuple(BATCH), engine=False),
    Mutation(
        "batch-admit-root",
        "(e) batched: prompts admitted in one prefill pass all start from the first one's first token",
        "engine/fast.py",
        "self.root.index_copy_(0, lane, first)",
        "self.root.index_copy_(0, lane, first[:1].expand(len(first)))",
        tuple(BATCH), engine=False),
    Mutation(
        "batch-pointer-length",
        "(e) batched: each lane's pointer head reads its sources up to its neighbour lane's length",
        "engine/fast.py",
        "lead[:, None], self.cache.lengths - 1)",
        "lead[:, None], self.cache.lengths.roll(1) - 1)",
        ("tests/unit/test_fast_path.py",), engine=False),
    Mutation(
        "admit-warmup-foreign-lane",
        "(e) batched: a new bucket's warm-up passes write the next lane over (a lane that may be decoding)",
        "engine/fast.py",
        "[lanes[j % A] for j in range(a)], n)",
        "[(lanes[j % A] + 1) % self.lanes for j in range(a)], n)",
        tuple(BATCH), engine=False),
    Mutation(
        "batch-ahead-stale-rows",
        "(e) batched: a step launched before a lane's request began (or after it ended) gives it tokens",
        "engine/fast.py",
        "if i is not None and since[lane] <= step]",
        "if i is not None]",
        tuple(BATCH), engine=False),
    Mutation(
        "admit-fed-rows-dropped",
        "(e) batched: a lane feeding a prompt commits at most two of its prompt rows a step",
        "engine/fast.py",
        "tau = torch.where(feeding, count, tau)",
        "tau = torch.where(feeding, count.clamp(max=2), tau)",
        tuple(BATCH), engine=False),
    Mutation(
        "admit-drafter-next-token",
        "(e) batched: the drafter reads a fed prompt's rows with the bonus, not the prompt's next token",
        "engine/fast.py",
        "nxt = torch.where(feeding[:, None], after, nxt)",
        "nxt = torch.where(feeding[:, None], bonus.expand_as(after), nxt)",
        tuple(BATCH), engine=False),
    Mutation(
        "admit-history",
        "(e) batched: the steps feeding a prompt count as its acceptance (its first draft length drops)",
        "engine/fast.py",
        "drafting = self.active if not self.admit_steps else self.active * ~feeding",
        "drafting = self.active",
        tuple(BATCH), engine=False),
    Mutation(
        "admit-share",
        "(e) batched: a lane feeding a prompt competes for the shared budget with its stale lattice",
        "engine/fast.py",
        "drafting = self.active * (self.feed_len <= self.fed) if self.admit_steps else None",
        "drafting = None",
        tuple(BATCH), engine=False),
    Mutation(
        "prefill-padding-state",
        "(e) static: a padded prefill's padding rows update a hybrid's recurrent state",
        "engine/model.py",
        "k, g, beta = k * real[..., None], g * real, beta * real",
        "k, g, beta = k, g, beta",
        tuple(BATCH), engine=False),
    Mutation(
        "tlv-unchecked-chain",
        "(f) two-level verification: the Q pass's chain C is accepted without the exact pass's check",
        "engine/decode.py",
        "path = tree.accept(argmax)",
        "path = tree.accept([tree.tokens[i + 1] if i + 1 < chain_rows else a for i, a in enumerate(argmax)])",
        tuple(TLV)),
    Mutation(
        "tlv-q-rows-kept",
        "(f) two-level verification: the Q pass's rows are not dropped (a hybrid's exact chain pass commits "
        "the Q pass's tree state)",
        "engine/tlv.py",
        "    finally:\n        cache.commit(0)",
        "    finally:\n        pass",
        tuple(TLV)),
    Mutation(
        "tlv-static-kept-chain",
        "(f) two-level verification, static: the device drafter keeps chain C after draft ② (not rewound)",
        "engine/fast.py",
        "        self.device_draft.rewind(mark)\n",
        "",
        tuple(TLV)),
    Mutation(
        "stats-population-sd",
        "statistics: the population standard deviation (ddof 0) instead of the sample one",
        "services/controller/stats.py",
        "sd = float(per_repeat.std(ddof=1))",
        "sd = float(per_repeat.std(ddof=0))",
        tuple(STATS), engine=False),
    Mutation(
        "stats-dof",
        "statistics: n instead of n − 1 degrees of freedom for the t quantile",
        "services/controller/stats.py",
        "tq = t_quantile(confidence, n - 1)",
        "tq = t_quantile(confidence, n)",
        tuple(STATS), engine=False),
]


def seeds_arg(text: str) -> list[int]:
    """'0-7' or '0,3,5' → seeds."""
    try:
        if "-" in text:
            a, b = text.split("-")
            return list(range(int(a), int(b) + 1))
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: expected a range like 0-7 or a list like 0,3,5") from None


def scratch_copy() -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="specpilot-mutation-"))
    shutil.copytree(REPO, tmp / "repo", ignore=IGNORE, symlinks=True)
    return tmp / "repo"


def apply(root: Path, m: Mutation) -> None:
    path = root / m.file
    text = path.read_text()
    if text.count(m.old) != 1:
        raise SystemExit(f"mutation {m.name}: {m.file} holds the snippet to replace {text.count(m.old)} times, "
                         "expected once — the code changed: update the mutation in tests/mutations/run.py")
    path.write_text(text.replace(m.old, m.new))


def run_tests(root: Path, tests: tuple[str, ...], seed: int, select: str | None, timeout: float) -> tuple[str, str]:
    """("passed" | "failed" | "timeout", the first failing test or the error) of pytest in `root`
    under a Hypothesis seed. A run that times out proves nothing either way."""
    args = [sys.executable, "-c", BOOT, "-q", "-x", "-p", "no:cacheprovider", f"--hypothesis-seed={seed}",
            *tests]
    if select:
        args += ["-k", select]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    try:
        out = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", f"no result within {timeout:.0f} s (raise --timeout)"
    failed = [ln.split(" - ")[0].removeprefix("FAILED ") for ln in out.stdout.splitlines() if ln.startswith("FAILED")]
    if out.returncode == 0:
        return "passed", ""
    if failed:
        return "failed", failed[0]
    text = (out.stdout + out.stderr).strip()
    return "failed", text.splitlines()[-1] if text else f"pytest exited {out.returncode}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run these mutations (see --list)")
    ap.add_argument("--seeds", type=seeds_arg, default=list(range(8)), help="Hypothesis seeds, e.g. 0-7 (default)")
    ap.add_argument("--property-only", action="store_true",
                    help="engine mutations: run only the Hypothesis property test (not the fixed deep runs)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the run of the unmutated copy")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run (default 600)")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--out", metavar="FILE", help="also write the results as JSON, with command, date and commit")
    a = ap.parse_args(argv)
    known = {m.name: m for m in MUTATIONS}
    if a.list:
        for m in MUTATIONS:
            print(f"{m.name:22} {m.file:30} {m.what}")
        return 0
    unknown = [n for n in a.only or () if n not in known]
    if unknown:
        print(f"error: unknown mutation {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    chosen = [known[n] for n in a.only] if a.only else MUTATIONS
    root = scratch_copy()
    results, ok = [], True
    try:
        pristine = {m.file: (root / m.file).read_text() for m in chosen}
        if not a.no_baseline:
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
            status, why = run_tests(root, tests, a.seeds[0], None, a.timeout)
            if status != "passed":
                print(f"error: the unmutated copy fails its tests ({why}); fix that first", file=sys.stderr)
                return 1
        for m in chosen:
            apply(root, m)
            select = "noisy_oracle" if a.property_only and m.engine else None
            row = {"mutation": m.name, "what": m.what, "seeds": {}}
            for seed in a.seeds:
                t0 = time.monotonic()
                status, why = run_tests(root, m.tests, seed, select, a.timeout)
                caught = status == "failed"
                row["seeds"][seed] = {"caught": caught, "status": status, "by": why,
                                      "seconds": round(time.monotonic() - t0, 1)}
                ok &= caught
                if not a.json:
                    word = {"failed": "caught", "passed": "ESCAPED", "timeout": "TIMEOUT"}[status]
                    print(f"{m.name:22} seed {seed}: {word}  {why}", flush=True)
            (root / m.file).write_text(pristine[m.file])
            results.append(row)
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)
    doc = {"mutations": results, "seeds": a.seeds, "property_only": a.property_only, "all_caught": ok}
    if a.out:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        head = {"command": " ".join(["python", "tests/mutations/run.py", *(argv if argv is not None else sys.argv[1:])]),
                "device": f"cpu ({os.cpu_count()} cores)", "date": time.strftime("%Y-%m-%d"),
                "git_sha": sha.stdout.strip() + ("+dirty" if dirty else "")}
        Path(a.out).write_text(json.dumps(head | doc, indent=1) + "\n")
    if a.json:
        print(json.dumps(doc, indent=1))
    else:
        width = max(len(m["mutation"]) for m in results)
        print("\n" + " " * width + "  " + " ".join(f"{s:>2}" for s in a.seeds))
        for r in results:
            marks = {"failed": " x", "passed": " -", "timeout": " ?"}
            print(f"{r['mutation']:{width}}  " + " ".join(marks[r["seeds"][s]["status"]] for s in a.seeds))
        print("x: caught (the tests failed), -: escaped (the tests passed), ?: timed out (counts as not caught)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
