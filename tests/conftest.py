"""Shared pytest set-up: the repository root off sys.path, and the `gpu` marker.

The top-level folders import only as specpilot.engine, specpilot.kernels, ...; with the root on
sys.path (`python -m pytest` puts the working folder there) the folder kernels/ would shadow the
PyPI package `kernels` that transformers imports when it is installed.

A test marked `gpu`, or any test under tests/gpu/, is skipped (with the reason) when
torch.cuda.is_available() is false.
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GPU_DIR = Path(__file__).parent / "gpu"
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped when torch.cuda.is_available() is false")


def pytest_collection_modifyitems(config, items):
    gpu_items = []
    for item in items:
        if GPU_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.gpu)
        if item.get_closest_marker("gpu") is not None:
            gpu_items.append(item)
    if not gpu_items:
        return
    import torch  # only when a gpu test was collected

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _user_data_home(tmp_path_factory, monkeypatch):
    """No test reads or writes the user's own memory store (`specpilot demo` and `specpilot memory`
    default to it): each sees an empty data folder of its own."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data-home")))
    monkeypatch.delenv("SPECPILOT_MEMORY_URL", raising=False)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and far faster than on threads that share busy cores):
    a module takes it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
