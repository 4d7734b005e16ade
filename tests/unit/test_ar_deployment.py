"""A deployment without a drafter: it loads and checks, its stock decodes AR, and the GPU worker's
Profile of an AR system is the AR step alone (one "ar" row, no replay), which the cost model reads."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specpilot import rpc
from specpilot.entrypoints.demo import SHIPPED
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.engine.profiler import KERNEL_CLASSES
from specpilot.entrypoints.round_cli import check_deployment
from specpilot.services.controller.round import DeploymentError, load_deployment, stock_config
from specpilot.services.gpu_worker.profiling import measure
from specpilot.services.planner.costmodel import analyze

TARGET, MARKOV = SHIPPED / "dense", SHIPPED / "dense-block-markov"
pytestmark = pytest.mark.skipif(not (MARKOV / "config.json").is_file(), reason="needs the shipped micro checkpoints")
PROMPT = [5, 17, 300, 42, 9, 77]


@pytest.mark.parametrize("drafter", ["absent", None])
def test_a_deployment_without_a_drafter_loads_and_its_stock_decodes_ar(drafter):
    raw = {"name": "ar", "target": str(TARGET), "drafters": {"block_markov": str(MARKOV)}}
    dep = load_deployment(raw if drafter == "absent" else {**raw, "drafter": drafter})
    assert dep["drafter"] is None and dep["drafters"] == {"block_markov": str(MARKOV.resolve())}
    stock = stock_config(dep)
    assert stock["mode"] == "ar" and "drafter" not in stock and "draft_len" not in stock
    assert (stock["target"], stock["max_new_tokens"]) == (dep["target"], dep["max_new_tokens"])
    EngineConfig(**stock).validate()  # a system the GPU worker can build
    check_deployment(dep)  # the target, the drafters by kind, the workload


def test_a_deployment_with_a_drafter_keeps_chain_speculation_as_stock():
    dep = load_deployment({"name": "chain", "target": str(TARGET), "drafter": str(MARKOV), "draft_len": 8})
    stock = stock_config(dep)
    assert (stock["mode"], stock["drafter"], stock["draft_len"]) == ("chain", str(MARKOV.resolve()), 8)


@pytest.mark.parametrize("value, says", [("", "'drafter' = ''"), (3, "'drafter' = 3"),
                                         ("/no/such/drafter", "drafter '/no/such/drafter' is not a checkpoint")])
def test_a_bad_drafter_value_is_named(value, says):
    with pytest.raises(DeploymentError, match=says):
        load_deployment({"name": "x", "target": str(TARGET), "drafter": value})


def test_a_broken_target_of_a_deployment_without_a_drafter_is_named_before_any_worker(tmp_path):
    bad = tmp_path / "t"
    shutil.copytree(TARGET, bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "num_attention_heads": 2.5}))
    dep = load_deployment({"name": "x", "target": str(bad)})
    with pytest.raises(ValueError, match="deployment: target: .*num_attention_heads"):
        check_deployment(dep)


def linear_flops_one_row(target) -> float:
    return sum(2.0 * m.in_features * m.out_features for m in target.model.layers.modules()
               if isinstance(m, torch.nn.Linear))


def test_the_profile_of_an_ar_system_is_one_ar_row_and_no_replay():
    engine = Engine(EngineConfig(target=str(TARGET), mode="ar"))
    m = measure(engine, [PROMPT, PROMPT[:3]], 8, ["chain", "best-first:16"], ["best-first:32", "chain"])
    assert (m["current"], m["draft_len"], m["replay"]) == ("ar", 0, {})
    (row,) = m["budgets"]
    assert (row["policy"], row["rows"], row["tau"]) == ("ar", 1.0, 1.0)
    assert row["t_step_s"] == m["t_ar_s"] > 0 and row["profiled_t_step_s"] > 0
    assert set(row["kernels"]) == set(KERNEL_CLASSES)
    k = {c: dict(zip(("seconds", "bytes", "flops"), v)) for c, v in row["kernels"].items()}
    cfg = engine.target.cfg
    assert k["target_linear"]["flops"] == linear_flops_one_row(engine.target) and k["target_linear"]["seconds"] > 0
    assert k["lm_head"]["flops"] == 2.0 * cfg.hidden_size * cfg.vocab_size and k["lm_head"]["seconds"] > 0
    assert k["drafter"]["seconds"] == 0 and k["tree_build"]["seconds"] == 0
    assert rpc.profile_json(rpc.profile_message(m)) == m  # the same measurement over gRPC
    cm = analyze(m, "h200")
    assert cm["speedup_current"] == 1.0 and cm["ceiling"]["factors"]["tree"] == 1.0
    assert cm["direction"] == "off-profile" or cm["direction"].startswith("kernel:")


def test_the_profile_of_a_speculative_system_keeps_its_budgets_and_replay():
    engine = Engine(EngineConfig(target=str(TARGET), drafter=str(MARKOV), mode="chain", draft_len=8))
    m = measure(engine, [PROMPT], 8, ["chain", "best-first:16"], ["best-first:32"])
    assert m["current"] == "chain" and m["draft_len"] == 8
    assert [b["policy"] for b in m["budgets"]] == ["chain", "best-first:16"]
    assert set(m["replay"]) == {"best-first:32", "oracle"} and m["replay"]["oracle"] >= 1
    assert all(b["rows"] > 1 and b["tau"] >= 1 for b in m["budgets"])
