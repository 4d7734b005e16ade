# Each target creates and uses .venv itself; .venv/.installed is rebuilt when pyproject.toml
# (or setup.py) changes. torch==2.13.0 is installed first (here: the local CPU wheel), so the
# `torch>=2.11` range in pyproject.toml never pulls a CUDA build.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
PYTEST_ARGS ?=

.PHONY: demo test bench proto

$(VENV)/.installed: pyproject.toml setup.py
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/specpilot demo

# The per-test timeout (300 s) is set in pyproject.toml; override with PYTEST_ARGS=--timeout=N.
test: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider tests $(PYTEST_ARGS)

bench:
	@echo "Benchmarks need a CUDA GPU: run them on the GPU machine, with the Python that has its CUDA torch:"
	@echo "  python -m pip install --no-deps --no-build-isolation -e .   # no downloads needed"
	@echo "  python bench/<script>.py"
	@echo "Each script writes bench/results/<name>.json (command, device, date, git_sha, figures);"
	@echo "add a row for it to BENCHMARKS.md. See bench/README.md."

# gRPC stubs from proto/ into specpilot/v1/ (committed; tests/unit/test_proto_stubs.py fails when stale)
proto: $(VENV)/.installed
	$(PY) -m specpilot.entrypoints.protogen
