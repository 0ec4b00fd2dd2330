# gemshal / gemsops: set-up, demo and tests.
#
# `make demo` and `make test` create .venv on first use and install the project.
# Where torch and triton are already importable (a GPU box), the venv sees them
# (--system-site-packages) and they are kept; elsewhere the CPU build of torch
# 2.13.0 and triton 3.9.0 are installed (triton 3.6 needs numpy < 2.4 for its
# interpreter; 3.9 works with numpy 2.4).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gemshal-installed
TEST_STAMP := $(VENV)/.gemshal-test-installed
DOCS_STAMP := $(VENV)/.gemshal-docs-installed
TORCH_CPU := torch==2.13.0
TRITON_CPU := triton==3.9.0

.PHONY: demo test check lint typing bench docs clean

$(STAMP): setup.cfg pyproject.toml
	@if $(PYTHON) -c "import torch, triton" 2>/dev/null; then \
		echo "gemshal: torch and triton found, keeping them"; \
		$(PYTHON) -m venv --system-site-packages $(VENV) && \
		$(PY) -m pip install -q --no-deps --no-build-isolation -e .; \
	else \
		$(PYTHON) -m venv $(VENV) && \
		$(PY) -m pip install -q --upgrade pip && \
		$(PY) -m pip install -q $(TORCH_CPU) $(TRITON_CPU) numpy && \
		$(PY) -m pip install -q -e .; \
	fi
	@touch $(STAMP)

# Test tools (pytest, hypothesis, mypy, ruff), on top of the runtime install.
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test]'
	@touch $(TEST_STAMP)

demo: $(STAMP)
	$(PY) -m gemshal info
	$(PY) -m gemsops demo

test: $(TEST_STAMP)
	$(PY) -m pytest -q -p no:cacheprovider
	$(PY) -m mypy
	$(PY) -m ruff check gemshal gemsops tests examples
	$(PY) -m ruff format --check gemshal
	$(PY) -m pip install -q --no-deps --no-build-isolation -e examples/vendor-plugin
	$(VENV)/bin/gemshal vendors | grep -q '^anvil '
	GEMS_VENDOR=anvil $(VENV)/bin/gemshal config anvil_neg | grep -q 'source: .*gemshal_anvil/tune/anvil.toml (vendor, anvil)'
	GEMS_VENDOR=anvil $(VENV)/bin/gemsops selftest --ops neg,add,softmax --examples 5

# The API reference (Sphinx + MyST, the `docs` extra): docs/_build/html/index.html.
# Warnings are errors, as in CI and `tox -e docs`.
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[docs]'
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(VENV)/bin/sphinx-build -n -W --keep-going -b html docs docs/_build/html

bench: $(STAMP)
	$(PY) -m gemsops bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
