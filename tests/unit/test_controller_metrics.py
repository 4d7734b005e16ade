"""The controller's scrape-time metrics that the Grafana dashboard and the alert rules read:
rejections by reason (`noise` for a lower bound inside the bar), the incumbent's τ and tokens/s per
deployment (its latest round), rounds by every state."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from specpilot.services.controller.metrics import ControllerCollector, rejection_reason


def verdict(accepted, lower, threshold=0.05, forcing=True, reasons=(), inc_tps=100.0, seconds=30.0):
    return {"accepted": accepted, "gain": lower + 0.02, "lower_bound": lower, "threshold": threshold,
            "forcing_passed": forcing, "reasons": list(reasons), "candidate_tps": 110.0, "incumbent_tps": inc_tps,
            "seconds": seconds}


def record(ident, name, gpu, updated, rounds):
    return {"id": ident, "deployment": {"name": name, "gpu": gpu}, "updated_at": updated, "doc": {"rounds": rounds}}


def rnd(k, tau, candidates):
    return {"round": k, "incumbent": {"label": f"inc{k}"}, "costmodel": {"tau_current": tau},
            "candidates": [{"name": f"c{i}", "pruned": None, "error": None, "verdict": v}
                           for i, v in enumerate(candidates)]}


class FakeRecords:
    def __init__(self, recs):
        self.recs = recs

    def list(self, limit=200):
        return self.recs

    def counts(self):
        return {"queued": 1, "running": 0, "done": 2, "failed": 1, "cancelled": 0}


def scrape(recs) -> str:
    reg = CollectorRegistry()
    reg.register(ControllerCollector(FakeRecords(recs), lambda: [{"address": "w:1", "kind": "h200", "healthy": True}],
                                     lambda kinds: {f"rounds.{k}": 3 for k in kinds}))
    return generate_latest(reg).decode()


def test_rejection_reasons():
    assert rejection_reason(verdict(False, 1.01)) == "noise"  # lower bound − 1 = 0.01, not > 0.05
    assert rejection_reason(verdict(False, 1.01, forcing=False)) == "forcing"
    assert rejection_reason(verdict(False, 1.2, reasons=["a system's outputs changed between timed runs: …"])) == \
        "unstable"
    assert rejection_reason(verdict(False, 1.2)) == "other"


def test_rejections_incumbent_per_deployment_and_every_round_state():
    recs = [
        record("old", "qwen", "h200", 100.0, [rnd(1, 2.0, [verdict(False, 1.0, inc_tps=50.0)])]),
        record("new", "qwen", "h200", 200.0, [rnd(1, 2.5, [verdict(True, 1.2, inc_tps=80.0)]),
                                              rnd(2, 3.25, [verdict(False, 1.01, inc_tps=90.0),
                                                            verdict(False, 1.3, forcing=False, inc_tps=110.0)])]),
        record("r", "llama", "rtx-pro-6000", 150.0, [rnd(1, 1.75, [])]),
    ]
    m = scrape(recs)
    assert 'specpilot_verdicts_total{decision="accepted"} 1.0' in m
    assert 'specpilot_verdicts_total{decision="rejected"} 3.0' in m
    assert 'specpilot_rejections_total{reason="noise"} 2.0' in m
    assert 'specpilot_rejections_total{reason="forcing"} 1.0' in m
    assert 'specpilot_rejections_total{reason="unstable"} 0.0' in m
    # the newest run's last round: τ 3.25, tokens/s the mean of that round's incumbent timings
    assert 'specpilot_incumbent_tau{deployment="qwen",gpu="h200"} 3.25' in m
    assert 'specpilot_incumbent_tokens_per_second{deployment="qwen",gpu="h200"} 100.0' in m
    assert 'specpilot_incumbent_tau{deployment="llama",gpu="rtx-pro-6000"} 1.75' in m
    assert 'specpilot_incumbent_tokens_per_second{deployment="llama"' not in m  # nothing timed yet
    assert 'specpilot_rounds{state="failed"} 1.0' in m and 'specpilot_rounds{state="cancelled"} 0.0' in m
    assert 'specpilot_queue_depth{queue="rounds.h200"} 3.0' in m


def test_no_records_still_exports_every_family():
    m = scrape([])
    for name in ("specpilot_rejections_total", "specpilot_incumbent_tau", "specpilot_incumbent_tokens_per_second",
                 "specpilot_verdicts_total"):
        assert f"# TYPE {name} " in m
