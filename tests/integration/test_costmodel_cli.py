"""`specpilot costmodel` on the shipped micro pair: a real profile, cost model and ceiling."""

import json
import math
import xml.etree.ElementTree as ET

from specpilot.cli import main
from specpilot.costmodel_cli import run_costmodel
from specpilot.demo import micro_pair


def test_costmodel_on_the_micro_pair(tmp_path, capsys):
    target, drafter, _ = micro_pair()
    out = run_costmodel(target, drafter, prompts=1, new_tokens=12, policies=("chain", "best-first:16"),
                        progress=False)
    assert [b["policy"] for b in out["budgets"]] == ["chain", "best-first:16"]
    for b in out["budgets"]:
        assert b["tau"] >= 1 and b["c"] > 0
        assert math.isclose(b["speedup"], b["tau"] / b["c"])
    assert out["best"] == max(out["budgets"], key=lambda b: b["speedup"])["policy"]
    f = out["ceiling"]["factors"]
    assert math.isclose(out["ceiling"]["product"], f["tree"] * f["kernels"] * f["off_profile"])
    assert out["tau_oracle"] >= min(b["tau"] for b in out["budgets"]) - 1e-9
    assert out["direction"] in ("tree", "off-profile") or out["direction"].startswith("kernel:")
    ET.fromstring(out["svg"])
    assert main(["costmodel", "--target", str(target), "--drafter", str(drafter), "--prompts", "1",
                 "--new-tokens", "8", "--json", "--svg", str(tmp_path / "c.svg")]) == 0
    assert json.loads(capsys.readouterr().out)["direction"]
    assert (tmp_path / "c.svg").read_text().startswith("<svg")
