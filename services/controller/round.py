"""The round: the product's main job, written once against the services' interfaces (`ports.py`).

One round, for a deployment and its incumbent (stock at first):

  profile (the GPU worker's Profile call on the incumbent) → cost model, ceiling, direction
  (planner) → agents propose → the controller evaluates each candidate (token forcing, paired
  swapped runs against the incumbent, stock-vs-stock noise measured once per round) → the
  accepted candidate with the highest lower bound becomes the incumbent → a memory entry
  (stored only if the reproduce check passes) → the round's report.

Several rounds run in a row. Every step's result is saved (`state`) as soon as it exists, so a
killed run resumes where it stopped: finished steps are read back, not measured again, and a
verdict already sealed (a file under `<run>/verdicts/` that names the round and the candidate) is
read back, never judged twice. The round reaches every system through the GPU worker interface
(local processes or gRPC workers), the memory through its interface (in-process or REST) and the
planner through its own (in-process or a Celery task): `specpilot/entrypoints/bootstrap.py` picks them.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from specpilot import gitrun
from specpilot.devices import device_list
from specpilot.progress import progress_bar
from specpilot.systemspec import ServerSystem, SystemSpecError, is_server, parse_system, server_program, with_options

from . import stats
from .pairing import baseline, judge, reference, run_pair, system, write_verdict
from .ports import Ports

BUDGETS = ("chain", "best-first:16", "best-first:32", "best-first:63")
DEPLOYMENT_DEFAULTS = {
    "drafter": None, "drafters": {}, "gpu": "cpu", "devices": "cpu,cpu", "batch": 1, "workload": "humaneval",
    "prompts": 3, "max_new_tokens": 48, "draft_len": 16, "repeats": 6, "warmup": 1, "budgets": list(BUDGETS),
    "timeout": 600.0, "max_candidates": 3, "stock": None,
}  # "drafter": None is a deployment without a drafter: plain AR decoding; "stock": None, our engine's stock
REQUIRED = ("name", "target")
AR_STOCK_NOTE = "stock decodes AR: the same comparison as over stock, timed once"


class DeploymentError(ValueError):
    """A deployment file is malformed; the message names the field and what to write."""


def load_deployment(source: str | Path | dict, base: Path | None = None) -> dict:
    """A deployment from a JSON file (paths relative to the file) or a dict, with defaults filled.

    `drafter` is optional: absent or null, the deployment serves plain AR decoding (its stock is
    mode "ar"); `drafters` may still name drafters by kind for the memory's variants to switch to.
    `stock` is optional: a server system ({"server": {...}}, `specpilot.systemspec`) to judge in
    place of our engine's stock; it serves `target` unless it names its own."""
    if isinstance(source, dict):
        raw, base = dict(source), base or Path.cwd()
    else:
        path = Path(source)
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise DeploymentError(f"{path}: cannot read the deployment ({e}); write a JSON object with at least "
                                  f'"name" and "target" (a checkpoint folder)') from None
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
    d = dep["drafter"]
    if d is not None and (not isinstance(d, str) or not d):
        raise DeploymentError(f"deployment: field 'drafter' = {d!r}: expected a checkpoint folder, 'ngram', or null "
                              "(absent) for plain AR decoding")
    dep["drafter"] = d if d in (None, "ngram") else folder(d, "drafter")
    if not isinstance(dep["drafters"], dict):
        raise DeploymentError('deployment: "drafters" maps drafter kinds to folders, e.g. {"block_markov": "DIR"}')
    dep["drafters"] = {k: folder(v, f"drafters.{k}") for k, v in dep["drafters"].items()}
    w = dep["workload"]
    if not isinstance(w, str) or not w:
        raise DeploymentError(f"deployment: field 'workload' = {w!r}: expected humaneval, stdlib or a FILE.jsonl")
    if w not in ("humaneval", "stdlib"):  # a workload file, relative to the deployment file like the folders
        dep["workload"] = str(Path(w) if Path(w).is_absolute() else base / w)
    for k in ("prompts", "max_new_tokens", "draft_len", "repeats", "warmup", "max_candidates"):
        if not _positive(dep[k]):
            raise DeploymentError(f"deployment: {k!r} must be a positive integer, got {dep[k]!r}")
    b = dep["batch"]
    if isinstance(b, list) and len(b) == 1:
        b = dep["batch"] = b[0]
    if not (_positive(b) or isinstance(b, list) and b and all(map(_positive, b)) and len(set(b)) == len(b)):
        raise DeploymentError(f"deployment: 'batch' = {b!r}: expected a positive integer (requests decoded at once) "
                              "or a list of distinct ones, e.g. [1, 16], for a dispatch table by batch size")
    if isinstance(b, list):
        dep["batch"] = sorted(b)
    if max(batch_sizes(dep)) > dep["prompts"]:
        raise DeploymentError(f"deployment: batch {max(batch_sizes(dep))} needs at least as many prompts; "
                              f"'prompts' is {dep['prompts']}")
    if dep["stock"] is not None:
        dep["stock"] = server_stock(dep["stock"], dep["target"], folder)
    if dep["repeats"] < 2:
        raise DeploymentError("deployment: repeats must be at least 2 (the bound is a t-interval over repeats)")
    device_list(dep["devices"])
    if "family" not in dep:
        dep["family"] = json.loads((Path(dep["target"]) / "config.json").read_text()).get("model_type", "unknown")
    return dep


def server_stock(raw, target: str, folder) -> dict:
    """A deployment's `stock` field, checked: a server system serving `target` unless it names
    its own checkpoint (relative to the deployment file, like the other folders)."""
    try:
        spec = parse_system(raw, "deployment: stock")
    except SystemSpecError as e:
        raise DeploymentError(str(e)) from None
    if not isinstance(spec, ServerSystem):
        raise DeploymentError("deployment: 'stock' names a server system ({\"server\": {...}}); our engine's stock "
                              "comes from 'target', 'drafter' and 'draft_len'")
    out = spec.to_json()
    out["server"]["target"] = folder(spec.target, "stock.server.target") if spec.target else target
    return out


def _positive(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def batch_sizes(dep: dict) -> list[int]:
    """The batch sizes a deployment is judged at: one, or each of a list (a dispatch table)."""
    return list(dep["batch"]) if isinstance(dep["batch"], list) else [dep["batch"]]


def requests_of(dep: dict) -> list[dict]:
    from specpilot.zoo.workloads import humaneval, read_workload, stdlib_completion

    w = dep["workload"]
    reqs = humaneval(dep["prompts"]) if w == "humaneval" else stdlib_completion(dep["prompts"]) \
        if w == "stdlib" else read_workload(w)[: dep["prompts"]]
    return [{**r.to_json(), "max_new_tokens": dep["max_new_tokens"]} for r in reqs]


def stock_config(dep: dict) -> dict:
    """The deployment's stock system: its server system when it names one, else chain speculation
    with its drafter, or plain AR decoding (no drafter, no draft length) when it names none."""
    if dep.get("stock"):
        return copy.deepcopy(dep["stock"])
    device = "cpu" if dep["devices"].split(",")[0].strip().startswith("cpu") else "cuda"
    common = {"target": dep["target"], "max_new_tokens": dep["max_new_tokens"], "device": device}
    if dep["drafter"] is None:
        return {**common, "mode": "ar"}
    return {**common, "drafter": dep["drafter"], "mode": "chain", "draft_len": dep["draft_len"]}


def server_costmodel(config: dict) -> dict:
    """The round's cost model for a server incumbent: none can be measured (the server runs its
    steps inside), so the direction is its speculative settings and timing alone judges them."""
    program = server_program(config) or "unknown"
    return {"direction": "server", "server_program": program, "ceiling": {"factors": {"server": 1.0}},
            "tau_current": None, "speedup_current": None, "budgets": [],
            "note": f"a {program} server: its steps run inside the server, so there is no profile and no ceiling; "
                    "the candidates are its speculative settings, judged by paired timing and token forcing"}


def port_deployment(dep: dict) -> dict:
    return {"family": dep["family"], "device": dep["gpu"], "batch": dep["batch"], "name": dep["name"]}


def _git(repo, *args) -> str:
    return gitrun.run(repo, *args, check=True).stdout.strip()


class Cancelled(Exception):
    """The round was cancelled; it stops between two steps."""


def _mean(xs) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


def demo_deployment() -> dict:
    """The embedded default: the shipped micro dense target with its block+Markov drafter (stock:
    chain speculation along the drafter's Markov head), two CPU cores standing for two GPUs."""
    from specpilot import zoo

    shipped = Path(zoo.__file__).resolve().parent / "checkpoints" / "micro"
    return {"name": "micro-dense-cpu", "target": str(shipped / "dense"), "drafter": str(shipped / "dense-block-markov"),
            "drafters": {"block_markov": str(shipped / "dense-block-markov")}, "gpu": "cpu", "devices": "cpu,cpu",
            "workload": "humaneval", "prompts": 3, "max_new_tokens": 96, "repeats": 14, "max_candidates": 2}


def verdict_key(dep: dict, k: int, candidate: str) -> str:
    return f"{dep['name']}/round-{k}/{candidate}"


def sealed_verdict(folder: Path, key: str) -> tuple[Path, dict] | None:
    """The verdict already written for `key`, if any (a killed run may have sealed it just before)."""
    for path in sorted(Path(folder).glob("*.json")):
        v = json.loads(path.read_text())
        if v.get("key") == key:
            return path, v
    return None


class Round:
    """Runs rounds for one deployment in `run_dir`, resuming from its saved state.

    `ports`: the GPU workers, the memory and the planner. `state`: where the run's state document
    is kept (`load()`, `save(doc)`: a round record, `records.RecordState`). `emit(kind, data)` is
    told of every step, candidate and verdict as they happen; `cancelled()` is asked between steps."""

    def __init__(self, dep: dict, run_dir: Path, ports: Ports, state, agents: list[str] | None = None,
                 repo: Path | None = None, log=print, progress: bool = True, emit=None, cancelled=None):
        if isinstance(dep["batch"], list):
            raise ValueError("a Round judges one batch size; run_deployment runs one per batch size")
        self.dep, self.dir, self.log, self.progress = dep, Path(run_dir), log or (lambda *a: None), progress
        self.batch = dep["batch"]
        self.workers, self.memory, self.planner = ports.workers, ports.memory, ports.planner
        self.agents = list(agents or ["search"])
        self.emit = emit or (lambda kind, data: None)
        self.cancelled = cancelled or (lambda: False)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.store_state = state
        self.repo = Path(repo) if repo else None
        self.state = self.store_state.load() or {}
        if self.state and self.state["deployment"] != dep:
            raise ValueError(f"{self.dir} holds a run of another deployment; use a new --run-dir")
        stock_rev = _git(self.repo, "rev-parse", "HEAD") if self.repo else None
        self.state.setdefault("deployment", dep)
        self.state.setdefault("stock_rev", stock_rev)
        self.state.setdefault("rounds", [])
        self.stock = stock_config(dep)
        self.requests = requests_of(dep)
        self.devices = self.workers.devices(dep)

    # ------------------------------------------------------------------ state
    def save(self) -> None:
        self.store_state.save(self.state)

    def check_cancelled(self) -> None:
        if self.cancelled():
            raise Cancelled("cancelled")

    def incumbent(self) -> dict:
        done = [r for r in self.state["rounds"] if r.get("status") == "done"]
        if done and done[-1].get("next_incumbent"):
            return done[-1]["next_incumbent"]
        return {"label": "stock", "config": dict(self.stock), "patch": "", "entries": [], "code_entries": []}

    def system(self, inc_or_cand: dict) -> dict:
        """The system to build: its engine config, its code patch and the pinned stock revision."""
        return system(inc_or_cand["config"], inc_or_cand.get("patch", ""), self.state["stock_rev"])

    def bar(self, total: int, desc: str):
        return progress_bar(total, desc, "run", disable=not self.progress, leave=False)

    # ------------------------------------------------------------------ steps
    def profile(self, rec: dict) -> None:
        inc = rec["incumbent"]
        self.emit("step", {"round": rec["round"], "step": "profile", "system": inc["label"]})
        t0 = time.perf_counter()
        if is_server(inc["config"]):  # its steps run inside the server: nothing to profile
            rec["measurement"], rec["profile_seconds"] = None, 0.0
            rec["costmodel"] = server_costmodel(inc["config"])
            rec["direction"] = rec["costmodel"]["direction"]
            return
        w = self.workers.start(self.system(inc), self.devices[0], self.dep["timeout"])
        try:
            with self.bar(1, f"round {rec['round']}: profiling {inc['label']}") as b:
                measurement = w.profile({"requests": self.requests, "new_tokens": self.dep["max_new_tokens"],
                                         "budgets": self.dep["budgets"], "replay": self._replays(),
                                         "batch": self.batch})  # at the batch its candidates are timed
                b.update(1)
        finally:
            w.close()
        rec["measurement"] = measurement
        rec["profile_seconds"] = time.perf_counter() - t0
        rec["costmodel"] = self.planner.analyze(measurement, self.dep["gpu"])
        rec["direction"] = rec["costmodel"]["direction"]

    def _replays(self) -> list[str]:
        """Every tree policy a stored variant names (exact replay prices them without running)."""
        out = []
        for e in self.memory.entries():
            for opts in e["variants"].values():
                if opts.get("mode") == "tree" and not opts.get("tree", "").startswith("sequoia"):
                    out.append(opts["tree"])
        return sorted(set(out)) + ["chain"]

    def propose(self, rec: dict) -> None:
        self.emit("step", {"round": rec["round"], "step": "propose"})
        inc = rec["incumbent"]
        tried = tuple(c["name"] for r in self.state["rounds"] if r is not rec for c in r.get("candidates", [])
                      if c.get("verdict") or c.get("error"))
        ctx = {"round": rec["round"], "deployment": self.dep, "incumbent": inc["config"],
               "incumbent_patch": inc["patch"], "costmodel": rec["costmodel"], "direction": rec["direction"],
               "memory": self.memory.port(port_deployment(self.dep)), "tried": list(tried)}
        out = self.planner.propose(ctx, self.agents, str(self.repo) if self.repo else None, self.state["stock_rev"],
                                   self.dep["timeout"])
        rec["agents"] = out["logs"]
        rec["candidates"] = [{**c, "verdict": None, "error": None} for c in out["candidates"]]
        for c in rec["candidates"]:
            self.emit("candidate", {"round": rec["round"], "name": c["name"], "pruned": c["pruned"]})

    def evaluate(self, rec: dict) -> None:
        if "baseline" not in self.state:  # stock against itself: the same for every round of the run
            self.emit("step", {"round": rec["round"], "step": "baseline"})
            with self.bar(2 * self.dep["repeats"], "stock noise (stock vs stock)") as b:
                self.state["baseline"] = baseline(system(self.stock, "", self.state["stock_rev"]), self.requests,
                                                  self.devices, self.dep["repeats"], self.dep["timeout"], b.update,
                                                  self.dep["warmup"], workers=self.workers, batch=self.batch)
            self.save()
        if "power" not in self.state:  # what this design can accept at the noise just measured
            noise = stats.gain([stats.PairedSample(**x) for x in self.state["baseline"]["samples"]])
            cpu = self.devices[0].startswith("cpu") or self.dep["gpu"] == "cpu"
            self.state["power"] = stats.power_check(noise, "cpu" if cpu else "gpu")
            warning = stats.power_warning(self.state["power"])
            if warning:
                self.log(f"  {warning}")
            self.save()
        inc = rec["incumbent"]
        for c in rec["candidates"]:
            if c["pruned"] or c["verdict"] or c["error"]:
                continue
            self.check_cancelled()
            key = verdict_key(self.dep, rec["round"], c["name"])
            self.emit("step", {"round": rec["round"], "step": "judge", "candidate": c["name"]})
            t0 = time.perf_counter()
            try:
                sealed = sealed_verdict(self.dir / "verdicts", key)
                if sealed:  # sealed before a kill, not yet in the state: read back, never judged again
                    path, v = sealed
                else:
                    cand = {"config": with_options(inc["config"], c["options"]), "patch": self._joined_patch(inc, c)}
                    with self.bar(2 * self.dep["repeats"], f"round {rec['round']}: {c['name']}") as b:
                        v = judge(self.system(cand), self.system(inc), system(self.stock, "", self.state["stock_rev"]),
                                  self.requests, self.devices, self.dep["repeats"], timeout=self.dep["timeout"],
                                  progress=b.update, base=self.state["baseline"], warmup=self.dep["warmup"],
                                  workers=self.workers, batch=self.batch)
                    path = write_verdict({**v, "key": key}, self.dir / "verdicts")
                c["verdict"] = {"path": str(path), "id": path.stem, "accepted": v["accepted"], "gain": v["gain"],
                                "lower_bound": v["lower_bound"], "threshold": v["threshold"],
                                "stock_noise": v["stock_noise"], "reasons": v["reasons"],
                                "forcing_passed": v["forcing"]["passed"],
                                "candidate_tps": _mean(x["candidate_tps"] for x in v["samples"]),
                                "incumbent_tps": _mean(x["incumbent_tps"] for x in v["samples"]),
                                "seconds": time.perf_counter() - t0}
                mark = "ACCEPTED" if v["accepted"] else "rejected"
                self.log(f"  {c['name']}: ×{v['gain']:.3f} (95 % lower bound ×{v['lower_bound']:.3f}, "
                         f"needs > ×{1 + v['threshold']:.3f}) → {mark}")
            except (RuntimeError, ValueError) as e:  # a build refused, a worker died or timed out
                c["error"] = f"{type(e).__name__}: {e}"
                self.log(f"  {c['name']}: could not be evaluated: {e}")
            self.emit("verdict", {"round": rec["round"], "name": c["name"], "verdict": c["verdict"],
                                  "error": c["error"]})
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
            except (RuntimeError, ValueError) as e:
                best["error"] = f"accepted, but not stored in memory: {e}"
                self.log(f"  {best['name']}: {best['error']}")
        if entry is None:
            rec["next_incumbent"] = inc
            return
        key = f"{entry['id']}@{entry['version']}"
        v = best["verdict"]
        rec["accepted"] = [{"candidate": best["name"], "entry": key, "gain": v["gain"],
                            "lower_bound": v["lower_bound"], "verdict_id": v["id"]}]
        code = inc["code_entries"] + ([key] if best.get("patch", "").strip() else [])
        rec["next_incumbent"] = {"label": best["name"], "config": with_options(inc["config"], best["options"]),
                                 "patch": self._joined_patch(inc, best), "entries": inc["entries"] + [key],
                                 "code_entries": code}

    def store_entry(self, rec: dict, c: dict) -> dict:
        """The accepted candidate as a memory entry: a new version of the entry it instantiates
        (config-only: no delta), or a new entry carrying its code delta; stored after the reproduce
        check (stock + requirements + delta == the accepted system's code)."""
        inc = rec["incumbent"]
        lineage = {"round": f"{self.dep['name']}/round-{rec['round']}", "candidate": c["name"]}
        for e in self.memory.entries():  # resumed after storing, before saving the state
            if e.get("lineage") == lineage:
                return e
        v = c["verdict"]
        evidence = {"deployment": port_deployment(self.dep), "gain": v["gain"], "lower_bound": v["lower_bound"],
                    "verdict_id": v["id"]}
        requires = [{"id": k.split("@")[0], "constraint": f"=={k.split('@')[1]}"} for k in inc["code_entries"]]
        if c.get("entry"):
            base = self.memory.get(c["entry"].split("@")[0])
            entry = {**base, "version": max(self.memory.versions(base["id"])) + 1, "requires": requires,
                     "evidence": evidence, "lineage": lineage, "reuse_of": c["entry"]}
        else:
            slug = f"patch-{self.dep['name'].lower()}-r{rec['round']}".replace("_", "-")
            entry = {"id": slug, "version": 1, "title": f"code from {c['name']} (round {rec['round']})",
                     "requires": requires, "delta": c["patch"], "variants": {"on": {}}, "evidence": evidence,
                     "lineage": lineage, "unverified": ["proposed by an external command; read the delta"]}
        expected = None
        if entry.get("delta", "").strip() or requires:
            if not self.repo:
                raise ValueError("storing an entry with code needs the engine's git repository (--repo)")
            expected = self.workers.code_tree(self.state["stock_rev"], self._joined_patch(inc, c))
        return self.memory.store(entry, expected)

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
        self.check_cancelled()
        if "costmodel" not in rec:
            self.profile(rec)
            self.save()
        cm = rec["costmodel"]
        f = cm["ceiling"]["factors"]
        tree_note = cm["ceiling"].get("notes", {}).get("tree")
        if cm["direction"] == "server":
            self.log(f"  {cm['note']}")
        else:
            self.log(f"  τ {cm['tau_current']:.2f} · ×{cm['speedup_current']:.2f} over AR by the cost model · ceiling "
                     f"tree ×{f['tree']:.2f}{f' ({tree_note})' if tree_note else ''}, kernels ×{f['kernels']:.2f}, "
                     f"off-profile ×{f['off_profile']:.2f}, rows ×{f.get('rows', 1.0):.2f} at batch "
                     f"{cm.get('batch', 1)} → direction {rec['direction']}")
        self.check_cancelled()
        if "candidates" not in rec:
            self.propose(rec)
            self.save()
        live = [c for c in rec["candidates"] if not c["pruned"]]
        self.log(f"  {len(live)} candidates ({len(rec['candidates']) - len(live)} pruned by exact replay / cost model)")
        self.evaluate(rec)
        self.check_cancelled()
        if "accepted" not in rec:
            self.emit("step", {"round": k, "step": "accept"})
            self.accept(rec)
            self.save()
        rec["result"] = self.result(rec)
        rec["status"] = "done"
        self.save()
        for a in rec["accepted"]:
            self.log(f"  accepted {a['candidate']} as memory entry {a['entry']} (×{a['gain']:.3f})")
        self.emit("step", {"round": k, "step": "done", "accepted": [a["entry"] for a in rec["accepted"]]})
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
        """The final incumbent against stock and against AR, timed by the controller. When stock
        decodes AR the two are one comparison: it is timed once, and the AR figure says so."""
        inc = self.incumbent()
        out = {"label": inc["label"], "config": inc["config"], "entries": inc["entries"]}
        if "final" in self.state and self.state["final"].get("label") == inc["label"]:
            return self.state["final"]
        self.emit("step", {"step": "final", "system": inc["label"]})
        reps = self.dep["repeats"]
        stock = system(self.stock, "", self.state["stock_rev"])
        ar_stock = self.stock.get("mode") == "ar"
        others = [("speedup_over_stock", stock)]
        if not ar_stock:
            others.append(("speedup_over_ar", reference(stock)))
        for key, other in others:
            if key == "speedup_over_stock" and inc["label"] == "stock":
                out[key] = {"gain": 1.0, "lower_bound": 1.0}
                continue
            self.check_cancelled()
            with self.bar(2 * reps, f"final: {inc['label']} vs {'stock' if 'stock' in key else 'AR'}") as b:
                r = run_pair(self.system(inc), other, self.requests, self.devices, reps, self.dep["timeout"], b.update,
                             self.dep["warmup"], workers=self.workers, batch=self.batch)
            est = stats.gain(r["samples"])
            out[key] = {"gain": est.gain, "lower_bound": est.lower, "against": other.to_json()}
            if key == "speedup_over_ar":  # the other way round: does AR beat the final system?
                out[key]["ar_lower_bound"] = stats.gain(stats.swapped(r["samples"])).lower
        if ar_stock:
            out["speedup_over_ar"] = {**out["speedup_over_stock"], "note": AR_STOCK_NOTE}
        self.state["final"] = out
        self.save()
        return out

    def run(self, rounds: int) -> dict:
        for k in range(1, rounds + 1):
            self.run_round(k)
        final = self.final()
        summary = {"deployment": self.dep, "rounds": self.state["rounds"], "final": final,
                   "power": self.state.get("power")}
        self.emit("step", {"step": "report"})
        summary["report"] = self.planner.report(summary, str(self.dir / "report"))
        self.state["report"] = summary["report"]
        self.save()
        return summary


class LaneState:
    """One batch size's state document inside a run's state document (`doc["lanes"][batch]`)."""

    def __init__(self, state, batch: int):
        self.state, self.key = state, str(batch)

    def load(self) -> dict | None:
        return ((self.state.load() or {}).get("lanes") or {}).get(self.key)

    def save(self, lane: dict) -> None:
        doc = self.state.load() or {}
        doc.setdefault("lanes", {})[self.key] = lane
        self.state.save(doc)


def lane(dep: dict, batch: int) -> dict:
    """The deployment at one of its batch sizes: its own name, so verdicts and memory lineage say it."""
    return {**dep, "batch": batch, "name": f"{dep['name']}-b{batch}"}


def run_deployment(dep: dict, run_dir: Path, ports: Ports, state, rounds: int, **kw) -> dict:
    """Rounds for a deployment: one `Round` at a single batch size; at a list of batch sizes one
    `Round` per size (each under `run_dir/batch-N`, its state a lane of the run's document) and
    the dispatch table of their final systems."""
    if not isinstance(dep["batch"], list):
        return Round(dep, run_dir, ports, state, **kw).run(rounds)
    lanes = [(b, Round(lane(dep, b), Path(run_dir) / f"batch-{b}", ports, LaneState(state, b), **kw).run(rounds))
             for b in dep["batch"]]
    table = dispatch_table([(b, s["final"]) for b, s in lanes])
    doc = state.load() or {}
    doc.update(deployment=dep, dispatch=table)
    state.save(doc)
    return {"deployment": dep, "lanes": [{"batch": b, **s} for b, s in lanes], "dispatch": table}


def dispatch_table(finals: list[tuple[int, dict]]) -> dict:
    """The system to run per batch-size range, from each measured batch size's final system (in
    increasing batch order): an entry covers its batch size up to the next one's; the first starts
    at 1, the last has no end. Where AR beat the final system with 95 % confidence (its lower bound
    over it above 1), the entry is plain AR: no speculation at those batch sizes."""
    entries = []
    for i, (b, f) in enumerate(finals):
        over_ar = f.get("speedup_over_ar") or {}
        ar = (over_ar.get("ar_lower_bound") or 0.0) > 1.0 and f["config"].get("mode") != "ar"
        config = f["config"] if not ar else {"target": f["config"]["server"]["target"], "mode": "ar"} \
            if is_server(f["config"]) else \
            {k: v for k, v in f["config"].items() if k not in ("drafter", "draft_len", "tree")} | {"mode": "ar"}
        entries.append({"min_batch": 1 if i == 0 else b, "max_batch": finals[i + 1][0] - 1 if i + 1 < len(finals)
                        else None, "measured_at": b, "label": "ar (no speculation)" if ar else f["label"],
                        "config": config, "speedup_over_stock": f["speedup_over_stock"], "speedup_over_ar": over_ar})
    systems = {json.dumps(e["config"], sort_keys=True) for e in entries}
    note = None
    if len(entries) > 1 and len(systems) == 1:
        figures = ", ".join(f"×{e['speedup_over_stock']['gain']:.3f} over stock at batch {e['measured_at']}"
                            for e in entries)
        note = f"one system wins at every batch size measured: {entries[0]['label']} ({figures})"
    return {"entries": entries, "note": note}


def dispatch_for(table: dict, batch: int) -> dict:
    """The entry of a dispatch table that serves a live batch of `batch` requests."""
    for e in table["entries"]:
        if batch >= e["min_batch"] and (e["max_batch"] is None or batch <= e["max_batch"]):
            return e
    raise ValueError(f"batch {batch}: no entry of the dispatch table covers it")


def summary_json(summary: dict) -> dict:
    """A run as `specpilot demo --json` and the controller's REST API show it (a run still in
    progress shows what it has so far)."""
    if "lanes" in summary:  # a dispatch table: each batch size's run, then the table
        return {"dispatch": summary.get("dispatch"),
                "lanes": [{"batch": s["batch"], **summary_json(s)} for s in summary["lanes"]]}
    final = summary.get("final") or {}

    def verdict(c, k):
        return (c.get("verdict") or {}).get(k)

    return {
        "rounds": [{"round": r.get("round"), "status": r.get("status"), "direction": r.get("direction"),
                    "candidates": [{"name": c["name"], "pruned": c.get("pruned"), "error": c.get("error"),
                                    "accepted": bool(verdict(c, "accepted")), "gain": verdict(c, "gain"),
                                    "lower_bound": verdict(c, "lower_bound")}
                                   for c in r.get("candidates", [])],
                    "accepted": [{"entry": a["entry"], "gain": a["gain"], "lower_bound": a["lower_bound"]}
                                 for a in r.get("accepted", [])]}
                   for r in summary.get("rounds", [])],
        "speedup_over_stock": (final.get("speedup_over_stock") or {}).get("gain"),
        "speedup_over_ar": (final.get("speedup_over_ar") or {}).get("gain"),
        "final": final,
        "power": summary.get("power"),
        "report": summary.get("report"),
    }
