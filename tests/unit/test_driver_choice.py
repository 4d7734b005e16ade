"""The driver choice (decode.pick_driver, EngineConfig.driver, `specpilot generate --driver`): auto
is eager on the CPU, static is refused in one line where the static driver cannot run, and the
result and the engine's JSON say which driver ran."""

from pathlib import Path

import pytest
import torch

from specpilot.engine.decode import generate, pick_driver
from specpilot.engine.drafters import Drafter, Lattice, NgramDrafter
from specpilot.engine.engine import Engine, EngineConfig
from specpilot.engine.replay import make_policy
from specpilot.engine.synthetic import random_model, tiny_config
from specpilot.zoo.workloads import Request

MICRO = Path(__file__).resolve().parents[2] / "zoo" / "checkpoints" / "micro"
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


class HostFeatures(Drafter):
    """A host drafter that reads target features: the static driver has no place for it."""

    kind, target_layers = "host_features", (1,)

    def propose(self, m, known=None):
        return Lattice.empty()


def tgt():
    return random_model(tiny_config("llama", vocab=97), seed=1, dtype=torch.float64)


def test_auto_is_eager_on_the_cpu_and_each_driver_can_be_forced():
    t, pol = tgt(), make_policy("best-first:12")
    assert pick_driver(t, NgramDrafter(), pol) == "eager"
    assert pick_driver(t, NgramDrafter(), pol, "static") == "static"
    assert pick_driver(t, None, None, "eager") == "eager"
    with pytest.raises(ValueError, match=r"driver 'fast': expected one of \('auto', 'static', 'eager'\)"):
        pick_driver(t, None, None, "fast")


def test_static_is_refused_for_a_drafter_it_cannot_run():
    t = tgt()
    assert pick_driver(t, HostFeatures(), None) == "eager"  # auto falls back: the eager driver runs it
    with pytest.raises(ValueError, match="driver 'static' cannot run a host_features drafter that reads target "
                                         "features on the host") as e:
        generate(t, PROMPT, 8, HostFeatures(), driver="static")
    assert "\n" not in str(e.value)


def test_the_result_says_which_driver_ran():
    t, d, pol = tgt(), NgramDrafter(), make_policy("best-first:12")
    eager = generate(t, PROMPT * 3, 24, d, 6, eos=set(), policy=pol)
    static = generate(t, PROMPT * 3, 24, d, 6, eos=set(), policy=pol, driver="static")
    assert (eager.driver, static.driver) == ("eager", "static")
    assert static.tokens == eager.tokens


def test_engine_config_validates_the_driver():
    with pytest.raises(ValueError, match="driver 'graphs'"):
        EngineConfig(target="x", mode="ar", driver="graphs").validate()


@pytest.mark.skipif(not (MICRO / "dense").is_dir(), reason="the micro checkpoints are not built")
def test_engine_runs_the_driver_it_is_given():
    req = [Request(id="a", prompt_ids=PROMPT, max_new_tokens=12)]
    runs = {drv: Engine(EngineConfig(target=str(MICRO / "dense"), drafter="ngram", mode="tree", tree="best-first:8",
                                     dtype="float64", driver=drv)).run(req) for drv in ("auto", "static")}
    assert runs["auto"]["driver"] == "eager" and runs["static"]["driver"] == "static"
    assert runs["static"]["config"]["driver"] == "static"
    assert runs["auto"]["outputs"][0]["tokens"] == runs["static"]["outputs"][0]["tokens"]
