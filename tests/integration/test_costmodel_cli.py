"""`specpilot costmodel` on the shipped micro pair: a real profile, cost model and ceiling."""

import json
import math
import xml.etree.ElementTree as ET

from specpilot.entrypoints.cli import main
from specpilot.entrypoints.costmodel_cli import run_costmodel
from specpilot.entrypoints.demo import micro_pair


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
    assert math.isclose(out["ceiling"]["product"], f["tree"] * f["kernels"] * f["off_profile"] * f["rows"])
    assert out["tau_oracle"] >= min(b["tau"] for b in out["budgets"]) - 1e-9
    assert out["direction"] in ("tree", "rows", "off-profile") or out["direction"].startswith("kernel:")
    assert out["batch"] == out["ceiling"]["batch"] == 1
    ET.fromstring(out["svg"])
    assert main(["costmodel", "--target", str(target), "--drafter", str(drafter), "--prompts", "1",
                 "--new-tokens", "8", "--json", "--svg", str(tmp_path / "c.svg")]) == 0
    assert json.loads(capsys.readouterr().out)["direction"]
    assert (tmp_path / "c.svg").read_text().startswith("<svg")


def test_costmodel_at_a_batch_and_on_a_batch_axis(tmp_path, capsys):
    """--batch 2: the profile runs two requests at a time (rows over the batch, T_AR at batch 2);
    --batch 1,2: both measured, the JSON lists them and the chart is the speedup by batch."""
    target, drafter, _ = micro_pair()
    base = ["costmodel", "--target", str(target), "--drafter", str(drafter), "--prompts", "2", "--new-tokens", "6",
            "--json"]
    assert main([*base, "--batch", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["batch"] == out["ceiling"]["batch"] == 2 and out["t_ar_s"] > 0
    assert all(b["rows"] == 2 * b["rows_per_request"] for b in out["budgets"])
    assert set(out["ceiling"]["factors"]) == {"tree", "kernels", "off_profile", "rows"}
    svg = tmp_path / "axis.svg"
    assert main([*base, "--batch", "2,1", "--svg", str(svg)]) == 0
    both = json.loads(capsys.readouterr().out)
    assert [a["batch"] for a in both["batches"]] == [1, 2] and both["target"] == str(target)
    texts = "".join(ET.fromstring(svg.read_text()).itertext())
    assert "batch 1" in texts and "batch 2" in texts
    for bad in ("0", "1,1", "two"):
        assert main([*base, "--batch", bad]) == 2
        assert "--batch" in json.loads(capsys.readouterr().out)["error"]
