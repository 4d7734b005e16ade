"""The planted bugs of tests/mutations/run.py: every one still applies to the current source, and a
few of them (one eager, one static, one statistical) are caught by the tests meant to catch them.

This runs three mutations under one Hypothesis seed. Run the whole script —
`python tests/mutations/run.py` (every mutation, seeds 0..7; tens of minutes on two cores) —
whenever acceptance, K/V compaction, the recurrent-state commit or the statistics change."""

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "mutations" / "run.py"


def load():
    spec = importlib.util.spec_from_file_location("mutations_run", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_every_mutation_applies_to_the_current_source():
    mod = load()
    assert len({m.name for m in mod.MUTATIONS}) == len(mod.MUTATIONS)
    for m in mod.MUTATIONS:
        text = (REPO / m.file).read_text()
        assert text.count(m.old) == 1, f"{m.name}: the snippet to replace is not in {m.file} exactly once"
        assert m.old != m.new
        assert all((REPO / t).is_file() for t in m.tests)


def test_planted_bugs_are_caught():
    out = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "0", "--no-baseline", "--only",
                          "eager-compaction", "static-tree-state", "stats-dof"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("seed 0: caught") == 3


def test_batch_row_selection_bugs_are_caught():
    """The shared budget's and the per-request draft length's planted bugs: a share that is not
    prefix-closed, idle lanes taking shares, a lane's tree hung from its neighbour's root, a lane
    accepting one position past its length."""
    names = ["batch-share-not-closed", "batch-share-idle-lane", "batch-shared-root", "batch-length-past"]
    out = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "0", "--no-baseline", "--only", *names],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("seed 0: caught") == len(names)


def test_two_level_verification_bugs_are_caught():
    """An exact pass that trusts the Q pass's chain, and a Q pass whose rows stay pending."""
    names = ["tlv-unchecked-chain", "tlv-q-rows-kept"]
    out = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "0", "--no-baseline", "--only", *names],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("seed 0: caught") == len(names)


def test_unknown_mutation_is_named():
    out = subprocess.run([sys.executable, str(SCRIPT), "--only", "nope"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "unknown mutation nope" in out.stderr
