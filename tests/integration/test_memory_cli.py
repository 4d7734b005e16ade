"""`specpilot memory …` and `specpilot serve memory-api` over a real SQLite store and real HTTP."""

import json
import socket
import subprocess
import sys
import time
import urllib.request

from specpilot.entrypoints.cli import main


def run(capsys, *argv):
    assert main(list(argv)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_memory_commands(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    added = json.loads(run(capsys, "memory", "--store", url, "seed", "--json"))["added"]
    assert "tree-best-first@1" in added
    assert json.loads(run(capsys, "memory", "--store", url, "seed", "--json"))["added"] == []  # idempotent
    listed = json.loads(run(capsys, "memory", "--store", url, "list", "--json"))
    assert {e["id"] for e in listed} == {a.split("@")[0] for a in added}
    tree = json.loads(run(capsys, "memory", "--store", url, "list", "--mechanism", "tree", "--json"))
    assert tree and all("tree" in e["id"] or "tree" in e["title"].lower() for e in tree)
    shown = json.loads(run(capsys, "memory", "--store", url, "show", "tree-best-first", "--json"))
    assert shown["variants"]["n32"]["tree"] == "best-first:32"
    svg = tmp_path / "g.svg"
    g = json.loads(run(capsys, "memory", "--store", url, "graph", "tree-best-first", "--svg", str(svg), "--json"))
    assert g["nodes"][0]["key"] == "tree-best-first@1" and svg.read_text().startswith("<svg")
    plan = json.loads(run(capsys, "memory", "--store", url, "port", "--deployment",
                          '{"family": "qwen3_next", "device": "h200", "batch": 1}', "--json"))
    batched = {"batch-shared-budget@1", "batch-draft-length@1", "batch-prompt-admission@1"}  # batch ≥ 2 only
    assert batched <= set(added) and set(plan["order"]) == set(added) - batched
    plan = json.loads(run(capsys, "memory", "--store", url, "port", "--deployment",
                          '{"family": "qwen3_next", "device": "h200", "batch": 16}', "--json"))
    assert set(plan["order"]) == set(added)  # two-level verification too: the static driver runs it at a batch
    assert main(["memory", "--store", url, "show", "nope"]) == 2
    assert "unknown entry" in capsys.readouterr().err


def test_serve_memory_api(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"sqlite:///{tmp_path / 'm.db'}"
    proc = subprocess.Popen([sys.executable, "-m", "specpilot.entrypoints.cli", "serve", "memory-api", "--store", url,
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/entries", timeout=2) as r:
                    assert r.status == 200 and json.loads(r.read()) == []
                    break
            except OSError:
                time.sleep(0.2)
        else:
            raise AssertionError("memory-api did not answer")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
