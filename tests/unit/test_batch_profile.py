"""The worker's Profile at a batch (services/gpu_worker/profiling.py `measure`, batch 2) on a
tiny random checkpoint, through the loaded Engine and the batched decoder users run, and the
planner's cost model of it."""

from __future__ import annotations

import pytest

from specpilot import rpc
from specpilot.engine.checkpoint import save_model
from specpilot.engine.drafters import save_drafter
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.engine.synthetic import random_drafter_net, random_model, tiny_config
from specpilot.services.gpu_worker.profiling import measure
from specpilot.services.planner.costmodel import analyze

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = [[5, 17, 3, 42, 8, 11], [7, 7, 1, 2], [9, 3, 30, 4, 4, 1, 2]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target folder, drafter folder): a random llama-family target and a block drafter for it."""
    root = tmp_path_factory.mktemp("ckpt")
    target = random_model(tiny_config("llama", vocab=97), seed=3)
    save_model(target, root / "target")
    save_drafter(random_drafter_net("block_markov", target.cfg, seed=5, block=8), root / "drafter")
    return root / "target", root / "drafter"


def test_a_speculative_system_is_profiled_at_its_batch(pair):
    engine = Engine(EngineConfig(target=str(pair[0]), drafter=str(pair[1]), mode="chain", draft_len=6))
    m = measure(engine, PROMPTS, 8, ["chain", "best-first:12"], ["best-first:12"], batch=2)
    assert m["batch"] == 2 and m["current"] == "chain" and m["t_ar_s"] > 0
    assert [(b["policy"], b["rows"]) for b in m["budgets"]] == [("chain", 2 * 7.0), ("best-first:12", 2 * 13.0)]
    for b in m["budgets"]:  # τ per request: from 1 (the bonus alone) to every drafted position + 1
        assert 1 <= b["tau"] <= 7 and b["t_step_s"] > 0
    assert set(m["replay"]) == {"best-first:12", "oracle"}
    assert rpc.profile_json(rpc.profile_message(m)) == m  # the same measurement over gRPC
    cm = analyze(m, "cpu")
    assert cm["batch"] == 2 and cm["ceiling"]["batch"] == 2 and cm["ceiling"]["rows"] == 14.0
    assert [b["rows_per_request"] for b in cm["budgets"]] == [7.0, 13.0]
    assert cm["ceiling"]["rows_needed"] == pytest.approx(2 * cm["tau_oracle"])
    assert cm["direction"] in ("tree", "rows", "off-profile") or cm["direction"].startswith("kernel:")
    assert "at batch 2, 14 rows per step (7 per request)" in cm["table"]


def test_an_ar_system_at_a_batch_has_one_row_per_request(pair):
    engine = Engine(EngineConfig(target=str(pair[0]), mode="ar"))
    m = measure(engine, PROMPTS[:2], 6, [], [], batch=2)
    (row,) = m["budgets"]
    assert (m["batch"], row["policy"], row["rows"], row["tau"]) == (2, "ar", 2.0, 1.0)
    assert row["t_step_s"] == m["t_ar_s"] > 0
    cm = analyze(m, "cpu")
    assert cm["speedup_current"] == 1.0 and cm["ceiling"]["factors"]["rows"] == 1.0


@pytest.mark.parametrize("batch, driver, says", [
    (0, "auto", "batch 0: expected a positive integer"),
    ("2", "auto", "batch '2': expected a positive integer"),
    (2, "eager", "batch 2: driver 'eager' decodes one request at a time"),
])
def test_a_batch_the_profile_cannot_run_is_refused_in_one_line(pair, batch, driver, says):
    engine = Engine(EngineConfig(target=str(pair[0]), drafter=str(pair[1]), mode="chain", draft_len=4, driver=driver))
    with pytest.raises(ValueError, match=says):
        measure(engine, PROMPTS, 4, ["chain"], [], batch=batch)
