"""`specpilot round`: the product's main job, in the embedded runner (DESIGN.md §1, §8).

One round, for a deployment and its incumbent (stock at first):

  profile (the GPU worker's Profile call on the incumbent) → cost model, ceiling, direction
  (planner) → agents propose → the controller evaluates each candidate (token forcing, paired
  swapped runs against the incumbent, stock-vs-stock noise measured once per round) → the
  accepted candidate with the highest lower bound becomes the incumbent → a memory entry
  (stored only if the reproduce check passes) → the round's report.

Several rounds run in a row. Every step's result is written to `<run>/state.json` as soon as it
exists (atomically), so a killed run resumes where it stopped: finished steps and verdicts are
read back, not measured again. This module composes the services — the one place that may — and
reaches every system only through the worker processes the controller starts.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from specpilot import gitrun, patches
from specpilot.services.controller import stats
from specpilot.services.controller.pairing import Worker, baseline, device_list, judge, run_pair, write_verdict
from specpilot.services.gpu_worker.build import BuildError, build_worktree, remove_worktree
from specpilot.services.memory_api.entries import Entry, EntryError, Evidence, Lineage, Requirement
from specpilot.services.memory_api.graph import GraphError
from specpilot.services.memory_api.porting import port
from specpilot.services.memory_api.reproduce import ReproduceError, reproduce, tree_of_worktree
from specpilot.services.memory_api.seed import seed_entries
from specpilot.services.memory_api.store import EntryExists, Store
from specpilot.services.planner import costmodel, report
from specpilot.services.planner.agents import Context
from specpilot.services.planner.command_agent import CommandAgent
from specpilot.services.planner.search_agent import SearchAgent

BUDGETS = ("chain", "best-first:16", "best-first:32", "best-first:63")
DEPLOYMENT_DEFAULTS = {
    "drafters": {}, "gpu": "cpu", "devices": "cpu,cpu", "batch": 1, "workload": "humaneval", "prompts": 3,
    "max_new_tokens": 48, "draft_len": 16, "repeats": 6, "warmup": 1, "budgets": list(BUDGETS), "timeout": 600.0,
    "max_candidates": 3,
}
REQUIRED = ("name", "target", "drafter")


class DeploymentError(ValueError):
    """A deployment file is malformed; the message names the field and what to write."""


def load_deployment(source: str | Path | dict, base: Path | None = None) -> dict:
    """A deployment from a JSON file (paths relative to the file) or a dict, with defaults filled."""
    if isinstance(source, dict):
        raw, base = dict(source), base or Path.cwd()
    else:
        path = Path(source)
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise DeploymentError(f"{path}: cannot read the deployment ({e}); write a JSON object with at least "
                                  f'"name", "target" and "drafter" (checkpoint folders)') from None
        base = path.resolve().parent
    if not isinstance(raw, dict):
        raise DeploymentError("a deployment is a JSON object")
    unknown = sorted(set(raw) - set(REQUIRED) - set(DEPLOYMENT_DEFAULTS) - {"family"})
    if unknown:
        raise DeploymentError(f"deployment: unknown field {unknown[0]!r}; known: "
                              f"{', '.join(REQUIRED + tuple(DEPLOYMENT_DEFAULTS) + ('family',))}")
    for k in REQUIRED:
        if not isinstance(raw.get(k), str) or not raw[k]:
            raise DeploymentError(f"deployment: field {k!r} is required (a non-empty string)")
    dep = {**copy.deepcopy(DEPLOYMENT_DEFAULTS), **raw}

    def folder(p: str, what: str) -> str:
        q = Path(p) if Path(p).is_absolute() else base / p
        if not (q / "config.json").is_file():
            raise DeploymentError(f"deployment: {what} {p!r} is not a checkpoint folder (no {q / 'config.json'})")
        return str(q.resolve())

    dep["target"] = folder(dep["target"], "target")
    dep["drafter"] = dep["drafter"] if dep["drafter"] == "ngram" else folder(dep["drafter"], "drafter")
    if not isinstance(dep["drafters"], dict):
        raise DeploymentError('deployment: "drafters" maps drafter kinds to folders, e.g. {"block_markov": "DIR"}')
    dep["drafters"] = {k: folder(v, f"drafters.{k}") for k, v in dep["drafters"].items()}
    for k in ("batch", "prompts", "max_new_tokens", "draft_len", "repeats", "warmup", "max_candidates"):
        if not isinstance(dep[k], int) or isinstance(dep[k], bool) or dep[k] < 1:
            raise DeploymentError(f"deployment: {k!r} must be a positive integer, got {dep[k]!r}")
    if dep["batch"] != 1:
        raise DeploymentError("deployment: the engine decodes one request at a time; batch must be 1")
    if dep["repeats"] < 2:
        raise DeploymentError("deployment: repeats must be at least 2 (the bound is a t-interval over repeats)")
    device_list(dep["devices"])
    if "family" not in dep:
        dep["family"] = json.loads((Path(dep["target"]) / "config.json").read_text()).get("model_type", "unknown")
    return dep


def requests_of(dep: dict) -> list[dict]:
    from specpilot.zoo.workloads import humaneval, read_workload, stdlib_completion

    w = dep["workload"]
    reqs = humaneval(dep["prompts"]) if w == "humaneval" else stdlib_completion(dep["prompts"]) \
        if w == "stdlib" else read_workload(w)[: dep["prompts"]]
    return [{**r.to_json(), "max_new_tokens": dep["max_new_tokens"]} for r in reqs]


def stock_config(dep: dict) -> dict:
    device = "cpu" if dep["devices"].split(",")[0].strip().startswith("cpu") else "cuda"
    return {"target": dep["target"], "drafter": dep["drafter"], "mode": "chain", "draft_len": dep["draft_len"],
            "max_new_tokens": dep["max_new_tokens"], "device": device}


def port_deployment(dep: dict) -> dict:
    return {"family": dep["family"], "device": dep["gpu"], "batch": dep["batch"], "name": dep["name"]}


def _git(repo, *args) -> str:
    return gitrun.run(repo, *args, check=True).stdout.strip()


class Round:
    """Runs rounds for one deployment in `run_dir`, resuming from its state file."""

    def __init__(self, dep: dict, run_dir: Path, agents=None, store_url: str | None = None, repo: Path | None = None,
                 log=print, progress: bool = True):
        self.dep, self.dir, self.log, self.progress = dep, Path(run_dir), log or (lambda *a: None), progress
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state_path = self.dir / "state.json"
        self.repo = Path(repo) if repo else None
        self.state = json.loads(self.state_path.read_text()) if self.state_path.is_file() else {}
        if self.state and self.state["deployment"] != dep:
            raise ValueError(f"{self.dir} holds a run of another deployment; use a new --run-dir")
        stock_rev = _git(self.repo, "rev-parse", "HEAD") if self.repo else None
        self.state.setdefault("deployment", dep)
        self.state.setdefault("stock_rev", stock_rev)
        self.state.setdefault("rounds", [])
        self.store = Store(store_url or f"sqlite:///{self.dir / 'memory.db'}")
        if not self.store.list():
            for e in seed_entries():
                self.store.add(e)
        self.agents = agents if agents is not None else [SearchAgent(dep["max_candidates"])]
        self.stock = stock_config(dep)
        self.requests = requests_of(dep)
        self.devices = device_list(dep["devices"])
        self.worktrees: list[Path] = []

    # ------------------------------------------------------------------ state
    def save(self) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        os.replace(tmp, self.state_path)

    def incumbent(self) -> dict:
        done = [r for r in self.state["rounds"] if r.get("status") == "done"]
        if done and done[-1].get("next_incumbent"):
            return done[-1]["next_incumbent"]
        return {"label": "stock", "config": dict(self.stock), "patch": "", "entries": [], "code_entries": []}

    # ------------------------------------------------------------------ systems
    def system(self, inc_or_cand: dict, tag: str) -> dict:
        """An engine config for a worker; a system with code gets a worktree (kept for the run)."""
        cfg = dict(inc_or_cand["config"])
        if inc_or_cand.get("patch", "").strip():
            dest = Path(tempfile.mkdtemp(prefix=f"specpilot-{tag}-")) / "wt"
            build_worktree(self.repo, self.state["stock_rev"], inc_or_cand["patch"], dest)
            self.worktrees.append(dest)
            cfg["root"] = str(dest)
        return cfg

    def close(self) -> None:
        for wt in self.worktrees:
            remove_worktree(self.repo, wt)
        self.worktrees.clear()
        self.store.close()

    def bar(self, total: int, desc: str):
        return tqdm(total=total, desc=desc, unit="run", file=sys.stderr, disable=not self.progress, leave=False)

    # ------------------------------------------------------------------ steps
    def profile(self, rec: dict) -> None:
        inc = rec["incumbent"]
        w = Worker(self.system(inc, "profile"), self.devices[0], self.dep["timeout"])
        try:
            with self.bar(1, f"round {rec['round']}: profiling {inc['label']}") as b:
                reply, _ = w.call({"profile": {"requests": self.requests, "new_tokens": self.dep["max_new_tokens"],
                                               "budgets": self.dep["budgets"], "replay": self._replays()}}, "profile")
                b.update(1)
        finally:
            w.close()
        rec["measurement"] = reply["profile"]
        rec["costmodel"] = costmodel.analyze(reply["profile"], self.dep["gpu"])
        rec["direction"] = rec["costmodel"]["direction"]

    def _replays(self) -> list[str]:
        """Every tree policy a stored variant names (exact replay prices them without running)."""
        out = []
        for e in self.store.list():
            for opts in e.variants.values():
                if opts.get("mode") == "tree" and not opts.get("tree", "").startswith("sequoia"):
                    out.append(opts["tree"])
        return sorted(set(out)) + ["chain"]

    def propose(self, rec: dict) -> None:
        plan = port(port_deployment(self.dep), self.store.catalog())
        inc = rec["incumbent"]
        tried = tuple(c["name"] for r in self.state["rounds"] if r is not rec for c in r.get("candidates", [])
                      if c.get("verdict") or c.get("error"))
        ctx = Context(round=rec["round"], deployment=self.dep, incumbent=inc["config"], incumbent_patch=inc["patch"],
                      costmodel=rec["costmodel"], direction=rec["direction"],
                      memory=[e.to_dict() for e in plan.order], tried=tried)
        cands, logs = [], {}
        for agent in self.agents:
            got = agent.propose(ctx)
            logs[agent.name] = getattr(agent, "last_log", {})
            cands += [c.to_dict() | {"pruned": None, "verdict": None, "error": None} for c in got]
            cands += [{**p, "verdict": None, "error": None} for p in logs[agent.name].get("pruned", [])]
        rec["agents"] = logs
        rec["candidates"] = cands

    def evaluate(self, rec: dict) -> None:
        if "baseline" not in self.state:  # stock against itself: the same for every round of the run
            with self.bar(2 * self.dep["repeats"], "stock noise (stock vs stock)") as b:
                self.state["baseline"] = baseline(self.stock, self.requests, self.devices, self.dep["repeats"],
                                                  self.dep["timeout"], b.update, self.dep["warmup"])
            self.save()
        inc = rec["incumbent"]
        for c in rec["candidates"]:
            if c["pruned"] or c["verdict"] or c["error"]:
                continue
            cand = {"config": {**inc["config"], **c["options"]}, "patch": self._joined_patch(inc, c)}
            try:
                cand_cfg, inc_cfg = self.system(cand, "candidate"), self.system(inc, "incumbent")
                with self.bar(2 * self.dep["repeats"], f"round {rec['round']}: {c['name']}") as b:
                    v = judge(cand_cfg, inc_cfg, self.stock, self.requests, self.devices, self.dep["repeats"],
                              timeout=self.dep["timeout"], progress=b.update, base=self.state["baseline"],
                              warmup=self.dep["warmup"])
                path = write_verdict(v, self.dir / "verdicts")
                c["verdict"] = {"path": str(path), "id": path.stem, "accepted": v["accepted"], "gain": v["gain"],
                                "lower_bound": v["lower_bound"], "threshold": v["threshold"],
                                "stock_noise": v["stock_noise"], "reasons": v["reasons"],
                                "forcing_passed": v["forcing"]["passed"]}
                mark = "ACCEPTED" if v["accepted"] else "rejected"
                self.log(f"  {c['name']}: ×{v['gain']:.3f} (95 % lower bound ×{v['lower_bound']:.3f}, "
                         f"needs > ×{1 + v['threshold']:.3f}) → {mark}")
            except (BuildError, RuntimeError, ValueError, patches.PatchRefused) as e:
                c["error"] = f"{type(e).__name__}: {e}"
                self.log(f"  {c['name']}: could not be evaluated: {e}")
            finally:
                for wt in self.worktrees:
                    remove_worktree(self.repo, wt)
                self.worktrees.clear()
            self.save()

    @staticmethod
    def _joined_patch(inc: dict, c: dict) -> str:
        if c.get("patch", "").strip() and inc["patch"].strip():
            raise ValueError("a code candidate on an incumbent that already carries code: combine them in one "
                             "patch against stock (not supported yet)")
        return c.get("patch", "") or inc["patch"]

    def accept(self, rec: dict) -> None:
        won = [c for c in rec["candidates"] if c["verdict"] and c["verdict"]["accepted"]]
        inc = rec["incumbent"]
        rec["accepted"] = []
        if not won:
            rec["next_incumbent"] = inc
            return
        entry = None
        for best in sorted(won, key=lambda c: (-c["verdict"]["lower_bound"], c["name"])):
            try:
                entry = self.store_entry(rec, best)
                break
            except (ReproduceError, EntryError, GraphError, BuildError, ValueError) as e:
                best["error"] = f"accepted, but not stored in memory: {e}"
                self.log(f"  {best['name']}: {best['error']}")
        if entry is None:
            rec["next_incumbent"] = inc
            return
        v = best["verdict"]
        rec["accepted"] = [{"candidate": best["name"], "entry": entry.key, "gain": v["gain"],
                            "lower_bound": v["lower_bound"], "verdict_id": v["id"]}]
        code = inc["code_entries"] + ([entry.key] if best.get("patch", "").strip() else [])
        rec["next_incumbent"] = {"label": best["name"], "config": {**inc["config"], **best["options"]},
                                 "patch": self._joined_patch(inc, best), "entries": inc["entries"] + [entry.key],
                                 "code_entries": code}

    def store_entry(self, rec: dict, c: dict) -> Entry:
        """The accepted candidate as a memory entry: a new version of the entry it instantiates
        (config-only: no delta), or a new entry carrying its code delta; stored after the reproduce
        check (stock + requirements + delta == the accepted system's code)."""
        inc = rec["incumbent"]
        lineage = Lineage(round=f"{self.dep['name']}/round-{rec['round']}", candidate=c["name"])
        for e in self.store.list():  # resumed after storing, before saving the state
            if e.lineage == lineage:
                return e
        v = c["verdict"]
        evidence = Evidence(deployment=port_deployment(self.dep), gain=v["gain"], lower_bound=v["lower_bound"],
                            verdict_id=v["id"])
        requires = tuple(Requirement(k.split("@")[0], f"=={k.split('@')[1]}") for k in inc["code_entries"])
        if c.get("entry"):
            base = self.store.get(c["entry"].split("@")[0])
            entry = Entry(id=base.id, version=max(self.store.versions(base.id)) + 1, title=base.title,
                          requires=requires, variants=base.variants, contract=base.contract, evidence=evidence,
                          limits=base.limits, unverified=base.unverified, lineage=lineage, reuse_of=c["entry"])
        else:
            slug = f"patch-{self.dep['name'].lower()}-r{rec['round']}".replace("_", "-")
            entry = Entry(id=slug, version=1, title=f"code from {c['name']} (round {rec['round']})",
                          requires=requires, delta=c["patch"], variants={"on": {}}, evidence=evidence,
                          lineage=lineage, unverified=("proposed by an external command; read the delta",))
        check = None
        if self.repo:
            expected = self._expected_tree({"config": {}, "patch": self._joined_patch(inc, c)})
            check = lambda e, order: reproduce(self.repo, self.state["stock_rev"], order, expected)  # noqa: E731
        elif entry.delta or requires:
            raise ValueError("storing an entry with code needs the engine's git repository (--repo)")
        try:
            return self.store.add(entry, reproduce=check)
        except EntryExists:
            return self.store.get(entry.id)

    def _expected_tree(self, system: dict) -> str:
        if not system["patch"].strip():
            return _git(self.repo, "rev-parse", f"{self.state['stock_rev']}^{{tree}}")
        dest = Path(tempfile.mkdtemp(prefix="specpilot-tree-")) / "wt"
        build_worktree(self.repo, self.state["stock_rev"], system["patch"], dest)
        try:
            return tree_of_worktree(dest)
        finally:
            remove_worktree(self.repo, dest)

    # ------------------------------------------------------------------ the loop
    def run_round(self, k: int) -> dict:
        rounds = self.state["rounds"]
        if len(rounds) < k:
            rounds.append({"round": k, "status": "running", "date": time.strftime("%Y-%m-%d %H:%M"),
                           "deployment": self.dep, "incumbent": self.incumbent()})
            self.save()
        rec = rounds[k - 1]
        if rec["status"] == "done":
            return rec
        self.log(f"round {k}: incumbent {rec['incumbent']['label']}")
        if "costmodel" not in rec:
            self.profile(rec)
            self.save()
        cm = rec["costmodel"]
        f = cm["ceiling"]["factors"]
        self.log(f"  τ {cm['tau_current']:.2f} · ×{cm['speedup_current']:.2f} over AR by the cost model · ceiling "
                 f"tree ×{f['tree']:.2f}, kernels ×{f['kernels']:.2f}, off-profile ×{f['off_profile']:.2f} "
                 f"→ direction {rec['direction']}")
        if "candidates" not in rec:
            self.propose(rec)
            self.save()
        live = [c for c in rec["candidates"] if not c["pruned"]]
        self.log(f"  {len(live)} candidates ({len(rec['candidates']) - len(live)} pruned by exact replay / cost model)")
        self.evaluate(rec)
        if "accepted" not in rec:
            self.accept(rec)
            self.save()
        rec["result"] = self.result(rec)
        rec["status"] = "done"
        self.save()
        for a in rec["accepted"]:
            self.log(f"  accepted {a['candidate']} as memory entry {a['entry']} (×{a['gain']:.3f})")
        return rec

    def result(self, rec: dict) -> dict:
        """The next incumbent: τ and speedup over AR by exact replay and the cost model (None where
        they cannot predict it: another drafter or code), and its speedup over stock chained from
        the accepted gains (the final system is also timed against stock and AR directly)."""
        gains = [a["gain"] for r in self.state["rounds"][: rec["round"]] for a in r.get("accepted", [])]
        won = {a["candidate"] for a in rec["accepted"]}
        cm = rec["costmodel"]
        pred = next((c.get("predicted") or {} for c in rec["candidates"] if c["name"] in won),
                    {"tau": cm["tau_current"], "speedup": cm["speedup_current"]})
        chained = 1.0
        for g in gains:
            chained *= g
        return {"tau": pred.get("tau"), "speedup_over_ar": pred.get("speedup"), "speedup_over_stock": chained}

    def final(self) -> dict:
        """The final incumbent against stock and against AR, timed by the controller."""
        inc = self.incumbent()
        out = {"label": inc["label"], "config": inc["config"], "entries": inc["entries"]}
        if "final" in self.state and self.state["final"].get("label") == inc["label"]:
            return self.state["final"]
        reps = self.dep["repeats"]
        try:
            sys_cfg = self.system(inc, "final")
            for key, other in (("speedup_over_stock", self.stock), ("speedup_over_ar", {**self.stock, "mode": "ar"})):
                if key == "speedup_over_stock" and inc["label"] == "stock":
                    out[key] = {"gain": 1.0, "lower_bound": 1.0}
                    continue
                with self.bar(2 * reps, f"final: {inc['label']} vs {'stock' if 'stock' in key else 'AR'}") as b:
                    r = run_pair(sys_cfg, other, self.requests, self.devices, reps, self.dep["timeout"], b.update,
                                 self.dep["warmup"])
                est = stats.gain(r["samples"])
                out[key] = {"gain": est.gain, "lower_bound": est.lower}
        finally:
            for wt in self.worktrees:
                remove_worktree(self.repo, wt)
            self.worktrees.clear()
        self.state["final"] = out
        self.save()
        return out

    def run(self, rounds: int) -> dict:
        try:
            for k in range(1, rounds + 1):
                self.run_round(k)
            final = self.final()
            summary = {"deployment": self.dep, "rounds": self.state["rounds"], "final": final}
            summary["report"] = str(report.write_report(summary, self.dir / "report"))
            self.state["report"] = summary["report"]
            self.save()
            return summary
        finally:
            self.close()


def make_agents(specs: list[str], dep: dict, repo: Path | None, timeout: float = 600.0) -> list:
    agents = []
    for s in specs or ["search"]:
        if s == "search":
            agents.append(SearchAgent(dep["max_candidates"]))
        elif s.startswith("command:"):
            if repo is None:
                raise ValueError("--agent command:CMD needs the engine's git repository (--repo DIR)")
            agents.append(CommandAgent(s[len("command:"):], repo, _git(repo, "rev-parse", "HEAD"), timeout))
        else:
            raise ValueError(f"--agent {s!r}: expected search or command:CMD")
    return agents


def find_repo() -> Path | None:
    """The git checkout this package runs from, if any (editable installs)."""
    here = Path(__file__).resolve().parent.parent
    try:
        return Path(_git(here, "rev-parse", "--show-toplevel"))
    except (gitrun.GitFailed, FileNotFoundError):
        return None
