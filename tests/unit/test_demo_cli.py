"""`specpilot demo` keeps its memory where `specpilot memory` looks by default, and ends with the
figures a user wants first and where to look next."""

from __future__ import annotations

import json

from specpilot.entrypoints import cli, round_cli
from specpilot.entrypoints.memory_cli import default_url


def _out(tmp_path):
    return {"rounds": [{"round": 1, "accepted": [{"entry": "tree-best-first@2", "gain": 1.2, "lower_bound": 1.1}]},
                       {"round": 2, "accepted": []}],
            "final": {"label": "round-1", "speedup_over_stock": {"gain": 1.2667, "lower_bound": 1.1504},
                      "speedup_over_ar": {"gain": 0.9891, "lower_bound": 0.9512}},
            "report": str(tmp_path / "run" / "report" / "index.html"), "seconds": 95.2,
            "speedup_over_stock": 1.2667, "speedup_over_ar": 0.9891}


def test_demo_uses_the_memory_commands_default_store(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECPILOT_MEMORY_URL", f"sqlite:///{tmp_path / 'm.db'}")
    seen = {}

    def fake(rounds, run_dir, json_out, overrides, store=None):
        seen["store"] = store
        return _out(tmp_path)

    monkeypatch.setattr(round_cli, "run_demo", fake)
    assert cli.main(["demo", "--quick"]) == 0
    assert seen["store"] == default_url() == f"sqlite:///{tmp_path / 'm.db'}"
    text = capsys.readouterr().out
    assert "speed-up over the stock chain: ×1.267 (95 % lower bound ×1.150)" in text
    assert "speed-up over plain AR:        ×0.989 (95 % lower bound ×0.951)" in text
    assert f"report    {tmp_path / 'run' / 'report' / 'index.html'}" in text
    assert f"verdicts  {tmp_path / 'run' / 'verdicts'}/" in text
    assert "memory    specpilot memory list" in text and "tree-best-first@2" in text
    assert cli.main(["demo", "--quick", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["final"]["speedup_over_ar"]["lower_bound"] == 0.9512


def test_demo_refuses_an_unusable_store_before_it_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(round_cli, "run_demo", lambda *a, **k: (_ for _ in ()).throw(AssertionError("started")))
    assert cli.main(["demo", "--store", "sqlite:////no/such/dir/m.db"]) == 2
    assert "--store" in capsys.readouterr().err


def test_demo_repeats_set_the_deployments_repeats_and_refuse_one(tmp_path, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(round_cli, "run_demo", lambda rounds, run_dir, json_out, overrides, store=None:
                        seen.append(overrides) or _out(tmp_path))
    store = ["--store", f"sqlite:///{tmp_path / 'm.db'}", "--json"]
    assert cli.main(["demo", "--repeats", "10", *store]) == 0
    assert cli.main(["demo", "--quick", "--repeats", "3", *store]) == 0
    assert cli.main(["demo", *store]) == 0
    assert seen[0] == {"repeats": 10} and seen[1]["repeats"] == 3 and seen[1]["prompts"] == 1 and seen[2] is None
    capsys.readouterr()
    assert cli.main(["demo", "--repeats", "1", *store]) == 2  # under --json the error is one object on stdout
    assert "--repeats 1: expected 2 or more" in json.loads(capsys.readouterr().out)["error"] and len(seen) == 3
    assert cli.main(["demo", "--repeats", "1", "--store", f"sqlite:///{tmp_path / 'm.db'}"]) == 2
    err = capsys.readouterr().err
    assert "--repeats 1: expected 2 or more" in err and "Traceback" not in err and len(seen) == 3
