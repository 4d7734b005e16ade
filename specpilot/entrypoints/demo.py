"""The micro pair the demo, the self-tests and the tests run on.

The zoo's shipped micro checkpoints when they exist; otherwise random-weight micro checkpoints,
written once under the user cache, so that the pipeline still runs end to end.
"""

from __future__ import annotations

import os
from pathlib import Path


from specpilot.engine.checkpoint import save_model
from specpilot.engine.drafters import save_drafter
from specpilot.engine.synthetic import random_drafter_net, random_model, tiny_config
from specpilot import zoo

SHIPPED = Path(zoo.__file__).resolve().parent / "checkpoints" / "micro"


def micro_pair() -> tuple[Path, Path, bool]:
    """(target folder, block-drafter folder, trained?)"""
    if (SHIPPED / "dense" / "config.json").is_file() and (SHIPPED / "dense-block" / "config.json").is_file():
        return SHIPPED / "dense", SHIPPED / "dense-block", True
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specpilot" / "random-micro"
    if not (root / "drafter" / "config.json").is_file():
        cfg = tiny_config("llama", vocab=512, hidden=128, layers=4)
        save_model(random_model(cfg, seed=0), root / "target")
        save_drafter(random_drafter_net("block", cfg, seed=1, block=8), root / "drafter")
    return root / "target", root / "drafter", False
