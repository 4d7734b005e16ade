"""The controller's Prometheus metrics, computed at scrape time from what it keeps (the round
records and their state documents), the GPU workers' health and the queues' depth: every
controller replica reports the same figures, and nothing is lost when a process restarts.
Names follow Prometheus conventions: `specpilot_` prefix, base units, `_total` for counters."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

DURATION_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 3600)


def histogram(name: str, doc: str, values: list[float]) -> HistogramMetricFamily:
    buckets = [(str(float(b)), sum(v <= b for v in values)) for b in DURATION_BUCKETS]
    buckets.append(("+Inf", len(values)))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=sum(values))


def rejection_reason(v: dict) -> str:
    """Why a rejected verdict was rejected, one reason each (the first that applies): `forcing`
    (token forcing failed), `unstable` (a system's outputs changed between timed runs), `noise`
    (the lower bound did not clear the bar of 1 % + stock noise), `other`."""
    if v.get("forcing_passed") is False:
        return "forcing"
    if any("outputs changed between timed runs" in r for r in v.get("reasons") or ()):
        return "unstable"
    lower, threshold = v.get("lower_bound"), v.get("threshold")
    if lower is None or threshold is None or not lower - 1.0 > threshold:
        return "noise"
    return "other"


REJECTION_REASONS = ("noise", "forcing", "unstable", "other")


def candidate_state(c: dict) -> str:
    if c.get("pruned"):
        return "pruned"
    if c.get("verdict"):
        return "accepted" if c["verdict"]["accepted"] else "rejected"
    return "error" if c.get("error") else "pending"


class ControllerCollector:
    """`records`: `records.Records`; `workers()`: the workers' health; `depth(kinds)`: {queue: length}."""

    def __init__(self, records, workers, depth):
        self.records, self.workers, self.depth = records, workers, depth

    def collect(self):
        recs = self.records.list(limit=10_000)
        states = GaugeMetricFamily("specpilot_rounds", "Queued runs by state", labels=["state"])
        for s, n in self.records.counts().items():
            states.add_metric([s], n)
        yield states
        cands = GaugeMetricFamily("specpilot_candidates", "Candidates of all runs by state", labels=["state"])
        verdicts = CounterMetricFamily("specpilot_verdicts", "Sealed verdicts by decision", labels=["decision"])
        tau = GaugeMetricFamily("specpilot_system_tau", "Tokens committed per verify pass of the measured "
                                "incumbent (profile)", labels=["run", "round", "system"])
        tps = GaugeMetricFamily("specpilot_system_tokens_per_second", "Mean throughput the controller timed per "
                                "system in a verdict's paired runs", labels=["run", "round", "system"])
        rejections = CounterMetricFamily("specpilot_rejections", "Rejected verdicts by their first reason (noise: the "
                                         "lower bound did not clear 1 % + stock noise)", labels=["reason"])
        inc_tau = GaugeMetricFamily("specpilot_incumbent_tau", "Tokens committed per verify pass of the incumbent "
                                    "of each deployment's latest measured round", labels=["deployment", "gpu"])
        inc_tps = GaugeMetricFamily("specpilot_incumbent_tokens_per_second", "Mean throughput the controller timed "
                                    "for the incumbent of each deployment's latest judged round",
                                    labels=["deployment", "gpu"])
        counts = {"pruned": 0, "accepted": 0, "rejected": 0, "error": 0, "pending": 0}
        reasons = dict.fromkeys(REJECTION_REASONS, 0)
        latest_tau: dict[tuple, tuple] = {}  # (deployment, gpu) -> (updated_at, τ)
        latest_tps: dict[tuple, tuple] = {}
        judge, profile = [], []
        for rec in recs:
            dep = rec.get("deployment") or {}
            which = (str(dep.get("name", "")), str(dep.get("gpu", "")))
            for r in (rec.get("doc") or {}).get("rounds", []):
                when = (rec.get("updated_at") or 0.0, r.get("round", 0))
                known = r.get("costmodel") and r["costmodel"].get("tau_current") is not None  # a server: none
                if known and when >= latest_tau.get(which, ((-1.0, -1), None))[0]:
                    latest_tau[which] = (when, r["costmodel"]["tau_current"])
                timed = [c["verdict"]["incumbent_tps"] for c in r.get("candidates", [])
                         if c.get("verdict") and c["verdict"].get("incumbent_tps") is not None]
                if timed and when >= latest_tps.get(which, ((-1.0, -1), None))[0]:
                    latest_tps[which] = (when, sum(timed) / len(timed))
                if known:
                    tau.add_metric([rec["id"], str(r["round"]), r["incumbent"]["label"]], r["costmodel"]["tau_current"])
                if "profile_seconds" in r:
                    profile.append(r["profile_seconds"])
                for c in r.get("candidates", []):
                    counts[candidate_state(c)] += 1
                    v = c.get("verdict")
                    if v and not v.get("accepted"):
                        reasons[rejection_reason(v)] += 1
                    if v:
                        if "seconds" in v:
                            judge.append(v["seconds"])
                        for system, key in ((c["name"], "candidate_tps"), (r["incumbent"]["label"], "incumbent_tps")):
                            if v.get(key) is not None:
                                tps.add_metric([rec["id"], str(r["round"]), system], v[key])
        for s, n in counts.items():
            cands.add_metric([s], n)
        verdicts.add_metric(["accepted"], counts["accepted"])
        verdicts.add_metric(["rejected"], counts["rejected"])
        for reason, n in reasons.items():
            rejections.add_metric([reason], n)
        for which, (_, value) in sorted(latest_tau.items()):
            inc_tau.add_metric(list(which), value)
        for which, (_, value) in sorted(latest_tps.items()):
            inc_tps.add_metric(list(which), value)
        yield cands
        yield verdicts
        yield rejections
        yield tau
        yield tps
        yield inc_tau
        yield inc_tps
        yield histogram("specpilot_judge_duration_seconds", "Time to judge one candidate (paired runs and token "
                        "forcing)", judge)
        yield histogram("specpilot_profile_duration_seconds", "Time to profile a round's incumbent", profile)
        health = GaugeMetricFamily("specpilot_worker_healthy", "1 when the GPU worker answers its health check",
                                   labels=["address", "kind"])
        workers = self.workers()
        for w in workers:
            health.add_metric([w["address"], w.get("kind") or ""], 1.0 if w["healthy"] else 0.0)
        yield health
        depth = GaugeMetricFamily("specpilot_queue_depth", "Tasks waiting in a queue", labels=["queue"])
        for q, n in self.depth([w["kind"] for w in workers if w.get("kind")]).items():
            depth.add_metric([q], n)
        yield depth
