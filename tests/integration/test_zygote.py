"""Workers forked by the zygote (services/gpu_worker/zygote.py) behave as fresh interpreters would:
the same tokens, the parent's working directory of the moment, a fresh interpreter whenever a fork
could not honour the start-up environment, and a new zygote when the last one is gone."""

import subprocess
from pathlib import Path

from specpilot.services.gpu_worker import systems
from specpilot.services.gpu_worker.systems import ZYGOTE, Forked, SystemProcess

SHIPPED = Path(systems.__file__).resolve().parents[2] / "zoo" / "checkpoints" / "micro"
REQUEST = {"id": "a", "prompt": "def add(a, b):", "max_new_tokens": 6}


def generate(engine: dict) -> tuple[type, list[int]]:
    w = SystemProcess(engine, "cpu:0", 120)
    try:
        outs, _ = w.generate([REQUEST])
        return type(w.proc), outs[0]
    finally:
        w.close()
        assert w.proc.poll() is not None  # closed means gone


def test_a_forked_worker_runs_in_the_parents_cwd_and_gives_a_fresh_interpreters_tokens(monkeypatch):
    generate({"target": str(SHIPPED / "dense"), "mode": "ar"})  # the zygote is up
    monkeypatch.chdir(SHIPPED)  # a relative checkpoint path resolves only in the parent's cwd of now
    kind, forked = generate({"target": "dense", "drafter": "dense-block-markov", "mode": "chain"})
    assert kind is Forked and len(forked) == 6
    monkeypatch.setenv("PYTHONNOUSERSITE", "1")  # a start-up variable changed: a fresh interpreter
    kind, fresh = generate({"target": "dense", "drafter": "dense-block-markov", "mode": "chain"})
    assert kind is subprocess.Popen and fresh == forked


def test_a_dead_zygote_is_replaced():
    generate({"target": str(SHIPPED / "dense"), "mode": "ar"})
    ZYGOTE._proc.kill()
    ZYGOTE._proc.wait()
    kind, out = generate({"target": str(SHIPPED / "dense"), "mode": "ar"})
    assert kind is Forked and len(out) == 6 and ZYGOTE._proc.poll() is None  # a new zygote forked it
